"""What one optimizer step moves and issues, summed over its schedule: bytes per level and kind, collectives
issued, elements quantized, seconds of latency (pure Python).

Each sum is one pass over ``Schedule.counts`` (every collective of the step with how often it runs), each
collective's bytes as ``volume.py`` books them, exactly what the engine's counter counts: the same list that
``predict`` times and ``memory`` holds.
"""

from __future__ import annotations

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import QUANT_BLOCK, Volume
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.schedule import Schedule, build_schedule
from zerotune.costmodel.timing import Costs, costs_for
from zerotune.errors import SpecError


def accumulation_steps(cluster: ClusterSpec, s: Strategy, global_batch: int | None) -> int:
    """Micro-steps per optimizer step: ``global_batch`` / (world · micro-batch), which must be whole
    (``SpecError`` otherwise: a prediction for a rounded batch would be one for another training).

    With no global batch, one micro-step (the batch is world · micro-batch sequences)."""
    per_micro = cluster.world_size * s.micro_batch_size
    if global_batch is None:
        return 1
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise SpecError("global_batch", global_batch, "must be a whole number of sequences >= 1")
    if global_batch % per_micro:
        raise SpecError("global_batch", global_batch,
                        f"must be a multiple of world size x micro_batch_size = {cluster.world_size} x "
                        f"{s.micro_batch_size} = {per_micro} (sequences per micro-step)")
    return global_batch // per_micro


def step_volume(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
                block: int = QUANT_BLOCK) -> Volume:
    """Bytes sent per rank per optimizer step, by level and collective kind."""
    sched = build_schedule(model, cluster, s)
    return volume_of(sched, costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block), accum)


def step_calls(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
               block: int = QUANT_BLOCK) -> dict[str, dict[str, int]]:
    """Collectives issued per rank per optimizer step, by level and kind: one for each level a collective of
    the schedule moves bytes on, as the engine issues its primitives (each pays a launch and its hops)."""
    sched = build_schedule(model, cluster, s)
    costs = costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block)
    out: dict[str, dict[str, int]] = {}
    for c, times in sched.counts(accum).items():
        for (name, kind), _ in costs.flat_volume(c):
            kinds = out.setdefault(name, {})
            kinds[kind] = kinds.get(kind, 0) + times
    return out


def step_totals(sched: Schedule, costs: Costs, accum: int) -> tuple[Volume, int]:
    """One optimizer step's bytes per rank by level and kind, and its elements block-quantized plus
    dequantized (``Costs.quant_elems`` over the quantized collectives: what run.json's
    ``quantization.elements`` counts), in one pass over the step's collectives, cached per schedule."""
    key = (sched.key, accum)
    known = costs.step_volumes.get(key)
    if known is None:
        flat: dict[tuple[str, str], int] = {}
        quant = 0
        for c, times in sched.counts(accum).items():
            for lk, n in costs.flat_volume(c):
                flat[lk] = flat.get(lk, 0) + n * times
            op, (lo, hi), numel, bits = c
            if bits < 16:
                quant += times * costs.quant_elems(op, lo, hi, numel)
        volume: Volume = {}
        for (name, kind), n in flat.items():
            volume.setdefault(name, {})[kind] = n
        if len(costs.step_volumes) > 100_000:
            costs.step_volumes.clear()
        known = costs.step_volumes[key] = (volume, quant)
    return known


def volume_of(sched: Schedule, costs: Costs, accum: int) -> Volume:
    """``step_totals``' bytes by level and kind, copied (those are cached; the caller owns these)."""
    return {name: dict(kinds) for name, kinds in step_totals(sched, costs, accum)[0].items()}


def step_latency(model: ModelSpec, cluster: ClusterSpec, s: Strategy, calib: Calibration, *, elem_bytes: int,
                 accum: int = 1, block: int = QUANT_BLOCK, all_to_all: bool = False) -> dict[str, float]:
    """Seconds per optimizer step the engine's ring collectives (with ``all_to_all``: its quantized
    all-to-alls) spend on latency (launch and hops), by level (``Costs.ring_latency`` over the step's
    schedule): what a run's measured seconds per level hold beside the time its bytes take on the wire."""
    costs = costs_for(cluster, calib, elem_bytes, s.quantize_above, block)
    out: dict[str, float] = {}
    for c, times in build_schedule(model, cluster, s).counts(accum).items():
        for name, seconds in costs.ring_latency(c, all_to_all):
            out[name] = out.get(name, 0.0) + seconds * times
    return out
