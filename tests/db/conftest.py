"""Database fixtures: a fresh SQLite file or PostgreSQL schema per test (or per module).

PostgreSQL tests run against the server at ``ZEROTUNE_TEST_PG_URL`` (default: the local
``postgres`` user, database ``test``): the run creates a ``zt_test_<random>`` database there,
gives each test its own schema in it, and drops it all at the end. They are skipped, with the
reason, only when the server cannot be reached.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, delete, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from zerotune.db.migrate import upgrade
from zerotune.db.models import Base
from zerotune.db.session import make_engine, make_session_factory

PG_ADMIN_URL = os.environ.get("ZEROTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_database() -> Iterator[Engine]:
    """A fresh ``zt_test_<random>`` database for this test run (autocommit engine on it), or skip."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:  # any failure to connect means "no server here"
        admin.dispose()
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_URL} ({type(error).__name__}: {error}); "
                    "start it or set ZEROTUNE_TEST_PG_URL")
    name = f"zt_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(make_url(PG_ADMIN_URL).set(database=name), isolation_level="AUTOCOMMIT")
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _fresh_pg_schema(database: Engine) -> Iterator[str]:
    """The URL of a new, empty schema in the test database: every connection made from it (ours
    and Optuna's alike) sees that schema only. Commits skip the fsync wait: nothing here needs to
    survive a crash, and it keeps the tests fast on slow disks."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with database.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    options = f"-csearch_path={schema} -csynchronous_commit=off"
    try:
        yield database.url.update_query_dict({"options": options}).render_as_string(hide_password=False)
    finally:
        with database.connect() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def _url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'zerotune.sqlite'}"
    else:
        yield from _fresh_pg_schema(request.getfixturevalue("pg_database"))


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of an empty database, once per backend; fresh for every test."""
    yield from _url(request, tmp_path_factory)


@pytest.fixture(params=BACKENDS, scope="module")
def migrated_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a database migrated to head, once per backend, shared by a test module."""
    for url in _url(request, tmp_path_factory):
        upgrade(url)
        yield url


@pytest.fixture
def factory(migrated_url: str) -> Iterator[sessionmaker[Session]]:
    """A session factory on the migrated database; every ``zt_`` row is deleted after the test."""
    engine = make_engine(migrated_url)
    yield make_session_factory(engine)
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(delete(table))
    engine.dispose()
