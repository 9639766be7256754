"""Studies: one Optuna study per request, and its state."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from zerotune.db.models import (
    STUDY_STATES,
    Study,
)
from zerotune.db.repository._common import (
    TERMINAL_STUDY_STATES,
    _check,
    _get,
    _now,
    _page,
)


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


def studies_of_request(*, session: Session, request_id: int) -> list[Study]:
    """A request's studies, oldest first (a failed study is followed by a new one)."""
    return list(session.scalars(select(Study).where(Study.request_id == request_id).order_by(Study.id)))
