"""How well the cost model predicts real runs, and how fast it predicts.

    python bench/costmodel_fidelity.py                       # 20 strategies on local:2x2x2, gpt-mini (~20 min)
    python bench/costmodel_fidelity.py --runs-dir runs/      # reuse run.json files already there

1. Trains each strategy for real (``zerotune train``, 8 gloo ranks) and keeps its run.json.
2. Calibrates the cost model on every other run (the even-numbered half) and predicts the others.
3. Prints measured vs predicted step time for the held-out half, the Spearman rank correlation and
   the median relative error (goals: >= 0.9 and <= 15%).
4. Trains zero3 ``--repeats`` more times and prints the run-to-run spread: the noise floor under any
   model's error (8 ranks share this machine's cores; step times wander with the scheduler).
5. Times ``predict`` on gpt-neox-20b / frontier:48 over random valid strategies (goal >= 10,000/s).
Run it on an otherwise idle machine: other work on the cores changes every measured step time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from strategies.calibration import Measurement, fit  # noqa: E402
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


def run_all(args: argparse.Namespace, runs_dir: Path, variants: list[tuple[str, dict]] | None = None,
            prefix: str = "run") -> list[Path]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    variants = VARIANTS if variants is None else variants
    for i, (preset, overrides) in enumerate(variants):
        path = runs_dir / f"{prefix}{i:02d}-{preset}.json"
        paths.append(path)
        if path.is_file() and json.loads(path.read_text()).get("status") == "ok":
            continue
        sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
        cmd = [sys.executable, "-m", "api.cli", "train", "--model", args.model, "--cluster", args.cluster,
               "--strategy", preset, *sets, "--steps", str(args.steps), "--warmup", "2", "--quiet", "--out", str(path)]
        t0 = time.perf_counter()
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        status = "ok" if result.returncode == 0 else "FAILED: " + result.stderr.strip().splitlines()[-1]
        print(f"[{i + 1}/{len(variants)}] {preset} {overrides}: {status} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr)
    return [p for p in paths if p.is_file() and json.loads(p.read_text()).get("status") == "ok"]


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def fidelity(paths: list[Path]) -> None:
    runs = [(p, Measurement.from_run(json.loads(p.read_text()), str(p))) for p in paths]
    train, test = runs[0::2], runs[1::2]
    fields = ["compute_efficiency", "latency_scale", "quant_elems_per_s", "overlap", "step_overhead_s"]
    calib, stats = fit([m for _, m in train], name="local-cpu", fields=fields)
    print(f"\ncalibrated on {len(train)} runs (fit median error {stats['median_rel_error']:.1%}):")
    print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in calib.to_dict().items() if k != "name"))
    print(f"\n{'held-out run':<36}{'measured s':>12}{'predicted s':>13}{'error':>9}")
    measured, predicted = [], []
    for path, m in test:
        p = predict(m.model, m.cluster, m.strategy, elem_bytes=m.elem_bytes, global_batch=m.global_batch,
                    calibration=calib, block=m.quant_block)["step_time_s"]
        measured.append(m.step_time_s)
        predicted.append(p)
        print(f"{path.stem:<36}{m.step_time_s:>12.4f}{p:>13.4f}{(p - m.step_time_s) / m.step_time_s:>9.1%}")
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    print(f"\nSpearman rank correlation (held-out): {spearman(measured, predicted):.3f}   goal >= 0.9")
    print(f"median relative error (held-out):     {statistics.median(errors):.1%}   goal <= 15%")


def noise(paths: list[Path]) -> None:
    """Run-to-run spread of one strategy trained several times: the floor under any model's error."""
    times = [json.loads(p.read_text())["step_time_s"] for p in paths]
    if len(times) < 2:
        return
    mean = statistics.mean(times)
    print(f"\nrun-to-run noise ({len(times)} identical zero3 runs): step time {min(times):.4f}-{max(times):.4f} s, "
          f"spread {max(times) / min(times) - 1:.1%}, coefficient of variation {statistics.stdev(times) / mean:.1%}")


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
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (2 of them warm-up)")
    parser.add_argument("--runs-dir", default=str(ROOT / "artifacts" / "fidelity"))
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--predictions", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3, help="extra identical zero3 runs that measure the noise")
    args = parser.parse_args()
    if not args.speed_only:
        fidelity(run_all(args, Path(args.runs_dir)))
        noise(run_all(args, Path(args.runs_dir), [("zero3", {})] * args.repeats, prefix="noise"))
    speed(args.predictions)


if __name__ == "__main__":
    main()
