"""What every repository module shares: the error, JSON clean-up, argument checks, paging, time."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from zerotune.db.models import (
    utcnow,
)
from zerotune.errors import NotFoundError

Row = TypeVar("Row")
JsonDict = dict[str, Any]
JsonObject = Mapping[str, Any]
"""What a caller hands over to be stored as a JSON object: any mapping (the run.json and prediction records of
``zerotune.core.records`` included, which the database layer does not import)."""

TERMINAL_STUDY_STATES = ("done", "failed", "cancelled")
TERMINAL_TRIAL_STATUSES = ("complete", "failed", "pruned", "infeasible")
TERMINAL_JOB_STATES = ("done", "failed", "cancelled")
ACTIVE_JOB_STATES = ("queued", "running")


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
        raise NotFoundError(model.__name__.lower(), row_id)
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


def _refreshed(session: Session, stmt: Any) -> Any:
    """Run an UPDATE ... RETURNING of ORM rows and return the row it changed, refreshed, or None."""
    return session.scalars(stmt, execution_options={"populate_existing": True}).one_or_none()
