"""How runners other than zerotune's engine issue the schedule's collectives (pure Python).

The bytes each runner moves per level are the schedule's (``schedule``, ``volume.py``); what differs is how
many collectives carry them and what they cost beside, each switched by a ``Calibration`` field:

- ``gathers = "module"`` (DeepSpeed's ZeRO-3): one all-gather per sub-module, as often as its parameter
  coordinator gathers it (``coordinator.gathers_of``), and its persistent parameters gathered after every step
  (``persistent_gathers``);
- ``grad_reduce = "all_reduce"`` (DeepSpeed's stages 1 and 2): each gradient bucket all-reduced where the
  schedule reduce-scatters it (``all_reduced``);
- ``weight_sync = "broadcast"`` (InternEvo): the updated weights broadcast from the ranks that own whole
  parameters (``broadcast_sync``);
- ``copies`` (FSDP2): each gather copied out of and each reduction copied into its flat buffer on the compute
  stream (``copy_seconds``).

This is the timing stage of ``predict``'s pipeline, after the schedule: ``schedule_seconds`` times the schedule's
collectives as the runner issues them (``Seconds``, the same for every strategy that shares the schedule; each
collective by ``timing.Costs``); ``copy_seconds`` what the copies add to the compute stream.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections import Counter
from collections.abc import Callable

from zerotune.core.plan import parameter_numels
from zerotune.core.spec import ModelSpec, Strategy
from zerotune.core.volume import wire_elem_bytes
from zerotune.costmodel.schedule import Coll, Schedule, Setup
from zerotune.costmodel.timing import Costs, Seconds

Timer = Callable[[Coll], float]
"""Seconds of one collective (``Costs.time``, or one runner's variant of it)."""


def schedule_seconds(setup: Setup, sched: Schedule, costs: Costs) -> Seconds:
    """``Seconds`` of ``sched`` on ``costs``, memoized there by schedule (whose key holds the model, the spans
    and the bits that every term reads)."""
    known = costs.seconds.get(sched.key)
    if known is not None:
        return known
    calib, s = costs.calib, setup.strategy
    # a runner that reduces a bucket with an all-reduce where the schedule reduce-scatters it (DeepSpeed's stages 1
    # and 2: Calibration.grad_reduce) pays the all-reduce's seconds for the same buffer; a gather costs the same
    timer = all_reduced(costs.time) if calib.grad_reduce == "all_reduce" and not s.param_span else costs.time
    # every collective of the schedule timed once, in the schedule's order
    t = {c: timer(c) for c in dict.fromkeys(itertools.chain(sched.fwd.values(), sched.bwd.values(),
                                                            *sched.reduce.values(), *sched.boundary.values()))}
    r_of = {g: t[a] + t[b] for g, (a, b) in sched.reduce.items()}
    outer_in_backward = calib.outer_reduce == "backward"
    # the final micro-step queues each group's reduction beyond grad_span after its own reduce-scatters
    outer_of = {g: sum(t[c] for c in cs) for g, cs in sched.outer.items()} if outer_in_backward else {}
    r_final = {g: r + outer_of[g] for g, r in r_of.items()} if any(outer_of.values()) else r_of
    sync = broadcast_sync(costs, setup.model, s) if calib.weight_sync == "broadcast" else None
    boundary_s = sum(k * sum(t[c] for i, c in enumerate(sched.boundary[n])
                             if i >= 2 * outer_in_backward and (sync is None or i != 2))
                     for n, k in sched.bucket_counts) + (sync or 0.0)
    if calib.gathers == "module" and s.param_span:  # DeepSpeed ZeRO-3's persistent parameters, once a step
        boundary_s += persistent_gathers(costs.time, setup.model, costs.prefix[s.param_span], s)
    fwd, bwd = {n: t[c] for n, c in sched.fwd.items()}, {n: t[c] for n, c in sched.bwd.items()}
    if len(costs.seconds) > 16_384:  # as many as the schedules kept (``schedule._build``), each with its passes
        costs.seconds.clear()
    known = costs.seconds[sched.key] = Seconds(fwd, bwd, r_of, r_final, boundary_s, {})
    return known


def copy_seconds(setup: Setup, sched: Schedule, costs: Costs) -> tuple[float, float] | None:
    """Seconds of one micro-step's copies on the compute stream (``Calibration.copies``), forward and backward:
    each all-gather's output read and written once more into the parameters (``costs.e``: the gather's
    16-bit elements), each reduce-scatter's input read from the gradients and written in the reduction's
    dtype (``wire_elem_bytes`` at ``grad_bits``), summed over the buckets and reduce groups that gather or reduce at
    all (``Costs.moves``), at the calibration's memory-bound rate. Memoized on ``costs`` by schedule. None for a
    runner that does not copy (or a calibration that charges no memory-bound bytes)."""
    if not (costs.calib.copies and costs.calib.memory_bytes_per_s):
        return None
    reduce_bytes = wire_elem_bytes(setup.elem_bytes, setup.strategy.grad_bits)
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


@functools.lru_cache(maxsize=256)
def persistent_params(model: ModelSpec) -> tuple[int, ...]:
    """The elements of each parameter DeepSpeed's ZeRO-3 keeps whole on every rank (``ds_persist``: fewer than
    ``stage3_param_persistence_threshold``, 1e5 by default and 10 x hidden in zerotune's export): a block's two
    LayerNorms' weights and biases and its four biases (qkv h + 2k, k = ``ModelSpec.kv``, proj h, fc ffn, out h),
    and the final LayerNorm's weight and bias. The block's weight matrices, the embeddings and an untied head are
    over either threshold. A Llama has no biases: its two RMSNorms' weights per block and the final one's, and its
    q, k and v biases and q and k norms where it has them (Qwen2, Qwen3, OLMo 2: ``ModelSpec.qkv_bias``,
    ``qk_norm``)."""
    h = model.hidden
    if model.llama:
        k, d = model.kv, model.head_dim
        extra = ((h, k, k) if model.qkv_bias else ()) + {"none": (), "head": (d, d), "full": (h, k)}[model.qk_norm]
        return (h, h, *extra) * model.layers + (h,)
    return (h, h, h + 2 * model.kv, h, h, h, model.ffn, h) * model.layers + (h, h)


def persistent_gathers(ct: Timer, model: ModelSpec, ranks: int, s: Strategy) -> float:
    """Seconds of the all-gathers DeepSpeed's ZeRO-3 runs after every optimizer step to bring its persistent
    parameters up to date (``stage3.py`` ``_post_step``: ``persistent_parameters[0].all_gather(...)``, which
    ``partition_parameters.py``'s ``_allgather_params_coalesced`` launches as one ``all_gather_into_tensor`` per
    parameter on the partition group): 8 per block and 2, each a message of a few KB over the whole group, so
    a ring's latency each (34 on gpt-mini's 4 blocks, counted on DeepSpeed 0.19.8: ``tests/tuner/test_exports.py``),
    on the ``ranks`` of the partition group (``param_span``'s)."""
    return sum(n * ct(("all_gather", (1, s.param_span), max(1, numel // ranks), 16))
               for numel, n in _counted(persistent_params(model)))


@functools.lru_cache(maxsize=256)
def _counted(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(size, how many) of ``sizes``: 354 persistent parameters of gpt-neox-20b are 3 sizes, 3 collectives to time."""
    return tuple(Counter(sizes).items())


def all_reduced(ct: Timer) -> Timer:
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
