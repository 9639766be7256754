"""How runners other than zerotune's engine issue the schedule's collectives (pure Python).

The bytes each runner moves per level are the schedule's (``schedule``, ``volume.py``); what differs is how
many collectives carry them and what they cost beside, each switched by a ``Calibration`` field:

- ``gathers = "module"`` (DeepSpeed's ZeRO-3): one all-gather per sub-module, as often as its parameter
  coordinator gathers it (``deepspeed.simulate``), and its persistent parameters gathered after every step
  (``persistent_gathers``);
- ``grad_reduce = "all_reduce"`` (DeepSpeed's stages 1 and 2): each gradient bucket all-reduced where the
  schedule reduce-scatters it (``all_reduced``);
- ``weight_sync = "broadcast"`` (InternEvo): the updated weights broadcast from the ranks that own whole
  parameters (``broadcast_sync``);
- ``copies`` (FSDP2): each gather copied out of and each reduction copied into its flat buffer on the compute
  stream (``copy_seconds``).
"""

from __future__ import annotations

import functools
import heapq
from collections import Counter
from typing import Any

from zerotune.core.plan import block_modules, parameter_numels
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.coordinator import Stage3Settings, Stage3Step
from zerotune.costmodel.schedule import Coll, Schedule
from zerotune.costmodel.timing import Costs


def copy_seconds(sched: Schedule, costs: Costs, reduce_bytes: int) -> tuple[float, float]:
    """Seconds of one micro-step's copies on the compute stream (``Calibration.copies``), forward and backward:
    each all-gather's output read and written once more into the parameters (``costs.e``: the gather's
    16-bit elements), each reduce-scatter's input read from the gradients and written in the reduction's
    dtype (``reduce_bytes``), summed over the buckets and reduce groups that gather or reduce at all
    (``Costs.moves``), at the calibration's memory-bound rate. Memoized on ``costs`` by schedule."""
    key = (sched.key, reduce_bytes)
    known = costs.copies.get(key)
    if known is not None:
        return known
    elem_bytes, bytes_per_s = costs.e, costs.calib.memory_bytes_per_s
    fwd = bwd = 0.0
    for n, k in sched.bucket_counts:
        if costs.moves(sched.fwd[n]):
            fwd += k * 2 * elem_bytes * n
        k_blocks = k - (n == sched.root)
        if k_blocks and costs.moves(sched.bwd[n]):
            bwd += k_blocks * 2 * elem_bytes * n
    for g, k in sched.group_counts:
        if any(costs.moves(c) for c in sched.reduce[g]):
            bwd += k * (elem_bytes + reduce_bytes) * sum(g)
    known = costs.copies[key] = (fwd / bytes_per_s, bwd / bytes_per_s)
    return known


def by_module(ct: Any, gathers: dict[int, Coll], lengths: tuple[int, ...], units: tuple[int, ...],
               model: ModelSpec, times: tuple[float, ...] | None = None) -> dict[int, float]:
    """Seconds of each block bucket's gather issued as one all-gather per sub-module
    (``Calibration.gathers = "module"``): the bucket's shard split in the sub-modules' proportions
    (``plan.block_modules``, its LayerNorms shared among them), one collective per block and module, each
    sub-module gathered ``times`` times in the pass (``deepspeed.Stage3Step``: more than once where a recompute's
    gathers were released before its backward, less where what the pass before gathered is kept; None: once)."""
    modules = block_modules(model)
    times = times or (1.0,) * len(modules)
    total = sum(modules)
    out = {}
    for n, u in dict(zip(lengths, units, strict=True)).items():
        op, rng, numel, bits = gathers[n]
        out[n] = u * sum(k * ct((op, rng, max(1, round(numel * m / total / u)), bits))
                         for m, k in zip(modules, times, strict=True))
    return out


@functools.lru_cache(maxsize=256)
def persistent_params(model: ModelSpec) -> tuple[int, ...]:
    """The elements of each parameter DeepSpeed's ZeRO-3 keeps whole on every rank (``ds_persist``: fewer than
    ``stage3_param_persistence_threshold``, 1e5 by default and 10 x hidden in zerotune's export): a block's two
    LayerNorms' weights and biases and its four biases (qkv h + 2k, k = ``ModelSpec.kv``, proj h, fc ffn, out h),
    and the final LayerNorm's weight and bias. The block's weight matrices, the embeddings and an untied head are
    over either threshold. A Llama has no biases: its two RMSNorms' weights per block and the final one's."""
    h = model.hidden
    if model.llama:
        return (h, h) * model.layers + (h,)
    return (h, h, h + 2 * model.kv, h, h, h, model.ffn, h) * model.layers + (h, h)


def persistent_gathers(ct: Any, model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> float:
    """Seconds of the all-gathers DeepSpeed's ZeRO-3 runs after every optimizer step to bring its persistent
    parameters up to date (``stage3.py`` ``_post_step``: ``persistent_parameters[0].all_gather(...)``, which
    ``partition_parameters.py``'s ``_allgather_params_coalesced`` launches as one ``all_gather_into_tensor`` per
    parameter on the partition group): 8 per block and 2, each a message of a few KB over the whole group, so
    a ring's latency each (34 on gpt-mini's 4 blocks, counted on DeepSpeed 0.19.8: ``tests/tuner/test_exports.py``)."""
    ranks = cluster.span_size(s.param_span)
    return sum(n * ct(("all_gather", (1, s.param_span), max(1, numel // ranks), 16))
               for numel, n in _counted(persistent_params(model)))


@functools.lru_cache(maxsize=256)
def _counted(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(size, how many) of ``sizes``: 354 persistent parameters of gpt-neox-20b are 3 sizes, 3 collectives to time."""
    return tuple(Counter(sizes).items())


def all_reduced(ct: Any) -> Any:
    """``ct`` with each 16-bit reduce-scatter timed as an all-reduce of the same buffer over the same levels."""
    def time(c: Coll) -> float:
        op, levels, numel, bits = c
        return ct(("all_reduce", levels, numel, bits) if op == "reduce_scatter" and bits >= 16 else c)
    return time


@functools.lru_cache(maxsize=1024)
def owners(model: ModelSpec, ranks: int, shard: int) -> tuple[tuple[int, int], ...]:
    """(elements, how many ranks hold that many) of the ranks that hold any parameter when whole parameters are
    handed out as InternEvo's ``_partition_param_list`` does: largest first, each to the rank holding the fewest
    elements so far (the lowest such rank), over ``ranks`` ranks; each parameter counted as its 1/``shard``
    (the slice its rank's gradient shard group holds). 4,096 ranks and 400 parameters take a millisecond."""
    load = [(0, r) for r in range(ranks)]
    for numel in sorted(parameter_numels(model), reverse=True):
        held, rank = heapq.heappop(load)
        heapq.heappush(load, (held + -(-numel // shard), rank))
    return _counted(tuple(held for held, _ in load if held))


def broadcast_sync(costs: Costs, model: ModelSpec, s: Strategy) -> float:
    """Seconds of the weight sync of ``Calibration.weight_sync = "broadcast"``: one broadcast over the optimizer
    group beyond ``grad_span`` (levels grad_span + 1 .. optim_span) from each rank that holds parameters, of the
    elements it holds (``owners``), one after the other on the group's communicator; in place of the boundary's
    all-gathers over those levels."""
    lo, hi = s.grad_span + 1, s.optim_span
    ranks = costs.prefix[hi] // costs.prefix[lo - 1] if lo <= hi else 1
    if ranks == 1:
        return 0.0
    return sum(n * costs.broadcast(lo, hi, numel) for numel, n in owners(model, ranks, costs.prefix[s.grad_span]))


def deepspeed_step(ds: Stage3Step, settings: Stage3Settings, which: str, elem_bytes: int) -> dict[str, Any]:
    """What a DeepSpeed ZeRO-3 run of the prediction does by its coordinator's rules (``deepspeed.simulate``): the
    stage-3 settings it runs under (``which``: zerotune's export or DeepSpeed's defaults), the times it gathers its
    partitioned parameters in a step, forward and backward, and the most bytes of them it holds gathered."""
    forward, backward = (n / ds.partitioned if ds.partitioned else 0.0 for n in ds.elements)
    return {"stage3_settings": which, "stage3": settings.config(),
            "gathered_per_step": forward + backward, "gathered_forward": forward, "gathered_backward": backward,
            "held_peak_bytes": ds.peak * elem_bytes}
