"""The scoreboard's rules, as functions of plain values (``bench/published.py`` applies them to its tables).

Primary score — the ranking. A *configuration* is one setting a source measured several strategies on: one
table's cluster, model, micro-batch and micro-batches per step, with the published value of each strategy (a
group's row with several strategy columns, joined by the ``[[compare]]`` ratios of two strategies on that same
setting; a ratio reaching a strategy the rows do not give places it relative to the other, and a setting that only
ratios give is placed from them alone). Within a configuration:

- ``pair_order``: every pair of strategies whose published values differ by at least ``GAP`` (the larger over the
  smaller, minus one) is *in order* when the prediction puts the same one ahead; pairs closer than ``GAP`` are not
  counted (the sources' repeats of one run differ by up to 4%: a closer gap is not a published order);
- ``picked``: whether the model's fastest strategy is the published winner — any strategy within ``GAP`` of the
  published best counts as a winner (a tie at the sources' resolution);
- ``regret``: the throughput lost by running the model's fastest strategy instead of the published best, as a
  fraction of the best (0 when it picks the best).

Each is counted in the configuration's scale band (``BANDS``, by its GPU count). Secondary score — the error:
median and 90th percentile of |predicted / published - 1| by band, and how the misses (outside ``GOAL``) split
between predicted above the published value (too fast) and below it (too slow). ``dedup``: a ratio of two rows
that are both scored as rows counts once — through its rows: its error is theirs divided, so it is not an item of
its own (the ratios of a ratios-only source, and ratios with a published value of their own, stay).

Outliers (``outliers``, applied to every table alike before anything is scored): within one table, the rows of one
model and strategy on the same machines (device and levels, their sizes aside) form a series by GPU count. Along it a
row does no more work per GPU than a row on fewer or as many GPUs when its micro-batch is no larger and its
sequences per GPU per optimizer step no more; its throughput per GPU cannot then be higher by more than
``OUTLIER_TOLERANCE`` (collectives only grow with the GPUs, and the same work twice is a repeat). Each such pair
breaking that is a *contradiction*; a row is an outlier when every contradiction in its series involves it (its
neighbours keep the rule without it). A series whose contradictions no single row explains has no outlier: it is
printed as such, and scored. Metrics of the whole cluster (samples per second) form no series. Outliers are printed
with the rows that contradict them and left out of every score and band.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple

GAP = 0.05
"""Pairs of strategies whose published values differ by less than this are not a published order."""
GOAL = 0.15
"""A row or ratio within this of the published value agrees (the issue's goal); outside it is a miss."""
OUTLIER_TOLERANCE = 0.10
"""How much faster per GPU a row may be than a row of its series it cannot beat (``outliers``): over twice the
largest spread of the sources' agreeing repeats (hf_playbook's sweep, the same work split two ways: up to 3.6%)."""
BANDS: tuple[tuple[str, int, float], ...] = (("<= 256", 0, 256), ("384-512", 257, 1023),
                                             (">= 1,024", 1024, float("inf")))
"""The scale bands, by GPU count: ``(label, lowest, highest)``. The middle band holds every count between 256 and
1,024 (the tables give 384 and 512)."""


def band_of_gpus(gpus: int) -> str:
    """The label of the scale band ``gpus`` falls in."""
    return next(label for label, lo, hi in BANDS if lo <= gpus <= hi)


def _winner_set(published: dict[str, float], gap: float) -> set[str]:
    best = max(published.values())
    return {s for s, v in published.items() if best / v - 1 < gap}


def pair_order(published: dict[str, float], predicted: dict[str, float], gap: float = GAP) -> tuple[int, int]:
    """``(pairs in order, pairs)`` over the pairs of strategies whose published values differ by at least ``gap``."""
    ordered = pairs = 0
    for a, b in itertools.combinations(sorted(published), 2):
        hi, lo = max(published[a], published[b]), min(published[a], published[b])
        if hi / lo - 1 < gap:
            continue
        pairs += 1
        ordered += (published[a] > published[b]) == (predicted[a] > predicted[b])
    return ordered, pairs


def model_winner(predicted: dict[str, float]) -> str:
    """The strategy the model ranks first (ties broken by name, so that the pick is reproducible)."""
    return max(sorted(predicted), key=lambda s: predicted[s])


def picked(published: dict[str, float], predicted: dict[str, float], gap: float = GAP) -> bool:
    """Whether the model's first is a published winner (within ``gap`` of the published best)."""
    return model_winner(predicted) in _winner_set(published, gap)


def regret(published: dict[str, float], predicted: dict[str, float]) -> float:
    """The fraction of the published best lost by running the model's first instead."""
    return 1 - published[model_winner(predicted)] / max(published.values())


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by nearest rank (``error.band_of``'s rule), None for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else None


class Configuration(NamedTuple):
    """One setting a source measured several strategies on: published and predicted value per strategy
    (published values may be relative: only their ratios are read)."""

    table: str
    key: str
    gpus: int
    published: dict[str, float]
    predicted: dict[str, float]


def ranking(configurations: Iterable[Configuration], gap: float = GAP) -> dict[str, dict[str, Any]]:
    """The primary score by band: pairs in order and pairs, winners picked and configurations, the regrets'
    median and 90th percentile (configurations with a single strategy are not counted)."""
    counts = {label: {"pairs_in_order": 0, "pairs": 0, "picked": 0, "configurations": 0} for label, _, _ in BANDS}
    regrets: dict[str, list[float]] = {label: [] for label, _, _ in BANDS}
    for c in configurations:
        if len(c.published) < 2:
            continue
        label = band_of_gpus(c.gpus)
        ordered, pairs = pair_order(c.published, c.predicted, gap)
        counts[label]["pairs_in_order"] += ordered
        counts[label]["pairs"] += pairs
        counts[label]["picked"] += picked(c.published, c.predicted, gap)
        counts[label]["configurations"] += 1
        regrets[label].append(regret(c.published, c.predicted))
    return {label: {**counts[label], "regret_median": statistics.median(regrets[label]) if regrets[label] else None,
                    "regret_p90": percentile(regrets[label], 0.9)} for label in counts}


def dedup(ratios: Iterable[dict[str, Any]], scored_rows: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The ratios that are items of their own: those whose ``of`` and ``over`` are not both scored rows of their
    table (``scored_rows``: ``(table, row id)``)."""
    return [r for r in ratios if not {(r["table"], r["of"]), (r["table"], r["over"])} <= scored_rows]


def error_by_band(items: Iterable[dict[str, Any]], goal: float = GOAL) -> dict[str, dict[str, Any]]:
    """The secondary score by band from items with ``gpus`` and ``error``: count, median and 90th percentile of
    |error|, misses (|error| > ``goal``), and how many of those are too fast (error > 0) and too slow."""
    out: dict[str, dict[str, Any]] = {}
    items = list(items)
    for label, _, _ in BANDS:
        errors = [it["error"] for it in items if band_of_gpus(it["gpus"]) == label]
        size = [abs(e) for e in errors]
        misses = [e for e in errors if abs(e) > goal]
        out[label] = {"count": len(errors), "median": statistics.median(size) if size else None,
                      "p90": percentile(size, 0.9), "misses": len(misses),
                      "too_fast": sum(e > 0 for e in misses), "too_slow": sum(e < 0 for e in misses)}
    return out


class Point(NamedTuple):
    """A published row as the outlier rule reads it: ``series`` names the machines, model and strategy (everything
    but the GPU count); ``value`` is per GPU."""

    id: str
    series: Hashable
    gpus: int
    micro_batch: int
    sequences_per_step: int
    value: float


def contradicts(small: Point, large: Point, tolerance: float = OUTLIER_TOLERANCE) -> bool:
    """Whether ``large`` (on as many GPUs as ``small`` or more, with no more work per GPU) runs faster per GPU than
    ``small`` by more than ``tolerance``: the pair the rule cannot both believe."""
    if large.gpus < small.gpus or large.micro_batch > small.micro_batch \
            or large.sequences_per_step > small.sequences_per_step:
        return False
    return large.value > small.value * (1 + tolerance)


def outliers(points: Iterable[Point], tolerance: float = OUTLIER_TOLERANCE) -> tuple[dict[str, list[str]],
                                                                                     list[list[str]]]:
    """The outliers (id -> the ids that contradict it) and the series whose contradictions no single row explains
    (their ids), by the module's rule."""
    by_series: dict[Hashable, list[Point]] = {}
    for p in points:
        by_series.setdefault(p.series, []).append(p)
    found: dict[str, list[str]] = {}
    unexplained: list[list[str]] = []
    for series in by_series.values():
        pairs = [(a, b) for a, b in itertools.permutations(series, 2) if contradicts(a, b, tolerance)]
        if not pairs:
            continue
        common = set.intersection(*({a.id, b.id} for a, b in pairs))
        if len(common) == 1:  # one row is in every contradiction: without it, its neighbours keep the rule
            (row,) = common
            found[row] = sorted({a.id if b.id == row else b.id for a, b in pairs})
        else:
            unexplained.append(sorted({p.id for pair in pairs for p in pair}))
    return found, unexplained
