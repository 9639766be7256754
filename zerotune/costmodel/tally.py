"""What one optimizer step moves and issues, summed over its schedule: bytes per level and kind, collectives
issued, elements quantized, seconds of latency (pure Python).

Each sum is one pass over ``step_counts`` (every collective of the step with how often it runs), each
collective's bytes as ``volume.py`` books them, exactly what the engine's counter counts: the same list that
``predict`` times and ``memory`` holds. ``step_bytes`` is the bytes stage of ``predict``'s pipeline.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import QUANT_BLOCK, Volume, quant_elements
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.schedule import Coll, Schedule, build_schedule
from zerotune.costmodel.timing import Costs, costs_for


def step_counts(sched: Schedule, accum: int) -> Counter[Coll]:
    """Every collective of one optimizer step of ``sched`` with how often it runs (``accum`` micro-steps)."""
    out: Counter[Coll] = Counter()
    for n, k in sched.bucket_counts:
        k_blocks = k - (n == sched.root)
        out[sched.fwd[n]] += k * accum
        if k_blocks:
            out[sched.bwd[n]] += k_blocks * accum
        for c in sched.boundary[n]:
            out[c] += k
    for g, k in sched.group_counts:
        for c in sched.reduce[g]:
            out[c] += k * accum
    return out


def step_volume(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
                block: int = QUANT_BLOCK) -> Volume:
    """Bytes sent per rank per optimizer step, by level and collective kind."""
    sched = build_schedule(model, cluster, s)
    return step_bytes(sched, costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block), accum).volume


def step_calls(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
               block: int = QUANT_BLOCK) -> dict[str, dict[str, int]]:
    """Collectives issued per rank per optimizer step, by level and kind: one for each level a collective of
    the schedule moves bytes on, as the engine issues its primitives (each pays a launch and its hops)."""
    sched = build_schedule(model, cluster, s)
    costs = costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block)
    out: dict[str, dict[str, int]] = {}
    for c, times in step_counts(sched, accum).items():
        for (name, kind), _ in costs.flat_volume(c):
            kinds = out.setdefault(name, {})
            kinds[kind] = kinds.get(kind, 0) + times
    return out


def step_totals(sched: Schedule, costs: Costs, accum: int) -> tuple[Volume, int]:
    """One optimizer step's bytes per rank by level and kind, and its elements block-quantized plus
    dequantized (``volume.quant_elements`` over the quantized collectives: what run.json's
    ``quantization.elements`` counts), in one pass over the step's collectives, cached per schedule."""
    key = (sched.key, accum)
    known = costs.step_volumes.get(key)
    if known is None:
        flat: dict[tuple[str, str], int] = {}
        quant = 0
        for c, times in step_counts(sched, accum).items():
            for lk, n in costs.flat_volume(c):
                flat[lk] = flat.get(lk, 0) + n * times
            op, (lo, hi), numel, bits = c
            if bits < 16:
                quant += times * quant_elements(costs.cluster, costs.qa, op, lo, hi, numel)
        volume: Volume = {}
        for (name, kind), n in flat.items():
            volume.setdefault(name, {})[kind] = n
        if len(costs.step_volumes) > 100_000:
            costs.step_volumes.clear()
        known = costs.step_volumes[key] = (volume, quant)
    return known


class StepBytes(NamedTuple):
    """What one optimizer step moves (``step_bytes``)."""

    volume: Volume
    """Bytes per rank by level and kind (the caller's own copy)."""
    quant_elements: int
    """Elements block-quantized plus dequantized."""


def step_bytes(sched: Schedule, costs: Costs, accum: int) -> StepBytes:
    """``step_totals`` of ``accum`` micro-steps of ``sched``, the bytes copied for the caller."""
    volume, quant = step_totals(sched, costs, accum)
    return StepBytes({name: dict(kinds) for name, kinds in volume.items()}, quant)


def step_latency(model: ModelSpec, cluster: ClusterSpec, s: Strategy, calib: Calibration, *, elem_bytes: int,
                 accum: int = 1, block: int = QUANT_BLOCK, all_to_all: bool = False) -> dict[str, float]:
    """Seconds per optimizer step the engine's ring collectives (with ``all_to_all``: its quantized
    all-to-alls) spend on latency (launch and hops), by level (``Costs.ring_latency`` over the step's
    schedule): what a run's measured seconds per level hold beside the time its bytes take on the wire."""
    costs = costs_for(cluster, calib, elem_bytes, s.quantize_above, block)
    out: dict[str, float] = {}
    for c, times in step_counts(build_schedule(model, cluster, s), accum).items():
        for name, seconds in costs.ring_latency(c, all_to_all):
            out[name] = out.get(name, 0.0) + seconds * times
    return out
