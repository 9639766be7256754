"""``zerotune recommend --measure SECONDS``: the answer's shortlist measured by the job itself, on its own nodes.

After the service's answer (the standard-library fast path, unchanged), a job that passes ``--measure`` asks the
service what the model cannot tell apart (``GET /v1/recommendations/{id}/shortlist``: the service's own shortlist),
runs each candidate for a few steps after warm-up with the built-in trainer and this job's model, picks the
measured winner, and sends the run.json files back (``POST /v1/recommendations/{id}/measurements``): the service
stores them as trials of the request, refits the cluster's calibration from them and answers the request from
them, so the next job of the same request and allocation shape is served the measured answer (and measures
nothing: :func:`measure_answer` reuses an answer measured by a job already).

Everything here is bounded by the budget: a candidate that would start with too little of it left, or that the
budget cuts off while it runs, is reported (``cut_off``), never waited for. The caller (``api/cli/recommend.py``)
turns any :class:`Unmeasured` or unexpected error into the predicted answer with one warning: measuring never
fails the job.

Where a trial runs is one function, :func:`trial_executor`: a trial as a Slurm step of this allocation when a
step runner exists (:func:`step_runner`), else the local executor on this node when the allocation's cluster runs
as is on it (a CPU cluster of this node's size). The heavier modules (the tuner's executors, the catalog) are
imported here, lazily, only when a job measures.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerotune.api.prologue.client import Client, ServiceError

if TYPE_CHECKING:
    from zerotune.core.spec import ClusterSpec, ModelSpec
    from zerotune.tuner.executors.base import Executor

MIN_TRIAL_S = 5.0
"""A candidate is not started with less of the budget left than this: torchrun and the trainer's start alone
take a few seconds, so it could only be cut off."""
UPLOAD_SHARE, UPLOAD_MIN_S, UPLOAD_MAX_S = 0.2, 2.0, 30.0
"""The part of the budget kept for sending the runs and the service's refit: 20%, between 2 and 30 s."""


class Unmeasured(Exception):
    """The shortlist could not be measured here; the message says why (the job keeps the predicted answer)."""


def step_runner() -> Executor | None:
    """The executor that runs a trial as a Slurm step (``srun --jobid``) on the nodes of the current allocation
    (``tuner.executors.slurm.SlurmExecutor`` in mode ``steps``), or None where there is none: no ``SLURM_JOB_ID``,
    no ``srun`` on the PATH, or a job id Slurm does not list as running (a job's variables copied into another
    shell)."""
    import shutil
    import subprocess

    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not job or shutil.which("srun") is None or shutil.which("squeue") is None:
        return None
    try:
        listed = subprocess.run(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%i"], capture_output=True,
                                text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0 or job not in listed.stdout.split():
        return None
    from zerotune.tuner.executors.slurm import SlurmExecutor

    return SlurmExecutor(mode="steps")


def trial_executor(model: ModelSpec, cluster: ClusterSpec, max_ranks: int) -> Executor:
    """What runs a candidate of ``model`` on ``cluster`` (the allocation): a Slurm step where there is a step
    runner, else the local executor when this node runs ``cluster`` as is, with the real model (never a proxy:
    a proxy or an emulation measures nothing of this allocation).

    Raises:
        Unmeasured: neither can run it.
    """
    from zerotune.tuner.executors.local import LocalExecutor, runs_as_is

    runner = step_runner()
    if runner is not None:
        return runner
    if not runs_as_is(cluster, max_ranks):
        raise Unmeasured(f"{cluster.name} ({cluster.world_size} ranks on {cluster.device}) does not run on this node "
                         "alone, and no Slurm step runner is available to run it on the allocation")
    return LocalExecutor(max_ranks=max_ranks, max_params=model.num_params() + 1)


def measure_answer(client: Client, rec: dict[str, Any], *, job: str | None, budget_s: float, workdir: Path,
                   steps: int = 10, warmup: int = 2, max_ranks: int = 8,
                   log: Any = None) -> dict[str, Any]:
    """The answer measured on this allocation: ``rec`` itself when it was measured by a job already (reused) or
    leaves nothing to tell apart, else the service's answer from this job's measurements of its shortlist.

    Args:
        client: the service (a fresh deadline: this function bounds each exchange itself).
        rec: the service's answer.
        job: this job's Slurm id (the measurements are stored under it).
        budget_s: seconds for all of it: the runs, and the upload with the refit.
        workdir: where each candidate's run writes (``cand-N/run.json``, its log).
        log: called with one progress line per candidate (None: silent).

    Raises:
        Unmeasured: nothing could be measured, or the service did not take the runs (the caller warns once
            and keeps ``rec``).
    """
    from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
    from zerotune.tuner.executors.base import TrialSpec

    start = time.monotonic()
    say = log or (lambda _: None)
    metrics = rec.get("metrics") or {}
    if metrics.get("measured_on_job"):
        say(f"reusing the measurement of job {metrics['measured_on_job']['job']} (same request and allocation shape)")
        return rec
    if rec.get("evidence") != "predicted" or rec.get("id") is None:
        return rec  # measured by the service already, or not the service's answer: nothing to settle here
    if job is None:
        raise Unmeasured("--measure runs inside a Slurm job (SLURM_JOB_ID), and this is none")
    upload_s = min(UPLOAD_MAX_S, max(UPLOAD_MIN_S, UPLOAD_SHARE * budget_s))
    runs_until = start + budget_s - upload_s
    shortlist = _call(client, "GET", f"/v1/recommendations/{rec['id']}/shortlist", None, start + budget_s)
    candidates = [Strategy.from_dict(c) for c in shortlist["candidates"]]
    if len(candidates) < 2:
        say(f"nothing to measure: {shortlist['why']}")
        return rec
    model, cluster = ModelSpec.from_dict(shortlist["model"]), ClusterSpec.from_dict(shortlist["cluster"])
    executor = trial_executor(model, cluster, max_ranks)
    runs: list[dict[str, Any]] = []
    cut: list[dict[str, Any]] = []
    for i, strategy in enumerate(candidates):
        label = strategy.name or f"candidate {i + 1}"
        left = runs_until - time.monotonic()
        if left < MIN_TRIAL_S:
            cut.append({"strategy": strategy.to_dict(), "reason": f"not started: {max(left, 0):.1f} s of the "
                        f"--measure budget left (a run needs {MIN_TRIAL_S:g} s at least)"})
            say(f"{label}: cut off by the budget (not started)")
            continue
        spec = TrialSpec(model=model, cluster=cluster, strategy=strategy, workdir=workdir / f"cand-{i + 1}",
                         steps=steps, warmup=warmup, global_batch=shortlist.get("global_batch"), timeout_s=left)
        began = time.monotonic()
        result = executor.run(spec, stop=threading.Event())
        took = time.monotonic() - began
        if result.status != "complete" and result.metrics is None and took >= left - 0.5:
            cut.append({"strategy": strategy.to_dict(),
                        "reason": f"cut off by the --measure budget after {took:.1f} s"})
            say(f"{label}: cut off by the budget after {took:.1f} s")
            continue
        if result.metrics is not None:  # a run.json: healthy, or failed by the health gate after running its steps
            run: dict[str, Any] = {**result.metrics, "strategy": strategy.to_dict(), "logs": result.logs[-20000:]}
            if result.status != "complete":
                run.update(status="failed", error=result.reason)
        else:  # broke before writing run.json (out of memory, a crash): a failed trial with its reason
            run = {"status": "failed", "model": model.to_dict(), "cluster": cluster.to_dict(),
                   "strategy": strategy.to_dict(), "error": result.reason or "failed run", "logs": result.logs[-20000:]}
        runs.append(run)
        value = run.get("tflops_per_rank")
        say(f"{label}: {result.status}" + (f", {value:.4g} TFLOPS per rank" if isinstance(value, int | float) else "")
            + (f" ({result.reason})" if result.reason else "") + f" in {took:.1f} s")
    if not any(r.get("status") == "ok" for r in runs):
        raise Unmeasured(f"no candidate completed within --measure {budget_s:g} s ({len(cut)} cut off by the budget, "
                         f"{len(runs)} failed)")
    body = {"job": job, "budget_s": budget_s, "runs": [_plain(r) for r in runs], "cut_off": cut}
    answer = _call(client, "POST", f"/v1/recommendations/{rec['id']}/measurements", body,
                   max(start + budget_s, time.monotonic() + UPLOAD_MIN_S))
    if not isinstance(answer, dict) or not isinstance(answer.get("exports"), dict):
        raise Unmeasured("the service's answer to the measurements is not a recommendation")
    return answer


def _call(client: Client, method: str, path: str, body: Any, deadline: float) -> Any:
    client.deadline = deadline
    try:
        _, _, payload = client.request(method, path, body)
    except ServiceError as exc:
        raise Unmeasured(f"{method} {path}: {exc}") from None
    return payload


def _plain(value: Any) -> Any:
    """A run.json as the service takes it: JSON values only (NaN and infinities as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
