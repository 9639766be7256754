"""The ``slurm`` executor: the same short run as ``local``, on a real cluster through ``sbatch`` + ``srun``.

Inside an allocation (``SLURM_JOB_ID`` set) and in mode ``steps`` (the default), a trial is a job step of that
allocation, ``srun`` on its nodes with no queue (``slurm_steps``: the step's layout, timeout, cancel and reason);
``run_in_allocation`` runs several trials that way, side by side on disjoint nodes where they fit. Otherwise (mode
``jobs``, or outside an allocation) one trial is one batch job (``slurm_batch``: its ``job.sbatch``, followed in
the queue until it ends, and its result). The allocation, its node pool and the allocation held for a study are
``slurm_allocation``.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zerotune.tuner.executors.base import StepHook, TrialResult, TrialSpec
from zerotune.tuner.executors.slurm_allocation import (
    Allocation,
    NodePool,
    hold_allocation,
    hold_script,
    release_allocation,
)
from zerotune.tuner.executors.slurm_batch import SlurmBatchJobs
from zerotune.tuner.executors.slurm_commands import TERMINAL_STATES, SlurmCommands
from zerotune.tuner.executors.slurm_steps import MODES, REPO_ROOT, StepRun, step_layout


class SlurmExecutor(SlurmBatchJobs):
    """Runs a trial as one Slurm batch job (``sbatch`` + ``srun python -m zerotune.trainer.train``)."""

    name = "slurm"

    def __init__(self, *, partition: str | None = None, account: str | None = None,
                 sbatch_options: Sequence[str] = (), srun_options: Sequence[str] = (),
                 python: str | None = None, workdir_root: str | Path | None = None,
                 poll_interval_s: float = 5.0, commands: SlurmCommands | None = None,
                 physical_nodes: int | None = None, gpus_per_node: int | None = None,
                 queue_timeout_s: float | None = 3600.0, cancel_wait_s: float = 60.0,
                 repo_root: str | Path | None = None, log_tail_lines: int = 200, mode: str = "steps",
                 allocation: Allocation | None = None, hold_time_s: float | None = None) -> None:
        """
        Args:
            partition: ``--partition`` (default: the cluster's default partition).
            account: ``--account`` to charge.
            sbatch_options: more ``#SBATCH`` options, one per item (``"--qos=short"``, ``"--exclusive"``).
            srun_options: more ``srun`` options (``"--cpu-bind=cores"``).
            python: the interpreter on the compute nodes (default: this one, ``sys.executable``).
            workdir_root: a directory the compute nodes see; a trial then runs in
                ``workdir_root/<its workdir's name>`` instead of its own workdir.
            poll_interval_s: seconds between ``squeue`` polls (and heartbeats).
            commands: the Slurm client commands (and a runner for tests).
            physical_nodes: at most this many real nodes per job; more emulated nodes are packed
                onto them (``--nodes P`` with the same total tasks).
            gpus_per_node: ``--gpus-per-node`` (GPU clusters; each rank takes ``cuda:LOCAL_RANK``).
            queue_timeout_s: cancel a job still pending after this long (None: wait as long as it takes).
            cancel_wait_s: how long to wait for a cancelled job to leave the queue.
            repo_root: the zerotune checkout the compute nodes import (``PYTHONPATH``); default this one.
            log_tail_lines: lines of the job's stdout and stderr kept in ``TrialResult.logs``.
            mode: ``steps``: inside an allocation each trial is a job step of it; ``jobs``: each trial is a batch
                job of its own, wherever zerotune runs (clusters that forbid steps).
            allocation: the allocation to run steps in (default: the one Slurm's variables describe, if any;
                outside one, mode ``steps`` holds one for the study: see ``close``).
            hold_time_s: the ``--time`` of an allocation held for a study (None: the partition's limit).
        """
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: must be one of {', '.join(MODES)}")
        for opt in [*sbatch_options, *srun_options]:
            if not opt.startswith("-") or "\n" in opt:
                raise ValueError(f"Slurm option {opt!r} must be one option starting with '-' (no newlines)")
        if physical_nodes is not None and physical_nodes < 1:
            raise ValueError(f"physical_nodes must be >= 1, got {physical_nodes}")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.partition = partition
        self.account = account
        self.sbatch_options = list(sbatch_options)
        self.srun_options = list(srun_options)
        self.python = python or sys.executable
        self.workdir_root = Path(workdir_root) if workdir_root is not None else None
        self.poll_interval_s = poll_interval_s
        self.commands = commands or SlurmCommands()
        self.physical_nodes = physical_nodes
        self.gpus_per_node = gpus_per_node
        self.queue_timeout_s = queue_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self.repo_root = Path(repo_root) if repo_root is not None else REPO_ROOT
        self.log_tail_lines = log_tail_lines
        self.mode = mode
        self._lock = threading.Lock()
        self._allocation: Allocation | None = None
        self._looked = False
        self._allocation_error = ""
        self._pool: NodePool | None = None
        self._steps = 0
        self._held = ""
        """The job id of the allocation this executor holds for its study ("" when none)."""
        self.hold_time_s = hold_time_s
        if allocation is not None:
            self.use_allocation(allocation)

    # -- the allocation ----------------------------------------------------------------------------------------

    def allocation(self) -> Allocation | None:
        """The allocation trials run in as steps (the one zerotune runs in, or the one held for the study): None in
        mode ``jobs``, or outside an allocation before the first trial."""
        if self.mode != "steps":
            return None
        with self._lock:
            if not self._looked:
                self._looked = True
                try:
                    self._allocation = Allocation.from_env({**os.environ, **(self.commands.env or {})}, self.commands)
                except ValueError as exc:
                    self._allocation_error = str(exc)
                self._pool = NodePool(self._allocation.nodes) if self._allocation else None
            if self._allocation_error:
                raise ValueError(self._allocation_error)
            return self._allocation

    def _hold(self, spec: TrialSpec, stop: threading.Event) -> tuple[Allocation | None, str]:
        """The allocation held for this study, submitted (and waited for: its one queue wait) at its first trial,
        with the trial's nodes and ranks per node."""
        with self._lock:
            if self._allocation is not None:
                return self._allocation, ""
            nodes, per_node = self.layout(spec)
            if self.physical_nodes is not None and nodes > self.physical_nodes:
                nodes = self.physical_nodes
                per_node = -(-spec.cluster.world_size // nodes)
            spec.workdir.mkdir(parents=True, exist_ok=True)
            script = spec.workdir.resolve().parent / "hold.sbatch"
            try:
                script.write_text(hold_script(
                    name=self.job_name(spec).replace("zerotune-", "zerotune-hold-"), workdir=script.parent,
                    nodes=nodes, per_node=per_node, site_options=self.site_options(),
                    time_min=None if self.hold_time_s is None else max(1, math.ceil(self.hold_time_s / 60))))
            except OSError as exc:
                return None, f"could not write {script}: {exc}"
            alloc, why = hold_allocation(self.commands, script, gpus_per_node=self.gpus_per_node or 0,
                                         queue_timeout_s=self.queue_timeout_s, poll_interval_s=self.poll_interval_s,
                                         stop=stop)
            if alloc is not None:
                self._held, self._allocation, self._pool = alloc.job_id, alloc, NodePool(alloc.nodes)
            return alloc, why

    def _drop_ended_hold(self) -> None:
        """Forget the allocation held for the study once it has ended (its time limit, an admin's scancel): the
        next trial holds another instead of failing on a job that is gone."""
        held = self._held
        if held:
            state = self.commands.queue_state(held)
            if state is None or state in TERMINAL_STATES:
                with self._lock:
                    if self._held == held:
                        self._held, self._allocation, self._pool = "", None, None

    def close(self) -> None:
        """Cancel the allocation held for the study, if this executor holds one (the next trial holds another)."""
        with self._lock:
            held, self._held = self._held, ""
            if held:
                self._allocation, self._pool = None, None
        if held:
            release_allocation(self.commands, held, self.cancel_wait_s)

    @property
    def held(self) -> str:
        """The job id of the allocation held for the study ("" when none)."""
        return self._held

    def use_allocation(self, allocation: Allocation) -> None:
        """Run steps in ``allocation`` (instead of the one the environment describes)."""
        with self._lock:
            self._allocation, self._looked, self._pool = allocation, True, NodePool(allocation.nodes)

    # -- run -------------------------------------------------------------------------------------------------

    def run(self, spec: TrialSpec, *, stop: threading.Event, on_step: StepHook | None = None) -> TrialResult:
        """One job step inside an allocation, else one batch job, followed until it ends (``on_step`` is not
        called: steps are not seen until the run ends)."""
        spec = self.trial_spec(spec)
        self._drop_ended_hold()
        try:
            allocation = self.allocation()
        except ValueError as exc:
            return self._failed(str(exc))
        if allocation is None and self.mode == "steps":
            allocation, why = self._hold(spec, stop)
            if allocation is None:
                return self.interrupted(why) if stop.is_set() else self._failed(why)
        if allocation is not None:
            return self._run_step(spec, allocation, stop)
        why = self._prepare(spec)
        if why:
            return self._failed(why)
        script = spec.workdir.resolve() / "job.sbatch"
        try:
            script.write_text(self.sbatch_script(spec))
        except OSError as exc:
            return self._failed(f"could not write the job files into {spec.workdir}: {exc}")

        sub = self.commands("sbatch", "--parsable", str(script))
        job_id = sub.stdout.strip().split(";")[0].strip() if sub.returncode == 0 else ""
        if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
            msg = (sub.stderr.strip() or sub.stdout.strip() or "no output").splitlines()
            return self._failed(f"sbatch failed (exit {sub.returncode}): {' '.join(m.strip() for m in msg)}",
                                extra={"slurm_script": str(script)})
        try:
            return self._follow(spec, job_id, stop)
        except BaseException:
            # Ctrl-C, a bug: leave nothing running behind.
            self.commands("scancel", job_id)
            raise

    def _prepare(self, spec: TrialSpec) -> str:
        """Write the trial's inputs and remove stale results; "" or why it cannot run."""
        for key, _ in spec.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                return f"environment variable name {key!r} is not valid in a shell"
        try:
            spec.write_inputs()
            out = spec.workdir.resolve() / "run.json"
            for stale in [out, *out.parent.glob("run.json.rank*.err")]:
                stale.unlink(missing_ok=True)
        except OSError as exc:
            return f"could not write the job files into {spec.workdir}: {exc}"
        return ""

    def _run_step(self, spec: TrialSpec, allocation: Allocation, stop: threading.Event) -> TrialResult:
        """The trial as one step of ``allocation`` on nodes no other running step holds."""
        nodes, per_node, why = step_layout(spec, allocation, self.physical_nodes)
        if why or (why := self._prepare(spec)):
            return self._failed(why)
        pool = self._pool
        assert pool is not None
        taken = pool.acquire(nodes, stop)
        if taken is None:
            return self.interrupted(f"the runner is stopping; no step of Slurm job {allocation.job_id} started")
        try:
            with self._lock:
                self._steps += 1
                seq = self._steps
            port = 20000 + (int(re.sub(r"\D", "", allocation.job_id) or 0) * 61 + seq) % 20000
            return StepRun(self, allocation, spec, taken, per_node, port).run(stop)
        finally:
            pool.release(taken)


def run_in_allocation(specs: Sequence[TrialSpec], *, executor: SlurmExecutor | None = None,
                      stop: threading.Event | None = None, allocation: Allocation | None = None,
                      on_result: Callable[[int, TrialResult], None] | None = None) -> list[TrialResult]:
    """Run trials as steps of the allocation zerotune runs in: each on nodes of its own, side by side while the
    allocation has free nodes for the next one (one at a time when each takes all of them).

    Args:
        specs: the trials (e.g. a shortlist), each with a workdir of its own.
        executor: the ``slurm`` executor to run them with (its srun options, python, timeouts); default
            ``SlurmExecutor()``. Its mode must be ``steps``.
        stop: set to end the running steps now (each comes back interrupted) and start no more.
        allocation: the allocation (default: the one Slurm's variables describe).
        on_result: called with (index, result) as each trial ends (from the thread that ran it).

    Returns:
        One ``TrialResult`` per spec, in the order of ``specs``.

    Raises:
        ValueError: not inside an allocation (``SLURM_JOB_ID`` unset), or the executor's mode is ``jobs``.
    """
    ex = executor or SlurmExecutor()
    if allocation is not None:
        ex.use_allocation(allocation)
    alloc = ex.allocation()
    if alloc is None:
        raise ValueError("run_in_allocation: not inside a Slurm allocation (SLURM_JOB_ID is not set)"
                         if ex.mode == "steps" else "run_in_allocation: the executor's mode is 'jobs'")
    halt = stop or threading.Event()
    results: list[TrialResult] = [TrialResult(status="failed", reason="not run", executor=ex.name)] * len(specs)

    def one(i: int) -> None:
        results[i] = ex.run(specs[i], stop=halt)
        if on_result is not None:
            on_result(i, results[i])

    with ThreadPoolExecutor(max(1, min(len(specs), len(alloc.nodes)))) as pool:
        for future in [pool.submit(one, i) for i in range(len(specs))]:
            future.result()
    return results
