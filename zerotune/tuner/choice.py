"""Choose a finished study's answer: the Recommendation (the best feasible trial, its evidence and exports).

:func:`choose` needs only what :class:`Chooser` holds (the request, the database, where and how long a
verification run may run), not the study that ran: a study hands it over when its trials are done.

The answer says what it was built on (``trials``: ``failures.account``): its budget, the trials that completed,
each run that failed with its reason, the runs cut short from outside and run again, and, when fewer trials
completed than the budget, a sentence saying why (``trials.short``).

Evidence says what backs the choice:
- ``measured``: the trial ran the requested model on the requested cluster (``slurm``, or
  ``local`` when the request is for this machine);
- ``proxy-verified``: a short local run of a scaled-down model with the same strategy trained
  healthily — what a ``local`` study on an emulated cluster gives, and what a ``model`` study gets
  by default before it recommends a quantized strategy (an unhealthy verification drops the
  candidate and the next best is tried);
- ``predicted``: the cost model only.

A predicted answer is held to the model's measured error (``costmodel.error``: the median
error of its predicted strategy comparisons against published ones, the *band*):

- a lossy choice (quantized weights or gradients) wins only when its predicted gain over the best
  unquantized trial exceeds the 90th percentile of that error (a gain the model vouches for nine
  times in ten: precision is given up only for a speed-up that is there); otherwise that unquantized
  trial is chosen, and the answer says why (``decision.lossy``);
- the runner-up is the best trial of another *partition* (spans, hpZ, bits), not the same strategy
  with another bucket size, and the margin over it is stated against the band (``beyond`` or
  ``within``); within it, ``decision.shortlist`` names the partitions worth measuring (those within
  the band of the winner), since the model cannot tell them apart;
- the model's figures for checkpointed runs lean against its figures for uncheckpointed ones (about 10% in the
  published tables that measured both: ``error_band.checkpointing``); where the pick and the best trial of the
  other checkpointing setting trade places once that lean is allowed for, ``decision.checkpointing`` says so
  and both join the shortlist. Nothing is corrected: the lean is stated, not fitted away.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy.orm import Session, sessionmaker

from zerotune.core.records import ErrorBand, Lean, Prediction, RunMetrics, TrialMetrics
from zerotune.core.spec import Strategy
from zerotune.costmodel.error import lean_sentence
from zerotune.costmodel.memory import memory_note
from zerotune.db import repository as repo
from zerotune.db.models import Trial
from zerotune.db.session import session_scope
from zerotune.errors import StudyFailed
from zerotune.tuner import failures, remeasure
from zerotune.tuner.answer_notes import baseline_note, pareto_front
from zerotune.tuner.executors.base import TrialSpec
from zerotune.tuner.request import TuneRequest


@dataclass
class Chooser:
    """What choosing a study's answer needs from the study that ran it."""

    request: TuneRequest
    sessions: sessionmaker[Session]
    workdir: Path
    """Where a verification run writes its files."""
    trial_timeout_s: float
    stop: threading.Event
    """Set when the runner stops: a verification run in progress ends."""
    phase: Callable[[str], None] = lambda _: None
    """Told ``verifying`` while a verification run is under way."""
    answer_key: str | None = None
    """The request key the answer is stored under (another request's, for a measured shortlist)."""
    refit: dict[str, Any] | None = None
    """The calibration the measured runs refitted, reported with the answer."""
    remeasured: list[int] = field(default_factory=list)
    """Trials run twice to tell overlapping leaders apart."""
    note: dict[str, Any] = field(default_factory=dict)
    """More facts the answer carries (e.g. ``measured_shortlist``)."""
    baseline: Strategy | None = None
    """The request's baseline as the study searched it (its first trial), when the space holds it."""


def exports(request: TuneRequest, strategy: Strategy) -> dict[str, Any]:
    """The recommendation in every format (``tuner.exports.all_exports``)."""
    from zerotune.tuner import exports as ex

    return ex.all_exports(request.model, request.cluster, strategy, request.global_batch)


def _evidence(request: TuneRequest, row: Trial) -> str:
    if row.executor == "model":
        return "predicted"
    if row.proxy_model or (row.metrics or {}).get("cluster", {}).get("name") != request.cluster.name:
        return "proxy-verified"
    return "measured"


VERIFY_OUTCOMES = ("healthy", "unhealthy", "could not run")
VERIFY_PROXY: dict[str, Any] = {"max_ranks": 4, "proxy_hidden": 128, "proxy_vocab": 512, "proxy_seq_len": 64}
"""The verification run's executor: a proxy small enough to learn in seconds on this machine."""


VERIFY_LOG_LINES = 60
"""Lines of a verification run's log kept with the answer (its end: the steps and the verdict)."""


def _verify(chooser: Chooser, strategy: Strategy, trial_id: int) -> dict[str, Any]:
    """A short run of a proxy with this strategy on this machine (a predicted quantized pick).

    ``healthy``: it trained and its loss fell beyond noise. ``unhealthy``: it trained and the health
    gate failed it (NaN, diverging or flat loss): the strategy loses its place. ``could not run``:
    no verdict (no torch here, the run crashed or timed out before a verdict): the pick keeps its
    place as a prediction, and the answer says why nothing verified it."""
    from zerotune.tuner.executors.local import LocalExecutor

    spec = TrialSpec(model=chooser.request.model, cluster=chooser.request.cluster, strategy=strategy,
                     workdir=chooser.workdir / f"verify-{trial_id}", steps=16, warmup=1,
                     timeout_s=chooser.trial_timeout_s)
    try:  # a health check, not a speed test: a small proxy that learns the synthetic stream within 16 steps
        result = LocalExecutor(**VERIFY_PROXY).run(spec, stop=chooser.stop)
    except Exception as exc:  # the executor itself could not start here
        return {"trial_id": trial_id, "outcome": "could not run", "healthy": None,
                "detail": f"{type(exc).__name__}: {exc}"}
    run = cast(RunMetrics, result.metrics or {})  # a local run's run.json, or nothing where it wrote none
    # the run itself, for whoever reads the answer: its loss curve, the proxy it trained and its log's tail
    shown = {"loss": run.get("loss"), "grad_norm": run.get("grad_norm"), "health": run.get("health"),
             "data": run.get("data"), "proxy_model": result.proxy_model, "cluster_run": result.extra.get("cluster_run"),
             "step_time_s": run.get("step_time_s"),
             "logs": "\n".join((result.logs or "").splitlines()[-VERIFY_LOG_LINES:])}
    health = run.get("health")
    if result.status == "complete":
        outcome, healthy, detail = "healthy", True, health["evidence"] if health else "healthy"
    elif health is not None and health["verdict"] != "ok":
        outcome, healthy, detail = "unhealthy", False, result.reason or health["verdict"]
    else:
        outcome, healthy, detail = "could not run", None, result.reason or "no verdict"
    return {"trial_id": trial_id, "outcome": outcome, "healthy": healthy, "detail": detail, **shown}


def partition(s: Strategy) -> tuple:
    """What tells two strategies apart as partitions (not as bucket, prefetch or micro-batch tunings)."""
    return (s.param_span, s.grad_span, s.optim_span, s.secondary_span, s.weight_bits, s.grad_bits,
            s.quantize_above if s.quantized else None)


Ranked = tuple[int, Strategy, float | None, str, TrialMetrics | None]
"""A completed trial as ``choose`` ranks it: (trial id, strategy, value, evidence, metrics)."""


def _error_band(metrics: TrialMetrics | None) -> ErrorBand | None:
    """The error band a predicted trial carries (a measured run's metrics have none)."""
    return cast("ErrorBand | None", metrics.get("error_band") if metrics else None)


def _band(metrics: TrialMetrics | None,
          key: Literal["comparison_median", "comparison_p90"] = "comparison_median") -> float | None:
    band = _error_band(metrics)
    return band[key] if band else None


def _first(ranked: list, i: int) -> list:
    """``ranked`` with its ``i``-th entry moved to the front."""
    return [ranked[i], *ranked[:i], *ranked[i + 1:]]


def _lossy_within_band(ranked: list, band: float | None) -> tuple[list, dict[str, Any] | None]:
    """Put the best unquantized trial first when the quantized leader's gain over it is inside ``band``
    (the 90th percentile of the model's comparison error)."""
    if band is None or not ranked or not ranked[0][1].quantized:
        return ranked, None
    plain = next((i for i, r in enumerate(ranked) if not r[1].quantized), None)
    if plain is None or not ranked[plain][2]:
        return ranked, None
    gain = ranked[0][2] / ranked[plain][2] - 1
    lossy = {"quantized_trial_id": ranked[0][0], "unquantized_trial_id": ranked[plain][0], "gain": gain,
             "band": band, "kept": "quantized" if gain > band else "unquantized",
             "why": (f"the quantized strategy is predicted {gain:+.1%} faster, beyond the model's comparison error "
                     f"(90th percentile {band:.1%})" if gain > band else
                     f"the quantized strategy is predicted only {gain:+.1%} faster, inside the model's comparison "
                     f"error (90th percentile {band:.1%}): its loss of precision buys nothing the model can vouch "
                     "for")}
    if gain > band:
        return ranked, lossy
    return _first(ranked, plain), lossy


def _lossy_within_spread(ranked: list) -> tuple[list, dict[str, Any] | None]:
    """Measured: put the best unquantized trial first when the quantized leader's interval (TFLOPS at the
    quartiles of its timed steps, ``tuner.remeasure``) reaches its own — a gain the runs cannot tell from
    their noise buys no loss of precision."""
    if not ranked or not ranked[0][1].quantized:
        return ranked, None
    plain = next((i for i, r in enumerate(ranked) if not r[1].quantized and r[3] != "predicted"), None)
    if plain is None or not ranked[plain][2]:
        return ranked, None
    lead_iv = remeasure.interval(ranked[0][2], cast(RunMetrics, ranked[0][4] or {}))
    plain_iv = remeasure.interval(ranked[plain][2], cast(RunMetrics, ranked[plain][4] or {}))
    if lead_iv is None or plain_iv is None:
        return ranked, None
    gain = ranked[0][2] / ranked[plain][2] - 1
    overlap = plain_iv[1] >= lead_iv[0]
    lossy = {"quantized_trial_id": ranked[0][0], "unquantized_trial_id": ranked[plain][0], "gain": gain,
             "band": None, "intervals": {"quantized": list(lead_iv), "unquantized": list(plain_iv)},
             "kept": "unquantized" if overlap else "quantized",
             "why": (f"the quantized strategy measured {gain:+.1%} faster, but its interquartile interval "
                     f"[{lead_iv[0]:.4g}, {lead_iv[1]:.4g}] reaches the unquantized one's [{plain_iv[0]:.4g}, "
                     f"{plain_iv[1]:.4g}] TFLOPS/rank: a gain the runs cannot tell from their noise buys no loss "
                     "of precision" if overlap else
                     f"the quantized strategy measured {gain:+.1%} faster, beyond the spread of both runs' timed "
                     "steps")}
    if not overlap:
        return ranked, lossy
    return _first(ranked, plain), lossy


def _checkpointing_call(pick: tuple, rivals: list, lean: Lean | None) -> dict[str, Any] | None:
    """How a predicted pick stands against the best trial with the other activation-checkpointing setting, once the
    model's lean on checkpointed runs is allowed for (``lean``: ``error_band.checkpointing``, from the published
    tables that measured both kinds; ``bench/published.py``'s ``checkpointing_lean``). The model's figure for the
    checkpointed side is divided by ``1 + lean``; ``within`` says that the pick then no longer leads (the two are
    worth measuring), ``beyond`` that it still does. None without a lean or a rival of the other setting. The lean
    was measured between full checkpointing and none: a pick that checkpoints selectively or only some blocks is
    not held to it, nor compared with such a rival."""
    if not lean or lean.get("lean") is None or not pick[2] or pick[1].checkpointing not in ("none", "full"):
        return None
    mine = pick[1].checkpointing == "full"
    other = "none" if mine else "full"
    rival = next((r for r in rivals if r[1].checkpointing == other and r[2]), None)
    if rival is None:
        return None
    share = 1 + lean["lean"]
    pick_fair, rival_fair = (pick[2] / share, rival[2]) if mine else (pick[2], rival[2] / share)
    verdict = "beyond" if pick_fair > rival_fair else "within"
    kinds = ("with", "without") if mine else ("without", "with")
    gain = pick[2] / rival[2] - 1
    why = (f"the pick runs {kinds[0]} activation checkpointing and is predicted {gain:+.1%} against the best trial "
           f"{kinds[1]} it (trial {rival[0]}); {lean_sentence(lean)}: "
           + ("allowing for it, the pick no longer leads: measure both before trusting it" if verdict == "within"
              else "the lean only widens the pick's lead" if (lean["lean"] < 0) == mine
              else "the pick leads beyond that lean"))
    return {"rival_trial_id": rival[0], "gain": gain, "lean": lean["lean"], "verdict": verdict, "why": why}


def leading_partitions(session: Any, study_id: int, n: int = 3) -> list[Strategy]:
    """The best completed trial of each of the study's ``n`` fastest partitions (its strategy)."""
    rows = repo.ranked_trials(session=session, study_id=study_id)
    out: dict[tuple, Strategy] = {}
    for row in rows:
        s = Strategy.from_dict(row.strategy)
        out.setdefault(partition(s), s)
        if len(out) == n:
            break
    return list(out.values())


def choose(chooser: Chooser, study_id: int, verify_quantized: bool = True, candidates: int = 3) -> dict[str, Any]:
    """Pick, verify, export and store the recommendation of a study."""
    request = chooser.request
    with session_scope(chooser.sessions) as s:
        rows = repo.ranked_trials(session=s, study_id=study_id)
        ranked: list[Ranked] = [(t.id, Strategy.from_dict(t.strategy), t.value, _evidence(request, t),
                                 cast("TrialMetrics | None", t.metrics)) for t in rows]
        front = pareto_front(rows) if request.objective == "pareto" else None
        tried = repo.trials_of(session=s, study_id=study_id)
        # what the answer was built on: fewer completed trials than the budget is said, with why
        tally = failures.account(request.trials, [(t.status, t.reason, t.strategy) for t in tried],
                                 time_budget_s=request.time_budget_s)
        predictions = {t.id: cast("Prediction | None", t.prediction) for t in rows}
        if not ranked:
            raise StudyFailed(f"no trial of study {study_id} completed ({len(tried)} tried): "
                              f"{failures.summary((t.status, t.reason) for t in tried)}")
    predicted = ranked[0][3] == "predicted"
    band = _band(ranked[0][4]) if predicted else None
    if predicted:
        ranked, lossy = _lossy_within_band(ranked, _band(ranked[0][4], "comparison_p90"))
    else:
        ranked, lossy = _lossy_within_spread(ranked)
    verification = None
    chosen: int | None = None
    unhealthy: list[int] = []
    for i, (trial_id, strategy, _, evidence, _) in enumerate(ranked[:candidates]):
        if evidence == "predicted" and strategy.quantized and verify_quantized:
            chooser.phase("verifying")
            verification = _verify(chooser, strategy, trial_id)
            if verification["outcome"] == "unhealthy":  # only a verdict against it disqualifies a pick
                unhealthy.append(trial_id)
                continue
            if verification["outcome"] == "healthy":
                ranked[i] = (*ranked[i][:3], "proxy-verified", ranked[i][4])
        chosen = i
        break
    if chosen is None:  # every leader verified unhealthy: the best strategy that quantizes nothing
        chosen = next((i for i, r in enumerate(ranked) if not r[1].quantized), None)
        if chosen is None:
            raise StudyFailed(f"every quantized leader of study {study_id} trained unhealthily "
                              f"(trials {unhealthy}) and no unquantized strategy completed")
    if verification is not None and unhealthy:
        verification = {**verification, "disqualified": unhealthy}
    trial_id, strategy, value, evidence, metrics = ranked[chosen]
    mine = partition(strategy)
    # the lossy leaders passed over are neither runners-up nor worth measuring against the pick
    passed_over = lossy is not None and lossy["kept"] == "unquantized"
    rivals = [r for r in ranked if not (passed_over and r[1].quantized)]
    runner = next((r for r in rivals if partition(r[1]) != mine), None)
    margin = (value - runner[2]) / value if runner and value and runner[2] is not None else None
    decision: dict[str, Any] = {"band": band, "lossy": lossy, "shortlist": [],
                                "margin_vs_band": None if band is None or margin is None else
                                ("beyond" if margin > band else "within")}
    band_of_pick = _error_band(metrics) if evidence == "predicted" else None
    slower = band_of_pick.get("collectives") if band_of_pick else None
    if slower:  # the runner's flat rings at a scale where its vendor library was measured off the model's ring
        decision["collectives"] = slower
    if decision["margin_vs_band"] == "within":
        seen: set[tuple] = set()
        floor = (value or 0.0) * (1 - (band or 0.0))
        for cand in rivals:  # the best trial of each partition within the band of the winner
            part = partition(cand[1])
            if part not in seen and cand[2] is not None and cand[2] >= floor and len(seen) < 5:
                seen.add(part)
                decision["shortlist"].append({"trial_id": cand[0], "strategy": cand[1].to_dict(), "value": cand[2]})
    lean = band_of_pick.get("checkpointing") if band_of_pick else None
    call = _checkpointing_call(ranked[chosen], rivals, lean)
    if call is not None:
        decision["checkpointing"] = call
        if call["verdict"] == "within":  # the model cannot tell the two apart: both are worth measuring
            listed = {c["trial_id"] for c in decision["shortlist"]}
            for cand in (ranked[chosen], next(r for r in rivals if r[0] == call["rival_trial_id"])):
                if cand[0] not in listed:
                    decision["shortlist"].append({"trial_id": cand[0], "strategy": cand[1].to_dict(),
                                                  "value": cand[2]})
    extra = {"decision": decision, "refit": chooser.refit, "runner": request.runner, "trials": tally, **chooser.note}
    foreseen_memory = predictions.get(trial_id)
    if foreseen_memory is not None and "memory_reserve" in foreseen_memory:  # how much it uses and what it kept
        extra["memory"] = memory_note(foreseen_memory, request.cluster.device_memory_gib)
    if request.baseline is not None:  # the gain over what the user runs today: predicted, and measured if both ran
        extra["baseline"] = baseline_note(request, ranked, ranked[chosen], chooser.baseline)
    if front is not None:  # the answer is the front's fastest point; the front is what a pareto request asks for
        extra["front"] = front
    measured = sorted(((r[0], r[2], cast(RunMetrics, r[4] or {})) for r in ranked
                       if r[3] != "predicted" and r[2] is not None), key=lambda r: -r[1])
    if measured:  # each leader's TFLOPS at the quartiles of its timed steps (and the answer's); which ran twice
        top = measured[:3] + [r for r in measured[3:] if r[0] == trial_id]
        extra["leaders"] = remeasure.leaders(top)
        extra["remeasured"] = chooser.remeasured
    if "measured_shortlist" in extra:  # does the measurement keep the predicted winner's partition?
        foreseen = Strategy.from_dict(extra["measured_shortlist"]["predicted_strategy"])
        extra["measured_shortlist"] = {**extra["measured_shortlist"], "agrees": partition(foreseen) == mine}
    body: dict[str, Any] = {
            "study_id": study_id, "request_key": chooser.answer_key or request.key(), "trial_id": trial_id,
            "strategy": strategy.to_dict(), "value": value, "evidence": evidence, "margin": margin,
            "runner_up_trial_id": runner[0] if runner else None, "verification": verification,
            **extra, "global_batch": request.global_batch, "tokens_per_step": request.tokens_per_step,
            "metrics": metrics, "exports": exports(request, strategy)}
    with session_scope(chooser.sessions) as s:
        saved = repo.save_recommendation(
            session=s, study_id=study_id, request_key=body["request_key"], strategy=body["strategy"],
            metrics={**cast(dict[str, Any], metrics or {}), "verification": verification, **extra}, evidence=evidence,
            margin=margin,
            runner_up_trial_id=body["runner_up_trial_id"], trial_id=trial_id, exports=body["exports"])
        body["id"] = saved.id
    return body
