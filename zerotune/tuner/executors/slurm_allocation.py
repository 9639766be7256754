"""The Slurm allocation trials run in as steps: the one zerotune runs in, or one held for the study.

``Allocation.from_env`` reads the allocation's real scale from Slurm: its nodes (``SLURM_JOB_NODELIST`` expanded
by ``scontrol show hostnames``; ``SLURM_JOB_NUM_NODES``) and GPUs per node (``SLURM_GPUS_ON_NODE``, else
``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS`` counted, else ``SLURM_GPUS_PER_NODE``). ``NodePool`` hands disjoint sets
of the allocation's nodes to the steps running at once, so trials run one at a time on a cluster as large as the
allocation, side by side where a trial's cluster is smaller.

**Outside an allocation** the executor holds one for the study: at its first trial it submits one batch job of
the trial's nodes that only sleeps (``hold_script``, ``hold_allocation``: the study's one queue wait), runs every
trial as a step of it (``srun --jobid`` from where the study runs), and cancels it when the study ends
(``Executor.close``, ``release_allocation``). ``slurm.run_in_allocation`` runs a list of trials, such as a
shortlist, as steps of an allocation.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from zerotune.tuner.executors.slurm_commands import TERMINAL_STATES, SlurmCommands


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The Slurm job zerotune runs in: its id, its nodes and the GPUs on each."""

    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: int = 0
    in_step: bool = False
    """zerotune itself runs in a step (``srun zerotune ...``): trial steps must overlap it (``--overlap``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 commands: SlurmCommands | None = None) -> Allocation | None:
        """The allocation described by Slurm's variables, or None outside one (no ``SLURM_JOB_ID``)."""
        env = os.environ if env is None else env
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        if not job_id.strip():
            return None
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        nodes: list[str] = []
        if nodelist:
            r = (commands or SlurmCommands())("scontrol", "show", "hostnames", nodelist)
            nodes = r.stdout.split() if r.returncode == 0 else []
            if not nodes and re.fullmatch(r"[\w.-]+(,[\w.-]+)*", nodelist):
                nodes = nodelist.split(",")  # no brackets: the list is already expanded
        count = _int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES"))
        if not nodes:
            raise ValueError(f"Slurm job {job_id}: cannot tell its nodes (SLURM_JOB_NODELIST={nodelist!r})")
        if count and count != len(nodes):
            raise ValueError(f"Slurm job {job_id}: SLURM_JOB_NUM_NODES={count} but its node list names "
                             f"{len(nodes)} ({nodelist})")
        return cls(job_id.strip(), tuple(nodes), gpus_on_node(env), in_step=bool(env.get("SLURM_STEP_ID")))

    def describe(self) -> str:
        gpus = f" x {self.gpus_per_node} GPUs" if self.gpus_per_node else ""
        return f"Slurm job {self.job_id}: {len(self.nodes)} node{'s' * (len(self.nodes) != 1)}{gpus}"


def gpus_on_node(env: Mapping[str, str]) -> int:
    """GPUs per node of the allocation from Slurm's variables (0: none, or Slurm does not say)."""
    n = _int(env.get("SLURM_GPUS_ON_NODE"))
    if n:
        return n
    for key in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):  # "0,1,2,3"
        ids = [g for g in (env.get(key) or "").split(",") if g.strip()]
        if ids:
            return len(ids)
    per_node = (env.get("SLURM_GPUS_PER_NODE") or "").split(",")[0]  # "4", "a100:4"
    return _int(per_node.rsplit(":", 1)[-1])


def _int(text: str | None) -> int:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else 0


class NodePool:
    """The allocation's nodes, lent to steps: each step takes ``n`` nodes no other running step holds."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = tuple(nodes)
        self._free = list(nodes)
        self._cond = threading.Condition()

    def acquire(self, n: int, stop: threading.Event, poll_s: float = 0.2) -> list[str] | None:
        """``n`` free nodes (waiting for running steps to hand theirs back); None once ``stop`` is set."""
        if not 1 <= n <= len(self.nodes):
            raise ValueError(f"a step needs 1 to {len(self.nodes)} nodes of this allocation, not {n}")
        with self._cond:
            while len(self._free) < n:
                if stop.is_set():
                    return None
                self._cond.wait(poll_s)
            if stop.is_set():
                return None
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def release(self, nodes: Sequence[str]) -> None:
        with self._cond:
            self._free += [n for n in nodes if n in self.nodes and n not in self._free]
            self._free.sort(key=self.nodes.index)
            self._cond.notify_all()

    @property
    def free(self) -> int:
        with self._cond:
            return len(self._free)


# -- an allocation held for a study -----------------------------------------------------------------------------


def hold_script(*, name: str, workdir: Path, nodes: int, per_node: int, time_min: int | None,
                site_options: Sequence[str] = ()) -> str:
    """The batch script of an allocation held for a study: ``nodes`` nodes with room for ``per_node`` ranks each,
    doing nothing itself (``sleep``) while the study runs its trials as steps of it, until it is cancelled
    (``site_options``: the executor's partition, account, GPUs and own options, ``SlurmBatchJobs.site_options``)."""
    wd = workdir.resolve()
    opts = [f"--job-name={name}", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
            f"--output={wd / 'hold-%j.out'}", f"--error={wd / 'hold-%j.out'}", f"--chdir={wd}"]
    if time_min is not None:
        opts.append(f"--time={time_min}")
    opts += list(site_options)
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
                      "# zerotune: an allocation held for a study; each trial runs as a step of it",
                      'echo "zerotune: holding $SLURM_JOB_NODELIST for a study (job $SLURM_JOB_ID)"',
                      "exec sleep infinity"]) + "\n"


def hold_allocation(commands: SlurmCommands, script: Path, *, gpus_per_node: int = 0,
                    queue_timeout_s: float | None = None, poll_interval_s: float = 1.0,
                    stop: threading.Event | None = None) -> tuple[Allocation | None, str]:
    """Submit ``script`` (``hold_script``) and wait until it runs: (its allocation, "") or (None, why not).

    The wait is the study's one queue wait; ``queue_timeout_s`` or ``stop`` cancel the job still pending."""
    sub = commands("sbatch", "--parsable", str(script))
    job_id = sub.stdout.strip().split(";")[0].strip() if sub.returncode == 0 else ""
    if not re.fullmatch(r"\d+", job_id):
        msg = " ".join((sub.stderr.strip() or sub.stdout.strip() or "no output").split())
        return None, f"sbatch of the study's allocation failed (exit {sub.returncode}): {msg}"
    t0 = time.monotonic()
    stop = stop or threading.Event()
    try:
        while True:
            state = commands.queue_state(job_id)
            if state == "RUNNING":
                r = commands("squeue", "-h", "-j", job_id, "-o", "%N")
                nodelist = r.stdout.strip() if r.returncode == 0 else ""
                if nodelist:
                    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodelist,
                           "SLURM_GPUS_ON_NODE": str(gpus_per_node)}
                    return Allocation.from_env(env, commands), ""
            elif state is None or state in TERMINAL_STATES:
                info = commands.final_state(job_id)
                return None, f"the study's allocation (Slurm job {job_id}) ended before it ran: {info.state} " \
                             f"({info.reason or 'no reason'})"
            if stop.is_set():
                release_allocation(commands, job_id)
                return None, f"stopped while Slurm job {job_id} (the study's allocation) was {state}"
            if queue_timeout_s is not None and time.monotonic() - t0 > queue_timeout_s:
                release_allocation(commands, job_id)
                return None, f"the study's allocation (Slurm job {job_id}) still {state} after {queue_timeout_s:g} " \
                             f"s in the queue; cancelled"
            stop.wait(poll_interval_s)
    except BaseException:
        release_allocation(commands, job_id)
        raise


def release_allocation(commands: SlurmCommands, job_id: str, wait_s: float = 30.0) -> None:
    """Cancel a held allocation and wait (up to ``wait_s``) for it to leave the queue."""
    commands("scancel", job_id)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        state = commands.queue_state(job_id)
        if state is None or state in TERMINAL_STATES:
            return
        time.sleep(0.3)
