"""Engines, sessions, the default location, and what importing ``db`` costs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.support import ROOT
from zerotune.db.session import default_url, make_engine, make_session_factory, normalize_url, session_scope


def test_default_url_is_a_sqlite_file_in_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path / "data"))
    assert default_url() == f"sqlite:///{tmp_path / 'data' / 'zerotune.sqlite'}"
    assert (tmp_path / "data").is_dir()
    monkeypatch.delenv("ZEROTUNE_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_url() == f"sqlite:///{tmp_path / 'home' / '.local' / 'share' / 'zerotune' / 'zerotune.sqlite'}"


def test_normalize_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROTUNE_DATA_DIR", str(tmp_path))
    assert normalize_url(None) == default_url()
    assert normalize_url("postgresql://u:p%40ss@db:5432/zt") == "postgresql+psycopg://u:p%40ss@db:5432/zt"
    assert normalize_url("postgres://db/zt") == "postgresql+psycopg://db/zt"
    assert normalize_url("postgresql+psycopg://db/zt") == "postgresql+psycopg://db/zt"
    assert normalize_url("sqlite:///x.sqlite") == "sqlite:///x.sqlite"


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'z.sqlite'}")
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
    engine.dispose()


def test_postgresql_engine_pings_before_use() -> None:
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:5432/test")  # builds no connection
    assert engine.pool._pre_ping
    engine.dispose()


def test_session_scope_commits_or_rolls_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'z.sqlite'}")
    factory = make_session_factory(engine)
    with session_scope(factory) as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
        session.execute(text("INSERT INTO t VALUES (1)"))
    with pytest.raises(RuntimeError, match="boom"), session_scope(factory) as session:
        session.execute(text("INSERT INTO t VALUES (2)"))
        raise RuntimeError("boom")
    with session_scope(factory) as session:
        assert session.execute(text("SELECT x FROM t")).scalars().all() == [1]
    engine.dispose()


def test_importing_db_pulls_in_neither_torch_nor_the_other_packages() -> None:
    code = ("import sys, zerotune.db.models, zerotune.db.session, zerotune.db.repository, zerotune.db.migrate; "
            "print(sorted({'torch', 'zerotune.core', 'zerotune.costmodel', 'zerotune.trainer', 'zerotune.tuner', "
            "'zerotune.api'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == "[]"
