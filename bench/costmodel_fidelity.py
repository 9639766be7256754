"""How well the cost model predicts real runs, and how fast it predicts.

    python bench/costmodel_fidelity.py                       # 20 strategies x 3 rounds, local:2x2x2 (~35 min)
    python bench/costmodel_fidelity.py --runs-dir runs/      # reuse run.json files already there (resumes)

1. Trains each strategy for real (``zerotune train``, 8 gloo ranks, 20 steps of which the first 8
   are warm-up: 8 ranks on a 2-core machine take that long to settle) ``--rounds`` times, round by
   round so that slow drift of the machine touches every strategy alike. A strategy's measured step
   time is the median over its rounds (each round's own figure is the median of its timed steps).
2. Calibrates the cost model on every other strategy (the even-numbered half) and predicts the others;
   then the other way round (two-fold), so every strategy is predicted once by a fit that never saw it.
3. Prints measured vs predicted step time for the held-out half, the Spearman rank correlation and
   the median relative error (goals: >= 0.9 and <= 15%), against the rounds' median and against the
   first round alone.
4. Prints how well the measurements rank themselves: Spearman between two rounds over all strategies
   (r), the same for the median of K rounds by the Spearman-Brown formula (r_K = K r / (1 + (K-1) r)),
   and about sqrt(r_K): what an exact predictor would reach against those medians, the ceiling the
   measurement noise puts on any model here.
5. Times ``predict`` on gpt-neox-20b / frontier:48 over random valid strategies (goal >= 10,000/s).
Run it on an otherwise idle machine: other work on the cores changes every measured step time.
``--hidden`` / ``--seq-len`` change the preset's shape (e.g. 384 / 32 for a communication-bound step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from strategies.calibration import Measurement, fit, predicted_step_time  # noqa: E402
from strategies.catalog import build_strategy, parse_cluster, parse_model  # noqa: E402
from strategies.costmodel import predict  # noqa: E402
from strategies.errors import SpecError  # noqa: E402

VARIANTS = [  # (preset, overrides): presets plus knobs the tuner turns
    ("zero1", {}), ("zero2", {}), ("zero3", {}), ("mics", {}), ("zeropp", {}), ("3level-a", {}), ("3level-b", {}),
    ("zero3", {"prefetch_buckets": 0}), ("zero3", {"allgather_bucket_mb": 0.5, "reduce_bucket_mb": 1}),
    ("zero3", {"weight_bits": 8}), ("zero3", {"grad_bits": 8}), ("zero3", {"micro_batch_size": 2}),
    ("zero3", {"activation_checkpointing": True}), ("zeropp", {"quantize_above": 3}),
    ("zeropp", {"weight_bits": 16}), ("mics", {"grad_bits": 4, "quantize_above": 2}),
    ("3level-a", {"allgather_bucket_mb": 0.5}), ("zero2", {"grad_bits": 8, "quantize_above": 3}),
    ("3level-b", {"prefetch_buckets": 2}), ("zero1", {"micro_batch_size": 2}),
]


def _ok_run(path: Path) -> dict | None:
    """The run.json at ``path`` if it finished (status ok), else None."""
    if not path.is_file():
        return None
    run = json.loads(path.read_text())
    return run if run.get("status") == "ok" else None


def run_all(args: argparse.Namespace, runs_dir: Path, prefix: str = "run") -> dict[int, dict]:
    """Train every variant once (skipping runs already there); returns {variant index: ok run.json}."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    model = bench_model(args, runs_dir)
    done = {}
    for i, (preset, overrides) in enumerate(VARIANTS):
        path = runs_dir / f"{prefix}{i:02d}-{preset}.json"
        run = _ok_run(path)
        if run is None:
            sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
            cmd = [sys.executable, "-m", "api.cli", "train", "--model", model, "--cluster", args.cluster,
                   "--strategy", preset, *sets, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--quiet", "--out", str(path)]
            t0 = time.perf_counter()
            result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            status = "ok" if result.returncode == 0 else "FAILED: " + (result.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{prefix} [{i + 1}/{len(VARIANTS)}] {preset} {overrides}: {status} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            run = _ok_run(path)
        if run is not None:
            done[i] = run
    return done


def bench_model(args: argparse.Namespace, runs_dir: Path) -> str:
    """The preset with ``--hidden`` / ``--seq-len`` applied, as a model JSON file in the runs directory."""
    base = parse_model(args.model)
    changes = {k: v for k, v in (("hidden", args.hidden), ("seq_len", args.seq_len)) if v}
    if not changes:
        return args.model
    spec = dataclasses.replace(base, name=f"{base.name}-h{changes.get('hidden', base.hidden)}"
                                          f"-t{changes.get('seq_len', base.seq_len)}", **changes)
    path = runs_dir / "model.json"
    path.write_text(json.dumps(spec.to_dict()))
    return str(path)


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def fidelity(rounds: list[dict[int, dict]]) -> None:
    runs = {i: [r[i] for r in rounds if i in r] for i in range(len(VARIANTS))}
    runs = {i: rs for i, rs in runs.items() if rs}
    measured = {i: statistics.median(r["step_time_s"] for r in rs) for i, rs in runs.items()}
    first = {i: rs[0]["step_time_s"] for i, rs in runs.items()}
    # what each strategy ran, timed by the median of its rounds
    points = {i: dataclasses.replace(Measurement.from_run(rs[0]), step_time_s=measured[i]) for i, rs in runs.items()}
    for calibrate_on, held_out in (("even", 1), ("odd", 0)):  # two-fold: each half predicted once
        held_out_half(runs, points, first, len(rounds), calibrate_on, held_out)
    reliability(runs, len(rounds))


def held_out_half(runs: dict[int, list[dict]], points: dict[int, Measurement], first: dict[int, float], k: int,
                  calibrate_on: str, held_out: int) -> None:
    train = [m for i, m in points.items() if i % 2 != held_out]
    fields = ["compute_efficiency", "latency_scale", "quant_elems_per_s", "overlap", "step_overhead_s"]
    calib, stats = fit(train, name="local-cpu", fields=fields)
    print(f"\n=== calibrated on the {calibrate_on}-numbered {len(train)} strategies "
          f"(fit median error {stats['median_rel_error']:.1%}):")
    print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in calib.to_dict().items() if k != "name"))
    held = [i for i in points if i % 2 == held_out]
    print(f"\n{'held-out strategy':<52}{'rounds s':>36}{'median s':>10}{'predicted':>11}{'error':>8}")
    pred, meas = [predicted_step_time(points[i], calib) for i in held], [points[i].step_time_s for i in held]
    for i, p, m in zip(held, pred, meas, strict=True):
        label = f"{i:02d} {VARIANTS[i][0]} {json.dumps(VARIANTS[i][1])}"[:50]
        each = " ".join(f"{r['step_time_s']:.3f}" for r in runs[i])
        print(f"{label:<52}{each:>36}{m:>10.4f}{p:>11.4f}{(p - m) / m:>8.1%}")
    for what, values in ((f"median of {k} rounds", meas), ("first round only", [first[i] for i in held])):
        errors = [abs(p - m) / m for p, m in zip(pred, values, strict=True)]
        print(f"against the {what}: Spearman {spearman(values, pred):.3f} (goal >= 0.9), "
              f"median relative error {statistics.median(errors):.1%} (goal <= 15%)")


def reliability(runs: dict[int, list[dict]], k: int) -> None:
    """How well the measurements rank themselves: the ceiling measurement noise puts on any model."""
    both = [i for i, rs in runs.items() if len(rs) >= 2]
    if len(both) < 3 or k < 2:
        return
    r = spearman([runs[i][0]["step_time_s"] for i in both], [runs[i][1]["step_time_s"] for i in both])
    rk = k * r / (1 + (k - 1) * r) if r > 0 else r
    spread = statistics.median(
        (max(x["step_time_s"] for x in rs) - min(x["step_time_s"] for x in rs))
        / statistics.median(x["step_time_s"] for x in rs) for rs in runs.values() if len(rs) >= 2)
    times = sorted(statistics.median(x["step_time_s"] for x in rs) for rs in runs.values())
    print(f"\nmeasurement noise: strategies' medians span {times[0]:.3f}-{times[-1]:.3f} s; one strategy's rounds "
          f"spread {spread:.1%} (median over strategies)")
    print(f"  Spearman(round 1, round 2) over {len(both)} strategies r = {r:.3f}; for the median of {k} rounds "
          f"r_{k} = {rk:.3f}; an exact predictor would reach about sqrt(r_{k}) = {math.sqrt(max(rk, 0.0)):.3f}")


def speed(n: int) -> None:
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("frontier:48")
    rng = random.Random(0)
    strategies = []
    while len(strategies) < n:
        p = rng.randint(0, 3)
        g = rng.randint(p, 3)
        fields = {"param_span": p, "grad_span": g, "optim_span": rng.randint(g, 3),
                  "secondary_span": rng.choice([None, *range(p)]), "weight_bits": rng.choice([16, 8, 4]),
                  "grad_bits": rng.choice([16, 8, 4]), "quantize_above": rng.randint(1, 3),
                  "allgather_bucket_mb": rng.choice([50, 100, 200, 500, 1000, 2000]),
                  "reduce_bucket_mb": rng.choice([50, 200, 500, 1000]), "prefetch_buckets": rng.randint(0, 3),
                  "micro_batch_size": rng.choice([1, 2, 4]), "activation_checkpointing": rng.random() < 0.5}
        try:
            strategies.append(build_strategy(fields, cluster))
        except SpecError:
            continue
    t0 = time.perf_counter()
    for s in strategies:
        predict(model, cluster, s, global_batch=1536)
    rate = n / (time.perf_counter() - t0)
    print(f"\nprediction speed: {rate:,.0f} strategies/s (gpt-neox-20b, frontier:48, {n} random strategies)"
          "   goal >= 10,000/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--cluster", default="local:2x2x2")
    parser.add_argument("--hidden", type=int, default=0, help="override the preset's hidden size (0: keep)")
    parser.add_argument("--seq-len", type=int, default=0, help="override the preset's sequence length (0: keep)")
    parser.add_argument("--rounds", type=int, default=3, help="times each strategy is trained (>= 2 for the noise)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=8,
                        help="first steps left out (here the first ~8 steps of 8 oversubscribed ranks run slow)")
    parser.add_argument("--runs-dir", default=str(ROOT / "artifacts" / "fidelity"))
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--predictions", type=int, default=20000)
    args = parser.parse_args()
    if not args.speed_only:
        fidelity([run_all(args, Path(args.runs_dir), "run" if k == 0 else f"round{k + 1}")
                  for k in range(args.rounds)])
    speed(args.predictions)


if __name__ == "__main__":
    main()
