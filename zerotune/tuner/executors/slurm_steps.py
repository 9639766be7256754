"""Trials as job steps of the allocation zerotune runs in.

**Inside an allocation** (``SLURM_JOB_ID`` set: a batch script, ``salloc``) a trial needs no batch job
and no queue: the ``slurm`` executor ``srun``s its ranks as a step of that job, on nodes of the allocation
(``--jobid``, ``--nodelist``; the allocation and its ``NodePool`` are ``slurm_allocation``'s). A step takes the
trial cluster's outermost level as its nodes, at most the allocation's (``step_layout``: more emulated nodes
are packed onto them, as ``physical_nodes`` does for batch jobs; on GPUs only while each rank keeps a GPU).

``StepRun`` follows one step: ``srun`` in a session of its own, the step found in ``squeue --steps`` by its
name, the trial's timeout counted from the step's start (``srun --time`` is Slurm's backstop), ``scancel
JOBID.STEPID`` on timeout or stop, then srun's process group killed if it outlives ``cancel_wait_s``: nothing is
left behind. A failed step's reason is Slurm's state (``sacct`` when accounting is kept, else srun's exit
status) and the first rank error the trainer wrote: ``Slurm step 12.3 FAILED (exit 1): rank 1 failed: ...``.
``read_run`` and ``failed`` make the ``slurm`` executor's results (steps and batch jobs alike).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zerotune.core.records import RunMetrics
from zerotune.trainer.faults import first_rank_error
from zerotune.tuner.executors.base import TrialResult, TrialSpec
from zerotune.tuner.executors.slurm_allocation import Allocation
from zerotune.tuner.executors.slurm_commands import TERMINAL_STATES, tail

REPO_ROOT = Path(__file__).resolve().parents[2]

MODES = ("steps", "jobs")
"""``steps``: inside an allocation each trial is a job step (outside one, ``zerotune tune`` submits the whole study
as one job); ``jobs``: each trial is a batch job of its own (clusters that forbid steps)."""

STEP_ENV_DROP = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS",
                 "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_NODELIST",
                 "SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_DISTRIBUTION")
"""Variables of the job (or of zerotune's own rank) that must not shape the trial's step: srun gets its layout from
its options."""



def step_layout(spec: TrialSpec, allocation: Allocation, physical_nodes: int | None = None) -> tuple[int, int, str]:
    """(nodes, tasks per node, "" or why the trial cannot run in this allocation) for a trial's step.

    The cluster's outermost level is its nodes; more nodes than the allocation holds (or than ``physical_nodes``)
    are packed onto fewer, ``world_size / nodes`` ranks each, as long as the ranks divide evenly and, on GPUs,
    each rank keeps a GPU of its own."""
    cluster = spec.cluster
    want = cluster.levels[-1].size if cluster.num_levels >= 2 else 1
    nodes = min(want, len(allocation.nodes), physical_nodes or want)
    world = cluster.world_size
    while nodes > 1 and world % nodes:
        nodes -= 1
    per_node = world // nodes
    if allocation.gpus_per_node and per_node > allocation.gpus_per_node:
        return nodes, per_node, (f"{cluster.name} needs {world} ranks on at most {nodes} nodes ({per_node} per node), "
                                 f"but {allocation.describe()}")
    return nodes, per_node, ""


class StepRun:
    """One trial as one step of the allocation: ``srun`` started, followed, and ended (``result``)."""

    def __init__(self, executor: Any, allocation: Allocation, spec: TrialSpec, nodes: Sequence[str],
                 per_node: int, port: int) -> None:
        self.ex = executor
        self.alloc = allocation
        self.spec = spec
        self.nodes = list(nodes)
        self.per_node = per_node
        self.port = port
        self.name = executor.job_name(spec)
        wd = spec.workdir.resolve()
        self.out_path, self.err_path = wd / "step.out", wd / "step.err"
        self.step_id = ""

    def argv(self) -> list[str]:
        """The srun command line of this step (``executor`` is the ``slurm`` executor: its options and timeouts)."""
        ex, spec = self.ex, self.spec
        wd = spec.workdir.resolve()
        opts = [f"--jobid={self.alloc.job_id}", f"--job-name={self.name}", f"--nodes={len(self.nodes)}",
                f"--nodelist={','.join(self.nodes)}", f"--ntasks={len(self.nodes) * self.per_node}",
                f"--ntasks-per-node={self.per_node}", f"--time={ex.time_limit_min(spec.timeout_s)}",
                f"--chdir={wd}", "--kill-on-bad-exit=1", "--wait=0"]
        if self.alloc.gpus_per_node:
            opts.append(f"--gpus-per-node={self.per_node}")
        if self.alloc.in_step:
            opts.append("--overlap")
        return [*ex.commands.argv("srun"), *opts, *ex.srun_options, ex.python, "-m", "zerotune.trainer.train",
                *spec.train_args(wd / "run.json")]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in STEP_ENV_DROP}
        env.update(self.ex.commands.env or {})
        root = str(self.ex.repo_root)
        env.update({"MASTER_ADDR": self.nodes[0], "MASTER_PORT": str(self.port),
                    "PYTHONPATH": root + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else ""),
                    "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")})
        env.update(dict(self.spec.env))
        return env

    def run(self, stop: threading.Event) -> TrialResult:
        argv = self.argv()
        (self.spec.workdir / "step.srun").write_text(" ".join(shlex.quote(a) for a in argv) + "\n")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            err.write(f"zerotune: step of Slurm job {self.alloc.job_id} on {','.join(self.nodes)}, master "
                      f"{self.nodes[0]}:{self.port}\n".encode())
            err.flush()
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.env(),
                                        cwd=self.spec.workdir.resolve(), start_new_session=True)
            except OSError as exc:
                return failed(f"srun could not start: {exc}")
        try:
            return self._follow(proc, stop)
        except BaseException:
            self._cancel(proc)  # Ctrl-C, a bug: the step goes too, not only srun
            raise
        finally:
            self._reap(proc)

    def _follow(self, proc: subprocess.Popen[bytes], stop: threading.Event) -> TrialResult:
        launched = time.monotonic()
        started: float | None = None
        while True:
            rc = proc.poll()
            if rc is not None:
                return self._result(rc)
            if stop.is_set():
                done = self._cancel(proc)
                return dataclasses.replace(
                    self.ex.interrupted(f"the runner is stopping; Slurm step {self.step_id or self.alloc.job_id} "
                                        f"{done}", **self._extra("CANCELLED")),
                    logs=self._logs())
            if not self.step_id:
                self.step_id = self._find_step()
            now = time.monotonic()
            if started is None and self.step_id:
                started = now
            if started is not None and now - started > self.spec.timeout_s:
                done = self._cancel(proc)
                return failed(f"timed out after {self.spec.timeout_s:g} s; Slurm step {self.step_id} {done}",
                                       logs=self._logs(), extra=self._extra("CANCELLED") | {"timed_out": True})
            wait = self.ex.queue_timeout_s
            if started is None and wait is not None and now - launched > wait:
                done = self._cancel(proc)
                return failed(f"the step did not start in {wait:g} s; srun {done}", logs=self._logs(),
                                       extra=self._extra("CANCELLED") | {"timed_out": True})
            stop.wait(min(self.ex.poll_interval_s, 0.5) if started is None else self.ex.poll_interval_s)

    def _find_step(self) -> str:
        """``JOBID.STEPID`` of this step once squeue lists it, else ""."""
        r = self.ex.commands("squeue", "--steps", "-h", "-j", self.alloc.job_id, "-o", "%i|%j")
        for line in r.stdout.splitlines() if r.returncode == 0 else []:
            sid, _, name = line.strip().partition("|")
            if name == self.name and re.fullmatch(r"\d+(?:_\d+)?\.\d+", sid):
                return sid
        return ""

    def _cancel(self, proc: subprocess.Popen[bytes]) -> str:
        """End the step: ``scancel JOBID.STEPID`` (or srun's interrupt when the step is not listed yet), then wait
        for srun; its process group is killed if it outlives ``cancel_wait_s``. Says how it went."""
        if not self.step_id:
            self.step_id = self._find_step()
        how = "cancelled"
        if self.step_id:
            r = self.ex.commands("scancel", self.step_id)
            if r.returncode != 0:
                how = f"scancel failed ({(r.stderr or r.stdout).strip()}), srun killed"
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.ex.cancel_wait_s)
        except subprocess.TimeoutExpired:
            how += "; srun killed"
        self._reap(proc)
        return how

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        """srun's session, killed if anything of it is still there (srun and its helpers; the ranks are slurmd's)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _state(self, rc: int) -> tuple[str, str]:
        """(state, exit code) of a step that ended on its own: accounting's when it is kept, else srun's exit status."""
        if self.step_id and self.ex.commands.sacct_works:
            info = self.ex.commands.final_state(self.step_id)
            if info.state in TERMINAL_STATES:
                return info.state, info.exit_code
        if rc == 0:
            return "COMPLETED", "0"
        return ("CANCELLED" if rc < 0 else "FAILED"), str(rc)

    def _result(self, rc: int) -> TrialResult:
        if not self.step_id:
            self.step_id = f"{self.alloc.job_id}.?"
        state, code = self._state(rc)
        rank_error = first_rank_error(self.spec.workdir.resolve() / "run.json") if state != "COMPLETED" else ""
        if state == "CANCELLED" and rank_error and rc > 0:
            # a rank failed and srun --kill-on-bad-exit ended the others: accounting records the step CANCELLED
            # with their signal (exit 0:15) though nobody cancelled it; srun's own exit says what happened
            state, code = "FAILED", str(rc)
        extra = self._extra(state) | ({"slurm_exit_code": code} if code and code != "0" else {})
        logs = self._logs()
        if state == "COMPLETED":
            return read_run(self.spec.workdir.resolve() / "run.json", f"Slurm step {self.step_id} {state}", logs, extra)
        head = f"Slurm step {self.step_id} {state} (exit {code})"
        why = rank_error or self._last_words()
        return failed(f"{head}: {why}" if why else head, logs=logs, extra=extra)

    def _extra(self, state: str) -> dict[str, object]:
        return {"slurm_job_id": self.alloc.job_id, "slurm_step_id": self.step_id, "slurm_state": state,
                "slurm_nodes": list(self.nodes), "slurm_srun": str(self.spec.workdir.resolve() / "step.srun")}

    def _logs(self) -> str:
        parts = []
        for path in (self.out_path, self.err_path):
            text = tail(path, self.ex.log_tail_lines)
            if text.strip():
                parts.append(f"==> {path.name} <==\n{text}")
        return "\n".join(parts)

    def _last_words(self) -> str:
        lines = [ln.strip() for ln in tail(self.err_path, 20).splitlines() if ln.strip()]
        return lines[-1] if lines else ""



def failed(reason: str, *, logs: str = "", extra: dict[str, Any] | None = None) -> TrialResult:
    """A failed trial of the ``slurm`` executor."""
    return TrialResult(status="failed", reason=reason, logs=logs, executor="slurm", extra=extra or {})


def read_run(out: Path, head: str, logs: str, extra: dict[str, Any]) -> TrialResult:
    """The result of a run that Slurm says completed: rank 0's ``run.json``, ``complete`` or ``failed`` with the
    health evidence; ``failed`` with ``head`` when there is no readable run.json."""
    try:
        metrics: RunMetrics = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return failed(f"{head} but rank 0 wrote no readable run.json ({type(exc).__name__}: {exc})", logs=logs,
                      extra=extra)
    verdict = (metrics.get("health") or {}).get("verdict", "ok")
    if metrics.get("status", "ok") != "ok" or verdict != "ok":
        evidence = (metrics.get("health") or {}).get("evidence") or metrics.get("error") or "no evidence"
        return TrialResult(status="failed", metrics=metrics, reason=f"unhealthy run ({verdict}): {evidence}",
                           logs=logs, executor="slurm", extra=extra)
    return TrialResult(status="complete", metrics=metrics, logs=logs, executor="slurm", extra=extra)
