"""The ``slurm`` executor's batch-job path (mode ``jobs``, or outside an allocation): ``SlurmBatchJobs``, the base
of ``slurm.SlurmExecutor``, writes a trial's ``job.sbatch``, follows the job until it leaves the queue and reads its
result.

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
import shlex
import threading
import time
from pathlib import Path
from typing import Any

from zerotune.trainer.faults import first_rank_error
from zerotune.tuner.executors.base import Executor, TrialResult, TrialSpec
from zerotune.tuner.executors.slurm_commands import (
    QUEUED_STATES,
    TERMINAL_STATES,
    UNINFORMATIVE_REASONS,
    JobInfo,
    SlurmCommands,
    tail,
)
from zerotune.tuner.executors.slurm_steps import read_run


class SlurmBatchJobs(Executor):
    """A trial as one Slurm batch job: its script, its job followed in the queue, its result (the attributes are
    ``slurm.SlurmExecutor``'s)."""

    partition: str | None
    account: str | None
    sbatch_options: list[str]
    srun_options: list[str]
    python: str
    workdir_root: Path | None
    poll_interval_s: float
    commands: SlurmCommands
    physical_nodes: int | None
    gpus_per_node: int | None
    queue_timeout_s: float | None
    cancel_wait_s: float
    repo_root: Path
    log_tail_lines: int

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

    def site_options(self) -> list[str]:
        """The ``#SBATCH`` options of every job this executor submits, a trial's or a held allocation's: the
        partition, the account, the GPUs a node and the user's own ``sbatch_options``."""
        opts = [f"--partition={self.partition}"] if self.partition else []
        if self.account:
            opts.append(f"--account={self.account}")
        if self.gpus_per_node:
            opts.append(f"--gpus-per-node={self.gpus_per_node}")
        return opts + list(self.sbatch_options)

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
                f"--output={wd / 'slurm-%j.out'}", f"--error={wd / 'slurm-%j.err'}", f"--chdir={wd}",
                *self.site_options()]
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

    # -- following the job ------------------------------------------------------------------------------------

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
