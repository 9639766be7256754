"""Launch W local processes with ``torchrun`` in their own process group, with a hard timeout.

Used by the CLI, the benches and the tests: one function that starts ``torchrun`` (the real
launcher, so rank environment variables are exactly what a cluster job sees), streams or captures
its output, and on timeout kills the whole process group — the launcher and every rank — so a
hung collective never leaves orphans behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class LaunchResult:
    returncode: int
    output: str
    timed_out: bool
    stopped: bool = False
    """Stopped on purpose by ``on_line`` (not a failure of the run itself)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.stopped


def torchrun_command(nproc: int, target: Sequence[str], *, module: bool = True) -> list[str]:
    """The argv of a single-node ``torchrun`` of ``target`` (``-m pkg.mod args`` or ``script args``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0"]
    return cmd + (["-m", *target] if module else list(target))


def run_torchrun(nproc: int, target: Sequence[str], *, timeout_s: float = 300.0, module: bool = True,
                 stream: bool = False, env: dict[str, str] | None = None,
                 on_line: Callable[[str], bool | None] | None = None) -> LaunchResult:
    """Run ``torchrun`` and wait; kill its process group on timeout.

    Args:
        nproc: processes (ranks) to start on this machine.
        target: module and its arguments (``["strategies.train", "--steps", "8"]``) or a script.
        timeout_s: wall-clock limit for the whole run.
        module: whether ``target[0]`` is a module name (``-m``) or a script path.
        stream: echo output lines to stderr while running (progress for a user).
        env: extra environment variables.
        on_line: called with each output line; returning True stops the run (e.g. pruning), which
            then ends with ``stopped=True``.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(torchrun_command(nproc, target, module=module), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True)
    lines: list[str] = []
    stop = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if stream:
                sys.stderr.write(line)
            if on_line is not None and not stop.is_set() and on_line(line):
                stop.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if stop.wait(timeout=0.2):
                kill_group(proc)
                break
            if time.monotonic() > deadline:
                timed_out = True
                kill_group(proc)
                break
    except BaseException:
        kill_group(proc)
        raise
    reader.join(timeout=10)
    return LaunchResult(returncode=proc.returncode if proc.returncode is not None else -9,
                        output="".join(lines), timed_out=timed_out, stopped=stop.is_set())


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL, the process group that ``proc`` leads (the launcher and all ranks)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # ranks can outlive the launcher
    except ProcessLookupError:
        pass
    proc.wait()
