"""Jobs: the queue of work the service hands to workers, from queued to done."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from zerotune.db.models import (
    JOB_STATES,
    Job,
    Request,
)
from zerotune.db.repository._common import (
    ACTIVE_JOB_STATES,
    TERMINAL_JOB_STATES,
    NotFoundError,
    _check,
    _dialect,
    _get,
    _now,
    _refreshed,
)


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
    lock = update(Request).where(Request.id == request_id).values(key=Request.key).returning(Request.id)
    if session.execute(lock).scalar_one_or_none() is None:
        raise NotFoundError("request", request_id)
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


def stamp_job(*, session: Session, job_id: int, owner: str, now: datetime | None = None, **values: Any) -> bool:
    """Report on the running job of worker ``owner`` (a heartbeat, progress, a phase) with ``values``.

    Returns:
        False when the job is no longer ``owner``'s to run (cancelled, re-queued, taken over): the
        worker should stop it. Nothing is written then.
    """
    stmt = (update(Job).where(Job.id == job_id, Job.worker == owner, Job.state == "running")
            .values(**{"heartbeat_at": _now(now), **values}).returning(Job.id))
    return session.execute(stmt).scalar_one_or_none() is not None


def end_job(*, session: Session, job_id: int, owner: str, state: str, error: str | None = None,
            now: datetime | None = None) -> str:
    """End the running job of worker ``owner``: ``done``, ``failed`` (with ``error``) or ``queued`` (handed
    back, to be run again by any worker). Returns the job's state afterwards — another one when the job
    was no longer ``owner``'s (cancelled meanwhile), ``gone`` when it no longer exists."""
    now = _now(now)
    values: dict[str, Any] = {"state": _check("state", state, ("done", "failed", "queued")), "error": error}
    if state == "done":
        values.update(progress=1.0, phase=None, finished_at=now)
    elif state == "failed":
        values.update(finished_at=now, error=(error or "failed")[:4000])
    else:
        values.update(worker=None, heartbeat_at=None, started_at=None, phase=None)
    if stamp_job(session=session, job_id=job_id, owner=owner, now=now, **values):
        return state
    job = session.get(Job, job_id, populate_existing=True)
    return job.state if job is not None else "gone"


def requeue_stale_jobs(*, session: Session, before: datetime, reason: str, max_runner_deaths: int | None = None,
                       now: datetime | None = None) -> list[tuple[int, str]]:
    """Hand back running jobs whose worker stopped heartbeating before ``before`` (it died or hung), each with
    ``reason``, counting the death on the job; a job that heartbeats meanwhile is left alone. The job whose
    runner has died ``max_runner_deaths`` times (None: no cap) ends ``failed`` instead, its error naming the
    deaths and the last one's cause: a job that kills every worker that runs it (the host's memory, a crash of
    the process) does not go round the queue for ever. Returns (job id, ``queued`` or ``failed``) of each."""
    ended = []
    for job in stale_jobs(session=session, before=before):
        deaths = job.runner_deaths + 1
        values: dict[str, Any] = {"worker": None, "heartbeat_at": None, "runner_deaths": deaths}
        if max_runner_deaths is not None and deaths >= max_runner_deaths:
            values.update(state="failed", finished_at=_now(now), phase=None,
                          error=(f"gave up after its runner died {deaths} times without ending it (at most "
                                 f"{max_runner_deaths}: ZEROTUNE_JOB_MAX_RUNNER_DEATHS); the last: {reason}")[:4000])
        else:
            values.update(state="queued", error=reason)
        done = session.execute(update(Job).where(Job.id == job.id, Job.state == "running",
                                                 Job.runner_deaths == job.runner_deaths,
                                                 or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < before))
                               .values(**values).returning(Job.id))
        if done.scalar_one_or_none() is not None:
            ended.append((job.id, values["state"]))
    return ended


def cancel_job(*, session: Session, job_id: int, reason: str, now: datetime | None = None) -> Job:
    """Cancel a queued or running job (its worker stops after the current trial).

    Raises:
        NotFoundError: no such job. ValueError: the job has already ended (its state says how).
    """
    done = session.execute(update(Job).where(Job.id == job_id, Job.state.in_(ACTIVE_JOB_STATES))
                           .values(state="cancelled", error=reason, finished_at=_now(now)).returning(Job.id))
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFoundError("job", job_id)
    if done.scalar_one_or_none() is None:
        raise ValueError(f"job {job_id} has already ended ({job.state}); nothing to cancel")
    return job


def job_summaries(*, session: Session, job_ids: Iterable[int]) -> list[tuple[int, str, int, str | None, int | None,
                                                                            str | None]]:
    """(id, state, trials_done, phase, study_id, error) of each job: what a waiter watches, in one query."""
    rows = session.execute(select(Job.id, Job.state, Job.trials_done, Job.phase, Job.study_id, Job.error)
                           .where(Job.id.in_(tuple(job_ids))))
    return [tuple(row) for row in rows]  # type: ignore[misc]


def latest_job_of_study(*, session: Session, study_id: int) -> Job | None:
    """The newest job that ran (or runs) ``study_id``; None for a study made by ``zerotune tune``."""
    return session.scalars(select(Job).where(Job.study_id == study_id).order_by(Job.id.desc()).limit(1)).first()


def waiting_jobs(*, session: Session, limit: int = 50) -> list[Job]:
    """Queued or running jobs whose study does not exist yet (no worker has started them)."""
    return list(session.scalars(select(Job).where(Job.state.in_(ACTIVE_JOB_STATES), Job.study_id.is_(None))
                                .order_by(Job.id).limit(limit)))


def job_counts(*, session: Session) -> dict[str, int]:
    """Jobs per state."""
    return {str(k): int(v) for k, v in session.execute(select(Job.state, func.count()).group_by(Job.state))}


def stale_jobs(*, session: Session, before: datetime) -> list[Job]:
    """Running jobs whose last heartbeat is older than ``before`` (their worker is presumed dead)."""
    query = select(Job).where(Job.state == "running", or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < _now(before)))
    return list(session.scalars(query.order_by(Job.id)))


# -- workers -------------------------------------------------------------------------------------
