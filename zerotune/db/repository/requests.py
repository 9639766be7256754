"""Requests: one row per distinct normalized request (its key)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from zerotune.db.models import (
    Request,
    utcnow,
)
from zerotune.db.repository._common import (
    JsonDict,
    _check_key,
    _dialect,
)


def get_or_create_request(*, session: Session, key: str, spec: JsonDict) -> tuple[Request, bool]:
    """The request stored under ``key``, inserting it if new; safe when many callers race.

    Args:
        key: the hash of the normalized request (64 characters at most).
        spec: the normalized request (``TuneRequest.to_dict()``), stored as it is.

    Returns:
        ``(request, created)``; ``created`` is False when an equal request was already stored.
    """
    _check_key("key", key)
    insert = postgresql.insert if _dialect(session) == "postgresql" else sqlite.insert
    stmt = (insert(Request).values(key=key, spec=spec, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["key"]).returning(Request.id))
    created = session.execute(stmt).scalar_one_or_none() is not None
    return session.scalars(select(Request).where(Request.key == key)).one(), created


def get_request(*, session: Session, request_id: int) -> Request | None:
    """The request with id ``request_id``, or None."""
    return session.get(Request, request_id)


def get_request_by_key(*, session: Session, key: str) -> Request | None:
    """The request stored under ``key``, or None."""
    return session.scalars(select(Request).where(Request.key == key)).one_or_none()


def list_requests(*, session: Session) -> list[Request]:
    """Every stored request, oldest first (a warm start looks for the most similar one)."""
    return list(session.scalars(select(Request).order_by(Request.id)))
