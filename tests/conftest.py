"""Shared fixtures: run real torchrun jobs from tests, under a hard timeout; a one-node Slurm cluster for the
session. Under ``CI=true`` a session in which any test was skipped fails, naming each skip and its reason: CI
provides every real dependency, so a skip there is a test that did not run."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import LocalSlurm, unavailable_reason
from tests.support import unavailable
from tests.support.ranks import run_ranks

_SKIPS: list[pytest.TestReport | pytest.CollectReport] = []


@pytest.fixture(scope="session")
def ranks_runner(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict]]:
    def run(nproc: int, script: Path, args: list[str], timeout_s: float = 240.0) -> list[dict]:
        return run_ranks(nproc, script, args, tmp_path_factory.mktemp(script.stem), timeout_s)
    return run


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """A one-node Slurm cluster on this machine for the session (``unavailable`` when it cannot be started)."""
    reason = unavailable_reason()
    if reason:
        unavailable(f"no local Slurm: {reason}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped at import (a module-level pytest.skip or importorskip)
        _SKIPS.append(report)


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: why")
        return report.longrepr[2].removeprefix("Skipped: ")
    return str(report.longrepr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _in_ci() and _SKIPS and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not (_in_ci() and _SKIPS):
        return
    terminalreporter.section("skipped under CI=true", sep="=", red=True, bold=True)
    for report in _SKIPS:
        terminalreporter.line(f"{report.nodeid}: {_reason(report)}")
    count = len(_SKIPS)
    terminalreporter.line(f"{count} test{'s' if count != 1 else ''} skipped: CI must run every test, so the run "
                          "fails", red=True, bold=True)
