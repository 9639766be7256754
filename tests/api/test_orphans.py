"""No trial outlives its runner: a worker stopped by SIGTERM ends its running trial and hands the job back;
a worker or service killed with SIGKILL takes its trial's torchrun and ranks with it (parent-death signals).
Restarted, the service finishes the job: the budget's trials complete, none is stored twice, and the trial
that was cut short is recorded as interrupted and its point run again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import rows, wait_job

HANG = {"ZEROTUNE_FAULT": "hang@1:2", "ZEROTUNE_SHUTDOWN_GRACE_S": "10"}
BODY = {"model": "gpt-tiny", "cluster": "local:2x2", "executor": "local", "budget": {"trials": 1}}
QUICK_RECOVERY = {"ZEROTUNE_STALE_AFTER_S": "5", "ZEROTUNE_LEASE_S": "3", "ZEROTUNE_HEARTBEAT_S": "1"}


def completes_after_restart(sqlite_url: str, launcher, job_id: int, server=None) -> None:
    """The job finishes with the budget's trials complete: on ``server`` (whose restarted worker takes it
    over) or on a fresh service on the same database (no fault)."""
    server = server or launcher.serve(sqlite_url, **QUICK_RECOVERY)
    job = wait_job(server.url, job_id, timeout=300)
    assert job["state"] == "done", job
    trials = rows(sqlite_url, "SELECT id, number, status, reason FROM zt_trials ORDER BY id")
    numbers = [number for _, number, _, _ in trials]
    assert len(numbers) == len(set(numbers)), trials  # no Optuna trial stored (or run) twice
    assert sum(status == "complete" for _, _, status, _ in trials) == BODY["budget"]["trials"], trials
    cut_short = [t for t in trials if t[2] == "failed"]
    assert all((reason or "").startswith("interrupted: ") and reason.endswith("; run again")
               for _, _, _, reason in cut_short), trials  # the only failure: the cut-short trial, run again


def trial_processes(under: Path) -> dict[int, str]:
    """pid -> argv of every process running a short run (torchrun or a rank) whose files are under ``under``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "zerotune.trainer.train" in argv and str(under) in argv and state != "Z":
            found[int(entry.name)] = argv
    return found


def wait_for_ranks(under: Path, timeout: float = 90.0) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = trial_processes(under)
        if sum("torch.distributed.run" not in a for a in procs.values()) >= 4:  # the 4 ranks are up
            return procs
        time.sleep(0.2)
    pytest.fail(f"no trial ranks under {under} after {timeout} s")


def running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie; a process that exits while we read it counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = {p for p in pids if running(p)}
        if not alive:
            return set()
        time.sleep(0.2)
    return alive


@pytest.mark.timeout(480)
def test_sigterm_of_the_service_ends_the_running_trial(sqlite_url, launcher):
    server = launcher.serve(sqlite_url, **HANG, **QUICK_RECOVERY)
    r = httpx.post(f"{server.url}/v1/recommendations", json=BODY, timeout=30)
    assert r.status_code == 202, r.text
    procs = wait_for_ranks(launcher.tmp_path)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    left = wait_gone(set(procs), timeout=30)
    assert not left, f"orphaned after SIGTERM: {[procs[p] for p in left]}"
    server.proc.wait(timeout=30)
    completes_after_restart(sqlite_url, launcher, r.json()["id"])


@pytest.mark.timeout(480)
@pytest.mark.parametrize("who", ["worker", "service"])
def test_sigkill_takes_the_trial_with_it(sqlite_url, launcher, who, tmp_path):
    # the hang strikes once: the worker the service restarts retries the trial, and it runs clean
    struck = tmp_path / "struck"
    server = launcher.serve(sqlite_url, **HANG, **QUICK_RECOVERY, ZEROTUNE_FAULT_ONCE=str(struck))
    r = httpx.post(f"{server.url}/v1/recommendations", json=BODY, timeout=30)
    assert r.status_code == 202, r.text
    procs = wait_for_ranks(launcher.tmp_path)
    deadline = time.monotonic() + 90
    while not struck.exists() and time.monotonic() < deadline:  # kill it mid-trial: a rank hangs in step 2
        time.sleep(0.2)
    assert struck.exists(), "the injected hang never struck"
    assert server.proc is not None
    if who == "service":
        victims = [server.proc.pid]
    else:  # the embedded worker: the service's child that launched the torchrun
        launchers = {int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
                     for p, argv in procs.items() if "torch.distributed.run" in argv}
        victims = list(launchers)
        assert victims and all(v != server.proc.pid for v in victims)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    if who == "service":  # its worker notices its parent is gone, and its trial goes with it
        server.proc.wait(timeout=10)
    left = wait_gone(set(procs), timeout=45)
    assert not left, f"orphaned after SIGKILL of the {who}: {[procs[p] for p in left]}"
    completes_after_restart(sqlite_url, launcher, r.json()["id"], server=server if who == "worker" else None)
