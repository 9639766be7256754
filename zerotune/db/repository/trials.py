"""Trials: leased, heartbeated and finished by the runner that holds them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from zerotune.db.models import (
    TRIAL_STATUSES,
    Study,
    Trial,
    utcnow,
)
from zerotune.db.repository._common import (
    TERMINAL_TRIAL_STATUSES,
    JsonDict,
    JsonObject,
    NotFoundError,
    _check,
    _check_key,
    _now,
    _page,
    _refreshed,
    json_safe,
)


def add_trial(
    *, session: Session, study_id: int, strategy: JsonDict, strategy_key: str, executor: str,
    number: int | None = None, optuna_trial_id: int | None = None, status: str = "queued",
) -> Trial:
    """Add a trial of ``strategy`` to a study (``number``: the Optuna trial number, unique per study)."""
    _check("status", status, TRIAL_STATUSES)
    _check_key("strategy_key", strategy_key)
    trial = Trial(study_id=study_id, strategy=strategy, strategy_key=strategy_key, executor=executor, number=number,
                  optuna_trial_id=optuna_trial_id, status=status, attempts=0, logs="")
    if status in TERMINAL_TRIAL_STATUSES:
        trial.finished_at = utcnow()
    session.add(trial)
    session.flush()
    return trial



def claim_trial(
    *, session: Session, trial_id: int, owner: str, lease_s: float, now: datetime | None = None,
) -> Trial | None:
    """Lease a queued trial, or a running one whose lease expired, to ``owner`` for ``lease_s`` seconds.

    One conditional UPDATE, so of several claimers exactly one wins. Sets status ``running``,
    ``lease_owner``, ``lease_expires_at``, ``started_at`` and counts the attempt.

    Returns:
        The claimed trial, or None when it is finished or leased to someone else.
    """
    if lease_s <= 0:
        raise ValueError(f"lease_s={lease_s}: need a positive lease")
    now = _now(now)
    claimable = or_(Trial.status == "queued", and_(Trial.status == "running", Trial.lease_expires_at < now))
    stmt = (update(Trial).where(Trial.id == trial_id, claimable)
            .values(status="running", lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_s),
                    heartbeat_at=now, started_at=now, finished_at=None, attempts=Trial.attempts + 1)
            .returning(Trial))
    return _refreshed(session, stmt)


def heartbeat_trial(
    *, session: Session, trial_id: int, owner: str, lease_s: float, now: datetime | None = None,
) -> bool:
    """Extend ``owner``'s lease on a running trial to ``now + lease_s``.

    Returns:
        False when ``owner`` no longer holds the trial (it was finished or claimed again): the
        worker should stop the run and drop its result.
    """
    now = _now(now)
    stmt = (update(Trial).where(Trial.id == trial_id, Trial.status == "running", Trial.lease_owner == owner)
            .values(lease_expires_at=now + timedelta(seconds=lease_s), heartbeat_at=now).returning(Trial))
    return _refreshed(session, stmt) is not None


def finish_trial(
    *, session: Session, trial_id: int, status: str, value: float | None = None, metrics: JsonObject | None = None,
    prediction: JsonObject | None = None, reason: str | None = None, logs: str | None = None,
    proxy_model: JsonDict | None = None, owner: str | None = None, now: datetime | None = None,
) -> Trial | None:
    """Record a trial's outcome and end its lease. Arguments left None keep their stored value.

    Args:
        status: ``complete``, ``failed``, ``pruned`` or ``infeasible``.
        value: the objective (e.g. TFLOPS per rank); ``metrics``: the run.json or the prediction.
        owner: when given, finish only if ``owner`` still holds the running trial's lease.

    Returns:
        The finished trial, or None when ``owner`` lost the trial to another claimer.

    Raises:
        NotFoundError: no trial has id ``trial_id``.
    """
    _check("status", status, TERMINAL_TRIAL_STATUSES)
    fields = {"value": value, "metrics": json_safe(metrics), "prediction": json_safe(prediction),
              "reason": json_safe(reason), "logs": json_safe(logs), "proxy_model": json_safe(proxy_model)}
    stmt = update(Trial).where(Trial.id == trial_id)
    if owner is not None:  # checked in the UPDATE itself, so a reclaim just before cannot be overwritten
        stmt = stmt.where(Trial.status == "running", Trial.lease_owner == owner)
    values = {name: v for name, v in fields.items() if v is not None}
    stmt = stmt.values(**values, status=status, finished_at=_now(now), lease_expires_at=None)
    trial = _refreshed(session, stmt.returning(Trial))
    if trial is None and session.get(Trial, trial_id) is None:
        raise NotFoundError("trial", trial_id)
    return trial




def get_trial(*, session: Session, trial_id: int) -> Trial | None:
    """The trial with id ``trial_id``, or None."""
    return session.get(Trial, trial_id)


def list_trials(
    *, session: Session, study_id: int, status: str | None = None, offset: int = 0, limit: int = 100,
) -> tuple[list[Trial], int]:
    """A page of a study's trials in the order they were added, and the total count."""
    query = select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)
    if status is not None:
        query = query.where(Trial.status == _check("status", status, TRIAL_STATUSES))
    return _page(session, query, offset, limit)


def best_trial(*, session: Session, study_id: int) -> Trial | None:
    """The complete trial with the highest ``value`` (the earliest on a tie), or None."""
    query = (select(Trial).where(Trial.study_id == study_id, Trial.status == "complete", Trial.value.is_not(None))
             .order_by(Trial.value.desc(), Trial.id).limit(1))
    return session.scalars(query).first()


def trials_with_strategy_key(
    *, session: Session, strategy_key: str, status: str | None = "complete", study_id: int | None = None,
) -> list[Trial]:
    """Trials of the same strategy (in any study unless ``study_id``; of any status when ``status`` is None):
    reuse and warm-start material, and what an upload compares itself with."""
    query = select(Trial).where(Trial.strategy_key == strategy_key)
    if status is not None:
        query = query.where(Trial.status == status)
    if study_id is not None:
        query = query.where(Trial.study_id == study_id)
    return list(session.scalars(query.order_by(Trial.id)))


def ranked_trials(*, session: Session, study_id: int) -> list[Trial]:
    """A study's complete trials with a value, best first."""
    return list(session.scalars(select(Trial).where(Trial.study_id == study_id, Trial.status == "complete",
                                                    Trial.value.is_not(None)).order_by(Trial.value.desc())))


def trials_of(*, session: Session, study_id: int) -> list[Trial]:
    """All of a study's trials in the order they were added."""
    return list(session.scalars(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)))


def trial_outcomes(*, session: Session, study_id: int) -> list[tuple[str, str | None]]:
    """(status, reason) of each of a study's trials in the order they were added."""
    rows = session.execute(select(Trial.status, Trial.reason).where(Trial.study_id == study_id).order_by(Trial.id))
    return [(status, reason) for status, reason in rows]


def trial_counts(*, session: Session, study_id: int | None = None) -> dict[str, int]:
    """Trials per status, of one study or of all."""
    query = select(Trial.status, func.count()).group_by(Trial.status)
    if study_id is not None:
        query = query.where(Trial.study_id == study_id)
    return {str(k): int(v) for k, v in session.execute(query)}


def count_spent_trials(*, session: Session, study_id: int, unspent: Iterable[str]) -> int:
    """A study's ended trials that count against its budget: not a failed one whose reason is ``LIKE`` one of the
    ``unspent`` patterns (it was cut short from outside and run again: the run again is what counts)."""
    again = or_(*(Trial.reason.like(p) for p in unspent))
    return session.scalar(select(func.count()).select_from(Trial).where(
        Trial.study_id == study_id, Trial.status.in_(TERMINAL_TRIAL_STATUSES),
        ~((Trial.status == "failed") & again))) or 0


def count_reasons(*, session: Session, study_id: int, like: str) -> dict[str, int]:
    """How many of a study's trials of each strategy (by key) have a reason ``LIKE`` the pattern ``like``."""
    rows = session.execute(select(Trial.strategy_key, func.count()).where(
        Trial.study_id == study_id, Trial.reason.like(like)).group_by(Trial.strategy_key))
    return {str(key): int(n) for key, n in rows}


def dead_trials(*, session: Session, study_id: int, now: datetime | None = None, all_running: bool = False,
                ) -> list[Trial]:
    """A study's trials whose runner died: ``queued`` rows (never claimed) and ``running`` ones whose lease
    expired before ``now`` — or every running one when ``all_running`` (the caller holds the study alone,
    so no other runner can be running a trial of it)."""
    running = Trial.status == "running"
    if not all_running:
        running = running & (Trial.lease_expires_at < _now(now))
    query = select(Trial).where(Trial.study_id == study_id, (Trial.status == "queued") | running)
    return list(session.scalars(query.order_by(Trial.id)))


def measured_trials(*, session: Session, statuses: Iterable[str], executors: Iterable[str] | None = None,
                    study_id: int | None = None) -> Iterator[Trial]:
    """Trials with ``statuses`` (run by ``executors``, of ``study_id``, where given), newest first; lazily,
    so a caller that has enough stops reading."""
    query = select(Trial).where(Trial.status.in_(tuple(statuses)))
    if executors is not None:
        query = query.where(Trial.executor.in_(tuple(executors)))
    if study_id is not None:
        query = query.where(Trial.study_id == study_id)
    return iter(session.scalars(query.order_by(Trial.id.desc())))


def best_trials_of_request(*, session: Session, request_id: int, limit: int) -> list[Trial]:
    """The ``limit`` best complete trials of all of a request's studies."""
    return list(session.scalars(select(Trial).join(Study, Study.id == Trial.study_id).where(
        Study.request_id == request_id, Trial.status == "complete").order_by(Trial.value.desc()).limit(limit)))
