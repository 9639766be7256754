"""Notes an answer carries beside its pick (``tuner.choice``): the Pareto front of speed and memory a ``pareto``
request asks for, and the gain over the user's baseline (``tuner.baseline_gain``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from zerotune.core.spec import Strategy
from zerotune.db.models import Trial
from zerotune.tuner.request import TuneRequest

Row = tuple[int, Strategy, float | None, str, Any]
"""A ranked trial as ``choice.Ranked`` holds it: (trial id, strategy, value, evidence, metrics)."""


def peak_memory_bytes(trial: Trial) -> float | None:
    """A trial's peak memory per rank: measured where it ran, else the cost model's."""
    for source in (trial.metrics, trial.prediction):
        peak = ((source or {}).get("memory_bytes") or {}).get("peak")
        if isinstance(peak, int | float):
            return float(peak)
    return None


def pareto_front(trials: Sequence[Trial]) -> list[dict[str, Any]]:
    """The complete trials no other beats on both TFLOPS per rank (higher) and peak memory per rank
    (lower), by memory ascending: what ``objective: pareto`` asks for. Ties keep the first trial."""
    points = [(t, float(t.value), peak_memory_bytes(t)) for t in trials if t.value is not None]
    points = [(t, v, m) for t, v, m in points if m is not None]
    front: list[dict[str, Any]] = []
    best = -float("inf")
    for t, value, memory in sorted(points, key=lambda p: (p[2], -p[1], p[0].id)):
        if value > best:  # faster than every point that needs no more memory
            best = value
            front.append({"trial_id": t.id, "strategy": t.strategy, "value": value, "peak_memory_bytes": memory})
    return front


def baseline_note(request: TuneRequest, ranked: Sequence[Row], pick: Row,
                   searched: Strategy | None = None) -> dict[str, Any]:
    """``tuner.baseline_gain.compare`` for the pick (the answer's ``baseline``): predicted under each one's runner;
    measured where the study measured the baseline's strategy (or ``searched``, the study's trial of it) as well as
    the pick."""
    from zerotune.tuner.baseline import parse_baseline
    from zerotune.tuner.baseline_gain import compare, same_strategy

    base = parse_baseline(cast(dict[str, Any], request.baseline), request.model, request.cluster,
                          request.global_batch)
    measured = None
    if pick[3] != "predicted" and pick[2]:
        ours = [request.fit(base.strategy)] + ([searched] if searched is not None else [])
        twin = next((r for r in ranked if r[3] != "predicted" and r[2] and any(same_strategy(r[1], b) for b in ours)),
                    None)
        if twin is not None:
            measured = (float(pick[2]), float(cast(float, twin[2])))
    return compare(request.model, request.cluster, base, pick[1], request.runner,
                   global_batch=request.global_batch, measured=measured)
