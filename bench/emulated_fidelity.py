"""The cost model against short runs on emulated clusters, where the levels' links really differ.

    sudo python bench/emulated_fidelity.py                     # 2 clusters x 13 strategies x 2 rounds + loopback (~1 h)
    python bench/emulated_fidelity.py --rounds 3 --runs-dir runs/emulated   # reuse run.json files there (resumes)

Loopback runs cannot check the model's time where links differ: every level is the same transport.
Here each cluster is emulated (``zerotune/tuner/executors/emulate.py``: a namespace per innermost group, ``tc``-shaped
links per level), its levels' bandwidths given directly as the emulated rates (``--emulate-scale 1``):

- ``two-level``: one rank per namespace; node links 320 MB/s per rank, inter-node links 8x slower;
- ``frontier-like``: Frontier's per-rank ratios (GCD pair : node : inter-node = 16 : 4 : 1): pairs
  of ranks on loopback, node links 50 MB/s per rank, inter-node 12.5 MB/s per rank (8 ranks share
  two cores, so each computes slowly: links 4x faster than these hid behind compute and left the
  ranking as loopback's).

1. Trains every strategy (ZeRO-3, ZeRO++ and each of its parts, MiCS, both 3-level readings where the
   cluster has their levels, buckets and prefetch variants, ZeRO-2, ZeRO-1) on each cluster,
   ``--rounds`` times, round by round (slow drift of the machine touches every strategy alike); a
   strategy's time is the median of its rounds' step times. Then once on loopback (no emulation).
2. 5x2 cross-validation: each half of the strategies calibrates the model (compute efficiency,
   quantization throughput and one bandwidth per level: the links differ, so levels are not tied;
   the bandwidths either fitted to the step times or read off the runs' per-level seconds, and then
   the quantization rate too off their seconds in (de)quantization), the
   other half is predicted. Prints Spearman and median relative error over the held-out halves
   (goals >= 0.9 and <= 10%), and measured vs predicted ZeRO++ / ZeRO-3.
3. The ranking on loopback against the emulated one: Spearman between them as measured, and whether
   the model predicts the change: on held-out halves, each strategy's slow-down (emulated / loopback
   step time) predicted by an emulated calibration and a loopback one (one bandwidth for all levels),
   both fitted on the other half, against the measured slow-down (Spearman); and the pairs whose order
   changes, measured against predicted.

Needs Linux and CAP_NET_ADMIN (root). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from zerotune.core.spec import ClusterSpec
from zerotune.costmodel.calibration import fit, fit_options, predicted_step_time
from zerotune.costmodel.catalog import build_strategy
from zerotune.costmodel.measured import Measurement
from zerotune.errors import SpecError
from zerotune.tuner.executors import netns

ROOT = Path(__file__).resolve().parent.parent

CLUSTERS: dict[str, dict[str, Any]] = {
    "two-level": {"name": "two-level", "device": "cpu", "device_memory_gib": 4.0, "peak_tflops": 0.1, "levels": [
        {"name": "rank", "size": 1, "bandwidth_gbps": 10.0, "latency_us": 5.0},
        {"name": "node", "size": 2, "bandwidth_gbps": 0.32, "latency_us": 10.0},
        {"name": "inter-node", "size": 2, "bandwidth_gbps": 0.04, "latency_us": 20.0}]},
    "frontier-like": {"name": "frontier-like", "device": "cpu", "device_memory_gib": 4.0, "peak_tflops": 0.1,
                      "levels": [{"name": "gcd-pair", "size": 2, "bandwidth_gbps": 0.2, "latency_us": 5.0},
                                 {"name": "node", "size": 2, "bandwidth_gbps": 0.05, "latency_us": 10.0},
                                 {"name": "inter-node", "size": 2, "bandwidth_gbps": 0.0125, "latency_us": 20.0}]},
}
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("zero3", {}), ("zeropp", {}), ("zero3", {"weight_bits": 8}), ("zero3", {"secondary_span": 2}),
    ("zero3", {"grad_bits": 4}), ("mics", {}), ("3level-a", {}), ("3level-b", {}),
    ("zero3", {"prefetch_buckets": 0}), ("zero3", {"prefetch_buckets": 2}),
    ("zero3", {"allgather_bucket_mb": 0.5, "reduce_bucket_mb": 1}), ("zero2", {}), ("zero1", {}),
]
FIT = fit_options("compute_efficiency,quant_elems_per_s,overlap", [])
"""The scalars fitted: overlap too, although ranks outnumber cores: on emulated links a collective is
mostly wire time, during which the cores compute for other ranks (held at 0, the fits were worse)."""
MODES: dict[str, dict[str, Any]] = {
    "fitted to step times, one per level": {"tie_levels": False},
    "read off the runs' per-level seconds": {"bandwidths": "measured"},
}
"""Two ways to calibrate the links: least squares on step times (one efficiency per level), or each
level's bytes over its seconds as run.json records them (``measured_level_efficiencies``; with them the
quantization rate, elements over seconds, where the runs recorded it: ``measured_quant_rate``)."""


def label(i: int) -> str:
    preset, overrides = VARIANTS[i]
    return f"{i:02d} {preset} {json.dumps(overrides) if overrides else ''}".strip()


def valid(cluster: ClusterSpec) -> list[int]:
    """The variants that resolve on ``cluster`` (a 3-level reading needs its levels)."""
    out = []
    for i, (preset, overrides) in enumerate(VARIANTS):
        try:
            build_strategy(preset, cluster, **overrides)
        except SpecError:
            continue
        out.append(i)
    return out


def train(cluster_file: Path, i: int, out: Path, args: argparse.Namespace, emulated: bool) -> dict | None:
    if out.is_file():
        run = json.loads(out.read_text())
        if run.get("status") == "ok":
            return run
    preset, overrides = VARIANTS[i]
    sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    cmd = [sys.executable, "-m", "zerotune.api.cli", "train", "--model", args.model, "--cluster", str(cluster_file),
           "--strategy", preset, *sets, "--steps", str(args.steps), "--warmup", str(args.warmup), "--quiet",
           "--out", str(out), *(["--emulate", "--emulate-scale", "1"] if emulated else [])]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    status = "ok" if result.returncode == 0 else "FAILED: " + (result.stderr.strip().splitlines() or ["?"])[-1]
    print(f"  {out.stem}: {status} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    run = json.loads(out.read_text()) if out.is_file() else None
    return run if run and run.get("status") == "ok" else None


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def splits(indices: list[int], repeats: int) -> list[tuple[list[int], list[int]]]:
    import random

    rng, out = random.Random(0), []
    for _ in range(repeats):
        order = rng.sample(indices, len(indices))
        a, b = sorted(order[:len(order) // 2]), sorted(order[len(order) // 2:])
        out += [(a, b), (b, a)]
    return out


def analyse(name: str, points: dict[int, Measurement], loopback: dict[int, Measurement], repeats: int) -> None:
    print(f"\n== {name}: {len(points)} strategies, step time = median of the rounds")
    for mode, how in MODES.items():
        rho, err = [], []
        for k, (train_ids, held) in enumerate(splits(sorted(points), repeats)):
            calib, _ = fit([points[i] for i in train_ids], name=name, fields=FIT[0], start=FIT[1], **how)
            pred = [predicted_step_time(points[i], calib) for i in held]
            meas = [points[i].step_time_s for i in held]
            rho.append(spearman(meas, pred))
            err.append(statistics.median(abs(p - m) / m for p, m in zip(pred, meas, strict=True)))
            if k == 0:
                per_level = ", ".join(f"{e:.3g}" for e in calib.bandwidth_efficiency)
                print(f"   bandwidths {mode}; calibrated on {len(train_ids)}: bandwidth efficiency per level "
                      f"{per_level}, compute {calib.compute_efficiency:.3g}, quantization "
                      f"{calib.quant_elems_per_s:.3g} elements/s")
                for i, p, m in zip(held, pred, meas, strict=True):
                    print(f"   {label(i):<50} measured {m:7.3f} s  predicted {p:7.3f} s  {p / m - 1:+6.1%}")
        print(f"   over {len(rho)} held-out halves: Spearman mean {statistics.fmean(rho):.3f} (min {min(rho):.3f}; "
              f"goal >= 0.9), median relative error mean {statistics.fmean(err):.1%} (max {max(err):.1%}; goal "
              f"<= 10%)")
    calib, _ = fit(list(points.values()), name=name, fields=FIT[0], start=FIT[1], tie_levels=False)
    if 0 in points and 1 in points:
        measured = points[0].step_time_s / points[1].step_time_s
        predicted = predicted_step_time(points[0], calib) / predicted_step_time(points[1], calib)
        print(f"   ZeRO++ over ZeRO-3 (step time ratio ZeRO-3 / ZeRO++): measured {measured:.2f}, predicted "
              f"{predicted:.2f} (calibrated on all)")
    common = sorted(set(points) & set(loopback))
    if len(common) >= 4:
        ranking_change(points, loopback, common, repeats)
        emu = [points[i].step_time_s for i in common]
        loop = [loopback[i].step_time_s for i in common]
        print(f"   loopback vs emulated ranking: Spearman {spearman(emu, loop):.3f} measured; the order changes for "
              f"{sum(1 for a in range(len(common)) for b in range(a) if (emu[a] - emu[b]) * (loop[a] - loop[b]) < 0)} "
              f"of {len(common) * (len(common) - 1) // 2} pairs")
        print("   " + ", ".join(f"{label(i).split(' ', 1)[1]}: {points[i].step_time_s / loopback[i].step_time_s:.1f}x"
                                for i in common))


def flips(a: list[float], b: list[float]) -> set[tuple[int, int]]:
    """The pairs (i, j) whose order in ``a`` differs from their order in ``b``."""
    return {(i, j) for i in range(len(a)) for j in range(i) if (a[i] - a[j]) * (b[i] - b[j]) < 0}


def ranking_change(points: dict[int, Measurement], loopback: dict[int, Measurement], common: list[int],
                   repeats: int) -> None:
    """Does the model predict where the emulated ranking departs from loopback's? Each held-out half is
    predicted twice: by a calibration fitted on the other half's emulated runs, and by one fitted on the
    same strategies' loopback runs (one bandwidth for every level: on loopback they are one transport)."""
    slow_rho, caught, claimed, agree, total = [], [], [], 0, 0
    for train_ids, held in splits(common, repeats):
        emu_calib, _ = fit([points[i] for i in train_ids], name="emulated", fields=FIT[0], start=FIT[1],
                           tie_levels=False)
        loop_calib, _ = fit([loopback[i] for i in train_ids], name="loopback", fields=FIT[0], start=FIT[1],
                            tie_levels=True)
        me = [points[i].step_time_s for i in held]
        ml = [loopback[i].step_time_s for i in held]
        pe = [predicted_step_time(points[i], emu_calib) for i in held]
        pl = [predicted_step_time(loopback[i], loop_calib) for i in held]
        slow_rho.append(spearman([a / b for a, b in zip(me, ml, strict=True)],
                                 [a / b for a, b in zip(pe, pl, strict=True)]))
        measured, predicted = flips(me, ml), flips(pe, pl)
        pairs = len(held) * (len(held) - 1) // 2
        agree += pairs - len(measured ^ predicted)
        total += pairs
        if measured:
            caught.append(len(measured & predicted) / len(measured))
        if predicted:
            claimed.append(len(measured & predicted) / len(predicted))
    print(f"   the model on the ranking change (held-out halves, emulated and loopback calibrations each fitted "
          f"on the other half): slow-down emulated/loopback per strategy, Spearman measured vs predicted mean "
          f"{statistics.fmean(slow_rho):.3f}; pairs whose order changes: measured and predicted agree on "
          f"{agree} of {total} ({agree / total:.0%}); of the measured changes the model predicts "
          f"{statistics.fmean(caught) if caught else float('nan'):.0%}, of its predicted changes "
          f"{statistics.fmean(claimed) if claimed else float('nan'):.0%} happen")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "emulated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--model", default="gpt-mini")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cluster", action="append", choices=sorted(CLUSTERS), help="default: both")
    args = ap.parse_args()
    lack = netns.missing()
    if lack is not None:
        print(f"emulated_fidelity.py: needs {lack}", file=sys.stderr)
        return 2
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    for name in args.cluster or sorted(CLUSTERS):
        spec = ClusterSpec.from_dict(CLUSTERS[name])
        cluster_file = args.runs_dir / f"{name}.json"
        cluster_file.write_text(json.dumps(CLUSTERS[name]))
        ids = valid(spec)
        rounds: dict[int, list[dict]] = {i: [] for i in ids}
        for r in range(args.rounds):
            print(f"{name}: round {r + 1}/{args.rounds}", file=sys.stderr)
            for i in ids:
                run = train(cluster_file, i, args.runs_dir / f"{name}-r{r}-{i:02d}.json", args, emulated=True)
                if run:
                    rounds[i].append(run)
        print(f"{name}: loopback", file=sys.stderr)
        loop = {i: train(cluster_file, i, args.runs_dir / f"{name}-loopback-{i:02d}.json", args, emulated=False)
                for i in ids}
        points = {i: dataclasses.replace(Measurement.from_run(rs[0]),
                                         step_time_s=statistics.median(r["step_time_s"] for r in rs))
                  for i, rs in rounds.items() if rs}
        loopback = {i: Measurement.from_run(run) for i, run in loop.items() if run}
        analyse(name, points, loopback, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
