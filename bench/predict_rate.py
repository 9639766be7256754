"""How many predictions per second the cost model makes: what a study's search, the tuner's ranking
of candidates and the service's recommend path pay per strategy they score.

    python bench/predict_rate.py                       # gpt-neox-20b on frontier:48 and dgx-h100:16
    python bench/predict_rate.py --seconds 0.5 --limit 20000 --json

Three rates per (model, cluster):
- warm: the same few strategies predicted over and over (a search revisiting its neighbourhood:
  plans, schedules and collective costs are memoized);
- search: every strategy of the tuner's search space (``tuner.space.Space``, enumerated before the
  clock starts) predicted once each, in the space's order, as an exhaustive search on the cost model
  ranks them: plans, schedules and collective costs are built as they are first met;
- unseen: every call bucket sizes not seen before (drawn from 1 to 4,093 MB, not the space's five; the pairs
  repeat only after 4,093 x 4,091 calls): each call cuts its bucket plan anew, and a schedule is built for
  each cut not met before (sizes that put the same blocks in each bucket and each reduce group move the
  same bytes and share one). The output gives the calls and the schedules they built.
The caches are cleared before each measure (``costmodel.clear_caches``). The figures are this
machine's; nothing is asserted about them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerotune.core.spec import Strategy  # noqa: E402
from zerotune.costmodel import clear_caches, predict, schedule  # noqa: E402
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model  # noqa: E402
from zerotune.tuner.space import Space  # noqa: E402

CASES = (("gpt-neox-20b", "frontier:48"), ("gpt-neox-20b", "dgx-h100:16"))
PRESETS = ("zero3", "zeropp", "3level-b", "mics")
GLOBAL_BATCH_PER_RANK = 8
SEARCH_LIMIT = 200_000
"""At most this many of the space's strategies are enumerated (``--limit``)."""


def _rate(calls: Iterator[Callable[[], Any]], seconds: float) -> tuple[float, int]:
    """Predictions per second of ``calls`` for about ``seconds`` (or until they run out)."""
    clear_caches()
    n, t0 = 0, time.perf_counter()
    for call in calls:
        call()
        n += 1
        if n % 16 == 0 and time.perf_counter() - t0 >= seconds:
            break
    return n / (time.perf_counter() - t0), n


def measure(model_name: str, cluster_name: str, seconds: float, limit: int = SEARCH_LIMIT) -> dict[str, Any]:
    model, cluster = parse_model(model_name), parse_cluster(cluster_name)
    batch = GLOBAL_BATCH_PER_RANK * cluster.world_size
    presets = [p for p in PRESETS if p in ("zero3", "zeropp", "mics") or cluster.num_levels >= 3]
    warm_strategies = [build_strategy(p, cluster, micro_batch_size=1, activation_checkpointing=True) for p in presets]
    space = list(itertools.islice(Space(cluster, global_batch=batch).enumerate_space(), limit))

    def calls(strategies: Iterable[Strategy]) -> Iterator[Callable[[], Any]]:
        for s in strategies:
            yield lambda s=s: predict(model, cluster, s, global_batch=batch)

    def unseen() -> Iterator[Strategy]:
        for i in itertools.count():
            yield build_strategy(presets[i % len(presets)], cluster, micro_batch_size=1, activation_checkpointing=True,
                                 allgather_bucket_mb=1 + (i * 37) % 4093, reduce_bucket_mb=1 + (i * 101) % 4091)

    warm_rate, warm_n = _rate(calls(itertools.cycle(warm_strategies)), seconds)
    search_rate, search_n = _rate(calls(space), seconds)
    unseen_strategies = list(itertools.islice(unseen(), max(64, int(seconds * 20_000))))
    unseen_rate, unseen_n = _rate(calls(unseen_strategies), seconds)
    built = schedule.schedules_built()  # by the unseen calls (_rate cleared the caches): their distinct cuts
    return {"model": model_name, "cluster": cluster_name, "warm_strategies": presets,
            "warm_per_s": round(warm_rate), "warm_calls": warm_n, "search_per_s": round(search_rate),
            "search_calls": search_n, "space_size": len(space), "unseen_per_s": round(unseen_rate),
            "unseen_calls": unseen_n, "unseen_schedules": built}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per rate (default 2)")
    parser.add_argument("--limit", type=int, default=SEARCH_LIMIT,
                        help=f"most strategies of the search space to enumerate (default {SEARCH_LIMIT:,})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        print(f"--seconds={args.seconds}: must be > 0", file=sys.stderr)
        return 2
    if args.limit < 1:
        print(f"--limit={args.limit}: must be >= 1", file=sys.stderr)
        return 2
    results = [measure(m, c, args.seconds, args.limit) for m, c in CASES]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'model':14} {'cluster':12} {'warm /s':>9} {'search /s':>10} {'unseen /s':>10} {'(calls, schedules)':>19}"
          f"  space  warm strategies")
    for r in results:
        seen = f"({r['unseen_calls']:,}, {r['unseen_schedules']:,})"
        print(f"{r['model']:14} {r['cluster']:12} {r['warm_per_s']:>9,} {r['search_per_s']:>10,} "
              f"{r['unseen_per_s']:>10,} {seen:>19}  {r['space_size']:,}  {', '.join(r['warm_strategies'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
