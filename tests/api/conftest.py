"""Fixtures for the service tests: a real ``zerotune serve`` (uvicorn) on a free port, real HTTP.

Every process a test starts runs in its own session under a hard deadline and is killed with its
children at the end, whatever happened. Databases: a SQLite file per test, or a fresh PostgreSQL
database per test (dropped afterwards; skipped, with the reason, when no server answers).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.support import ROOT
from tests.support.postgres import fresh_database

# Fast heartbeats and short leases, so that the restart and dead-worker tests wait seconds, not minutes.
FAST = {"ZEROTUNE_VERIFY_QUANTIZED": "false", "ZEROTUNE_HEARTBEAT_S": "0.5", "ZEROTUNE_LEASE_S": "3",
        "ZEROTUNE_STALE_AFTER_S": "4", "ZEROTUNE_POLL_S": "0.2", "ZEROTUNE_WATCH_S": "0.1",
        "ZEROTUNE_SHUTDOWN_GRACE_S": "30", "ZEROTUNE_STEPS": "8", "ZEROTUNE_TRIAL_TIMEOUT_S": "120"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A ``zerotune`` process (service or worker) of a test, with its log file."""

    args: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    nofile: int | None = None
    """The process's open-file limit (``ulimit -n``), when the test sets one."""

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")
        nofile = self.nofile

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen([sys.executable, "-m", "zerotune.api.cli", *self.args], cwd=ROOT, env=self.env,
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=limit if nofile is not None else None)
        out.close()
        return self

    def wait_ready(self, timeout: float = 90.0, path: str = "/readyz") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"zerotune {self.args[0]} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"zerotune {self.args[0]} not ready in {timeout} s:\n{self.tail()}")

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        pytest.fail(f"{text!r} not in the log of zerotune {self.args[0]} after {timeout} s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Signal the process; wait; kill its whole session if it lingers. Returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        return self.proc.returncode

    def kill_group(self) -> None:
        """SIGKILL everything left in this process's session (its workers and their torchrun ranks)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL always ends it
            pass


class Launcher:
    """Starts services and workers for one test and cleans them all up."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[Proc] = []
        self.base_env = {**os.environ, **FAST, "ZEROTUNE_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT),
                         "PYTHONUNBUFFERED": "1"}
        self.base_env.pop("ZEROTUNE_TOKEN", None)
        self.base_env.pop("ZEROTUNE_DB", None)

    def serve(self, db: str | None, workers: int = 1, port: int | None = None, ready: bool = True,
              nofile: int | None = None, **env: str) -> Proc:
        """``zerotune serve`` on ``db`` (None: the database ``ZEROTUNE_DB`` or ``ZEROTUNE_DB_FILE`` in ``env`` names,
        no ``--db``), under an open-file limit of ``nofile`` when given."""
        port = port or free_port()
        p = Proc(["serve", "--port", str(port), *(["--db", db] if db is not None else []), "--workers", str(workers)],
                 self.tmp_path / f"serve-{len(self.procs)}.log", {**self.base_env, **env}, nofile=nofile)
        p.url = f"http://127.0.0.1:{port}"
        self.procs.append(p.start())
        if ready:
            p.wait_ready()
        return p

    def worker(self, db: str, **env: str) -> Proc:
        p = Proc(["worker", "--db", db], self.tmp_path / f"worker-{len(self.procs)}.log", {**self.base_env, **env})
        self.procs.append(p.start())
        return p

    def close(self) -> None:
        for p in self.procs:
            p.stop(timeout=30)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'zerotune.sqlite'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    with fresh_database("zt_api") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


def rows(url: str, sql: str, **params: object) -> list[tuple]:
    """Read the database directly (what the service stored, not what it says)."""
    from zerotune.db.session import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(sql), params)]
    finally:
        engine.dispose()


def wait_job(url: str, job_id: int, timeout: float = 120.0, states: tuple[str, ...] = ("done", "failed", "cancelled"),
             ) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    pytest.fail(f"job {job_id} still {job.get('state')} after {timeout} s: {job}")


TOKEN = "test-token-4b1d"


@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One service for the light tests (validation, auth, fuzzing): a token is set, no worker runs jobs,
    and ?wait holds a request 1 s at most."""
    tmp = tmp_path_factory.mktemp("api-server")
    launcher = Launcher(tmp)
    try:
        server = launcher.serve(f"sqlite:///{tmp / 'zerotune.sqlite'}", workers=0, ZEROTUNE_TOKEN=TOKEN,
                                ZEROTUNE_WAIT_MAX_S="1")
        server.extra = {"Authorization": f"Bearer {TOKEN}"}
        yield server
    finally:
        launcher.close()
