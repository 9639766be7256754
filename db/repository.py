"""Keyword-only functions over the ``zt_`` tables, used by the tuner and the API.

Each function works inside the caller's session and transaction: it adds, flushes and returns
rows but never commits (wrap calls in :func:`db.session.session_scope`, and commit soon after a
claim). The functions that many callers race on (:func:`get_or_create_request`,
:func:`get_or_create_job`, :func:`claim_trial`, :func:`finish_trial` with ``owner``,
:func:`claim_next_job`) are race-free on PostgreSQL and on SQLite, the two supported backends.
Times are timezone-aware UTC; every ``now`` argument defaults to the current time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from zerotune.db.models import (
    EVIDENCE_KINDS,
    JOB_STATES,
    STUDY_STATES,
    TRIAL_STATUSES,
    WORKER_STATES,
    Job,
    Recommendation,
    Request,
    StoredCalibration,
    Study,
    Trial,
    WorkerProcess,
    utcnow,
)

Row = TypeVar("Row")
JsonDict = dict[str, Any]

TERMINAL_STUDY_STATES = ("done", "failed", "cancelled")
TERMINAL_TRIAL_STATUSES = ("complete", "failed", "pruned", "infeasible")
TERMINAL_JOB_STATES = ("done", "failed", "cancelled")
ACTIVE_JOB_STATES = ("queued", "running")


class NotFoundError(LookupError):
    """A row that does not exist; the message names the table and the id."""


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None and NUL characters dropped.

    PostgreSQL's ``json`` refuses NaN/Infinity (a diverged run's losses) and its text types refuse
    NUL; SQLite stores both but no JSON parser reads them back. Applied to what trials store, and to
    response bodies (``api.queries.finite``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _check(field: str, value: str, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ValueError naming the field."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{field}={value!r}: must be one of {', '.join(allowed)}")
    return value


def _get(session: Session, model: type[Row], row_id: int) -> Row:
    """The row of ``model`` with primary key ``row_id``, or NotFoundError."""
    row = session.get(model, row_id)
    if row is None:
        raise NotFoundError(f"{model.__tablename__} has no row with id={row_id}")  # type: ignore[attr-defined]
    return row


def _page(session: Session, query: Select[Any], offset: int, limit: int) -> tuple[list[Any], int]:
    """One page of ``query`` (already ordered) and the total number of rows it matches."""
    if offset < 0 or limit < 1:
        raise ValueError(f"offset={offset}, limit={limit}: need offset >= 0 and limit >= 1")
    count = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    return list(session.scalars(query.offset(offset).limit(limit))), count


def _now(now: datetime | None) -> datetime:
    """``now``, checked to be timezone-aware, or the current UTC time."""
    if now is None:
        return utcnow()
    if now.tzinfo is None:
        raise ValueError(f"now={now!r} is a naive datetime: pass a timezone-aware one (datetime.now(UTC))")
    return now


def _check_key(field: str, key: str) -> None:
    """Keys are hashes stored in 64 characters (PostgreSQL would refuse more; SQLite would not)."""
    if not 0 < len(key) <= 64:
        raise ValueError(f"{field}={key!r}: must be 1 to 64 characters (a hex digest)")


def _dialect(session: Session) -> str:
    """``postgresql`` or ``sqlite``: the two backends zerotune supports (their UPSERT and locking differ)."""
    name = session.get_bind().dialect.name
    if name not in ("postgresql", "sqlite"):
        raise ValueError(f"database backend {name!r}: zerotune supports sqlite and postgresql")
    return name


# --- requests -------------------------------------------------------------------------------


def get_or_create_request(
    *, session: Session, key: str, model: JsonDict, cluster: JsonDict, objective: str, budget: JsonDict,
    executor: str, global_batch: int | None = None, calibration: str | None = None, measure: str | None = None,
) -> tuple[Request, bool]:
    """The request stored under ``key``, inserting it if new; safe when many callers race.

    Args:
        key: the hash of the normalized request (64 characters at most).

    Returns:
        ``(request, created)``; ``created`` is False when an equal request was already stored.
    """
    _check_key("key", key)
    values = {"key": key, "model": model, "cluster": cluster, "objective": objective, "budget": budget,
              "executor": executor, "global_batch": global_batch, "calibration": calibration, "measure": measure,
              "created_at": utcnow()}
    insert = postgresql.insert if _dialect(session) == "postgresql" else sqlite.insert
    stmt = insert(Request).values(**values).on_conflict_do_nothing(index_elements=["key"]).returning(Request.id)
    created = session.execute(stmt).scalar_one_or_none() is not None
    return session.scalars(select(Request).where(Request.key == key)).one(), created


def get_request(*, session: Session, request_id: int) -> Request | None:
    """The request with id ``request_id``, or None."""
    return session.get(Request, request_id)


def get_request_by_key(*, session: Session, key: str) -> Request | None:
    """The request stored under ``key``, or None."""
    return session.scalars(select(Request).where(Request.key == key)).one_or_none()


# --- studies --------------------------------------------------------------------------------


def create_study(
    *, session: Session, request_id: int, optuna_study_name: str, sampler: str, executor: str, n_trials: int,
) -> Study:
    """Add a ``pending`` study for a request; ``optuna_study_name`` must be unique."""
    if n_trials < 1:
        raise ValueError(f"n_trials={n_trials}: need at least 1")
    study = Study(request_id=request_id, optuna_study_name=optuna_study_name, sampler=sampler,
                  executor=executor, n_trials=n_trials, state="pending")
    session.add(study)
    session.flush()
    return study


def get_study(*, session: Session, study_id: int) -> Study | None:
    """The study with id ``study_id``, or None."""
    return session.get(Study, study_id)


def get_study_by_name(*, session: Session, optuna_study_name: str) -> Study | None:
    """The study mirrored by the Optuna study ``optuna_study_name``, or None."""
    return session.scalars(select(Study).where(Study.optuna_study_name == optuna_study_name)).one_or_none()


def list_studies(
    *, session: Session, offset: int = 0, limit: int = 50, request_id: int | None = None,
) -> tuple[list[Study], int]:
    """A page of studies, newest first, and the total count (optionally of one request only)."""
    query = select(Study).order_by(Study.id.desc())
    if request_id is not None:
        query = query.where(Study.request_id == request_id)
    return _page(session, query, offset, limit)


def set_study_state(
    *, session: Session, study_id: int, state: str, error: str | None = None, now: datetime | None = None,
) -> Study:
    """Move a study to ``state``; stamps ``started_at`` on the first run and ``finished_at`` at the end."""
    study = _get(session, Study, study_id)
    now = _now(now)
    study.state = _check("state", state, STUDY_STATES)
    if state == "running" and study.started_at is None:
        study.started_at = now
    study.finished_at = now if state in TERMINAL_STUDY_STATES else None
    if error is not None:
        study.error = error
    session.flush()
    return study


# --- trials ---------------------------------------------------------------------------------


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


def _refreshed(session: Session, stmt: Any) -> Any:
    """Run an UPDATE ... RETURNING of ORM rows and return the row it changed, refreshed, or None."""
    return session.scalars(stmt, execution_options={"populate_existing": True}).one_or_none()


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
    *, session: Session, trial_id: int, status: str, value: float | None = None, metrics: JsonDict | None = None,
    prediction: JsonDict | None = None, reason: str | None = None, logs: str | None = None,
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
        raise NotFoundError(f"zt_trials has no row with id={trial_id}")
    return trial


def expired_trials(*, session: Session, now: datetime | None = None, study_id: int | None = None) -> list[Trial]:
    """Running trials whose lease ran out before ``now`` (their worker died or hung)."""
    query = select(Trial).where(Trial.status == "running", Trial.lease_expires_at < _now(now))
    if study_id is not None:
        query = query.where(Trial.study_id == study_id)
    return list(session.scalars(query.order_by(Trial.id)))


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
    *, session: Session, strategy_key: str, status: str = "complete", study_id: int | None = None,
) -> list[Trial]:
    """Trials of the same strategy (in any study unless ``study_id``): reuse and warm-start material."""
    query = select(Trial).where(Trial.strategy_key == strategy_key, Trial.status == status)
    if study_id is not None:
        query = query.where(Trial.study_id == study_id)
    return list(session.scalars(query.order_by(Trial.id)))


# --- recommendations ------------------------------------------------------------------------


def save_recommendation(
    *, session: Session, study_id: int, request_key: str, strategy: JsonDict, metrics: JsonDict, evidence: str,
    exports: JsonDict, margin: float | None = None, runner_up_trial_id: int | None = None,
    trial_id: int | None = None,
) -> Recommendation:
    """Store a study's recommendation; the newest one per ``request_key`` is the one served.

    Args:
        evidence: ``predicted``, ``proxy-verified`` or ``measured``.
        exports: ``{"zerotune": ..., "deepspeed": ..., "fsdp": ...}``.
        margin: relative margin of the chosen trial over ``runner_up_trial_id``.
    """
    _check_key("request_key", request_key)
    recommendation = Recommendation(
        study_id=study_id, request_key=request_key, strategy=strategy, metrics=json_safe(metrics),
        evidence=_check("evidence", evidence, EVIDENCE_KINDS), exports=exports, margin=margin,
        runner_up_trial_id=runner_up_trial_id, trial_id=trial_id)
    session.add(recommendation)
    session.flush()
    return recommendation


def get_recommendation_by_key(*, session: Session, request_key: str) -> Recommendation | None:
    """The newest recommendation stored for ``request_key``, or None."""
    query = (select(Recommendation).where(Recommendation.request_key == request_key)
             .order_by(Recommendation.id.desc()).limit(1))
    return session.scalars(query).first()


def served_recommendation(*, session: Session, request_key: str) -> Recommendation | None:
    """The newest recommendation for ``request_key`` whose study finished (state ``done``).

    What the service answers with: a stopped or failed study's partial answer is never served."""
    query = (select(Recommendation).join(Study, Study.id == Recommendation.study_id)
             .where(Recommendation.request_key == request_key, Study.state == "done")
             .order_by(Recommendation.id.desc()).limit(1))
    return session.scalars(query).first()


# --- calibrations ---------------------------------------------------------------------------


def save_calibration(
    *, session: Session, name: str, cluster: str, num_levels: int, calibration: JsonDict, report: JsonDict,
    study_id: int | None = None,
) -> StoredCalibration:
    """Store a calibration of the cost model for ``cluster`` (a cluster name, e.g. ``local:2x2``).

    Args:
        name: unique; a second calibration under the same name is refused.
        report: how it was made and its error before and after (``strategies.calibration.refit``).
    """
    if not name or len(name) > 128:
        raise ValueError(f"name={name!r}: must be 1-128 characters")
    row = StoredCalibration(name=name, cluster=cluster, family=cluster.partition(":")[0], num_levels=num_levels,
                            calibration=json_safe(calibration), report=json_safe(report), study_id=study_id)
    session.add(row)
    session.flush()
    return row


def get_calibration(*, session: Session, name: str) -> StoredCalibration | None:
    """The stored calibration called ``name``, or None."""
    return session.scalars(select(StoredCalibration).where(StoredCalibration.name == name)).one_or_none()


def calibration_for_cluster(*, session: Session, cluster: str, num_levels: int) -> StoredCalibration | None:
    """The calibration a study on ``cluster`` starts from: the newest stored for that very cluster, else
    the newest for the same family (the name before ``:``) with the same number of levels."""
    newest = select(StoredCalibration).order_by(StoredCalibration.id.desc()).limit(1)
    exact = session.scalars(newest.where(StoredCalibration.cluster == cluster)).first()
    if exact is not None:
        return exact
    return session.scalars(newest.where(StoredCalibration.family == cluster.partition(":")[0],
                                        StoredCalibration.num_levels == num_levels)).first()


def list_calibrations(*, session: Session, offset: int = 0, limit: int = 100) -> tuple[list[StoredCalibration], int]:
    """Stored calibrations, newest first, and their total count."""
    return _page(session, select(StoredCalibration).order_by(StoredCalibration.id.desc()), offset, limit)


# --- jobs -----------------------------------------------------------------------------------


def create_job(*, session: Session, request_id: int, study_id: int | None = None) -> Job:
    """Queue a job for a request (see :func:`get_or_create_job` to share one among equal requests)."""
    job = Job(request_id=request_id, study_id=study_id, state="queued", progress=0.0, trials_done=0)
    session.add(job)
    session.flush()
    return job


def get_or_create_job(*, session: Session, request_id: int) -> tuple[Job, bool]:
    """The request's queued or running job, or a new queued one: equal requests share one search.

    The request row is locked first (a no-op UPDATE: a row lock on PostgreSQL, the write lock on
    SQLite), so callers racing on the same request queue one job between them. Commit soon.

    Returns:
        ``(job, created)``.
    """
    lock = update(Request).where(Request.id == request_id).values(objective=Request.objective).returning(Request.id)
    if session.execute(lock).scalar_one_or_none() is None:
        raise NotFoundError(f"zt_requests has no row with id={request_id}")
    query = (select(Job).where(Job.request_id == request_id, Job.state.in_(ACTIVE_JOB_STATES))
             .order_by(Job.id).limit(1))
    job = session.scalars(query).first()
    return (job, False) if job is not None else (create_job(session=session, request_id=request_id), True)


def claim_next_job(*, session: Session, worker: str, now: datetime | None = None) -> Job | None:
    """Hand the oldest queued job to ``worker`` (state ``running``), or return None if none is queued.

    PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED``, so concurrent workers each get a different
    job without waiting. SQLite: one ``UPDATE ... WHERE id = (oldest queued) RETURNING``, atomic
    under SQLite's single writer lock. Commit soon: the claim is visible to others only then.
    """
    now = _now(now)
    claimed = {"state": "running", "worker": worker, "started_at": now, "heartbeat_at": now}
    if _dialect(session) == "postgresql":
        query = select(Job).where(Job.state == "queued").order_by(Job.id).limit(1).with_for_update(skip_locked=True)
        job = session.scalars(query, execution_options={"populate_existing": True}).first()
        if job is None:
            return None
        for name, value in claimed.items():
            setattr(job, name, value)
        session.flush()
        return job
    oldest_queued = select(Job.id).where(Job.state == "queued").order_by(Job.id).limit(1).scalar_subquery()
    stmt = (update(Job).where(Job.id == oldest_queued, Job.state == "queued")
            .values(**claimed).returning(Job))
    return _refreshed(session, stmt)


def update_job(
    *, session: Session, job_id: int, state: str | None = None, progress: float | None = None,
    trials_done: int | None = None, error: str | None = None, study_id: int | None = None,
    now: datetime | None = None,
) -> Job:
    """Report on a job; arguments left None keep their value. Every call counts as a heartbeat.

    Stamps ``started_at`` when the job starts running and ``finished_at`` when it ends.
    """
    job = _get(session, Job, job_id)
    now = _now(now)
    if progress is not None and not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress={progress}: must lie in [0, 1]")
    if state is not None:
        job.state = _check("state", state, JOB_STATES)
        if state == "running" and job.started_at is None:
            job.started_at = now
        job.finished_at = now if state in TERMINAL_JOB_STATES else None
    for name, value in {"progress": progress, "trials_done": trials_done, "error": error,
                        "study_id": study_id}.items():
        if value is not None:
            setattr(job, name, value)
    job.heartbeat_at = now
    session.flush()
    return job


def get_job(*, session: Session, job_id: int) -> Job | None:
    """The job with id ``job_id``, or None."""
    return session.get(Job, job_id)


def stale_jobs(*, session: Session, before: datetime) -> list[Job]:
    """Running jobs whose last heartbeat is older than ``before`` (their worker is presumed dead)."""
    query = select(Job).where(Job.state == "running", or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < _now(before)))
    return list(session.scalars(query.order_by(Job.id)))


# -- workers -------------------------------------------------------------------------------------
def stamp_worker(
    *, session: Session, worker_id: str, host: str, pid: int, state: str, job_id: int | None = None,
    jobs_run: int = 0, now: datetime | None = None,
) -> WorkerProcess:
    """Record that worker ``worker_id`` is alive now (creating its row on the first stamp)."""
    _check("state", state, WORKER_STATES)
    now = _now(now)
    row = session.get(WorkerProcess, worker_id)
    if row is None:
        row = WorkerProcess(id=worker_id, host=host, pid=pid, started_at=now)
        session.add(row)
    row.state, row.job_id, row.jobs_run, row.heartbeat_at = state, job_id, jobs_run, now
    session.flush()
    return row


def live_workers(*, session: Session, since: datetime) -> list[WorkerProcess]:
    """Workers heard from at or after ``since`` that have not said they stopped, oldest first."""
    query = select(WorkerProcess).where(WorkerProcess.heartbeat_at >= since, WorkerProcess.state != "stopped")
    return list(session.scalars(query.order_by(WorkerProcess.started_at)))


def forget_workers(*, session: Session, before: datetime) -> int:
    """Delete the rows of workers not heard from since ``before``; return how many."""
    rows = session.scalars(select(WorkerProcess).where(WorkerProcess.heartbeat_at < before)).all()
    for row in rows:
        session.delete(row)
    return len(rows)
