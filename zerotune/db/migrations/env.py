"""Alembic environment for zerotune's own tables — and only those (see ``zerotune/db/migrations/__init__.py``).

Run it through :mod:`db.migrate`, which hands over an open connection in
``config.attributes["connection"]``; with only ``sqlalchemy.url`` set (the ``alembic`` command
line) an engine is built from the URL here.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, text

from zerotune.db.migrations import VERSION_TABLE, include_name, include_object
from zerotune.db.models import Base
from zerotune.db.session import make_engine

# Key of the PostgreSQL advisory lock that serializes concurrent upgrades (a server and its
# workers may all start at once); any fixed 64-bit number unlikely to be used by others.
PG_MIGRATION_LOCK = 0x7A74_6D69_6772

CONFIGURE_OPTS: dict[str, Any] = {
    "target_metadata": Base.metadata,
    "version_table": VERSION_TABLE,
    "include_name": include_name,
    "include_object": include_object,
    "render_as_batch": True,  # SQLite can ALTER little: batch mode copies the table instead
    "compare_type": True,
}


def run_migrations_offline() -> None:
    """Emit the SQL for ``alembic upgrade --sql`` without connecting."""
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), literal_binds=True, **CONFIGURE_OPTS)
    with context.begin_transaction():
        context.run_migrations()


def run_on_connection(connection: Connection) -> None:
    """Run the migrations on ``connection`` as one transaction that excludes other migrators.

    SQLite: foreign keys are switched off first (a batch table copy drops the old table, which
    would fire ON DELETE actions on the rows referring to it), and ``BEGIN IMMEDIATE`` takes the
    write lock up front so a second migrator waits and then finds the schema already current.
    PostgreSQL: DDL is transactional; an advisory lock does the same serializing.
    """
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # only takes effect outside a transaction
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        context.configure(connection=connection, **CONFIGURE_OPTS)
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK})
            context.run_migrations()
            if sqlite:
                problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if problems:  # roll back rather than commit a schema with broken references
                    raise RuntimeError(f"migration left rows with dangling foreign keys: {problems[:5]}")
        connection.commit()
    finally:
        if sqlite:
            connection.rollback()  # no-op after the commit; ends the transaction after an error
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on one opened from ``sqlalchemy.url``."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_on_connection(connection)
        return
    engine = make_engine(context.config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as connection:
            run_on_connection(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
