"""Migrations: empty → head, 0001 → head with data, models == migrations, beside Optuna's tables."""

from __future__ import annotations

import json
import multiprocessing
import threading

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from zerotune.db.migrate import current, downgrade, head, upgrade
from zerotune.db.migrations import VERSION_TABLE, include_name, include_object
from zerotune.db.models import Base
from zerotune.db.session import make_engine

OUR_TABLES = {"zt_requests", "zt_studies", "zt_trials", "zt_recommendations", "zt_jobs", "zt_workers",
              "zt_calibrations"}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def columns(url: str, table: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {column["name"] for column in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def sql(url: str, statement: str, **params: object) -> list[tuple]:
    """Run one statement in its own transaction and return its rows (if any)."""
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            result = connection.execute(text(statement), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def json_value(value: object) -> object:
    """A JSON column's value as Python: SQLite hands back its text, PostgreSQL the value."""
    return json.loads(value) if isinstance(value, str) else value


def request_specs(url: str) -> list[tuple[str, object]]:
    """Every stored request's key and ``spec``."""
    return [(key, json_value(spec)) for key, spec in sql(url, "SELECT key, spec FROM zt_requests")]


def schema_diff(url: str) -> list:
    """What autogenerate would change to make the database match ``db.models`` (zt_ tables only)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={
                "include_name": include_name, "include_object": include_object, "compare_type": True,
                "version_table": VERSION_TABLE})
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def test_upgrade_empty_database_to_head(empty_url: str) -> None:
    assert current(empty_url) is None
    upgrade(empty_url)
    assert current(empty_url) == head() == "0010"
    assert tables(empty_url) == OUR_TABLES | {VERSION_TABLE}  # and no "alembic_version" of ours
    upgrade(empty_url)  # a second upgrade is a no-op
    assert current(empty_url) == head()


def test_migrations_match_models(empty_url: str) -> None:
    upgrade(empty_url)
    assert schema_diff(empty_url) == []


def test_upgrade_from_previous_revision_keeps_rows(empty_url: str) -> None:
    upgrade(empty_url, "0001")
    assert current(empty_url) == "0001"
    assert "proxy_model" not in columns(empty_url, "zt_trials")
    now = "2025-01-01 00:00:00"
    sql(empty_url, "INSERT INTO zt_requests (id, key, model, cluster, objective, budget, executor, created_at) "
        "VALUES (1, 'k', '{}', '{}', 'tflops', '{}', 'model', :now)", now=now)
    sql(empty_url, "INSERT INTO zt_studies (id, request_id, optuna_study_name, state, sampler, executor, n_trials, "
        "created_at) VALUES (1, 1, 's1', 'done', 'tpe', 'model', 4, :now)", now=now)
    sql(empty_url, "INSERT INTO zt_trials (id, study_id, number, strategy, strategy_key, executor, status, value, "
        "logs, attempts, created_at) VALUES (7, 1, 0, '{\"param_span\": 3}', 'sk', 'model', 'complete', 12.5, "
        "'ok', 1, :now)", now=now)
    sql(empty_url, "INSERT INTO zt_recommendations (study_id, request_key, strategy, metrics, evidence, trial_id, "
        "exports, created_at) VALUES (1, 'k', '{}', '{}', 'predicted', 7, '{}', :now)", now=now)

    upgrade(empty_url, "0002")

    assert current(empty_url) == "0002"
    assert "proxy_model" in columns(empty_url, "zt_trials")
    assert sql(empty_url, "SELECT id, value, logs, proxy_model FROM zt_trials") == [(7, 12.5, "ok", None)]
    sql(empty_url, "UPDATE zt_trials SET proxy_model = '{\"layers\": 2}' WHERE id = 7")

    # And back: the column goes, the rows stay, and (SQLite copies the table) references survive.
    downgrade(empty_url, "0001")
    assert "proxy_model" not in columns(empty_url, "zt_trials")
    assert sql(empty_url, "SELECT id, value FROM zt_trials") == [(7, 12.5)]
    assert sql(empty_url, "SELECT trial_id FROM zt_recommendations") == [(7,)]
    # to 0008: 0003 adds zt_workers, 0004 zt_calibrations and two request columns, 0005 zt_jobs.phase,
    # 0006 zt_requests.emulate (false for the rows already there), 0007 zt_requests.runner (zerotune's),
    # 0008 zt_requests.grad_reduce_in_fp32 (false for the rows already there)
    upgrade(empty_url, "0008")
    assert sql(empty_url, "SELECT key, emulate, runner, grad_reduce_in_fp32 FROM zt_requests") in (
        [("k", 0, "zerotune", 0)], [("k", False, "zerotune", False)])
    # 0009 moves every request field into zt_requests.spec, beside the key: no value is lost, either way
    sql(empty_url, "UPDATE zt_requests SET budget = :budget, global_batch = 64, calibration = 'cal', runner = 'fsdp', "
        "grad_reduce_in_fp32 = :yes", budget='{"trials": 5, "time_s": 30.0}', yes=True)
    upgrade(empty_url)
    assert columns(empty_url, "zt_requests") == {"id", "key", "spec", "created_at"}
    assert request_specs(empty_url) == [("k", {
        "model": {}, "cluster": {}, "objective": "tflops", "executor": "model", "global_batch": 64, "trials": 5,
        "time_budget_s": 30.0, "calibration": "cal", "measure": None, "emulate": False, "runner": "fsdp",
        "grad_reduce_in_fp32": True})]
    assert sql(empty_url, "SELECT id, value FROM zt_trials") == [(7, 12.5)]  # and the rows that refer to it
    downgrade(empty_url, "0008")
    assert "spec" not in columns(empty_url, "zt_requests")
    assert [(key, json_value(budget), *rest) for key, budget, *rest in sql(
        empty_url, "SELECT key, budget, objective, executor, global_batch, calibration, measure, runner FROM "
        "zt_requests")] == [("k", {"trials": 5, "time_s": 30.0}, "tflops", "model", 64, "cal", None, "fsdp")]
    assert sql(empty_url, "SELECT emulate, grad_reduce_in_fp32 FROM zt_requests") in ([(0, 1)], [(False, True)])
    downgrade(empty_url, "0007")
    assert "grad_reduce_in_fp32" not in columns(empty_url, "zt_requests")
    assert sql(empty_url, "SELECT key, runner FROM zt_requests") == [("k", "fsdp")]
    downgrade(empty_url, "0006")
    assert "runner" not in columns(empty_url, "zt_requests") and sql(empty_url, "SELECT key FROM zt_requests") == [
        ("k",)]
    downgrade(empty_url, "0005")
    assert "emulate" not in columns(empty_url, "zt_requests") and sql(empty_url, "SELECT key FROM zt_requests") == [
        ("k",)]
    upgrade(empty_url)
    assert schema_diff(empty_url) == []
    assert sql(empty_url, "SELECT count(*) FROM zt_workers") == [(0,)]
    [(key, spec)] = request_specs(empty_url)  # the columns that 0005-0007 dropped come back at their defaults
    assert (key, spec["calibration"], spec["measure"], spec["runner"], spec["trials"]) == ("k", "cal", None,
                                                                                           "zerotune", 5)
    assert sql(empty_url, "SELECT count(*) FROM zt_calibrations") == [(0,)]
    assert "phase" in columns(empty_url, "zt_jobs")
    downgrade(empty_url, "0004")
    assert "phase" not in columns(empty_url, "zt_jobs") and sql(empty_url, "SELECT key FROM zt_requests") == [("k",)]
    downgrade(empty_url, "0003")
    assert "zt_calibrations" not in tables(empty_url) and "measure" not in columns(empty_url, "zt_requests")
    assert sql(empty_url, "SELECT key FROM zt_requests") == [("k",)]
    downgrade(empty_url, "0002")
    assert "zt_workers" not in tables(empty_url) and sql(empty_url, "SELECT id FROM zt_trials") == [(7,)]


def test_concurrent_upgrades_serialize(empty_url: str) -> None:
    """A server and its workers may all run ``upgrade`` at start-up, as separate processes."""
    processes = [multiprocessing.get_context("fork").Process(target=upgrade, args=(empty_url,)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0, 0, 0]
    assert current(empty_url) == head()
    assert schema_diff(empty_url) == []


def test_upgrade_from_threads(empty_url: str) -> None:
    """Alembic's globals are per process; ``upgrade`` serializes callers within one."""
    errors: list[Exception] = []

    def run() -> None:
        try:
            upgrade(empty_url)
        except Exception as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert current(empty_url) == head()


def test_optuna_tables_coexist(empty_url: str) -> None:
    """Ours before Optuna's, a real migration after them, and a downgrade: neither side is touched."""
    import optuna  # a runtime dependency of zerotune: its tables must coexist with ours
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    upgrade(empty_url, "0001")
    storage = optuna.storages.RDBStorage(empty_url)
    study = optuna.create_study(storage=storage, study_name="coexist", direction="maximize")
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=3)
    optuna_version = sql(empty_url, "SELECT version_num FROM alembic_version")
    assert optuna_version != []

    upgrade(empty_url)  # 0001 -> head (on SQLite batch operations) with Optuna's tables beside ours

    names = tables(empty_url)
    assert OUR_TABLES | {VERSION_TABLE} <= names
    assert {"studies", "trials", "trial_params", "version_info", "alembic_version"} <= names
    assert sql(empty_url, f"SELECT version_num FROM {VERSION_TABLE}") == [(head(),)]
    assert sql(empty_url, "SELECT version_num FROM alembic_version") == optuna_version
    assert schema_diff(empty_url) == []  # autogenerate does not even see Optuna's tables
    assert len(optuna.load_study(study_name="coexist", storage=empty_url).trials) == 3  # a fresh RDBStorage

    downgrade(empty_url, "base")  # drops ours, and only ours
    assert tables(empty_url) & OUR_TABLES == set()
    assert current(empty_url) is None  # Alembic keeps its version table, emptied
    assert sql(empty_url, "SELECT version_num FROM alembic_version") == optuna_version
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=1)
    assert len(study.trials) == 4


def test_optuna_tables_are_created_once_by_racing_processes(empty_url: str) -> None:
    """Workers starting together on a fresh database all prepare Optuna's storage; none fails."""
    import optuna

    from zerotune.db.migrate import prepare_optuna_storage

    upgrade(empty_url)
    processes = [multiprocessing.get_context("fork").Process(target=prepare_optuna_storage, args=(empty_url,))
                 for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    assert {"studies", "trials", "version_info", "alembic_version"} <= tables(empty_url)
    assert schema_diff(empty_url) == []  # ours untouched
    study = optuna.create_study(storage=empty_url, study_name="after-race", direction="maximize")
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=2)
    assert len(optuna.load_study(study_name="after-race", storage=empty_url).trials) == 2
