"""What each dashboard page shows, built from the JSON API's own reads (``api.queries``, ``api.schemas``).

Every builder returns the template context; ``data`` is what the page's JavaScript draws, with the
field names of the JSON API (a study page's ``data.study`` is ``GET /v1/studies/{id}``, its
``data.points`` is ``GET /v1/studies/{id}/points``), so a live update can swap in a fresh JSON
answer unchanged.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sqlalchemy.orm import Session

from zerotune.api import queries
from zerotune.api.prologue import collectives_caveat, notes_of
from zerotune.api.schemas import StudyPublic, TrialDetailPublic
from zerotune.db import repository as repo
from zerotune.db.models import Recommendation, Request, Study, Trial
from zerotune.tuner.seeding import PRESETS  # the known-good strategies every study runs first

EXPORTS = (("zerotune", "zerotune.json", "zerotune's trainer: write its strategy to strategy.json, run its command "
             "on every node"),
           ("deepspeed", "ds_config.json", "DeepSpeed: deepspeed.initialize(..., config=\"ds_config.json\")"),
           ("fsdp", "fsdp.json", "PyTorch FSDP2: the device mesh shape and fully_shard(reshard_after_forward=...)"))
STRATEGY_FIELDS = (
    ("param_span", "P (16-bit weights) partitioned over"),
    ("grad_span", "G (gradients) partitioned over"),
    ("optim_span", "OS (fp32 master + Adam moments) partitioned over"),
    ("secondary_span", "hpZ: secondary weight copy over (backward all-gather)"),
    ("weight_bits", "bits of weight all-gathers"),
    ("grad_bits", "bits of gradient reduction"),
    ("quantize_above", "quantized from this level outwards"),
    ("allgather_bucket_mb", "all-gather bucket (MB)"),
    ("reduce_bucket_mb", "reduce bucket (MB)"),
    ("prefetch_buckets", "buckets gathered ahead"),
    ("micro_batch_size", "micro-batch size"),
    ("activation_checkpointing", "activation checkpointing"),
    ("checkpoint_policy", "what a checkpointed block keeps (full: its input; selective: attention and every "
                          "second matmul)"),
    ("checkpoint_every", "blocks per checkpointed block (1: every block)"),
)
PER_PAGE = 50


def page_data(value: Any) -> Any:
    """JSON-ready and finite (NaN losses become null): what ``JSON.parse`` in the page accepts."""
    return queries.finite(json.loads(json.dumps(value, default=str)))


def cluster_levels(request: Request) -> list[dict[str, Any]]:
    return list((request.spec.get("cluster") or {}).get("levels") or [])


def span_words(levels: list[dict[str, Any]], span: Any) -> str:
    """``span 2: node (8 ranks)``: a span in the words of the cluster's levels."""
    if span is None:
        return "off"
    if not isinstance(span, int) or not 0 <= span <= len(levels):
        return str(span)
    if span == 0:
        return "0: not partitioned (each rank holds all)"
    ranks = math.prod(int(level.get("size", 1)) for level in levels[:span])
    return f"{span}: {levels[span - 1].get('name')} ({ranks} ranks)"


def strategy_rows(strategy: dict[str, Any], levels: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(field, value in words, meaning) for each Strategy dimension."""
    out = []
    for name, meaning in STRATEGY_FIELDS:
        value = strategy.get(name)
        if name.endswith("_span"):
            words = span_words(levels, value)
        elif name == "quantize_above" and isinstance(value, int) and 1 <= value <= len(levels):
            words = f"{value}: {levels[value - 1].get('name')}"
        else:
            words = "—" if value is None else str(value)
        out.append((name, words, meaning))
    return out


def request_summary(request: Request) -> dict[str, Any]:
    fields = queries.request_fields(request)
    model, cluster = fields.get("model") or {}, fields.get("cluster") or {}
    levels = cluster_levels(request)
    return {"id": request.id, "model": model.get("name", "custom"), "cluster": cluster.get("name", "custom"),
            "world_size": math.prod(int(level.get("size", 1)) for level in levels) if levels else None,
            "device": cluster.get("device"), "device_memory_gib": cluster.get("device_memory_gib"),
            "levels": [level.get("name") for level in levels], "objective": fields["objective"],
            "executor": fields["executor"], "trials": fields["trials"], "calibration": fields["calibration"],
            "runner": fields["runner"], "grad_reduce_in_fp32": bool(fields["grad_reduce_in_fp32"])}


def refit_of(session: Session, study_id: int) -> dict[str, Any] | None:
    """The calibration a study's measured runs refitted (its report, with ``name`` and ``cluster``), or None."""
    row = repo.calibration_of_study(session=session, study_id=study_id)
    return {**row.report, "name": row.name, "cluster": row.cluster} if row is not None else None


def measured_by_jobs(session: Session) -> list[dict[str, Any]]:
    """Which training jobs measured what (``zerotune recommend --measure``): per job, its request's model and
    cluster, each shortlisted strategy's outcome (TFLOPS per rank, failed, cut off by the budget), the winner,
    and the calibration its runs refitted."""
    out = []
    for rec in repo.job_measured_recommendations(session=session):
        on = (rec.metrics or {})["measured_on_job"]
        study = repo.get_study(session=session, study_id=rec.study_id)
        request = repo.get_request(session=session, request_id=study.request_id) if study is not None else None
        out.append({"job": on.get("job"), "recommendation_id": rec.id, "study_id": rec.study_id,
                    "request": request_summary(request) if request is not None else None,
                    "runs": on.get("runs") or [], "cut_off": on.get("cut_off") or [],
                    "winner": rec.strategy.get("name") or "custom", "refit": on.get("refit"),
                    "created_at": rec.created_at})
    return out


def studies_page(session: Session, page: int) -> dict[str, Any]:
    rows, count = repo.list_studies(session=session, offset=(page - 1) * PER_PAGE, limit=PER_PAGE)
    studies: list[dict[str, Any]] = []
    live: list[dict[str, int | None]] = []
    for study in rows:
        detail = queries.study_detail(session, study)
        job = repo.latest_job_of_study(session=session, study_id=study.id)
        request = repo.get_request(session=session, request_id=study.request_id)
        assert request is not None
        done = sum(n for status, n in detail.trial_counts.items() if status in repo.TERMINAL_TRIAL_STATUSES)
        studies.append({"study": detail, "request": request_summary(request), "done": done,
                        "job": queries.job_public(session, job) if job is not None else None})
        if detail.state in ("pending", "running"):
            live.append({"study_id": detail.id, "job_id": job.id if job is not None else None})
    waiting: list[dict[str, Any]] = []
    for waiting_job in repo.waiting_jobs(session=session):
        request = repo.get_request(session=session, request_id=waiting_job.request_id)
        assert request is not None
        waiting.append({"job": queries.job_public(session, waiting_job), "request": request_summary(request)})
    pages = max(1, math.ceil(count / PER_PAGE))
    return {"studies": studies, "count": count, "page": page, "pages": pages, "waiting": waiting,
            "measured_by_jobs": measured_by_jobs(session) if page == 1 else [],
            "data": page_data({"live": live, "waiting": [w["job"].id for w in waiting]})}


def study_page(session: Session, study: Study) -> dict[str, Any]:
    detail = queries.study_detail(session, study)
    request = repo.get_request(session=session, request_id=study.request_id)
    assert request is not None
    summary = request_summary(request)
    points = queries.trial_points(session, study)
    job = repo.latest_job_of_study(session=session, study_id=study.id)
    job_view = queries.job_public(session, job) if job is not None else None
    present = {p.strategy.get("name") for p in points.data if p.status == "complete"}
    presets = [name for name in PRESETS if name in present]
    failed = [p for p in points.data if p.status in ("failed", "infeasible")]
    return {"study": detail, "request": summary, "job": job_view, "presets": presets,
            "refit": refit_of(session, study.id),
            "count": points.count, "failed": len(failed),
            # JSON-ready as dumped: every number of a point went through queries.trial_point's finite check
            # (a 500-trial study skips a second pass over 30,000 values)
            "data": {"study": detail.model_dump(mode="json"), "points": points.model_dump(mode="json"),
                     "job": job_view.model_dump(mode="json") if job_view else None,
                     "device_memory_gib": summary["device_memory_gib"],
                     "outer_level": queries.outer_level(request)}}


def trial_view(session: Session, trial: Trial) -> dict[str, Any]:
    """A trial with its study's request, as the trial and compare pages draw it."""
    study = repo.get_study(session=session, study_id=trial.study_id)
    assert study is not None
    request = repo.get_request(session=session, request_id=study.request_id)
    assert request is not None
    detail = TrialDetailPublic.model_validate(trial, from_attributes=True)
    return {"trial": detail, "study": StudyPublic.model_validate(study, from_attributes=True),
            "request": request_summary(request), "levels": cluster_levels(request),
            "point": queries.trial_point(trial, queries.outer_level(request))}


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def rate_words(bytes_per_s: float) -> str:
    """``412 MB/s``, ``1.93 GB/s``: a rate in decimal units, as link rates are quoted."""
    return f"{bytes_per_s / 1e9:.3g} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.3g} MB/s"


def collective_rows(metrics: dict[str, Any], levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A measured run's collectives by level and kind: the bytes per rank per step it sent (run.json's
    ``bytes_per_level``), rank 0's seconds per step inside them (``seconds_per_level``) and their rate.
    Only the run's own bytes: the prediction's are the requested cluster's, not those of the cluster
    the run emulated. Empty for a trial whose metrics carry no seconds per level."""
    seconds = metrics.get("seconds_per_level")
    if not isinstance(seconds, dict) or not seconds:
        return []
    volume = metrics.get("bytes_per_level")
    if not isinstance(volume, dict):
        volume = {}

    def kinds_of(table: dict[str, Any], level: str) -> dict[str, Any]:
        kinds = table.get(level)
        return kinds if isinstance(kinds, dict) else {}

    known = [str(level.get("name")) for level in levels]
    names = [n for n in known if n in seconds or n in volume]
    names += [n for n in [*seconds, *volume] if n not in names]
    rows = []
    for name in names:
        sent, spent = kinds_of(volume, name), kinds_of(seconds, name)
        for kind in dict.fromkeys([*sent, *spent]):
            nbytes, secs = _finite(sent.get(kind)), _finite(spent.get(kind))
            rate = nbytes / secs if nbytes is not None and secs is not None and nbytes > 0 and secs > 0 else None
            rows.append({"level": name, "kind": kind, "bytes": nbytes, "seconds": secs,
                         "rate": rate_words(rate) if rate is not None else None})
    return rows


def emulation_words(emulation: Any) -> str | None:
    """An emulated run's network in one line (run.json's ``emulation``: the scale, each level's link rate), or None."""
    if not isinstance(emulation, dict):
        return None
    scale = _finite(emulation.get("scale"))
    head = "emulated network"
    facts = [f"links slowed by scale {scale:.3g}"] if scale is not None else []
    if isinstance(emulation.get("namespaces"), int):
        facts.append(f"{emulation['namespaces']} namespaces")
    if facts:
        head += f" ({', '.join(facts)})"
    parts = []
    levels = emulation.get("levels")
    for name, link in (levels.items() if isinstance(levels, dict) else ()):
        if not isinstance(link, dict):
            continue
        rate = _finite(link.get("mb_per_s"))
        words = f"{name} {rate_words(rate * 1e6) if rate is not None else '—'} per link each way"
        extra = [f"{link['links']} links"] if isinstance(link.get("links"), int) else []
        delay = _finite(link.get("delay_us"))
        if delay:
            extra.append(f"{delay:.3g} µs latency")
        parts.append(words + (f" ({', '.join(extra)})" if extra else ""))
    line = head + (": " + "; ".join(parts) if parts else "")
    notes = emulation.get("notes")
    return line + "".join(f"; {note}" for note in (notes if isinstance(notes, list) else []) if note)


def trial_page(session: Session, trial: Trial) -> dict[str, Any]:
    view = trial_view(session, trial)
    best = repo.best_trial(session=session, study_id=trial.study_id)
    detail: TrialDetailPublic = view["trial"]
    metrics = detail.metrics if isinstance(detail.metrics, dict) else {}
    return {**view, "best": best.id if best is not None and best.id != trial.id else None,
            "strategy_rows": strategy_rows(detail.strategy, view["levels"]),
            "collectives": collective_rows(metrics, view["levels"]),
            "emulation": emulation_words(metrics.get("emulation")),
            "data": page_data({"trial": detail.model_dump(mode="json", exclude={"logs"}),
                               "levels": [level.get("name") for level in view["levels"]],
                               "device_memory_gib": view["request"]["device_memory_gib"]})}


def recommendation_page(session: Session, row: Recommendation) -> dict[str, Any]:
    rec = queries.recommendation_public(row)
    study = repo.get_study(session=session, study_id=row.study_id)
    assert study is not None
    request = repo.get_request(session=session, request_id=study.request_id)
    assert request is not None
    level = queries.outer_level(request)
    evidence = {}
    for role, trial_id in (("chosen", row.trial_id), ("runner-up", row.runner_up_trial_id)):
        trial = repo.get_trial(session=session, trial_id=trial_id) if trial_id is not None else None
        if trial is not None:
            evidence[role] = queries.trial_point(trial, level)
    exports = [{"format": fmt, "filename": filename, "use": use,
                "text": json.dumps(page_data(rec.exports.get(fmt) or {}), indent=2)}
               for fmt, filename, use in EXPORTS if fmt in rec.exports]
    metrics = rec.metrics or {}
    # the same notes `zerotune recommend` prints and writes to notes.txt (DeepSpeed's, FSDP2's, the precision)
    notes = notes_of({"metrics": metrics, "exports": rec.exports or {}}, "env")
    return {"rec": rec, "request": request_summary(request), "evidence": evidence, "exports": exports,
            "notes": notes, "verification": metrics.get("verification"), "decision": metrics.get("decision"),
            "baseline": metrics.get("baseline"),
            "collectives": collectives_caveat(slower) if (slower := (metrics.get("decision") or {}).get(
                "collectives")) else None,
            "band": metrics.get("error_band") or {}, "refit": refit_of(session, row.study_id),
            "shortlist_note": metrics.get("measured_shortlist"), "leaders": metrics.get("leaders") or [],
            "remeasured": metrics.get("remeasured") or [], "front": metrics.get("front") or [],
            "strategy_rows": strategy_rows(rec.strategy, cluster_levels(request)),
            "data": page_data({"verification": metrics.get("verification")})}


def compare_trials(session: Session, trial_ids: list[int], study_id: int | None,
                   strategies: list[str]) -> tuple[list[Trial], list[str]]:
    """The trials to compare, and what could not be found (ids, or preset names absent from the study)."""
    trials: list[Trial] = []
    missing: list[str] = []
    for trial_id in trial_ids:
        trial = repo.get_trial(session=session, trial_id=trial_id)
        if trial is None:
            missing.append(f"trial {trial_id}")
        elif trial not in trials:
            trials.append(trial)
    if study_id is not None:
        rows, _ = repo.list_trials(session=session, study_id=study_id, limit=100_000)
        for name in strategies or list(PRESETS):
            named = [t for t in rows if t.strategy.get("name") == name]
            chosen = max((t for t in named if t.status == "complete"), key=lambda t: t.value or 0.0, default=None) \
                or (named[0] if named else None)
            if chosen is None:
                if strategies:
                    missing.append(f"{name} in study {study_id}")
            elif chosen not in trials:
                trials.append(chosen)
    return trials, missing


def compare_page(session: Session, trials: list[Trial], missing: list[str]) -> dict[str, Any]:
    views = [trial_view(session, t) for t in trials]
    rows: list[tuple[str, list[str], bool]] = []

    def row(name: str, values: list[Any]) -> None:
        words = ["—" if v is None else v if isinstance(v, str) else f"{v:.4g}" if isinstance(v, float) else str(v)
                 for v in values]
        rows.append((name, words, len(set(words)) > 1))

    row("study", [f"{v['study'].id}: {v['request']['model']} on {v['request']['cluster']}" for v in views])
    row("status", [v["trial"].status for v in views])
    row("executor", [v["trial"].executor for v in views])
    row("TFLOPS per rank", [v["point"].value for v in views])
    row("predicted TFLOPS per rank", [v["point"].predicted_tflops_per_rank for v in views])
    row("measured step time (s)", [v["point"].measured_step_time_s for v in views])
    row("predicted step time (s)", [v["point"].predicted_step_time_s for v in views])
    row("peak memory (GiB)", [v["point"].peak_memory_bytes / 2**30 if v["point"].peak_memory_bytes is not None
                              else None for v in views])
    row("inter-node MiB per step", [v["point"].inter_node_bytes / 2**20 if v["point"].inter_node_bytes is not None
                                    else None for v in views])
    for name, _ in STRATEGY_FIELDS:
        row(name, [span_words(v["levels"], v["trial"].strategy.get(name)) if name.endswith("_span")
                   else v["trial"].strategy.get(name) for v in views])
    row("reason", [v["trial"].reason for v in views])
    limits = {v["request"]["device_memory_gib"] for v in views}
    return {"views": views, "rows": rows, "missing": missing,
            "data": page_data({"trials": [{"trial": v["trial"].model_dump(mode="json", exclude={"logs"}),
                                           "label": f"#{v['trial'].id} {v['point'].label}",
                                           "levels": [level.get("name") for level in v["levels"]]}
                                          for v in views],
                               "device_memory_gib": limits.pop() if len(limits) == 1 else None})}
