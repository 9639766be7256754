"""What a study tries first: the known-good presets, then the best strategies of the most similar earlier
request (its warm start), then the neighbours of the best of them (``refine``)."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel import Calibration, predict
from zerotune.costmodel.catalog import build_strategy
from zerotune.db import repository as repo
from zerotune.errors import SpecError
from zerotune.tuner.request import TuneRequest, strategy_key
from zerotune.tuner.space import Space, params_key, runner_rule

REPLICATING = ("zero2", "zero1", "ddp")
"""Known-good strategies that replicate what ZeRO-3 shards: tried first only where the cost model says they fit."""
PRESETS = ("zero3", "zeropp", "3level-b", "3level-a", "mics", *REPLICATING)
"""Known-good strategies every study tries first, in this order."""


def known_good(request: TuneRequest, calibration: Calibration | None = None) -> list[tuple[Strategy, dict[str, Any]]]:
    """The known-good presets that exist on the request's cluster and that its runner runs exactly, each with the
    Optuna user attribute that marks it. A preset that the cost model (with ``calibration``) says does not fit is
    tried as a user would next try it (``_as_fits``: with selective, then full activation checkpointing, then one
    sequence per micro-batch, then both); one that fits in none of these ways is kept as it is when it shards the
    parameters (its trial records what overflows) and left out when it replicates them."""
    r, out = request, []
    for name in PRESETS:
        try:
            s = r.fit(build_strategy(name, r.cluster))
        except SpecError:
            continue
        if runner_rule(r.runner, r.cluster, s) is not None:
            continue
        fitting = _as_fits(r, s, calibration)
        if fitting is None and name in REPLICATING:
            continue
        out.append((fitting or s, {"preset": name}))
    return out


def _as_fits(r: TuneRequest, s: Strategy, calibration: Calibration | None) -> Strategy | None:
    """``s``, or ``s`` with selective activation checkpointing (where the runner runs it), then with full, with
    one sequence per micro-batch, or with both: the first of these the cost model says fits the request's devices
    (selective recomputes less than full); None where none does."""
    selective = {"activation_checkpointing": True, "checkpoint_policy": "selective"}
    full = {"activation_checkpointing": True}
    for changes in ({}, selective, full, {"micro_batch_size": 1}, {**selective, "micro_batch_size": 1},
                    {**full, "micro_batch_size": 1}):
        variant = s.replace(**changes)
        if runner_rule(r.runner, r.cluster, variant) is not None:
            continue
        try:
            if predict(r.model, r.cluster, variant, global_batch=r.global_batch, calibration=calibration,
                       memory_reserve_gib=r.memory_reserve_gib)["feasible"]:
                return variant
        except SpecError:  # a batch this micro-batch does not divide: the study's own trials say so
            continue
    return None


def warm_start(session: Session, request: TuneRequest, top: int = 3) -> list[Strategy]:
    """The best strategies of the most similar earlier request (same cluster family, nearest size): its
    recommended strategy first (what its decision kept, not always its fastest trial), then its fastest;
    only those the request's runner runs exactly."""
    r = request
    family = r.cluster.name.split(":")[0]
    best: tuple[float, int] | None = None
    for req in repo.list_requests(session=session):
        cluster = ClusterSpec.from_dict(req.spec["cluster"])
        if req.key == r.key() or cluster.name.split(":")[0] != family or \
                cluster.num_levels != r.cluster.num_levels:
            continue
        model = ModelSpec.from_dict(req.spec["model"])
        distance = abs(math.log(model.num_params() / r.model.num_params())) + \
            abs(math.log(cluster.world_size / r.cluster.world_size))
        if distance < math.log(8) and (best is None or distance < best[0]):
            best = (distance, req.id)
    if best is None:
        return []
    answer = repo.latest_recommendation(session=session, request_id=best[1])
    rows = repo.best_trials_of_request(session=session, request_id=best[1], limit=top)
    out: list[Strategy] = []
    for fields in ([answer.strategy] if answer else []) + [row.strategy for row in rows]:
        try:
            s_ = r.fit(Strategy.from_dict(fields).validate_for(r.cluster))
        except SpecError:
            continue
        if runner_rule(r.runner, r.cluster, s_) is not None:
            continue
        if all(strategy_key(s_) != strategy_key(o) for o in out):
            out.append(s_)
    return out[:top]


REFINE_ROUNDS = 3
"""How many incumbents a study refines around (``refine``) before its sampler alone goes on."""
REFINED = "refined"
"""The Optuna study user attribute listing the trial numbers a study has refined around (a resumed study goes on
from there)."""


def refine(study: Any, space: Space, budget_left: int) -> int:
    """Once nothing is queued, enqueue the strategies one knob away (``Space.neighbours``) from the study's best
    feasible trial that the study has not tried yet, the first of them (``neighbours`` puts the knobs that move a step
    most first) up to a quarter of ``budget_left`` (at least one), around at most ``REFINE_ROUNDS`` incumbents, each
    once: about half of what the presets leave of a budget, the rest TPE's. Returns how many were enqueued (user
    attribute ``refine``: the number of the trial they surround).

    The presets put a study near the optimum and its neighbours are where the rest of the gain usually is: the
    DeepSpeed autotuner's method is exactly this (its stages, then the best one's micro-batch, then its other knobs
    one grid at a time). TPE, started from the presets alone, spends its first trials far from them
    (``bench/search_efficiency.py``, gpt-neox-20b on frontier:48: 36.5 trials to within 2% of the optimum, median
    of 10 seeds, where the autotuner's method took 9; 9 with this step); refining first and sampling after keeps
    TPE's reach for the optima that are not a preset's neighbours."""
    import optuna

    refined = list(study.user_attrs.get(REFINED, []))
    if budget_left <= 0 or len(refined) >= REFINE_ROUNDS:  # an exhausted study pays one read per trial, not a scan
        return 0
    trials = study.get_trials(deepcopy=False)
    if any(t.state == optuna.trial.TrialState.WAITING for t in trials):
        return 0
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.values
            and all(v <= 0 for v in t.constraints.values())]
    if not done:
        return 0
    best = max(done, key=lambda t: t.values[0])
    if best.number in refined:
        return 0
    study.set_user_attr(REFINED, [*refined, best.number])
    try:
        incumbent = space.strategy_of(best.params)
    except (SpecError, ValueError):  # a trial of another space (a study resumed under other rules)
        return 0
    tried = {params_key(t.params) for t in trials}
    fresh = [params for params in (space.strategy_params(s) for s in space.neighbours(incumbent))
             if params_key(params) not in tried]
    fresh = fresh[:max(1, budget_left // 4)]
    for params in fresh:
        study.enqueue_trial(params, user_attrs={"refine": str(best.number)})
    return len(fresh)
