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
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class LaunchResult:
    returncode: int
    output: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def torchrun_command(nproc: int, target: Sequence[str], *, module: bool = True) -> list[str]:
    """The argv of a single-node ``torchrun`` of ``target`` (``-m pkg.mod args`` or ``script args``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0"]
    return cmd + (["-m", *target] if module else list(target))


def run_torchrun(nproc: int, target: Sequence[str], *, timeout_s: float = 300.0, module: bool = True,
                 stream: bool = False, env: dict[str, str] | None = None) -> LaunchResult:
    """Run ``torchrun`` and wait; kill its process group on timeout.

    Args:
        nproc: processes (ranks) to start on this machine.
        target: module and its arguments (``["strategies.train", "--steps", "8"]``) or a script.
        timeout_s: wall-clock limit for the whole run.
        module: whether ``target[0]`` is a module name (``-m``) or a script path.
        stream: echo output lines to stderr while running (progress for a user).
        env: extra environment variables.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(torchrun_command(nproc, target, module=module), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True)
    lines: list[str] = []
    timed_out = False
    try:
        if stream:
            import threading

            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.append(line)
                    sys.stderr.write(line)
            t = threading.Thread(target=pump, daemon=True)
            t.start()
            proc.wait(timeout=timeout_s)
            t.join(timeout=5)
        else:
            out, _ = proc.communicate(timeout=timeout_s)
            lines.append(out)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        try:
            out, _ = proc.communicate(timeout=10)
            lines.append(out or "")
        except (subprocess.TimeoutExpired, ValueError):
            pass
    except BaseException:
        kill_group(proc)
        raise
    return LaunchResult(returncode=proc.returncode if proc.returncode is not None else -9,
                        output="".join(lines), timed_out=timed_out)


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
