"""Measuring the shortlist of a predicted answer: which strategies, as what request, and why.

A model study's decision names the partitions within the model's error of its winner
(``decision.shortlist``); where nothing measured that error on the cluster (no band), its fastest
``LEADERS`` partitions are all in doubt. A request with ``measure`` set has them measured by that
executor as a request of its own (``shortlist_of`` the predicted one: same model, cluster and global
batch), whose recommendation is stored under the predicted request's key — the newest answer, and
so the one served: :func:`plan` says what to measure, a :class:`ShortlistTuner` measures it. The worker
(``tuner.worker``) and ``zerotune tune --measure-shortlist`` both use them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from zerotune.core.spec import Strategy
from zerotune.costmodel import Calibration
from zerotune.db import repository as repo
from zerotune.db.models import Recommendation
from zerotune.errors import SpecError
from zerotune.tuner.choice import Chooser, leading_partitions
from zerotune.tuner.executors.base import Executor, StepHook
from zerotune.tuner.request import TuneRequest, key_of
from zerotune.tuner.study import Tuner
from zerotune.tuner.study_options import Progress, TunerOptions

LEADERS = 3
"""Partitions measured when the model's error on a cluster is unknown (its fastest predicted ones)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    request: TuneRequest
    """The measured request (``executor`` = the predicted request's ``measure``)."""
    candidates: list[Strategy]
    answer_key: str
    """Where its answer is stored: the predicted request's key."""
    note: dict[str, Any]
    """``measured_shortlist`` for the answer's metrics: what was measured, and why."""


def plan(session: Session, request: TuneRequest, predicted: dict[str, Any]) -> Plan | None:
    """The measurement of ``predicted``'s shortlist, or None when the decision leaves nothing to measure
    (a winner beyond the model's error, or fewer than two partitions)."""
    if request.measure is None:
        return None
    decision = predicted["decision"]
    if decision["band"] is None:
        candidates = leading_partitions(session, predicted["study_id"], LEADERS)
        why = (f"the model's error on {request.cluster.name} is unknown (no calibration measured it): the "
               f"{len(candidates)} fastest partitions predicted")
    else:
        candidates = [Strategy.from_dict(c["strategy"]) for c in decision["shortlist"]]
        why = (f"{len(candidates)} partitions lay within the model's error ({decision['band']:.1%}) of the "
               "predicted winner")
        call = decision.get("checkpointing") or {}
        if call.get("verdict") == "within":  # the pick and its rival of the other checkpointing setting
            why += (f", or within its lean on checkpointed runs ({call['lean']:+.1%}: trial "
                    f"{call['rival_trial_id']})")
    if len(candidates) < 2:
        return None
    measured = dataclasses.replace(request, executor=request.measure, measure=None, trials=len(candidates),
                                   shortlist_of=request.key(), time_budget_s=None)
    note = {"measured_shortlist": {
        "of_request": request.key(), "predicted_recommendation_id": predicted["id"],
        "predicted_strategy": predicted["strategy"], "candidates": len(candidates), "executor": request.measure,
        "why": why}}
    return Plan(request=measured, candidates=candidates, answer_key=request.key(), note=note)


class ShortlistTuner(Tuner):
    """The study that measures a :class:`Plan`: exactly its candidates (no known-good strategies, no warm start,
    no refining, no sampler's picks), each run in full, answered under the predicted request's key with the
    plan's note. Built as a :class:`~zerotune.tuner.study.Tuner` is, with the plan in place of the request."""

    def __init__(self, todo: Plan, *, sessions: sessionmaker[Session], executor: Executor, workdir: Path,
                 options: TunerOptions | None = None, calibration: Calibration | None = None,
                 progress: Callable[[Progress], None] | None = None, stop: threading.Event | None = None) -> None:
        super().__init__(todo.request, sessions=sessions, executor=executor, workdir=workdir, options=options,
                         calibration=calibration, progress=progress, stop=stop)
        self.plan = todo

    @property
    def refines(self) -> bool:
        return False

    def _first_picks(self) -> list[tuple[Strategy, dict[str, Any]]]:
        return [(s, {"preset": s.name} if s.name else {"shortlist": "true"}) for s in self.plan.candidates]

    def _pruner(self) -> StepHook | None:
        return None  # the candidates are what the model could not tell apart: a run cut short tells nothing either

    def _chooser(self) -> Chooser:
        return dataclasses.replace(super()._chooser(), answer_key=self.plan.answer_key, note=self.plan.note)


# -- a shortlist measured by a training job on its own allocation (``zerotune recommend --measure``) --------------

ON_JOB = "job"
"""What keys the measured request of a job's measurements, beside its executor (``external``: uploaded runs)."""


def measured_on_job(request: TuneRequest, trials: int = 1) -> tuple[TuneRequest, str]:
    """The request a job's measurements of ``request``'s shortlist are stored under, and its key: the predicted
    request's model, cluster (the allocation's shape), batch and runner, ``shortlist_of`` it, whatever
    calibration it predicted with (a refit from those very runs changes the calibration a body resolves to,
    never what was measured). ``trials``: the runs the study holds (not part of the key)."""
    plain = dataclasses.replace(request, calibration=None, executor="model", measure=None, emulate=False,
                                time_budget_s=None)
    measured = dataclasses.replace(plain, executor="local", trials=trials, shortlist_of=plain.key())
    keyed = dataclasses.replace(measured, trials=1)
    return measured, key_of({**keyed.normalized(), "executor": "external", "measured_on": ON_JOB})


def job_measured_answer(session: Session, request: TuneRequest) -> Recommendation | None:
    """The newest answer made from a job's measurements of ``request``'s shortlist (on the same cluster and
    allocation shape, whatever calibration ``request`` resolves to), or None. A request for another runner
    than zerotune's trainer has none (a job measures what that trainer runs)."""
    if request.runner != "zerotune":
        return None
    try:
        _, key = measured_on_job(request)
    except SpecError:  # a request no job can measure as asked
        return None
    req = repo.get_request_by_key(session=session, key=key)
    if req is None:
        return None
    return repo.latest_recommendation(session=session, request_id=req.id)
