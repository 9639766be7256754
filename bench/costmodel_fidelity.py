"""How well the cost model predicts real runs, and how fast it predicts.

    python bench/costmodel_fidelity.py                       # 20 strategies x 3 rounds, local:2x2x2 (~45 min)
    python bench/costmodel_fidelity.py --runs-dir runs/      # reuse run.json files already there (resumes)
    python bench/costmodel_fidelity.py --runs-dir bench/data/fidelity-2core --rounds 28 --campaign 5,5,5,5,3,5  # stored

1. Trains each strategy for real (``zerotune train``, 8 gloo ranks, 20 steps of which the first 8
   are warm-up: 8 ranks on a 2-core machine take that long to settle) ``--rounds`` times, round by
   round so that slow drift of the machine touches every strategy alike. A run's step time is the
   median of its timed steps (run.json's ``step_time_s``, what the tuner ranks by); ``--statistic
   min`` takes the fastest step instead, which repeats better on a shared 2-core machine (the r of
   item 4 in the six stored campaigns: 0.65-0.79 against 0.54-0.74) but is not what the tuner
   ranks by. A strategy's time is the median over its rounds.
2. 5x2 cross-validation (Dietterich 1998): ``--repeats`` random splits of the strategies into two
   halves; each half calibrates (``FIT_LOCAL``) and the other half is predicted, so every figure
   comes from a fit that never saw the strategy, and no single lucky split decides the result.
3. Prints measured vs predicted step time for the first split's held-out halves, then per split and
   averaged over all held-out halves: Spearman rank correlation and median relative error (goals:
   >= 0.9 and <= 15%), against the rounds' median (and against the first round alone).
4. Prints how well the measurements rank themselves: the mean Spearman between two rounds over all
   strategies (r), the same for the median of K rounds by the Spearman-Brown formula
   (r_K = K r / (1 + (K-1) r)), and about sqrt(r_K): what an exact predictor would reach against
   those medians, the ceiling the measurement noise puts on any model here. With ``--campaign K``
   (rounds measured in campaigns of K, at different times; ``K1,K2,...`` for campaigns of
   different sizes, in order) also each campaign's medians as the prediction of every other
   campaign's, scored as the model is: the ceiling the machine's drift puts on it, which sqrt(r_K)
   does not see.
5. Times ``predict`` on gpt-neox-20b / frontier:48 over random valid strategies, best of 3 passes
   each started with empty caches (goal >= 10,000/s).
Run it on an otherwise idle machine: other work on the cores changes every measured step time.
``--hidden`` / ``--seq-len`` change the preset's shape (e.g. 384 / 32 for a communication-bound step);
``--first-round K`` analyses rounds K..``--rounds`` alone (a later campaign as an independent check).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from zerotune.costmodel import Calibration, clear_caches, predict
from zerotune.costmodel.calibration import fit, fit_options, predicted_step_time
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.measured import Measurement
from zerotune.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent

VARIANTS = [  # (preset, overrides): presets plus knobs the tuner turns
    ("zero1", {}), ("zero2", {}), ("zero3", {}), ("mics", {}), ("zeropp", {}), ("3level-a", {}), ("3level-b", {}),
    ("zero3", {"prefetch_buckets": 0}), ("zero3", {"allgather_bucket_mb": 0.5, "reduce_bucket_mb": 1}),
    ("zero3", {"weight_bits": 8}), ("zero3", {"grad_bits": 8}), ("zero3", {"micro_batch_size": 2}),
    ("zero3", {"activation_checkpointing": True}), ("zeropp", {"quantize_above": 3}),
    ("zeropp", {"weight_bits": 16}), ("mics", {"grad_bits": 4, "quantize_above": 2}),
    ("3level-a", {"allgather_bucket_mb": 0.5}), ("zero2", {"grad_bits": 8, "quantize_above": 3}),
    ("3level-b", {"prefetch_buckets": 2}), ("zero1", {"micro_batch_size": 2}),
]
# What a half (10 runs) calibrates: compute efficiency, quantization throughput and one effective
# bandwidth shared by the three levels (3 unknowns): all 8 ranks run on this host, so every level's
# collectives cross the same loopback transport (``fit``'s default for one-host runs; --per-level
# fits one bandwidth per level, 5 unknowns, and ranks worse on every campaign: report.txt). Overlap
# is fixed at 0: 8 ranks share 2 cores, so no core is ever idle for communication to hide behind;
# and these runs cannot tell overlap apart (fits from different starts end anywhere in 0..1 at the
# same cost). Latency stays nominal. Fitting latency, overlap and step overhead too (--fit-all:
# 6 unknowns for 10 runs) lets a fit trade latency against bandwidth and overhead against compute,
# and it ranks worse (report.txt: 0.804 against 0.933 on rounds 1-28, 0.885 against 0.906 on 16-28).
# As `zerotune calibrate --fit compute_efficiency,quant_elems_per_s --fix overlap=0`.
FIT_LOCAL = fit_options("compute_efficiency,quant_elems_per_s", ["overlap=0"])
FIT_ALL = fit_options("compute_efficiency,latency_scale,quant_elems_per_s,overlap,step_overhead_s", [])


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
            cmd = [sys.executable, "-m", "zerotune.api.cli", "train", "--model", model, "--cluster", args.cluster,
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


def figure(run: dict, statistic: str) -> float:
    """One run's step time: run.json's ``step_time_s`` (the median of its timed steps) or the fastest timed step."""
    return float(min(run["step_times_s"][run["warmup_steps"]:])) if statistic == "min" else run["step_time_s"]


def fidelity(rounds: list[dict[int, dict]], statistic: str, repeats: int,
             fit_with: tuple[list[str] | None, Calibration, bool | None],
             campaign: list[int] | None = None) -> None:
    runs = {i: [r[i] for r in rounds if i in r] for i in range(len(VARIANTS))}
    runs = {i: rs for i, rs in runs.items() if rs}
    times = {i: [figure(r, statistic) for r in rs] for i, rs in runs.items()}
    # what each strategy ran, timed by the median of its rounds
    points = {i: dataclasses.replace(Measurement.from_run(runs[i][0]), step_time_s=statistics.median(times[i]))
              for i in runs}
    print(f"step time of a run: the {statistic} of its timed steps; of a strategy: the median over its "
          f"{len(rounds)} rounds; {repeats}x2 cross-validation (each split: each half calibrates, the other "
          f"is predicted)")
    folds: list[tuple[float, float, float]] = []
    for rep, pairs in enumerate(splits(sorted(points), repeats)):
        for train, held in pairs:
            folds.append(held_out_half(times, points, train, held, fit_with, detail=rep == 0))
        print(f"split {rep + 1}: Spearman {folds[-2][0]:.3f} / {folds[-1][0]:.3f}, median relative error "
              f"{folds[-2][1]:.1%} / {folds[-1][1]:.1%} (first round only: Spearman {folds[-2][2]:.3f} / "
              f"{folds[-1][2]:.3f})")
    rho, err, rho1 = ([f[k] for f in folds] for k in range(3))
    print(f"\nover {len(folds)} held-out halves: Spearman mean {statistics.fmean(rho):.3f} "
          f"(range {min(rho):.3f}-{max(rho):.3f}; goal >= 0.9), median relative error mean "
          f"{statistics.fmean(err):.1%} (max {max(err):.1%}; goal <= 15%); against the first round only: "
          f"Spearman mean {statistics.fmean(rho1):.3f}")
    reliability(times, len(rounds))
    if campaign:
        campaigns(rounds, campaign, statistic, repeats)


def splits(indices: list[int], repeats: int) -> list[tuple[tuple[list[int], list[int]], ...]]:
    """The 5x2 cross-validation's splits: per repeat, (train, held) both ways round (seeded: every
    caller gets the same halves)."""
    rng, out = random.Random(0), []
    for _ in range(repeats):
        order = rng.sample(indices, len(indices))
        a, b = sorted(order[:len(order) // 2]), sorted(order[len(order) // 2:])
        out.append(((a, b), (b, a)))
    return out


def campaign_sizes(text: str) -> list[int]:
    """``--campaign``: ``K`` (campaigns of K rounds) or ``K1,K2,...`` (consecutive campaigns of those sizes)."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--campaign={text!r}: must be K or K1,K2,... (rounds per campaign)") from None
    if any(k < 1 for k in sizes):
        raise argparse.ArgumentTypeError(f"--campaign={text!r}: every campaign needs at least 1 round")
    return sizes


def campaign_groups(rounds: list[dict[int, dict]], sizes: list[int]) -> list[list[dict[int, dict]]]:
    """Consecutive rounds grouped into campaigns: one size repeats for as many whole campaigns as
    there are rounds; a list is taken as given (``main`` checks that it adds up to the rounds analysed)."""
    if len(sizes) == 1:
        sizes = sizes * (len(rounds) // sizes[0])
    ends = list(itertools.accumulate(sizes))
    return [rounds[end - k:end] for k, end in zip(sizes, ends, strict=True)]


def campaigns(rounds: list[dict[int, dict]], sizes: list[int], statistic: str, repeats: int) -> None:
    """How well one campaign's measurements predict another's, on the same held-out halves.

    Rounds are grouped into campaigns of consecutive rounds (measured at different times).
    Each campaign's medians are used as the "prediction" of every other campaign's, scored exactly as
    the model is (mean Spearman over the held-out halves). No model can be expected to beat a
    re-measurement of the same strategies at another time by much: that is the ceiling the machine's
    drift puts on the goal, which sqrt(r_K) (rounds of one campaign only) does not see."""
    groups = campaign_groups(rounds, sizes)
    if len(groups) < 2:
        return
    medians = [{i: statistics.median(figure(r[i], statistic) for r in g) for i in range(len(VARIANTS))
                if all(i in r for r in g)} for g in groups]
    counts = [len(g) for g in groups]
    of = str(counts[0]) if len(set(counts)) == 1 else "+".join(map(str, counts))
    print(f"\nanother campaign as the prediction ({len(groups)} campaigns of {of} rounds; mean Spearman over "
          f"the same held-out halves, source -> target):")
    cells = []
    for t, target in enumerate(medians):
        for s, source in enumerate(medians):
            common = sorted(set(target) & set(source))
            if s == t or len(common) < 4:
                continue
            rho = [spearman([target[i] for i in held], [source[i] for i in held])
                   for pairs in splits(common, repeats) for _, held in pairs]
            cells.append(f"{s + 1}->{t + 1} {statistics.fmean(rho):.3f}")
    print("  " + ", ".join(cells))


def held_out_half(times: dict[int, list[float]], points: dict[int, Measurement], train: list[int], held: list[int],
                  fit_with: tuple[list[str] | None, Calibration, bool | None],
                  detail: bool) -> tuple[float, float, float]:
    """Calibrate on ``train`` (fields, start, tie_levels), predict ``held``: (Spearman, median relative error,
    Spearman vs the first round)."""
    fields, start, tie = fit_with
    calib, stats = fit([points[i] for i in train], name="local-cpu", fields=fields, start=start, tie_levels=tie)
    pred, meas = [predicted_step_time(points[i], calib) for i in held], [points[i].step_time_s for i in held]
    first = [times[i][0] for i in held]
    if detail:
        print(f"\n=== calibrated on {len(train)} strategies ({' '.join(f'{i:02d}' for i in train)}), "
              f"fit median error {stats['median_rel_error']:.1%}:")
        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in calib.to_dict().items() if k != "name"))
        print(f"{'held-out strategy':<52}{'rounds s':>36}{'median s':>10}{'predicted':>11}{'error':>8}")
        for i, p, m in zip(held, pred, meas, strict=True):
            label = f"{i:02d} {VARIANTS[i][0]} {json.dumps(VARIANTS[i][1])}"[:50]
            each = " ".join(f"{t:.3f}" for t in times[i])
            each = each if len(each) <= 34 else each[:31] + "..."
            print(f"{label:<52}{each:>36}{m:>10.4f}{p:>11.4f}{(p - m) / m:>8.1%}")
    errors = [abs(p - m) / m for p, m in zip(pred, meas, strict=True)]
    return spearman(meas, pred), statistics.median(errors), spearman(first, pred)


def reliability(times: dict[int, list[float]], k: int) -> None:
    """How well the measurements rank themselves: the ceiling measurement noise puts on any model.

    r is the mean Spearman over every pair of rounds (all strategies measured in both); the median
    of k rounds then ranks like r_k = k r / (1 + (k - 1) r) (Spearman-Brown), and a predictor that
    knew the true times exactly would reach about sqrt(r_k) against those medians."""
    full = [i for i, ts in times.items() if len(ts) == k]
    if len(full) < 3 or k < 2:
        return
    pairs = [spearman([times[i][a] for i in full], [times[i][b] for i in full])
             for a in range(k) for b in range(a + 1, k)]
    r = statistics.fmean(pairs)
    rk = k * r / (1 + (k - 1) * r) if r > 0 else r
    spread = statistics.median((max(ts) - min(ts)) / statistics.median(ts) for ts in times.values() if len(ts) >= 2)
    medians = sorted(statistics.median(ts) for ts in times.values())
    print(f"\nmeasurement noise: strategies' medians span {medians[0]:.3f}-{medians[-1]:.3f} s; one strategy's rounds "
          f"spread {spread:.1%} (median over strategies)")
    print(f"  Spearman between two rounds over {len(full)} strategies: mean r = {r:.3f} over {len(pairs)} pairs "
          f"({min(pairs):.3f}-{max(pairs):.3f}); for the median of {k} rounds r_{k} = {rk:.3f}; "
          f"an exact predictor would reach about sqrt(r_{k}) = {math.sqrt(max(rk, 0.0)):.3f}")


def speed(n: int, passes: int = 3) -> None:
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
    rates = []
    for _ in range(passes):  # each pass cold: predict memoizes plans and collective costs as it goes
        clear_caches()
        t0 = time.perf_counter()
        for s in strategies:
            predict(model, cluster, s, global_batch=1536)
        rates.append(n / (time.perf_counter() - t0))
    print(f"\nprediction speed: {max(rates):,.0f} strategies/s, best of {passes} cold passes (median "
          f"{statistics.median(rates):,.0f}/s; gpt-neox-20b, frontier:48, {n} random strategies)   goal >= 10,000/s")


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
    parser.add_argument("--first-round", type=int, default=1,
                        help="analyse rounds first..rounds only (e.g. a second campaign on its own)")
    parser.add_argument("--statistic", choices=["median", "min"], default="median",
                        help="a run's step time from its timed steps: median (run.json's step_time_s) or min")
    parser.add_argument("--repeats", type=int, default=5,
                        help="random half splits (5: Dietterich's 5x2 cross-validation)")
    parser.add_argument("--fit-all", action="store_true",
                        help="also fit latency, overlap and step overhead (6 unknowns for 10 runs; see FIT_LOCAL)")
    parser.add_argument("--per-level", action="store_true",
                        help="fit one bandwidth per level instead of one shared by all (all ranks share this host)")
    parser.add_argument("--campaign", type=campaign_sizes, default=None, metavar="K[,K2,...]",
                        help="rounds come in campaigns of K (or of K1, K2, ... rounds, in order) measured at "
                             "different times: also score each campaign's medians as the prediction of every other's")
    parser.add_argument("--runs-dir", default=str(ROOT / "artifacts" / "fidelity"))
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--predictions", type=int, default=20000)
    args = parser.parse_args()
    analysed = args.rounds - args.first_round + 1
    if args.campaign and len(args.campaign) > 1 and sum(args.campaign) != analysed:
        parser.error(f"--campaign={','.join(map(str, args.campaign))}: the sizes add up to {sum(args.campaign)} "
                     f"rounds, but rounds {args.first_round}..{args.rounds} are {analysed}")
    if not args.speed_only:
        fidelity([run_all(args, Path(args.runs_dir), "run" if k == 0 else f"round{k + 1}")
                  for k in range(args.first_round - 1, args.rounds)], args.statistic, args.repeats,
                 (*(FIT_ALL if args.fit_all else FIT_LOCAL), False if args.per_level else None), args.campaign)
    speed(args.predictions)


if __name__ == "__main__":
    main()
