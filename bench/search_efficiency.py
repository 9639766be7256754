"""How many trials each search needs to get within 2% of the true optimum (cost-model executor).

    python bench/search_efficiency.py                   # gpt-neox-20b on frontier:48, 10 seeds

1. Enumerates the whole strategy space (``tuner.space.Space``) with the cost model and takes the
   best feasible point as the true optimum.
2. For each seed, runs each search until a trial is within 2% of it (or the cap) and records the
   number of trials (every evaluated strategy counts, infeasible ones too):
   - ``zerotune-tpe``: zerotune's study — the known-good presets enqueued first, then the neighbours of the best
     trial so far (``tuner.seeding.refine``: up to three incumbents), then TPE with the memory constraint (what
     ``zerotune tune`` runs);
   - ``tpe``: plain TPE with the constraint;
   - ``random``: uniform random sampling of the same space;
   - ``grid-refine``: the DeepSpeed autotuner's method — every ZeRO stage/preset with default
     knobs, then the best one's micro-batch size, then buckets, prefetch and checkpointing one
     grid at a time (coordinate-wise refinement).
3. Prints the median (and max) trials to 2% per method, and the ratio random / zerotune-tpe.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from zerotune.core.spec import Strategy
from zerotune.costmodel import predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.errors import SpecError
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.seeding import PRESETS, refine
from zerotune.tuner.space import Space


def evaluate(model: Any, cluster: Any, s: Strategy, batch: int) -> tuple[float, float]:
    """(TFLOPS per rank, constraint): constraint > 0 means it does not fit (GiB over)."""
    p = predict(model, cluster, s, global_batch=batch)
    return p["tflops_per_rank"], -p["headroom_bytes"] / 2**30


def optimum(space: Space, model: Any, cluster: Any, batch: int) -> tuple[float, Strategy, int]:
    best, arg, n = -1.0, None, 0
    for s in space.enumerate_space():
        n += 1
        value, over = evaluate(model, cluster, s, batch)
        if over <= 0 and value > best:
            best, arg = value, s
    assert arg is not None
    return best, arg, n


def optuna_search(space: Space, model: Any, cluster: Any, batch: int, target: float, seed: int, sampler: str,
                  presets: bool, cap: int, budget: int) -> int:
    """Trials until one is within 2% of ``target`` (``cap`` + 1: not within ``cap``); ``budget``: the study's trial
    budget, which sizes its refinement rounds as ``zerotune tune``'s does."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)

    if sampler == "random":
        smp = optuna.samplers.RandomSampler(seed=seed)
    else:
        smp = optuna.samplers.TPESampler(seed=seed, n_startup_trials=10, multivariate=True, group=True)
    study = optuna.create_study(direction="maximize", sampler=smp)
    if presets:
        for name in PRESETS:
            study.enqueue_trial(space.strategy_params(build_strategy(name, cluster)))
    n = 0
    while n < cap:
        if presets:  # zerotune's study refines around its best trials before TPE samples (seeding.refine)
            refine(study, space, budget - n)
        trial, s = space.ask(study)
        if s is None:
            continue
        n += 1
        value, over = evaluate(model, cluster, s, batch)
        trial.set_constraint("memory_gib_over", over)
        study.tell(trial, value)
        if over <= 0 and value >= 0.98 * target:
            return n
    return cap + 1


def grid_refine(space: Space, model: Any, cluster: Any, batch: int, target: float, cap: int) -> int:
    """DeepSpeed-autotuner-like: stages first, then one knob grid at a time around the best."""
    n, best, best_s = 0, -1.0, None

    def try_(s: Strategy) -> bool:
        nonlocal n, best, best_s
        n += 1
        value, over = evaluate(model, cluster, s, batch)
        if over <= 0 and value > best:
            best, best_s = value, s
        return over <= 0 and value >= 0.98 * target

    for name in ("zero1", "zero2", "zero3", "mics", "zeropp", "3level-a", "3level-b"):
        try:
            if try_(build_strategy(name, cluster)):
                return n
        except SpecError:
            continue
    grids = [("micro_batch_size", space.micro_batch_sizes), ("allgather_bucket_mb", space.bucket_mb),
             ("reduce_bucket_mb", space.bucket_mb), ("prefetch_buckets", space.prefetch),
             ("activation_checkpointing", space.checkpointing)]
    for field, choices in grids:
        assert best_s is not None
        base = best_s
        for value in choices:
            if n >= cap:
                return cap + 1
            try:
                if try_(base.replace(**{field: value})):
                    return n
            except SpecError:
                continue
    return cap + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-neox-20b")
    parser.add_argument("--cluster", default="frontier:48")
    parser.add_argument("--global-batch", type=int, default=1536)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--cap", type=int, default=600, help="give up after this many trials")
    parser.add_argument("--budget", type=int, default=TuneRequest.trials,
                        help="the study's trial budget, which sizes its refinement (default: zerotune tune's)")
    args = parser.parse_args()
    model, cluster = parse_model(args.model), parse_cluster(args.cluster)
    space = Space(cluster)
    t0 = time.perf_counter()
    target, arg, size = optimum(space, model, cluster, args.global_batch)
    print(f"space: {size:,} valid strategies, enumerated in {time.perf_counter() - t0:.0f} s; optimum "
          f"{target:.2f} TFLOPS/rank: {arg}")
    results: dict[str, list[int]] = {"zerotune-tpe": [], "tpe": [], "random": [], "grid-refine": []}
    for seed in range(args.seeds):
        results["zerotune-tpe"].append(optuna_search(space, model, cluster, args.global_batch, target, seed, "tpe",
                                                     True, args.cap, args.budget))
        results["tpe"].append(optuna_search(space, model, cluster, args.global_batch, target, seed, "tpe", False,
                                            args.cap, args.budget))
        results["random"].append(optuna_search(space, model, cluster, args.global_batch, target, seed, "random",
                                               False, args.cap, args.budget))
        results["grid-refine"].append(grid_refine(space, model, cluster, args.global_batch, target, args.cap))
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]}" for k, v in results.items()), file=sys.stderr)
    print(f"\ntrials to reach within 2% of the optimum ({args.seeds} seeds; {args.cap + 1} = not reached "
          f"within {args.cap})")
    for name, counts in results.items():
        print(f"  {name:<14} median {statistics.median(counts):>6.1f}   max {max(counts):>5}")
    ratio = statistics.median(results["random"]) / statistics.median(results["zerotune-tpe"])
    print(f"random / zerotune-tpe: {ratio:.1f}x fewer trials   (goal: <= 30 trials and >= 3x)")


if __name__ == "__main__":
    main()
