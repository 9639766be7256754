"""The ``slurm`` executor: the same short run as ``local``, on a real cluster through ``sbatch`` + ``srun``.

Inside an allocation (``SLURM_JOB_ID`` set) and in mode ``steps`` (the default), a trial is a job step of that
allocation, ``srun`` on its nodes with no queue (``slurm_steps``: the step's layout, timeout, cancel and reason);
``run_in_allocation`` runs several trials that way, side by side on disjoint nodes where they fit. Otherwise (mode
``jobs``, or outside an allocation) one trial is one batch job, as follows.

One trial is one batch job. ``run`` writes the trial's inputs and a ``job.sbatch`` into the trial's
workdir (which compute nodes must see: a shared filesystem, or ``workdir_root`` pointing at one),
submits it with ``sbatch --parsable``, and polls ``squeue`` until the job leaves the queue; the caller's
``stop`` cancels the job (``scancel``) and returns at once. The batch script exports ``MASTER_ADDR``
(the job's first node) and a ``MASTER_PORT`` derived from the job id, then ``srun``s one
``python -m zerotune.trainer.train`` per rank; the trainer maps ``SLURM_PROCID``/``SLURM_NTASKS``/
``SLURM_LOCALID`` to ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` itself.

The job's final state comes from ``sacct`` when the cluster keeps accounting, else from
``scontrol show job`` (slurmctld remembers finished jobs for ``MinJobAge``, 300 s by default).

- ``COMPLETED`` → ``run.json`` (rank 0's metrics): ``complete``, or ``failed`` with the health
  evidence when the run was unhealthy (NaN, diverged, flat loss).
- ``FAILED``, ``CANCELLED``, ``TIMEOUT``, ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``PREEMPTED``, … →
  ``failed`` with Slurm's state, exit code and reason, and the first rank error that the trainer
  wrote (``run.json.rank<r>.err``): ``Slurm job 12 FAILED (exit 1:0): rank 1 failed: RuntimeError: …``.
- ``spec.timeout_s`` after the job started running (or ``queue_timeout_s`` pending) → ``scancel``
  and ``failed``: ``timed out after 600 s; Slurm job 12 cancelled``.
- ``sbatch`` refuses the job → ``failed`` with sbatch's error.

Nodes: a job asks for the cluster's outermost level size as ``--nodes`` (1 for a one-level cluster)
and ``world_size // nodes`` as ``--ntasks-per-node``. ``physical_nodes=P`` caps that at P real
nodes, packing the ranks of several emulated nodes onto one (e.g. ``local:2x2`` as 4 tasks on 1
node); the per-level byte counts still follow the ClusterSpec, only the wires differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from zerotune.trainer.faults import first_rank_error
from zerotune.tuner.executors.base import Executor, StepHook, TrialResult, TrialSpec
from zerotune.tuner.executors.slurm_commands import (
    QUEUED_STATES,
    TERMINAL_STATES,
    UNINFORMATIVE_REASONS,
    JobInfo,
    SlurmCommands,
    tail,
)
from zerotune.tuner.executors.slurm_steps import (
    MODES,
    REPO_ROOT,
    Allocation,
    NodePool,
    StepRun,
    hold_allocation,
    hold_script,
    read_run,
    release_allocation,
    step_layout,
)


class SlurmExecutor(Executor):
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
                    nodes=nodes, per_node=per_node, partition=self.partition, account=self.account,
                    gpus_per_node=self.gpus_per_node, sbatch_options=self.sbatch_options,
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

    # -- the job ---------------------------------------------------------------------------------------------

    def layout(self, spec: TrialSpec) -> tuple[int, int]:
        """(nodes, tasks per node) for this trial's cluster: the outermost level is the nodes."""
        cluster = spec.cluster
        nodes = cluster.levels[-1].size if cluster.num_levels >= 2 else 1
        return nodes, cluster.world_size // nodes

    def trial_spec(self, spec: TrialSpec) -> TrialSpec:
        """The spec as run: its workdir moved under ``workdir_root`` when one is set."""
        if self.workdir_root is None:
            return spec
        return dataclasses.replace(spec, workdir=self.workdir_root / spec.workdir.name)

    @staticmethod
    def job_name(spec: TrialSpec) -> str:
        return "zerotune-" + hashlib.sha1(str(spec.workdir.resolve()).encode()).hexdigest()[:8]

    @staticmethod
    def time_limit_min(timeout_s: float) -> int:
        """Slurm's ``--time`` in minutes: the trial's timeout rounded up, plus one minute so that our own
        timeout (with its clearer message) normally fires first and Slurm's is the backstop."""
        return max(1, math.ceil(timeout_s / 60)) + 1

    def sbatch_script(self, spec: TrialSpec) -> str:
        """The text of ``job.sbatch`` for this trial (absolute paths: the job runs in ``--chdir``)."""
        spec = dataclasses.replace(spec, workdir=spec.workdir.resolve())
        wd = spec.workdir
        world = spec.cluster.world_size
        nodes, per_node = self.layout(spec)
        if self.physical_nodes is not None and nodes > self.physical_nodes:
            nodes = self.physical_nodes
            tasks = [f"--ntasks-per-node={world // nodes}"] if world % nodes == 0 else [f"--ntasks={world}"]
        else:
            tasks = [f"--ntasks-per-node={per_node}"]
        opts = [f"--job-name={self.job_name(spec)}", f"--nodes={nodes}", *tasks,
                f"--time={self.time_limit_min(spec.timeout_s)}",
                f"--output={wd / 'slurm-%j.out'}", f"--error={wd / 'slurm-%j.err'}", f"--chdir={wd}"]
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.account:
            opts.append(f"--account={self.account}")
        if self.gpus_per_node:
            opts.append(f"--gpus-per-node={self.gpus_per_node}")
        opts += self.sbatch_options
        q = shlex.quote
        srun = ["srun", "--kill-on-bad-exit=1", *self.srun_options, self.python, "-m", "zerotune.trainer.train",
                *spec.train_args(wd / "run.json")]
        lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
                 f"# zerotune trial: {spec.model.name} on {spec.cluster.name} ({world} ranks), "
                 f"strategy {spec.strategy.name or 'custom'}",
                 "set -eu",
                 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
                 "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                 f"export PYTHONPATH={q(str(self.repo_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
                 "export PYTHONUNBUFFERED=1",
                 "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
                 "unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE  # srun's SLURM_* give the layout",
                 *(f"export {k}={q(v)}" for k, v in spec.env),
                 'echo "zerotune: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT" >&2',
                 " ".join(q(a) for a in srun)]
        return "\n".join(lines) + "\n"

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

    def _follow(self, spec: TrialSpec, job_id: str, stop: threading.Event) -> TrialResult:
        submitted = time.monotonic()
        started: float | None = None
        gone_polls = 0
        while True:
            if stop.is_set():
                r = self.commands("scancel", job_id)
                done = "cancelled" if r.returncode == 0 else f"scancel failed: {(r.stderr or r.stdout).strip()}"
                return dataclasses.replace(self.interrupted(f"the runner is stopping; Slurm job {job_id} {done}",
                                                            **self._extra(spec, job_id, JobInfo("CANCELLED"))),
                                           logs=self._logs(spec, job_id))
            state = self.commands.queue_state(job_id)
            now = time.monotonic()
            if state is not None and state not in TERMINAL_STATES:
                gone_polls = 0
                if state != "?" and state not in QUEUED_STATES and started is None:
                    started = now
                if started is not None and now - started > spec.timeout_s:
                    return self._cancel(spec, job_id, f"timed out after {spec.timeout_s:g} s")
                if started is None and self.queue_timeout_s is not None and now - submitted > self.queue_timeout_s:
                    return self._cancel(spec, job_id,
                                        f"still {state} after {self.queue_timeout_s:g} s in the queue")
            else:
                info = self.commands.final_state(job_id)
                gone_polls += 1
                # Accounting can lag the queue by a moment: wait a few polls for a final state.
                if info.state in TERMINAL_STATES or gone_polls >= 5:
                    return self._result(spec, job_id, info)
            stop.wait(self.poll_interval_s)

    def _cancel(self, spec: TrialSpec, job_id: str, why: str) -> TrialResult:
        r = self.commands("scancel", job_id)
        if r.returncode != 0:
            why += f"; scancel of Slurm job {job_id} failed: {(r.stderr or r.stdout).strip()}"
        else:
            why += f"; Slurm job {job_id} cancelled"
        end = time.monotonic() + self.cancel_wait_s
        info = JobInfo("CANCELLED")
        while time.monotonic() < end:
            state = self.commands.queue_state(job_id)
            if state is None or state in TERMINAL_STATES:
                info = self.commands.final_state(job_id)
                break
            time.sleep(min(self.poll_interval_s, 1.0))
        return self._failed(why, logs=self._logs(spec, job_id),
                            extra=self._extra(spec, job_id, info) | {"timed_out": True})

    def _result(self, spec: TrialSpec, job_id: str, info: JobInfo) -> TrialResult:
        out = spec.workdir.resolve() / "run.json"
        logs = self._logs(spec, job_id)
        extra = self._extra(spec, job_id, info)
        if info.state == "COMPLETED" or (info.state == "UNKNOWN" and out.is_file()):
            return read_run(out, f"Slurm job {job_id} {info.state}", logs, extra)
        if info.state == "UNKNOWN":
            head = f"Slurm job {job_id} left the queue and its final state is unknown (no sacct, purged)"
        else:
            detail = f"exit {info.exit_code or '?'}"
            if info.reason not in UNINFORMATIVE_REASONS:
                detail += f", {info.reason}"
            head = f"Slurm job {job_id} {info.state} ({detail})"
        why = first_rank_error(out) or self._last_words(spec, job_id)
        return self._failed(f"{head}: {why}" if why else head, logs=logs, extra=extra)

    # -- helpers ---------------------------------------------------------------------------------------------

    def _failed(self, reason: str, *, logs: str = "", extra: dict[str, Any] | None = None) -> TrialResult:
        return TrialResult(status="failed", reason=reason, logs=logs, executor=self.name, extra=extra or {})

    def _extra(self, spec: TrialSpec, job_id: str, info: JobInfo) -> dict[str, Any]:
        extra: dict[str, Any] = {"slurm_job_id": job_id, "slurm_state": info.state,
                                 "slurm_script": str(spec.workdir.resolve() / "job.sbatch")}
        if info.exit_code:
            extra["slurm_exit_code"] = info.exit_code
        if info.reason not in ("", "None", "(null)"):
            extra["slurm_reason"] = info.reason
        return extra

    def _job_files(self, spec: TrialSpec, job_id: str) -> tuple[Path, Path]:
        wd = spec.workdir.resolve()
        return wd / f"slurm-{job_id}.out", wd / f"slurm-{job_id}.err"

    def _logs(self, spec: TrialSpec, job_id: str) -> str:
        """The tails of the job's stdout and stderr (the trainer logs its steps on stderr)."""
        parts = []
        for path in self._job_files(spec, job_id):
            text = tail(path, self.log_tail_lines)
            if text.strip():
                parts.append(f"==> {path.name} <==\n{text}")
        return "\n".join(parts)

    def _last_words(self, spec: TrialSpec, job_id: str) -> str:
        """The last line the job wrote on stderr (e.g. ``srun: error: …`` or slurmstepd's CANCELLED line)."""
        lines = [ln.strip() for ln in tail(self._job_files(spec, job_id)[1], 20).splitlines() if ln.strip()]
        return lines[-1] if lines else ""


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
