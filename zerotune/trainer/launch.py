"""Launch W local processes with ``torchrun`` in their own process group, with a hard timeout.

Used by the CLI, the benches and the tests: one function that starts ``torchrun`` (the real
launcher, so rank environment variables are exactly what a cluster job sees), streams or captures
its output, and on timeout kills the whole process group — the launcher and every rank — so a
hung collective never leaves orphans behind.

Nor does a caller that dies: ``torchrun`` runs in its own session (so a Ctrl-C meant for the caller
reaches the run through ``kill_group`` only), and on Linux it is started with a parent-death signal
(SIGTERM, on which torchrun stops its ranks) tied to the thread that launched it; each rank of
``trainer.train`` sets its own (SIGKILL) towards torchrun. A caller killed with SIGKILL therefore
takes its run with it. ``stop`` ends a run on request (a worker shutting down).
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
    interrupted: bool = False
    """Ended because the caller's ``stop`` was set (not a failure of the run itself)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.stopped and not self.interrupted


_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]))  # PR_SET_PDEATHSIG
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[2]):
    sys.exit(f"launcher: the parent process {sys.argv[2]} exited before the run started")
os.execv(sys.argv[3], sys.argv[3:])
"""


def die_with_parent(argv: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """``argv`` started so that it receives ``sig`` when the calling thread's process dies (Linux
    ``PR_SET_PDEATHSIG``, kept across exec; elsewhere ``argv`` unchanged in effect)."""
    if sys.platform != "linux":
        return argv
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(int(sig)), str(os.getpid()), *argv]


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """This process receives ``sig`` when its parent exits (Linux; a no-op elsewhere)."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


def torchrun_command(nproc: int, target: Sequence[str], *, module: bool = True) -> list[str]:
    """The argv of a single-node ``torchrun`` of ``target`` (``-m pkg.mod args`` or ``script args``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0"]
    return cmd + (["-m", *target] if module else list(target))


def run_torchrun(nproc: int, target: Sequence[str], *, timeout_s: float = 300.0, module: bool = True,
                 stream: bool = False, env: dict[str, str] | None = None,
                 on_line: Callable[[str], bool | None] | None = None,
                 stop: threading.Event | None = None, agents: Sequence[Sequence[str]] | None = None) -> LaunchResult:
    """Run ``torchrun`` and wait; kill its process group on timeout.

    Args:
        nproc: processes (ranks) to start on this machine.
        target: module and its arguments (``["zerotune.trainer.train", "--steps", "8"]``) or a script.
        timeout_s: wall-clock limit for the whole run.
        module: whether ``target[0]`` is a module name (``-m``) or a script path.
        stream: echo output lines to stderr while running (progress for a user).
        env: extra environment variables.
        on_line: called with each output line; returning True stops the run (e.g. pruning), which
            then ends with ``stopped=True``.
        stop: set by the caller to end the run at once (``interrupted=True``).
        agents: instead of one single-node ``torchrun``, these full command lines, one launcher each (an
            emulated cluster's agents, one per namespace: ``tuner.executors.emulate.agent_commands``). They run
            and end together: the first to fail ends the others, whose ranks would wait for it forever.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    argvs = [list(a) for a in agents] if agents else [torchrun_command(nproc, target, module=module)]
    procs = [subprocess.Popen(die_with_parent(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=full_env, start_new_session=True) for argv in argvs]
    lines: list[str] = []
    caller_stop, stop = stop, threading.Event()

    def pump(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if stream:
                sys.stderr.write(line)
            if on_line is not None and not stop.is_set() and on_line(line):
                stop.set()

    readers = [threading.Thread(target=pump, args=(proc,), daemon=True) for proc in procs]
    for reader in readers:
        reader.start()
    timed_out = interrupted = False
    deadline = time.monotonic() + timeout_s

    def end_all() -> None:
        for proc in procs:
            kill_group(proc)
    try:
        while any(proc.poll() is None for proc in procs):
            if stop.wait(timeout=0.2):
                end_all()
                break
            if caller_stop is not None and caller_stop.is_set():
                interrupted = True
                end_all()
                break
            if time.monotonic() > deadline:
                timed_out = True
                end_all()
                break
            if any(proc.poll() not in (None, 0) for proc in procs):  # one agent failed: its peers cannot finish
                end_all()
                break
    except BaseException:
        end_all()
        raise
    for reader in readers:
        reader.join(timeout=10)
    codes = [proc.returncode if proc.returncode is not None else -9 for proc in procs]
    failed = [c for c in codes if c > 0] or [c for c in codes if c != 0]  # the agent that failed, not those it ended
    return LaunchResult(returncode=failed[0] if failed else 0, output="".join(lines),
                        timed_out=timed_out, stopped=stop.is_set(), interrupted=interrupted)


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
