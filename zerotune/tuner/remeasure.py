"""Measured leaders with their spread: intervals from the timed steps, and a second run where they overlap.

A measured trial's value is TFLOPS per rank at its median step time; its interval is the same
figure at the quartiles of its timed steps (at the third quartile's time for the low end, the
first's for the high end). When the runner-up's interval reaches the leader's, one short run
cannot tell them apart: both (and a third leader in the same overlap) run again, the timed steps
of both runs are pooled, and value and interval are recomputed from the pool. What was pooled is
kept in the trial's metrics (``remeasured``), and the answer lists the leaders with their intervals.
"""

from __future__ import annotations

from typing import TypedDict

from zerotune.core.records import Remeasured, RunMetrics
from zerotune.trainer.health import spread

MAX_REMEASURED = 3
"""The leader and at most two rivals whose intervals overlap it are run again."""


class Leader(TypedDict):
    """A measured leader as the answer lists it (``leaders``)."""

    trial_id: int
    value: float
    interval: list[float] | None
    """TFLOPS per rank at the third and first quartile of its timed steps."""
    steps: int
    remeasured: bool


def timed_steps(metrics: RunMetrics) -> list[float]:
    """The step times a value was computed from (pooled ones after a re-measurement)."""
    again = metrics.get("remeasured")
    if again and again.get("timed_steps_s"):
        return list(again["timed_steps_s"])
    times = metrics.get("step_times_s") or []
    return list(times[int(metrics.get("warmup_steps") or 0):]) or list(times)


def interval(value: float, metrics: RunMetrics) -> tuple[float, float] | None:
    """(low, high) TFLOPS per rank: ``value`` scaled from the median step time to the third and first quartile."""
    times = timed_steps(metrics)
    if not times or not value:
        return None
    s = spread(times)
    if s["q1"] <= 0:
        return None
    return value * s["median"] / s["q3"], value * s["median"] / s["q1"]


def overlapping(ranked: list[tuple[int, float, RunMetrics]]) -> list[int]:
    """Trial ids of the leader and the rivals whose intervals reach its own (``ranked``: best value
    first, as (trial id, value, metrics)); empty when the leader stands clear or has no rival."""
    with_interval = [(i, v, iv) for i, v, m in ranked if (iv := interval(v, m)) is not None]
    if len(with_interval) < 2:
        return []
    lead_id, _, (lead_low, _) = with_interval[0]
    rivals = [i for i, _, (_, high) in with_interval[1:] if high >= lead_low]
    return [lead_id, *rivals[:MAX_REMEASURED - 1]] if rivals else []


def pooled(metrics: RunMetrics, value: float, again: RunMetrics) -> tuple[float, RunMetrics]:
    """The trial's value and metrics once the second run ``again`` (its run.json) is pooled in."""
    first = timed_steps(metrics)
    second = timed_steps(again)
    pool = first + second
    s = spread(pool)
    new_value = value * spread(first)["median"] / s["median"]
    remeasured: Remeasured = {"runs": 2, "timed_steps_s": pool, "spread": s, "first_value": value,
                              "second_value": again.get("tflops_per_rank"),
                              "health_again": (again.get("health") or {}).get("verdict")}
    return new_value, {**metrics, "remeasured": remeasured, "step_time_s": s["median"],
                       "tflops_per_rank": new_value, "step_time_spread": s}


def leaders(rows: list[tuple[int, float, RunMetrics]]) -> list[Leader]:
    """Measured trials (trial id, value, metrics) with their intervals, for the answer."""
    out: list[Leader] = []
    for trial_id, value, metrics in rows:
        iv = interval(value, metrics)
        out.append({"trial_id": trial_id, "value": value, "interval": list(iv) if iv else None,
                    "steps": len(timed_steps(metrics)), "remeasured": bool(metrics.get("remeasured"))})
    return out
