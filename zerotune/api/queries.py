"""Rows turned into response bodies: every read goes through ``db.repository``; this module only shapes."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from zerotune.api import schemas
from zerotune.api.schemas import ImportancePublic, ParamImportancePublic, TrialPointPublic, TrialPointsPublic
from zerotune.core.fields import DEFAULTS, to_body
from zerotune.db import repository as repo
from zerotune.db.models import Job, Recommendation, Request, Study, Trial

finite = repo.json_safe  # response bodies: non-finite floats become None, NUL characters go


def recommendation_public(row: Recommendation) -> schemas.RecommendationPublic:
    metrics = row.metrics or {}
    value = metrics.get("tflops_per_rank")
    return schemas.RecommendationPublic(
        id=row.id, request_key=row.request_key, study_id=row.study_id, trial_id=row.trial_id,
        runner_up_trial_id=row.runner_up_trial_id, strategy=row.strategy, value=value if isinstance(value, float | int)
        else None, evidence=row.evidence,  # type: ignore[arg-type]  # the table's CHECK constraint holds it to these
        margin=row.margin, memory=metrics.get("memory"), metrics=metrics, exports=row.exports,
        created_at=row.created_at)


def answer_bytes(row: Recommendation) -> bytes:
    """A recommendation serialized once, as every repeat request gets it."""
    return recommendation_public(row).model_dump_json().encode()


def served_answer(session: Session, key: str) -> bytes | None:
    """The served recommendation for ``key`` as answer bytes, or None while there is none."""
    row = repo.served_recommendation(session=session, request_key=key)
    return answer_bytes(row) if row is not None else None


def request_fields(row: Request) -> dict[str, Any]:
    """What a stored request asks: its model, cluster and fields (one it has none of, stored before the field
    existed, at its default)."""
    return {**DEFAULTS, **row.spec}


def request_public(row: Request) -> schemas.RequestPublic:
    """A stored request as a client reads it: the body it stands for, presets expanded and defaults filled."""
    fields = request_fields(row)
    return schemas.RequestPublic.model_validate({**to_body(fields), "model": fields.get("model"),
                                                 "cluster": fields.get("cluster"), "id": row.id, "key": row.key,
                                                 "created_at": row.created_at})


def job_public(session: Session, job: Job) -> schemas.JobPublic:
    """A job with what a client polls for: progress, best so far, the recommendation once done."""
    request = repo.get_request(session=session, request_id=job.request_id)
    assert request is not None, f"job {job.id} without its request"
    best = repo.best_trial(session=session, study_id=job.study_id) if job.study_id else None
    rec = repo.served_recommendation(session=session, request_key=request.key) if job.state == "done" else None
    return schemas.JobPublic(
        id=job.id, state=job.state,  # type: ignore[arg-type]  # CHECK constraint
        progress=job.progress, trials_done=job.trials_done, phase=job.phase,
        trials_total=int(request_fields(request)["trials"]), best_value=best.value if best else None,
        error=job.error, request_key=request.key, request_id=request.id, study_id=job.study_id,
        recommendation_id=rec.id if rec else None,
        worker=job.worker, runner_deaths=job.runner_deaths, created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at, heartbeat_at=job.heartbeat_at)


def study_detail(session: Session, study: Study) -> schemas.StudyDetailPublic:
    counts = repo.trial_counts(session=session, study_id=study.id)
    best = repo.best_trial(session=session, study_id=study.id)
    request = repo.get_request(session=session, request_id=study.request_id)
    assert request is not None
    rec = repo.latest_recommendation(session=session, study_id=study.id)
    return schemas.StudyDetailPublic(
        **schemas.StudyPublic.model_validate(study, from_attributes=True).model_dump(),
        request=request_public(request),
        trial_counts=counts, best_trial_id=best.id if best else None,
        best_value=best.value if best else None, recommendation_id=rec.id if rec else None)


# --- the dashboard's reads (zerotune/api/dashboard): the same rows, shaped for its pages ---------------------


def strategy_label(strategy: dict[str, Any]) -> str:
    """A short name for a strategy: its preset name, else spans and quantization (``P3/G3/OS3 hpZ1 w8 g4``)."""
    if strategy.get("name"):
        return str(strategy["name"])
    label = f"P{strategy.get('param_span')}/G{strategy.get('grad_span')}/OS{strategy.get('optim_span')}"
    if strategy.get("secondary_span") is not None:
        label += f" hpZ{strategy['secondary_span']}"
    for key, short in (("weight_bits", "w"), ("grad_bits", "g")):
        if strategy.get(key, 16) != 16:
            label += f" {short}{strategy[key]}"
    return label


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def trial_point(trial: Trial, outer_level: str | None) -> TrialPointPublic:
    """One trial as the study page draws it (``outer_level``: the cluster's outermost level name).

    Measured trials (a run.json, ``status: ok``) report their own memory and step time beside the
    cost model's prediction for the same point; predicted trials (the ``model`` executor) and
    infeasible ones (screened by the cost model) have the prediction only.
    """
    metrics, prediction = trial.metrics or {}, trial.prediction or {}
    measured = metrics.get("status") == "ok"
    source = metrics or prediction
    peak = (source.get("memory_bytes") or {}).get("peak")
    volume = source.get("bytes_per_level") or {}
    inter = None
    if outer_level is not None and isinstance(volume, dict) and volume:
        kinds = volume.get(outer_level) or {}
        inter = int(sum(v for v in kinds.values() if _number(v) is not None)) if isinstance(kinds, dict) else None
    health = (metrics.get("health") or {}).get("verdict") if measured else None
    return TrialPointPublic(
        id=trial.id, number=trial.number, status=trial.status,  # type: ignore[arg-type]  # CHECK constraint
        executor=trial.executor, strategy=trial.strategy, label=strategy_label(trial.strategy),
        value=_number(trial.value), reason=trial.reason, measured=measured,
        predicted_tflops_per_rank=_number(prediction.get("tflops_per_rank", metrics.get("tflops_per_rank")
                                                          if not measured else None)),
        peak_memory_bytes=int(peak) if isinstance(peak, int | float) and _number(peak) is not None else None,
        predicted_step_time_s=_number(prediction.get("step_time_s", metrics.get("step_time_s")
                                                     if not measured else None)),
        measured_step_time_s=_number(metrics.get("step_time_s")) if measured else None,
        inter_node_bytes=inter, health=health if isinstance(health, str) else None,
        proxy=bool(trial.proxy_model), finished_at=trial.finished_at)


def outer_level(request: Request) -> str | None:
    """The name of the request's outermost cluster level (where cross-node bytes go)."""
    levels = (request.spec.get("cluster") or {}).get("levels") or []
    return str(levels[-1]["name"]) if levels else None


def trial_points(session: Session, study: Study, offset: int = 0, limit: int = 100_000) -> TrialPointsPublic:
    """A study's trials in the order they were added, as points (see :func:`trial_point`)."""
    request = repo.get_request(session=session, request_id=study.request_id)
    assert request is not None, f"study {study.id} without its request"
    rows, count = repo.list_trials(session=session, study_id=study.id, offset=offset, limit=limit)
    level = outer_level(request)
    return TrialPointsPublic(data=[trial_point(t, level) for t in rows], count=count)


IMPORTANCE_METHOD = "PED-ANOVA: optuna.importance.get_param_importances (Optuna's default evaluator)"


def param_importance(*, study_id: int, optuna_study_name: str, storage: Any) -> ParamImportancePublic:
    """Which strategy dimension mattered, by Optuna's own evaluator, over the complete feasible trials.

    The study is loaded from ``storage`` (an ``optuna.storages.RDBStorage`` on the service's
    database, where the tuner wrote it). Trials the cost model screened as infeasible are told to
    Optuna with a positive constraint and their predicted values; they are left out here, as the
    samplers leave them out, so the importance speaks of strategies that can run.
    """
    import warnings

    import optuna

    def empty(n: int, note: str) -> ParamImportancePublic:
        return ParamImportancePublic(study_id=study_id, method=IMPORTANCE_METHOD, trials_used=n, data=[], note=note)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        loaded = optuna.load_study(study_name=optuna_study_name, storage=storage)
    except KeyError:
        return empty(0, "no Optuna study is stored for this study yet (a worker creates it when the study starts)")
    complete = loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    feasible = [t for t in complete if all(v <= 0 for v in t.constraints.values())]
    if len(feasible) < 2:
        return empty(len(feasible), f"needs at least 2 complete, feasible trials; this study has {len(feasible)}")
    scratch = optuna.create_study(directions=loaded.directions)  # in memory: the feasible trials only
    scratch.add_trials(feasible)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "too few trials, importances equal" is said by the note instead
            importances = optuna.importance.get_param_importances(scratch)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return empty(len(feasible), f"Optuna could not compute importances: {exc}")
    data = [ImportancePublic(param=k, importance=float(v)) for k, v in importances.items() if math.isfinite(v)]
    note = None if data else "no parameter varied among the feasible trials"
    return ParamImportancePublic(study_id=study_id, method=IMPORTANCE_METHOD, trials_used=len(feasible),
                                 data=data, note=note)
