"""The cost model against short runs on emulated clusters, where the levels' links really differ.

    sudo python bench/emulated_fidelity.py                     # 2 clusters x 13 strategies x 2 rounds + loopback
    python bench/emulated_fidelity.py --rounds 3 --runs-dir runs/emulated   # reuse run.json files there (resumes)

Loopback runs cannot check the model's time where links differ: every level is the same transport.
Here each cluster is emulated (``strategies/emulate.py``: a namespace per innermost group, ``tc``-shaped
links per level), its levels' bandwidths given directly as the emulated rates (``--emulate-scale 1``):

- ``two-level``: one rank per namespace; node links 320 MB/s per rank, inter-node links 8x slower;
- ``frontier-like``: Frontier's per-rank ratios (GCD pair : node : inter-node = 16 : 4 : 1): pairs
  of ranks on loopback, node links 200 MB/s per rank, inter-node 50 MB/s per rank.

1. Trains every strategy (ZeRO-3, ZeRO++ and each of its parts, MiCS, both 3-level readings where the
   cluster has their levels, buckets and prefetch variants, ZeRO-2, ZeRO-1) on each cluster,
   ``--rounds`` times, round by round (slow drift of the machine touches every strategy alike); a
   strategy's time is the median of its rounds' step times. Then once on loopback (no emulation).
2. 5x2 cross-validation: each half of the strategies calibrates the model (compute efficiency,
   quantization throughput and one bandwidth per level: the links differ, so levels are not tied),
   the other half is predicted. Prints Spearman and median relative error over the held-out halves
   (goals >= 0.9 and <= 10%), and measured vs predicted ZeRO++ / ZeRO-3.
3. The ranking on loopback against the emulated one: Spearman between them, measured and predicted
   (the model predicts the loopback runs with the same calibration and loopback-like links).

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

from zerotune.errors import SpecError
from zerotune.strategies import emulate
from zerotune.strategies.calibration import Measurement, fit, fit_options, predicted_step_time
from zerotune.strategies.catalog import build_strategy
from zerotune.strategies.spec import ClusterSpec

ROOT = Path(__file__).resolve().parent.parent

CLUSTERS: dict[str, dict[str, Any]] = {
    "two-level": {"name": "two-level", "device": "cpu", "device_memory_gib": 4.0, "peak_tflops": 0.1, "levels": [
        {"name": "rank", "size": 1, "bandwidth_gbps": 10.0, "latency_us": 5.0},
        {"name": "node", "size": 2, "bandwidth_gbps": 0.32, "latency_us": 10.0},
        {"name": "inter-node", "size": 2, "bandwidth_gbps": 0.04, "latency_us": 20.0}]},
    "frontier-like": {"name": "frontier-like", "device": "cpu", "device_memory_gib": 4.0, "peak_tflops": 0.1,
                      "levels": [{"name": "gcd-pair", "size": 2, "bandwidth_gbps": 0.8, "latency_us": 5.0},
                                 {"name": "node", "size": 2, "bandwidth_gbps": 0.2, "latency_us": 10.0},
                                 {"name": "inter-node", "size": 2, "bandwidth_gbps": 0.05, "latency_us": 20.0}]},
}
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("zero3", {}), ("zeropp", {}), ("zero3", {"weight_bits": 8}), ("zero3", {"secondary_span": 2}),
    ("zero3", {"grad_bits": 4}), ("mics", {}), ("3level-a", {}), ("3level-b", {}),
    ("zero3", {"prefetch_buckets": 0}), ("zero3", {"prefetch_buckets": 2}),
    ("zero3", {"allgather_bucket_mb": 0.5, "reduce_bucket_mb": 1}), ("zero2", {}), ("zero1", {}),
]
FIT = fit_options("compute_efficiency,quant_elems_per_s", ["overlap=0"])


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
    rho, err = [], []
    for k, (train_ids, held) in enumerate(splits(sorted(points), repeats)):
        calib, _ = fit([points[i] for i in train_ids], name=name, fields=FIT[0], start=FIT[1], tie_levels=False)
        pred = [predicted_step_time(points[i], calib) for i in held]
        meas = [points[i].step_time_s for i in held]
        rho.append(spearman(meas, pred))
        err.append(statistics.median(abs(p - m) / m for p, m in zip(pred, meas, strict=True)))
        if k == 0:
            per_level = ", ".join(f"{e:.3g}" for e in calib.bandwidth_efficiency)
            print(f"   calibrated on {len(train_ids)}: bandwidth efficiency per level {per_level}, "
                  f"compute {calib.compute_efficiency:.3g}")
            for i, p, m in zip(held, pred, meas, strict=True):
                print(f"   {label(i):<50} measured {m:7.3f} s  predicted {p:7.3f} s  {p / m - 1:+6.1%}")
    print(f"   over {len(rho)} held-out halves: Spearman mean {statistics.fmean(rho):.3f} (min {min(rho):.3f}; goal "
          f">= 0.9), median relative error mean {statistics.fmean(err):.1%} (max {max(err):.1%}; goal <= 10%)")
    calib, _ = fit(list(points.values()), name=name, fields=FIT[0], start=FIT[1], tie_levels=False)
    if 0 in points and 1 in points:
        measured = points[0].step_time_s / points[1].step_time_s
        predicted = predicted_step_time(points[0], calib) / predicted_step_time(points[1], calib)
        print(f"   ZeRO++ over ZeRO-3 (step time ratio ZeRO-3 / ZeRO++): measured {measured:.2f}, predicted "
              f"{predicted:.2f} (calibrated on all)")
    common = sorted(set(points) & set(loopback))
    if len(common) >= 4:
        emu = [points[i].step_time_s for i in common]
        loop = [loopback[i].step_time_s for i in common]
        print(f"   loopback vs emulated ranking: Spearman {spearman(emu, loop):.3f} measured; the order changes for "
              f"{sum(1 for a in range(len(common)) for b in range(a) if (emu[a] - emu[b]) * (loop[a] - loop[b]) < 0)} "
              f"of {len(common) * (len(common) - 1) // 2} pairs")
        print("   " + ", ".join(f"{label(i).split(' ', 1)[1]}: {points[i].step_time_s / loopback[i].step_time_s:.1f}x"
                                for i in common))


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
    lack = emulate.missing()
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
