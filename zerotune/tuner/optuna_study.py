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
them (``_serializer.serialize_frozen_trial``: ``system_attrs["constraints"]``). Optuna 5 reads this list as well
as its own per-name keys (``study/_constrained_optimization.py`` ``_get_constraints_from_system_attrs``: the list
as ``"0"``, ``"1"``, ..., then ``"constraints:<name>"``), so the constraint is stored once, in the list both
read; the study's user attribute ``constraints`` names it."""
CONSTRAINT_ABOUT = f"{CONSTRAINT}: GiB per rank over the device memory (<= 0: the strategy fits)"

NOTE_CHUNK = 2045
"""optuna-dashboard's study note: ``dashboard:note_ver`` and the body in ``dashboard:note_str:<i>`` chunks of at most
2045 characters, study system attributes (optuna_dashboard 0.21.0 ``_note.py``, ``SYSTEM_ATTR_MAX_LENGTH``)."""


def constrain(trial: Any, over_gib: float) -> None:
    """Record the memory constraint once, where Optuna's samplers and optuna-dashboard both read it, so the
    dashboard shows each trial's feasibility."""
    trial.storage.set_trial_system_attr(trial._trial_id, LEGACY_CONSTRAINTS_KEY, [float(over_gib)])


def save_study_note(study: Any, body: str) -> None:
    """The study's note as optuna-dashboard shows it (its ``save_note`` format; optuna-dashboard itself is not a
    dependency of the service): the next version, the body in chunks, older chunks beyond the new body emptied."""
    storage, sid = study._storage, study._study_id
    attrs = storage.get_study_system_attrs(sid)
    chunks = [body[i:i + NOTE_CHUNK] for i in range(0, len(body), NOTE_CHUNK)] or [""]
    storage.set_study_system_attr(sid, "dashboard:note_ver", int(attrs.get("dashboard:note_ver", 0)) + 1)
    for i, chunk in enumerate(chunks):
        storage.set_study_system_attr(sid, f"dashboard:note_str:{i}", chunk)
    old = sum(1 for k in attrs if k.startswith("dashboard:note_str:"))
    for i in range(len(chunks), old):
        storage.set_study_system_attr(sid, f"dashboard:note_str:{i}", "")


def mark_choice(study: Any, recommendation: dict[str, Any]) -> str | None:
    """Tell optuna-dashboard which trial zerotune chose, and why a higher one shown as best was passed over: the
    study's user attributes ``zt_chosen_trial`` (the Optuna trial number) and ``zt_choice``, and the study's note.
    Returns the text (None when the chosen trial is not in this Optuna study)."""
    numbers = {t.user_attrs.get("zt_trial_id"): t for t in study.get_trials(deepcopy=False)}
    chosen = numbers.get(recommendation.get("trial_id"))
    if chosen is None:
        return None
    value = recommendation.get("value")
    said = f"zerotune chose trial {chosen.number}" + (f" ({value:.4g} TFLOPS per rank" if value else " (") + \
        f", {recommendation.get('evidence')})"
    best = None
    if len(study.directions) == 1:
        complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        best = max(complete, key=lambda t: t.values[0], default=None)
    if best is None or best.number == chosen.number:
        text = said + ": the best trial shown."
    else:
        decision = (recommendation.get("metrics") or {}).get("decision") or recommendation.get("decision") or {}
        lossy = decision.get("lossy") or {}
        verification = recommendation.get("verification") or {}
        if lossy.get("kept") == "unquantized" and numbers.get(lossy.get("quantized_trial_id")) is not None:
            why = f"it quantizes: {lossy.get('why')}"
        elif best.user_attrs.get("zt_trial_id") in (verification.get("disqualified") or []):
            why = "its quantized training was verified unhealthy (the answer's verification)"
        else:
            why = "see the answer's decision"
        text = (f"{said}, not trial {best.number} shown as best ({best.values[0]:.4g} TFLOPS per rank): {why}.")
    study.set_user_attr("zt_chosen_trial", chosen.number)
    study.set_user_attr("zt_choice", text)
    save_study_note(study, text)
    return text


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
    study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, directions=directions,
                                load_if_exists=True)
    if study.user_attrs.get("constraints") != [CONSTRAINT_ABOUT]:
        study.set_user_attr("constraints", [CONSTRAINT_ABOUT])  # what the trials' one constraint value is
    return study


def tell_infeasible(study: Any, trial: Any, prediction: Prediction, objective: str) -> None:
    """Tell Optuna a point that does not fit, so that no reader takes it for a result.

    Throughput: PRUNED with its constraint. TPE files a trial whose constraint is violated as
    infeasible before it looks at the state (``_tpe.sampler._split_trials``), so it learns exactly
    what a COMPLETE infeasible trial teaches; but a reader that ranks complete trials by value alone
    no longer crowns it (optuna-dashboard's best trial is a plain maximum over COMPLETE trials: the
    predicted TFLOPS of a point 12 GiB over memory were the study's "best", and a study where nothing
    fits had one). Pareto: NSGA-II ranks only COMPLETE trials, so it stays COMPLETE, at 0 TFLOPS (it
    does not run) beside its memory, dominated by every point that fits. The predicted TFLOPS stay
    on the zt_trials row either way; why it does not fit is the trial's user attribute ``reason``, which
    optuna-dashboard shows with the trial."""
    import optuna

    trial.set_user_attr("reason", prediction["overflow"]["reason"])  # shown beside the trial in optuna-dashboard
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
