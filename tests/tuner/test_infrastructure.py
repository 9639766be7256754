"""Which exceptions are faults of the infrastructure: real ones, raised by the drivers and wrapped as Optuna and
SQLAlchemy wrap them."""

from __future__ import annotations

import sqlite3

import optuna
import psycopg
import pytest
from sqlalchemy import create_engine, exc, text

from tests.support.postgres import fresh_database
from zerotune.db.session import make_engine
from zerotune.tuner import infrastructure
from zerotune.tuner.infrastructure import fault


def wrapped_by_optuna(error: BaseException) -> optuna.exceptions.StorageInternalError:
    """``error`` raised inside Optuna's storage session, as it reaches a study: StorageInternalError from it."""
    try:
        try:
            raise error
        except exc.SQLAlchemyError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as outer:
        return outer


def test_a_terminated_postgresql_connection_is_infrastructure():
    with fresh_database("zt_infra") as url:
        victim, killer = make_engine(url), make_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with victim.connect() as c:
                pid = c.execute(text("SELECT pg_backend_pid()")).scalar_one()
                with killer.connect() as k:
                    k.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                with pytest.raises(exc.OperationalError) as caught:
                    c.execute(text("SELECT 1"))
        finally:
            victim.dispose()
            killer.dispose()
    assert caught.value.connection_invalidated
    named = fault(wrapped_by_optuna(caught.value))
    assert named is not None and named.startswith("psycopg."), named
    assert "terminating connection due to administrator command" in named or "closed" in named, named


def test_a_refused_connection_and_sqlstates_of_the_infrastructure():
    refused = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(exc.OperationalError) as caught:
        refused.connect()
    assert fault(caught.value) is not None
    for cls in (psycopg.errors.AdminShutdown, psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
                psycopg.errors.QueryCanceled, psycopg.errors.TooManyConnections, psycopg.errors.DiskFull,
                psycopg.errors.CannotConnectNow, psycopg.errors.LockNotAvailable):
        assert fault(wrapped_by_optuna(exc.OperationalError("SELECT 1", {}, cls("x")))) is not None, cls
    assert fault(ConnectionResetError(104, "Connection reset by peer")) == \
        "builtins.ConnectionResetError: [Errno 104] Connection reset by peer"
    assert fault(BrokenPipeError()) is not None


def test_the_works_own_failures_are_not_infrastructure(tmp_path):
    for cls in (psycopg.errors.UniqueViolation, psycopg.errors.StringDataRightTruncation,
                psycopg.errors.UndefinedTable, psycopg.errors.DivisionByZero):
        assert fault(wrapped_by_optuna(exc.IntegrityError("INSERT", {}, cls("x")))) is None, cls
    # Optuna's wrapper alone ("invalid data in the commit") names no fault of its own
    assert fault(optuna.exceptions.StorageInternalError("An exception is raised during the commit.")) is None
    engine = make_engine(f"sqlite:///{tmp_path / 'z.sqlite'}")
    with engine.connect() as c, pytest.raises(exc.OperationalError) as caught:
        c.execute(text("SELECT * FROM no_such_table"))
    assert fault(caught.value) is None  # a query the work got wrong
    for error in (ValueError("bad"), RuntimeError("executor bug"), KeyError("x"), TimeoutError("run timed out")):
        assert fault(error) is None


def test_a_locked_sqlite_database_is_infrastructure(tmp_path):
    path = tmp_path / "locked.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.1})
    try:
        with engine.connect() as c, pytest.raises(exc.OperationalError) as caught:
            c.execute(text("INSERT INTO t VALUES (1)"))
    finally:
        holder.close()
        engine.dispose()
    assert fault(caught.value) == "sqlite3.OperationalError: database is locked"


def test_backoff_doubles_up_to_half_a_minute():
    assert [infrastructure.backoff_s(a) for a in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert sum(infrastructure.backoff_s(a) for a in range(1, infrastructure.JOB_ATTEMPTS)) >= 60
