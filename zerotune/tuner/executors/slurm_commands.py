"""Slurm's clients as the executor calls them: ``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``scontrol`` and
``srun`` (each a program or an argv prefix such as ``ssh login1 sbatch``), a job's state in the queue, and its final
state from accounting (or from slurmctld's memory when there is no accounting)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ACTIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "POWER_UP_NODE", "UPDATE_DB"})
"""States of a job that is still queued or running (squeue's ``%T``)."""
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "REVOKED", "SPECIAL_EXIT"})
"""States of a job that is over (sacct / scontrol ``JobState``)."""
QUEUED_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "POWER_UP_NODE"})
"""Active states in which the run itself has not started (the timeout does not run yet)."""
UNINFORMATIVE_REASONS = frozenset({"", "None", "(null)", "NonZeroExitCode"})

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
"""Runs one command line and returns its exit status and output (``subprocess.run``-like)."""


@dataclasses.dataclass
class SlurmCommands:
    """How to call Slurm's clients: each is a program name, or an argv prefix (``("ssh", "login1", "sbatch")``).

    ``runner`` replaces ``subprocess.run`` (tests pass a fake that records the command lines);
    ``env`` is added to the environment of the real commands (e.g. ``SLURM_CONF``), and ``sbatch``
    hands it on to the job (``--export=ALL`` is Slurm's default).
    """

    sbatch: str | Sequence[str] = "sbatch"
    squeue: str | Sequence[str] = "squeue"
    sacct: str | Sequence[str] = "sacct"
    scancel: str | Sequence[str] = "scancel"
    scontrol: str | Sequence[str] = "scontrol"
    srun: str | Sequence[str] = "srun"
    runner: Runner | None = None
    env: Mapping[str, str] | None = None
    timeout_s: float = 60.0
    """Limit for one client command (a slurmctld that does not answer is retried at the next poll)."""
    sacct_works: bool = dataclasses.field(default=True, compare=False)
    """False once sacct said accounting is disabled (no slurmdbd): final states come from scontrol."""

    def argv(self, tool: str, *args: str) -> list[str]:
        prefix = getattr(self, tool)
        return [prefix, *args] if isinstance(prefix, str) else [*prefix, *args]

    def __call__(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = self.argv(tool, *args)
        if self.runner is not None:
            return self.runner(argv)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  env={**os.environ, **(self.env or {})}, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{' '.join(argv)}: no answer in {self.timeout_s:g} s")
        except OSError as exc:
            return subprocess.CompletedProcess(argv, 126, "", f"{argv[0]}: {exc}")

    def queue_state(self, job_id: str) -> str | None:
        """squeue's state for the job; None once it has left the queue; ``"?"`` when squeue did not answer."""
        r = self("squeue", "-h", "-j", job_id, "-o", "%T")
        if r.returncode != 0:
            return None if "invalid job id" in (r.stderr + r.stdout).lower() else "?"
        states = [s.strip() for s in r.stdout.splitlines() if s.strip()]
        return _norm_state(states[0]) if states else None

    def final_state(self, job_id: str) -> JobInfo:
        """The job's state, exit code and reason: sacct when accounting is kept, else ``scontrol show job``."""
        if self.sacct_works:
            r = self("sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,Reason")
            if r.returncode == 0:
                for line in r.stdout.splitlines():
                    fields = line.strip().split("|")
                    if len(fields) >= 3 and fields[0] == job_id:
                        info = JobInfo(_norm_state(fields[1]), fields[2], fields[3] if len(fields) > 3 else "")
                        if info.state in TERMINAL_STATES:
                            return info
            elif "disabled" in (r.stderr + r.stdout).lower() or r.returncode == 127:
                self.sacct_works = False  # no slurmdbd (or no sacct): scontrol from now on
        r = self("scontrol", "show", "job", job_id)
        if r.returncode == 0:
            found = dict(re.findall(r"(?:^|\s)(JobState|Reason|ExitCode)=(\S*)", r.stdout))
            if "JobState" in found:
                return JobInfo(_norm_state(found["JobState"]), found.get("ExitCode", ""), found.get("Reason", ""))
        return JobInfo("UNKNOWN")


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """A job's state as Slurm reports it."""

    state: str
    exit_code: str = ""
    reason: str = ""


def _norm_state(text: str) -> str:
    """``CANCELLED by 0`` → ``CANCELLED``; ``RUNNING+`` → ``RUNNING``."""
    return text.strip().split(" ")[0].rstrip("+").upper() if text.strip() else ""


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a job's (or step's) output file; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 200 * lines))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
