"""Trials measured elsewhere: a run.json from a real cluster stored as measured evidence.

Uploads of one (model, cluster) pair live in one study of executor ``external`` under their own
request, so later studies of similar requests find them (warm starts read the best complete
trials of the nearest request) and ``zerotune calibrate`` material stays in the database. Each
stored trial also carries the cost model's prediction for the same point.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from zerotune.api.inputs import JobMeasurementsCreate, TrialCreate
from zerotune.api.queries import finite
from zerotune.api.service import cluster_spec, model_spec
from zerotune.core.records import Prediction
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, device_matches
from zerotune.db import repository as repo
from zerotune.db.models import Recommendation, Trial
from zerotune.db.session import session_scope
from zerotune.errors import InputError, NotFoundError, SpecError, StudyFailed
from zerotune.tuner import calibrating
from zerotune.tuner.choice import Chooser, choose
from zerotune.tuner.request import TuneRequest, key_of, strategy_key
from zerotune.tuner.shortlist import measured_on_job, plan

EXECUTOR = "external"


def store_run(*, session: Session, run: TrialCreate) -> tuple[Trial, bool]:
    """Store a run.json as a finished trial; an identical upload returns the stored one.

    Returns:
        ``(trial, created)``.
    """
    model, cluster = model_spec(run.model), cluster_spec(run.cluster)
    if isinstance(run.strategy, str) and run.strategy not in STRATEGY_PRESETS:
        raise InputError("body.strategy", run.strategy, f"unknown strategy preset; known: {sorted(STRATEGY_PRESETS)}")
    try:
        spec = run.strategy if isinstance(run.strategy, str) else run.strategy.model_dump()
        strategy = build_strategy(spec, cluster)
    except SpecError as exc:
        raise InputError.from_spec("strategy", exc) from None
    if run.device is not None and not device_matches(cluster.device, run.device):
        raise InputError("body.device", run.device,
                         f"the run ran on {run.device} and {cluster.name}'s devices are {cluster.device}: a run "
                         "emulated on other hardware measures no time of that cluster; upload runs made on it")
    if run.status == "ok" and run.tflops_per_rank is None:
        raise InputError("body.tflops_per_rank", None, "required when status is 'ok'")
    metrics = finite({**run.model_dump(exclude={"logs"}), "model": model.to_dict(), "cluster": cluster.to_dict(),
                      "strategy": strategy.to_dict()})
    # uploaded runs are kept under a request of their own: a one-trial study of their model and cluster, by the
    # executor no request may name
    request = TuneRequest(model=model, cluster=cluster, trials=1)
    key = key_of({**request.normalized(), "executor": EXECUTOR})
    req, _ = repo.get_or_create_request(session=session, key=key, spec={**request.to_dict(), "executor": EXECUTOR})
    study = next(iter(repo.studies_of_request(session=session, request_id=req.id)), None)
    if study is None:  # the request row insert above serializes racing first uploads
        study = repo.create_study(session=session, request_id=req.id, optuna_study_name=f"zerotune-external-{key[:24]}",
                                  sampler="none", executor=EXECUTOR, n_trials=1)
        repo.set_study_state(session=session, study_id=study.id, state="done")
    skey = strategy_key(strategy)
    for same in repo.trials_with_strategy_key(session=session, study_id=study.id, strategy_key=skey,
                                               status=None):
        if same.metrics == metrics:
            return same, False
    trial = repo.add_trial(session=session, study_id=study.id, strategy=strategy.to_dict(), strategy_key=skey,
                           executor=EXECUTOR)
    finished = repo.finish_trial(session=session, trial_id=trial.id, status="complete" if run.status == "ok"
                                 else "failed", value=run.tflops_per_rank if run.status == "ok" else None,
                                 metrics=metrics, prediction=_prediction(run, model, cluster, strategy),
                                 reason=(run.error or "failed run") if run.status != "ok" else None,
                                 logs=finite(run.logs or ""))
    assert finished is not None
    return finished, True


def _prediction(run: TrialCreate, model: ModelSpec, cluster: ClusterSpec, strategy: Strategy) -> Prediction | None:
    from zerotune.costmodel import predict

    try:
        return finite(predict(model, cluster, strategy, global_batch=run.global_batch))
    except (SpecError, ValueError, ArithmeticError):  # no prediction for this point: the upload still counts
        return None


# -- a shortlist measured by the training job itself (``zerotune recommend --measure``) -------------------------

def _predicted(session: Session, recommendation_id: int) -> tuple[Recommendation, TuneRequest]:
    row = repo.get_recommendation(session=session, recommendation_id=recommendation_id)
    if row is None:
        raise NotFoundError("recommendation", recommendation_id)
    req = repo.get_request_by_key(session=session, key=row.request_key)
    if req is None:
        raise NotFoundError("request", row.request_key, "the recommendation's request is not stored")
    return row, TuneRequest.from_dict(req.spec)


def job_shortlist(*, session: Session, recommendation_id: int) -> dict[str, Any]:
    """What a job measures of a recommendation: its shortlist as the service measures one
    (``tuner.shortlist.plan``: the partitions within the model's error of the winner, else the fastest
    ``LEADERS`` when no calibration measured that error), with why, or none and why not."""
    row, request = _predicted(session, recommendation_id)
    out: dict[str, Any] = {"recommendation_id": row.id, "request_key": row.request_key,
                           "cluster": request.cluster.to_dict(), "model": request.model.to_dict(),
                           "global_batch": request.global_batch,
                           "evidence": row.evidence, "candidates": [], "why": None}
    if row.evidence != "predicted":
        out["why"] = f"the answer is {row.evidence} already"
        return out
    predicted = {"decision": (row.metrics or {}).get("decision") or {"band": None, "shortlist": []},
                 "study_id": row.study_id, "id": row.id, "strategy": row.strategy}
    try:
        # the job's runs are on the allocation itself, as the service's Slurm executor's would be
        todo = plan(session, dataclasses.replace(request, measure="slurm"), predicted)
    except SpecError as exc:  # e.g. a DeepSpeed runner's request: the trainer does not run what it runs
        out["why"] = f"{exc.field}: {exc.rule}"
        return out
    if todo is None:
        out["why"] = "the predicted winner leads beyond the model's error: nothing to tell apart"
        return out
    out.update(candidates=[c.to_dict() for c in todo.candidates], why=todo.note["measured_shortlist"]["why"])
    return out


def store_job_measurements(*, sessions: sessionmaker[Session], recommendation_id: int, body: JobMeasurementsCreate,
                           workdir: Path) -> tuple[int, bool]:
    """Store a job's measurements of a recommendation's shortlist as trials of that request, refit the cluster's
    calibration from them, and answer the request from them.

    The runs become the trials (executor ``external``) of one study of the *measured request* (the predicted
    request's model, cluster and batch, ``shortlist_of`` it); the refit is ``tuner.calibrating.refit_study``'s;
    the answer, chosen as a measured study's is (``tuner.choice.choose``), is stored under the predicted
    request's key, so the next job of the same request and allocation shape is served it. The same job's
    measurements sent again return the answer they made.

    Returns:
        ``(recommendation id, created)``.

    Raises:
        InputError: a run of another model or cluster than the request's (a proxy or an emulation measures
            nothing of this allocation), or of a strategy the cluster cannot run.
        NotFoundError: no such recommendation.
        StudyFailed: no run completed (the refit and the trials are stored all the same).
    """
    with session_scope(sessions) as s:
        row, request = _predicted(s, recommendation_id)
        measured, key = measured_on_job(request, len(body.runs))
        for i, run in enumerate(body.runs):
            model, cluster = model_spec(run.model), cluster_spec(run.cluster)
            if model != request.model:
                raise InputError(f"body.runs[{i}].model", model.name, f"the request's model is {request.model.name}: "
                                 "a job measures its own model (a proxy measures nothing of it)")
            if cluster.name != request.cluster.name:
                raise InputError(f"body.runs[{i}].cluster", cluster.name, f"the request's cluster is "
                                 f"{request.cluster.name}: runs on another shape measure nothing of this allocation")
        req, _ = repo.get_or_create_request(session=s, key=key, spec={**measured.to_dict(), "executor": EXECUTOR})
        for study in repo.studies_of_request(session=s, request_id=req.id):
            done = repo.latest_recommendation(session=s, study_id=study.id)
            if done is not None and ((done.metrics or {}).get("measured_on_job") or {}).get("job") == body.job:
                return done.id, False
        count = len(repo.studies_of_request(session=s, request_id=req.id))
        study = repo.create_study(session=s, request_id=req.id, sampler="none", executor=EXECUTOR,
                                  optuna_study_name=f"zerotune-job-{body.job}-{key[:16]}-{count}",
                                  n_trials=len(body.runs))
        study_id = study.id
        repo.set_study_state(session=s, study_id=study_id, state="running")
        ran = []
        for i, run in enumerate(body.runs):
            try:
                spec = run.strategy if isinstance(run.strategy, str) else run.strategy.model_dump()
                strategy = build_strategy(spec, request.cluster)
            except SpecError as exc:
                raise InputError.from_spec(f"runs[{i}]", exc) from None
            ok = run.status == "ok"
            metrics = finite({**run.model_dump(exclude={"logs"}), "model": request.model.to_dict(),
                              "cluster": request.cluster.to_dict(), "strategy": strategy.to_dict(),
                              "job": {"id": body.job, "budget_s": body.budget_s}})
            trial = repo.add_trial(session=s, study_id=study_id, strategy=strategy.to_dict(),
                                   strategy_key=strategy_key(strategy), executor=EXECUTOR)
            repo.finish_trial(session=s, trial_id=trial.id, status="complete" if ok else "failed",
                              value=run.tflops_per_rank if ok else None, metrics=metrics,
                              prediction=_prediction(run, request.model, request.cluster, strategy),
                              reason=None if ok else (run.error or "failed run"), logs=finite(run.logs or ""))
            ran.append({"trial_id": trial.id, "strategy": strategy.name or strategy_key(strategy)[:12],
                        "status": "complete" if ok else "failed", "tflops_per_rank": run.tflops_per_rank,
                        **({} if ok else {"reason": run.error or "failed run"})})
    with session_scope(sessions) as s:
        try:
            report = calibrating.refit_study(s, study_id)
        except Exception as exc:  # the measurements still answer the request
            calibrating.log.warning("job %s: refit failed: %s: %s", body.job, type(exc).__name__, exc)
            report = None
    note = {"measured_on_job": {
        "job": body.job, "cluster": request.cluster.name, "budget_s": body.budget_s, "runs": ran,
        "cut_off": [{"strategy": c.strategy if isinstance(c.strategy, str) else c.strategy.name, "reason": c.reason}
                    for c in body.cut_off],
        "refit": None if report is None else report["name"]},
        "measured_shortlist": {"of_request": request.key(), "predicted_recommendation_id": row.id,
                               "predicted_strategy": row.strategy, "candidates": len(body.runs) + len(body.cut_off),
                               "executor": f"job {body.job}",
                               "why": f"measured on the allocation of Slurm job {body.job}"}}
    chooser = Chooser(request=measured, sessions=sessions, workdir=workdir, trial_timeout_s=60.0,
                      stop=threading.Event(), answer_key=request.key(), refit=report, note=note)
    try:
        answer = choose(chooser, study_id, verify_quantized=False)
    except StudyFailed as exc:
        with session_scope(sessions) as s:
            repo.set_study_state(session=s, study_id=study_id, state="failed", error=str(exc))
        raise
    with session_scope(sessions) as s:
        repo.set_study_state(session=s, study_id=study_id, state="done")
    return int(answer["id"]), True
