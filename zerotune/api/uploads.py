"""Trials measured elsewhere: a run.json from a real cluster stored as measured evidence.

Uploads of one (model, cluster) pair live in one study of executor ``external`` under their own
request, so later studies of similar requests find them (warm starts read the best complete
trials of the nearest request) and ``zerotune calibrate`` material stays in the database. Each
stored trial also carries the cost model's prediction for the same point.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from zerotune.api.inputs import TrialCreate
from zerotune.api.queries import finite
from zerotune.api.service import cluster_spec, model_spec
from zerotune.core.records import Prediction
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, device_matches
from zerotune.db import repository as repo
from zerotune.db.models import Trial
from zerotune.errors import InputError, SpecError
from zerotune.tuner.request import TuneRequest, key_of, strategy_key

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
