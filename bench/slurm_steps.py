"""Wall time of a 4-candidate shortlist measured on Slurm: as steps of one allocation, against one job per trial.

The shortlist is four partitions of gpt-tiny on ``local:2`` (ddp, zero1, zero2, zero3; 3 steps after 1 warm-up
step each), run by the ``slurm`` executor one trial after another, as a study runs them:

- ``steps``: mode ``steps`` outside an allocation: one batch job is held for the four (one queue wait), each trial an
  ``srun --jobid`` step of it, the job cancelled at the end (``Executor.close``);
- ``jobs``: mode ``jobs``: each trial a batch job of its own (``sbatch``, then ``squeue`` until it ends).

Printed for each: the wall time from the first submission to the last result, the queue wait (each job's
``StartTime - SubmitTime`` from ``scontrol show job``, whole seconds; summed over the jobs) and the wall time with
the queue wait taken out. Both modes poll Slurm every ``--poll`` seconds. On an idle cluster the queue wait is
Slurm's scheduling latency; ``--assume-wait W`` adds the projection for a cluster whose queue holds each job W
seconds (steps: one wait, jobs: four), which is arithmetic on the measured figures, not a measurement.

    python bench/slurm_steps.py                      # starts a one-node Slurm of its own (root; .ci/install-slurm.sh)
    SLURM_CONF=/etc/slurm/slurm.conf python bench/slurm_steps.py --partition debug --use-cluster
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model  # noqa: E402
from zerotune.tuner.executors.base import TrialResult, TrialSpec  # noqa: E402
from zerotune.tuner.executors.slurm import SlurmExecutor  # noqa: E402
from zerotune.tuner.executors.slurm_commands import SlurmCommands  # noqa: E402

SHORTLIST = ("ddp", "zero1", "zero2", "zero3")


def specs(root: Path, cluster: str) -> list[TrialSpec]:
    c = parse_cluster(cluster)
    return [TrialSpec(model=parse_model("gpt-tiny"), cluster=c, strategy=build_strategy(s, c), workdir=root / s,
                      steps=3, warmup=1, timeout_s=600) for s in SHORTLIST]


def queue_wait_s(commands: SlurmCommands, job_id: str) -> float:
    """StartTime - SubmitTime of a job, from slurmctld's memory of it."""
    out = commands("scontrol", "show", "job", job_id).stdout
    times = dict(re.findall(r"(SubmitTime|StartTime)=(\S+)", out))
    if len(times) < 2:
        return float("nan")
    submit, start = (datetime.fromisoformat(times[k]) for k in ("SubmitTime", "StartTime"))
    return (start - submit).total_seconds()


def run(mode: str, root: Path, args: argparse.Namespace, commands: SlurmCommands) -> dict[str, float]:
    ex = SlurmExecutor(mode=mode, partition=args.partition, physical_nodes=1, poll_interval_s=args.poll,
                       commands=commands)
    jobs: list[str] = []
    t0 = time.monotonic()
    results: list[TrialResult] = []
    try:
        for spec in specs(root / mode, args.cluster):
            r = ex.run(spec, stop=threading.Event())
            results.append(r)
            if r.status != "complete":
                raise SystemExit(f"{mode}: {spec.strategy.name} {r.status}: {r.reason}\n{r.logs[-2000:]}")
            jobs.append(r.extra["slurm_job_id"])
    finally:
        ex.close()
    wall = time.monotonic() - t0
    waits = [queue_wait_s(commands, j) for j in dict.fromkeys(jobs)]
    step_times = [r.metrics["step_time_s"] for r in results if r.metrics]
    return {"wall_s": wall, "jobs": len(set(jobs)), "queue_s": sum(waits), "excluded_s": wall - sum(waits),
            "step_time_s": sum(step_times) / len(step_times)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="local:2", help="the trials' cluster (default local:2: 2 ranks)")
    p.add_argument("--partition", default=None)
    p.add_argument("--poll", type=float, default=0.5, help="seconds between squeue polls (both modes)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of (steps, jobs), alternating which goes first")
    p.add_argument("--assume-wait", type=float, default=None, help="project a queue wait of this many s per job")
    p.add_argument("--use-cluster", action="store_true", help="use the Slurm that SLURM_CONF (or the default) names")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zt-slurm-steps-"))
    cluster = None
    if not args.use_cluster:
        from tests.slurm.cluster import PARTITION, LocalSlurm, unavailable_reason

        reason = unavailable_reason()
        if reason:
            print(f"cannot start a local Slurm: {reason}", file=sys.stderr)
            return 1
        cluster = LocalSlurm(work / "slurm")
        cluster.start()
        args.partition = args.partition or PARTITION
    commands = SlurmCommands(env=cluster.env if cluster else ({"SLURM_CONF": os.environ["SLURM_CONF"]}
                                                             if "SLURM_CONF" in os.environ else None))
    rows: dict[str, list[dict[str, float]]] = {"steps": [], "jobs": []}
    try:
        for i in range(args.rounds):
            for mode in (("steps", "jobs") if i % 2 == 0 else ("jobs", "steps")):
                rows[mode].append(run(mode, work / f"round{i}", args, commands))
                print(f"round {i} {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[mode][-1].items()),
                      file=sys.stderr)
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"4-candidate shortlist of gpt-tiny on {args.cluster}, {args.rounds} round(s), mean:")
    print(f"{'mode':6} {'jobs':>4} {'wall s':>8} {'queue s':>8} {'wall-queue s':>13} {'step s':>7}")
    mean: dict[str, dict[str, float]] = {}
    for mode, rs in rows.items():
        mean[mode] = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
        m = mean[mode]
        print(f"{mode:6} {m['jobs']:4.0f} {m['wall_s']:8.1f} {m['queue_s']:8.1f} {m['excluded_s']:13.1f} "
              f"{m['step_time_s']:7.3f}")
    s, j = mean["steps"], mean["jobs"]
    print(f"jobs / steps: {j['wall_s'] / s['wall_s']:.2f}x with the queue wait, "
          f"{j['excluded_s'] / s['excluded_s']:.2f}x without")
    if args.assume_wait is not None:
        w = args.assume_wait
        print(f"projected with a {w:g} s queue wait per job: steps {s['excluded_s'] + w * s['jobs']:.0f} s, "
              f"jobs {j['excluded_s'] + w * j['jobs']:.0f} s (arithmetic on the figures above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
