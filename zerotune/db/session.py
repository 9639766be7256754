"""Engines and sessions, built from a URL on demand (no module-level engine).

SQLite is the default: one file under the user's data dir, in WAL mode so readers (the
dashboard) never block the writer (a worker). PostgreSQL is for several workers on several
machines. Typical use::

    engine = make_engine(url)                      # url=None: the default SQLite file
    factory = make_session_factory(engine)
    with session_scope(factory) as session:
        ...                                        # committed on exit, rolled back on error
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from zerotune.errors import UsageError

DATA_DIR_ENV = "ZEROTUNE_DATA_DIR"
SQLITE_FILENAME = "zerotune.sqlite"
SQLITE_BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another's lock before "database is locked"


def data_dir() -> Path:
    """The directory holding zerotune's local data (``$ZEROTUNE_DATA_DIR`` or ``~/.local/share/zerotune``)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "zerotune"


def default_url() -> str:
    """The URL of the default SQLite database, creating its directory if needed.

    Returns:
        ``sqlite:///<data dir>/zerotune.sqlite`` with an absolute path.
    """
    directory = data_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(directory / SQLITE_FILENAME).resolve()}"


def normalize_url(url: str | None = None) -> str:
    """``url`` as zerotune uses it: ``None`` → :func:`default_url`; a bare ``postgresql://`` (or
    ``postgres://``) gets the psycopg 3 driver that zerotune installs, instead of SQLAlchemy's
    default psycopg2. Pass the result to Optuna too, so both open the database the same way. A value that
    is no URL (a bare file path) is a ``UsageError`` naming the URL it should have been."""
    if url is None:
        return default_url()
    try:
        parsed = make_url(url)
    except ArgumentError:
        example = f"sqlite:///{Path(url).expanduser().resolve()}" if url.strip() else "sqlite:///<absolute path>"
        raise UsageError("db", url, f"not a database URL: a SQLite file is written {example}, a PostgreSQL "
                                    "database postgresql://user@host/dbname") from None
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    return url


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Per-connection SQLite settings: WAL, enforced foreign keys, a busy timeout."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")  # persistent in the file; harmless on :memory:
        cursor.execute("PRAGMA foreign_keys=ON")  # SQLite ignores REFERENCES unless told
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # the recommended pairing with WAL
    finally:
        cursor.close()


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """Build an engine for ``url`` with zerotune's per-backend settings.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path``, ``postgresql://user@host/db``); see
            :func:`normalize_url` (``None`` means the default SQLite file).
        **kwargs: passed on to :func:`sqlalchemy.create_engine`.

    Returns:
        The engine. SQLite connections run in WAL mode with ``foreign_keys=ON`` and a 30 s busy
        timeout; PostgreSQL connections are pinged before use (``pool_pre_ping``) so a restarted
        server does not fail the first request.
    """
    url = normalize_url(url)
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, **kwargs.pop("connect_args", {})}
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _set_sqlite_pragmas)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory bound to ``engine``; loaded rows stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: yield a session, commit on success, roll back on any error, always close."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def url_of(factory: sessionmaker[Session]) -> str:
    """The URL ``factory``'s engine connects to, password included: for a library that opens its own engine on
    the same database (Optuna's RDB storage)."""
    engine: Engine = factory.kw["bind"]
    return engine.url.render_as_string(hide_password=False)
