"""What a study tells Optuna, and how: its sampler and directions, the memory constraint (stored where Optuna
and optuna-dashboard each read it), a point that does not fit, and a trial's values."""

from __future__ import annotations

import warnings
from typing import Any

from zerotune.core.records import Prediction, TrialMetrics
from zerotune.tuner.request import TuneRequest

CONSTRAINT = "memory_gib_over"
"""The study's one constraint: GiB per rank over the device memory (<= 0: fits)."""
LEGACY_CONSTRAINTS_KEY = "constraints"
"""Where Optuna before 5.0 kept a trial's constraints (a list), and where optuna-dashboard (0.21) still reads
them; Optuna 5 reads both forms (``_get_constraints_from_system_attrs``)."""


def constrain(trial: Any, over_gib: float) -> None:
    """Record the memory constraint the way Optuna 5 stores it and the way optuna-dashboard reads it, so
    the dashboard shows each trial's feasibility."""
    trial.set_constraint(CONSTRAINT, over_gib)
    trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_KEY, [over_gib])


def create(request: TuneRequest, db_url: str, name: str) -> Any:
    """The Optuna study ``name`` on ``db_url`` (created, or loaded when it exists) with the request's sampler
    and directions."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # TPE's multivariate/group and constraints are marked experimental; the warnings say nothing a user can act on
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    r = request
    sampler: optuna.samplers.BaseSampler
    if r.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=r.seed)
    elif r.sampler == "nsga2" or r.objective == "pareto":
        sampler = optuna.samplers.NSGAIISampler(seed=r.seed, population_size=20)
    else:
        sampler = optuna.samplers.TPESampler(seed=r.seed, n_startup_trials=10, multivariate=True, group=True)
    directions: list[Any] = ["maximize", "minimize"] if r.objective == "pareto" else ["maximize"]
    # a pooled connection the server dropped meanwhile (a failover, an idle reaper) is replaced before use, as
    # zerotune's own engine does (db.session.make_engine); Optuna sets this for MySQL only
    engine_kwargs = {"pool_pre_ping": True} if db_url.startswith("postgresql") else {}
    storage = optuna.storages.RDBStorage(db_url, engine_kwargs=engine_kwargs, skip_compatibility_check=False)
    return optuna.create_study(storage=storage, study_name=name, sampler=sampler, directions=directions,
                               load_if_exists=True)


def tell_infeasible(study: Any, trial: Any, prediction: Prediction, objective: str) -> None:
    """Tell Optuna a point that does not fit, so that no reader takes it for a result.

    Throughput: PRUNED with its constraint. TPE files a trial whose constraint is violated as
    infeasible before it looks at the state (``_tpe.sampler._split_trials``), so it learns exactly
    what a COMPLETE infeasible trial teaches; but a reader that ranks complete trials by value alone
    no longer crowns it (optuna-dashboard's best trial is a plain maximum over COMPLETE trials: the
    predicted TFLOPS of a point 12 GiB over memory were the study's "best", and a study where nothing
    fits had one). Pareto: NSGA-II ranks only COMPLETE trials, so it stays COMPLETE, at 0 TFLOPS (it
    does not run) beside its memory, dominated by every point that fits. The predicted TFLOPS stay
    on the zt_trials row either way."""
    import optuna

    if objective == "pareto":
        study.tell(trial, [0.0, float(prediction["memory_bytes"]["peak"]) / 2**30])
    else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)

def values(metrics: TrialMetrics, objective: str) -> list[float]:
    """What a measured or predicted trial tells Optuna: TFLOPS per rank (and peak GiB for a Pareto study)."""
    tflops = float(metrics["tflops_per_rank"])
    if objective == "pareto":
        return [tflops, float(metrics["memory_bytes"]["peak"]) / 2**30]
    return [tflops]
