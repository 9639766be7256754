"""Schema migrations, run from Python: what ``zerotune db upgrade`` and the tests call.

Alembic is configured here in code (no ``alembic.ini``); the revisions live in
``zerotune/db/migrations/versions`` and are recorded in the ``zt_alembic_version`` table, apart from
Optuna's own ``alembic_version``. Usage::

    from zerotune.db.migrate import upgrade, current
    upgrade(url)            # to the newest revision; a no-op when already there
    current(url)            # "0002", or None for a database never migrated

Developers: ``python -m zerotune.db.migrate upgrade|downgrade|current|heads [revision] [--url URL]``.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.pool import NullPool

from zerotune.db.migrations import VERSION_TABLE
from zerotune.db.session import make_engine, normalize_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Alembic's ``context``/``op`` proxies are process-wide globals: one migration per process at a time.
# (Across processes the database serializes them; see migrations/env.py.)
_ALEMBIC_LOCK = threading.Lock()
PG_OPTUNA_LOCK = 0x7A74_6F70_7475  # advisory lock key serializing the creation of Optuna's tables


def alembic_config(url: str | None = None) -> Config:
    """An Alembic ``Config`` for zerotune's migrations, built in code.

    Args:
        url: the database URL; ``None`` means the default SQLite file.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser treats "%" as interpolation: a URL-encoded password needs it doubled.
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def _run(url: str | None, action: Callable[[Config], None], engine: Engine | None = None) -> None:
    """Run an Alembic command on one connection of ``engine``, else of a throw-away engine on ``url``."""
    config = alembic_config(str(engine.url) if engine is not None else url)
    own = engine is None
    engine = make_engine(url, poolclass=NullPool) if engine is None else engine
    try:
        with _ALEMBIC_LOCK, engine.connect() as connection:
            config.attributes["connection"] = connection
            action(config)
    finally:
        if own:
            engine.dispose()


def upgrade(url: str | None = None, revision: str = "head", *, engine: Engine | None = None) -> None:
    """Migrate the database at ``url`` (or behind ``engine``: an in-memory one, say) up to ``revision``,
    creating our tables in an empty one.

    Safe to call from several processes at once: the second waits for the first and then finds
    nothing to do. Optuna's tables in the same database are never touched.
    """
    _run(url, lambda config: command.upgrade(config, revision), engine)


def prepare_optuna_storage(url: str | None = None, attempts: int = 10) -> None:
    """Create Optuna's tables in the database at ``url`` once, before any study runs.

    Optuna creates its schema lazily in ``RDBStorage.__init__``; workers starting together on a
    fresh database race there (PostgreSQL refuses the second ``CREATE TYPE``). On PostgreSQL the
    creation runs under a session advisory lock, so the others wait and then find the tables; on
    SQLite the file lock serializes writers and a rare lost race is retried. Optuna owns those
    tables (and its own ``alembic_version``): our migrations never touch them.
    """
    import time

    import optuna
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    url = normalize_url(url)
    engine = make_engine(url, poolclass=NullPool)
    try:
        for attempt in range(attempts):
            try:
                with engine.connect() as connection:
                    postgres = connection.dialect.name == "postgresql"
                    if postgres:
                        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_OPTUNA_LOCK})
                    try:
                        optuna.storages.RDBStorage(url).remove_session()
                    finally:
                        if postgres:
                            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_OPTUNA_LOCK})
                            connection.commit()
                return
            except SQLAlchemyError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
    finally:
        engine.dispose()


def downgrade(url: str | None, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` drops all our tables)."""
    _run(url, lambda config: command.downgrade(config, revision))


def current(url: str | None = None) -> str | None:
    """The revision the database at ``url`` is at, or ``None`` if it was never migrated."""
    engine = make_engine(url, poolclass=NullPool)
    try:
        return revision_of(engine)
    finally:
        engine.dispose()


def revision_of(engine: Engine) -> str | None:
    """The revision of the database behind ``engine`` (a round trip: it raises when the database is down)."""
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def has_optuna_tables(engine: Engine) -> bool:
    """Whether Optuna's RDB storage tables exist (a study has been run on this database)."""
    return inspect(engine).has_table("studies")


def head() -> str:
    """The newest revision this code knows (what :func:`upgrade` goes to by default)."""
    revision = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert revision is not None, "zerotune/db/migrations/versions holds no revision"
    return revision


def is_current(url: str | None = None) -> bool:
    """Whether the database at ``url`` is at :func:`head` (for health checks and startup)."""
    return current(url) == head()


def main(argv: list[str] | None = None) -> int:
    """``python -m zerotune.db.migrate``: a small developer entry point."""
    parser = argparse.ArgumentParser(prog="python -m zerotune.db.migrate", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["upgrade", "downgrade", "current", "heads"])
    parser.add_argument("revision", nargs="?", default=None, help='target revision (upgrade: default "head")')
    parser.add_argument("--url", default=None, help="database URL (default: the SQLite file in the data dir)")
    args = parser.parse_args(argv)
    if args.action == "upgrade":
        upgrade(args.url, args.revision or "head")
    elif args.action == "downgrade":
        if args.revision is None:
            parser.error("downgrade needs a target revision, e.g. 0001 or base")
        downgrade(args.url, args.revision)
    print(current(args.url) if args.action != "heads" else head())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
