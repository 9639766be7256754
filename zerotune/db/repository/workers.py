"""Workers: the processes that run jobs, as they last reported themselves."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from zerotune.db.models import (
    WORKER_STATES,
    WorkerProcess,
)
from zerotune.db.repository._common import (
    _check,
    _now,
)


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
