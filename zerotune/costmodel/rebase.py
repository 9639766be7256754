"""Solve each source run's compute efficiency on the whole model, and store it in ``rebased.json``.

A device's published efficiency whose run the model can express (``hardware.SOURCE_RUNS``) is re-based to the
compute efficiency at which ``predict`` gives that run's published tokens per second. Solving it runs the whole
model, so it is solved here, once, and stored; ``profiles`` reads the file when it builds the presets and never
runs a prediction. After a change to a device, link, source run or to the model itself:

    python -m zerotune.costmodel.rebase            # solve and compare with the stored file (exit 1 if stale)
    python -m zerotune.costmodel.rebase --write    # store the solved efficiencies

``tests/costmodel/test_rebase.py`` solves them again and fails, naming the run and both values, when the file is
stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from zerotune.costmodel.attention import FIGURE_ATTENTION
from zerotune.costmodel.catalog import build_strategy
from zerotune.costmodel.hardware import DEVICES, SOURCE_RUNS
from zerotune.costmodel.predict import predict
from zerotune.costmodel.profiles import REBASED_FILE, SOURCE_RUN_EFFICIENCY, profile_calibration, profile_cluster

WRITE_COMMAND = "python -m zerotune.costmodel.rebase --write"


def bisect_source_run(ran_on: str, stack: str) -> float:
    """The compute efficiency at which the model predicts the source run of ``DEVICES[ran_on]``'s
    ``stack`` figure (``SOURCE_RUNS``) at its published tokens per second: the whole prediction
    (compute, exposed communication, the slow-down beside collectives, the step boundary, the optimizer)
    held to that step by bisection between 5% of peak and peak (an error if neither end brackets it),
    rounded to 6 decimals."""
    d, run = DEVICES[ran_on], SOURCE_RUNS[(ran_on, stack)]
    found = d.source_model(stack)
    if found is None or found[1] != ran_on:
        raise ValueError(f"SOURCE_RUNS[{(ran_on, stack)!r}]: DEVICES[{ran_on!r}] names no {stack} run on itself")
    model = found[0]
    cluster = profile_cluster(f"{ran_on}-{stack}-source", ran_on, tuple(lv[:3] for lv in run.levels),
                              tuple(lv[3] for lv in run.levels))
    base = profile_calibration("source", ran_on, tuple(lv[2] for lv in run.levels), stack, run.rings,
                               run.outer_reduce, whole_run=False, attention=FIGURE_ATTENTION.get(stack, "matmul"))
    strategy = build_strategy(dict(run.strategy), cluster, micro_batch_size=run.micro_batch)
    target = run.micro_batch * model.seq_len / run.tokens_per_s_per_gpu

    def step(efficiency: float) -> float:
        calib = dataclasses.replace(base, compute_efficiency=efficiency)
        return predict(model, cluster, strategy, elem_bytes=2, calibration=calib,
                       global_batch=cluster.world_size * run.micro_batch)["step_time_s"]

    lo, hi = 0.05, 1.0
    if step(hi) > target or step(lo) < target:
        raise ValueError(f"SOURCE_RUNS[{(ran_on, stack)!r}]: no efficiency in [{lo}, {hi}] predicts the run's "
                         f"{run.tokens_per_s_per_gpu} tokens/s per GPU")
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) > target else (lo, mid)
    return round(hi, 6)


def solve() -> dict[tuple[str, str], float]:
    """Every source run's efficiency, by (key in ``DEVICES``, stack), in ``SOURCE_RUNS``'s order."""
    return {key: bisect_source_run(*key) for key in SOURCE_RUNS}


def stale(stored: dict[tuple[str, str], float], solved: dict[tuple[str, str], float]) -> list[str]:
    """What differs between the stored efficiencies and the solved ones, one line per source run (none: fresh)."""
    lines = []
    for key in sorted(set(stored) | set(solved)):
        was, now = stored.get(key), solved.get(key)
        if was != now:
            lines.append(f"SOURCE_RUNS[{key!r}]: {REBASED_FILE.name} holds {was}, the model solves {now}")
    return lines


def to_json(solved: dict[tuple[str, str], float]) -> str:
    """The text of ``rebased.json`` (what ``profiles`` reads)."""
    runs = [{"device": device, "stack": stack, "compute_efficiency": value}
            for (device, stack), value in solved.items()]
    return json.dumps({"written_by": WRITE_COMMAND, "source_runs": runs}, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"store the solved efficiencies in {REBASED_FILE}")
    args = ap.parse_args(argv)
    solved = solve()
    if args.write:
        REBASED_FILE.write_text(to_json(solved))
        print(f"wrote {REBASED_FILE}: {len(solved)} source runs")
        return 0
    differ = stale(SOURCE_RUN_EFFICIENCY, solved)
    for line in differ:
        print(line, file=sys.stderr)
    if differ:
        print(f"{REBASED_FILE.name} is stale: run {WRITE_COMMAND}", file=sys.stderr)
        return 1
    print(f"{REBASED_FILE.name} is fresh: {len(solved)} source runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
