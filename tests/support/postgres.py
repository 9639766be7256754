"""PostgreSQL for tests: the server at ``ZEROTUNE_TEST_PG_URL`` (default: the local one, trust auth,
database ``test``). A test gets a database of its own, dropped afterwards; without a server the test
skips with the reason (fails under CI=true, which provides one)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from tests.support import unavailable

PG_ADMIN_URL = os.environ.get("ZEROTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def admin_engine() -> Engine:
    """An autocommit engine on the admin database; without a server the test skips (fails under CI=true)."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to connect means "no server here"
        admin.dispose()
        unavailable(f"PostgreSQL is unreachable at {PG_ADMIN_URL} ({type(exc).__name__}: {exc}); "
                    "start it or set ZEROTUNE_TEST_PG_URL")
    return admin


@contextmanager
def fresh_database(prefix: str = "zt_test") -> Iterator[str]:
    """The URL of a new, empty database ``<prefix>_<random>``, dropped (with its connections) afterwards."""
    admin = admin_engine()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
