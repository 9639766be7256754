"""What goes wrong in a run, and what it says: the reason a failed run gives (rank errors, torchrun's root
cause, a timeout), the ranks' status files, and faults injected on purpose (``ZEROTUNE_FAULT``,
``ZEROTUNE_FAULT_ONCE``) to test that a failing trial fails alone."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import resource
import signal
import time
from pathlib import Path
from typing import Any

from zerotune.errors import SpecError

ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
# What a rank raises when a *peer* died: gloo's and NCCL's words for a lost connection, an aborted
# communicator or a collective that timed out. Such an error is a symptom, never the cause.
PEER_SYMPTOM = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker|DistBackendError"
    r"|NCCL communicator was aborted|ncclRemoteError|Watchdog caught collective operation timeout"
    r"|Timed out waiting .* for (?:a )?peer", re.I)


def failure_reason(out: Path, output: str, timed_out: bool, limit: float) -> str:
    """Which rank failed and why, cause before symptoms.

    When one rank fails its peers fail after it: inside a collective (an error naming a lost
    connection) or, when the collective's own thread gets the error, by SIGABRT — and torchrun's
    "Root Cause" is the first *observed* failure, which can be such a peer. So, in order: a rank
    killed by SIGKILL (what the kernel's out-of-memory killer sends; torchrun stops peers with
    SIGTERM), named with the memory it last held; else the first error a rank wrote
    (``<out>.rank<r>.err``) that is not a peer's symptom; else any other signal torchrun names; else
    the first symptom written; else the launcher's last words."""
    if timed_out:
        return f"timed out after {limit:g} s; every rank was killed"
    m = ROOT_CAUSE.search(output)
    signalled = (int(m.group(1)), -int(m.group(2))) if m and int(m.group(2)) < 0 else None
    causes, symptoms = rank_errors(out)
    if signalled and (signalled[1] == signal.SIGKILL or not causes):
        return _killed(out, *signalled)
    if causes or symptoms:
        return _named(causes or symptoms)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else "torchrun exited without output"


def rank_errors(out: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The errors ranks wrote (``<out>.rank<r>.err``), earliest first, as (rank, error) pairs split
    into causes and peers' symptoms (``PEER_SYMPTOM``). Unreadable files are skipped."""
    written = []
    for path in out.parent.glob(out.name + ".rank*.err"):
        err = _read_json(path)
        if err.get("error"):
            try:
                written.append((float(err.get("time", math.inf)), int(err.get("rank", 0)), str(err["error"])))
            except (TypeError, ValueError):
                continue
    causes: list[tuple[int, str]] = []
    symptoms: list[tuple[int, str]] = []
    for _, rank, error in sorted(written):
        (symptoms if PEER_SYMPTOM.search(error) else causes).append((rank, error))
    return causes, symptoms


def first_rank_error(out: Path) -> str:
    """``rank R failed: Error: msg``: the first error a rank wrote that is not a peer's symptom, else
    the first symptom; "" when no rank wrote one."""
    causes, symptoms = rank_errors(out)
    return _named(causes or symptoms) if causes or symptoms else ""


def _named(errors: list[tuple[int, str]]) -> str:
    rank, error = errors[0]
    return f"rank {rank} failed: {error}"


def _killed(out: Path, rank: int, signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    reason = f"rank {rank} killed by {name}"
    if signum == signal.SIGKILL:
        reason += " — out of memory?"
    status = _read_json(Path(f"{out}.rank{rank}.status"))
    if status.get("max_rss_bytes"):
        reason += (f" (resident memory {status['max_rss_bytes'] / 2**30:.2f} GiB when last recorded, "
                   f"{status.get('phase', '')})").replace(" )", ")")
    return reason


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


class RankStatus:
    """``<out>.rank<r>.status``: this rank's phase and peak resident memory, rewritten when either
    changes (the memory by 5% or more), so a rank the kernel kills leaves its last figures behind."""

    def __init__(self, out: str, rank: int) -> None:
        self.path, self.rank = Path(f"{out}.rank{rank}.status"), rank
        self.written: tuple[str | None, int] = (None, 0)

    def update(self, phase: str) -> None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
        last_phase, last_rss = self.written
        if last_phase is None or phase.split()[0] != last_phase.split()[0] or rss > 1.05 * last_rss:
            self.path.write_text(json.dumps({"rank": self.rank, "phase": phase, "max_rss_bytes": rss}))
            self.written = (phase, rss)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


FAULT_KINDS = ("crash", "hang", "kill", "nan")


def fault() -> tuple[str, int, int] | None:
    """The fault ``ZEROTUNE_FAULT`` injects, for failure-path tests and for rehearsing a cluster's
    failure handling: ``KIND@RANK:STEP`` (``:STEP`` defaults to 0) with KIND one of ``crash`` (the
    rank raises), ``hang`` (the rank sleeps: the run's timeout must end it), ``kill`` (SIGKILL, as the
    kernel's out-of-memory killer sends) or ``nan`` (the rank's loss is NaN from that step on: the
    health gate fails the run). Unset: None. ``resolve`` refuses a malformed value before anything
    starts. With ``ZEROTUNE_FAULT_ONCE=PATH`` the fault strikes one run only: the run that reaches it
    first creates PATH, and every run that finds PATH runs clean (a retry after the fault succeeds)."""
    spec = os.environ.get("ZEROTUNE_FAULT")
    if not spec:
        return None
    m = re.fullmatch(r"(\w+)@(\d+)(?::(\d+))?", spec.strip())
    if not m or m.group(1) not in FAULT_KINDS:
        raise SpecError("ZEROTUNE_FAULT", spec, f"must be KIND@RANK:STEP with KIND one of {list(FAULT_KINDS)}")
    return m.group(1), int(m.group(2)), int(m.group(3) or 0)


def maybe_fault(rank: int, step: int) -> bool:
    """Inject ``fault()`` on this rank at this step; returns whether this rank's loss is poisoned."""
    injected = fault()
    if injected is None:
        return False
    kind, fault_rank, fault_step = injected
    if rank != fault_rank or step < fault_step or not _strikes():
        return False
    if step == fault_step:
        if kind == "crash":
            raise RuntimeError(f"injected crash on rank {rank} at step {step} (ZEROTUNE_FAULT={kind}@{rank}:{step})")
        if kind == "hang":
            time.sleep(10**6)
        if kind == "kill":  # as the kernel's out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
    return kind == "nan"


@functools.cache
def _strikes() -> bool:
    """Whether the fault strikes in this run: always, or under ``ZEROTUNE_FAULT_ONCE`` only in the run
    that creates the marker file first (decided once per process, when the fault's step is reached)."""
    marker = os.environ.get("ZEROTUNE_FAULT_ONCE")
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
