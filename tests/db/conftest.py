"""Database fixtures: a fresh SQLite file or PostgreSQL schema per test (or per module).

PostgreSQL tests run against the server at ``ZEROTUNE_TEST_PG_URL`` (default: the local
``postgres`` user, database ``test``): the run creates a ``zt_test_<random>`` database there,
gives each test its own schema in it, and drops it all at the end. They are skipped, with the
reason, only when the server cannot be reached.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, delete, text
from sqlalchemy.orm import Session, sessionmaker

from tests.support.postgres import fresh_database
from zerotune.db.migrate import upgrade
from zerotune.db.models import Base
from zerotune.db.session import make_engine, make_session_factory

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def pg_database() -> Iterator[Engine]:
    """A fresh ``zt_test_<random>`` database for this test run (autocommit engine on it), or skip."""
    with fresh_database("zt_test") as url:
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            yield engine
        finally:
            engine.dispose()


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
