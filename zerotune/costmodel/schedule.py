"""The one schedule: every collective the engine issues in one step, read off its bucket plan.

Bytes (``step_volume``), time (``predict``) and memory (``state_memory``) all read this one value,
so they cannot disagree about what runs. Per micro-step (A per step), for a bucket of padded
length n and spans P ≤ G ≤ O, hpZ span H (S_k = ranks in span k):

- forward all-gather over span P of n/S_P elements (``weight_bits`` at levels ≥ quantize_above);
- backward all-gather (block buckets only: the root stays gathered) over span H of n/S_H, 16-bit,
  with hpZ, else the forward gather again;
- per reduce group of total length m: reduce-scatter over levels 1..P of m, then P+1..G of m/S_P.

Per step and bucket: reduce-scatter over G+1..O of n/S_G and all-reduce over O+1..L of n/S_O (both
``grad_bits``; the engine runs them in its last micro-step's backward, with the bucket's reduce group),
then, at the step boundary, all-gather over G+1..O of n/S_O and over P+1..G of n/S_G, 16-bit (the
authoritative shard is never quantized). ``boundary`` holds all four; where they run is timing's.

Buckets of one length share their collectives, so the schedule is held per distinct length (a
plan of 44 identical blocks has one forward gather, not 44): cheap to build, cached per strategy.

The schedule is the first stage of ``predict``'s pipeline; ``Setup`` is what every stage reads of the question.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

from zerotune.core.plan import bucket_layout, clear_cuts, cut_reduce_groups
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.errors import SpecError

if TYPE_CHECKING:
    from zerotune.costmodel.rates import Calibration

Coll = tuple[str, tuple[int, int], int, int]
"""One collective: (op, (first level, last level), numel, bits). ``numel`` is the shard for
all-gathers and the buffer otherwise; levels lo > hi means "nothing to do"."""
Group = tuple[int, ...]
"""A reduce group: the padded lengths of its buckets (the engine reduces them as one buffer, then, in the
final micro-step, each bucket's shard beyond grad_span on its own); () where no group ends."""


class Setup(NamedTuple):
    """One prediction's question (``predict``'s arguments, defaults filled in) and what its specs say of the step:
    the input every stage of the pipeline reads."""

    model: ModelSpec
    cluster: ClusterSpec
    strategy: Strategy
    calib: Calibration
    elem_bytes: int
    """Bytes per element of the run's dtype."""
    accum: int
    """Micro-steps per optimizer step (``accumulation_steps``)."""
    tokens: int
    """Tokens of one rank's micro-batch."""
    recompute: str
    """What a checkpointed block's backward runs again (``Strategy.recompute``)."""
    checkpointed: float
    """The share of blocks checkpointed (``Strategy.checkpointed_blocks``)."""
    flops_per_token: int
    """The model's training FLOPs per token (``ModelSpec.flops_per_token``)."""
    attention: float
    """The attention kernel's fraction of peak at the model's sequence length and head size
    (``Calibration.attention_rate``; 0: the matmul rate)."""


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


class Schedule(NamedTuple):
    """One step of one strategy, bucket by bucket."""

    key: int
    """A number of its own: no two schedules built in one process share it (``_build`` keeps one schedule per
    cut), so memos of what a schedule costs key on it cheaply (a tuple of what it was built from hashes a
    model and every reduce group at each lookup)."""
    root: int
    """The root bucket's padded length (embeddings + final LN, gathered for the whole micro-step)."""
    lengths: tuple[int, ...]
    """Block bucket padded lengths, forward order."""
    units: tuple[int, ...]
    """Transformer blocks in each block bucket."""
    group_end: tuple[Group, ...]
    """The reduce group that ends at each block bucket (() where none ends there)."""
    root_group: Group
    """The group ending at the root (the last reduction of the backward pass)."""
    fwd: dict[int, Coll]
    """Forward gather by bucket length (root included)."""
    bwd: dict[int, Coll]
    """Backward gather by block bucket length."""
    reduce: dict[Group, tuple[Coll, Coll]]
    """The two reduce-scatters of a reduce group, of its total length."""
    boundary: dict[int, tuple[Coll, Coll, Coll, Coll]]
    """The step-boundary collectives of a bucket, by bucket length (root included)."""
    outer: dict[Group, tuple[Coll, ...]]
    """The reduction beyond grad_span of a reduce group's grad shards, bucket by bucket as the engine runs
    it (``_reduce_outer``): the first two of each member's ``boundary``, timed with the group when the final
    backward runs them (bytes count ``boundary``'s)."""
    block_counts: tuple[tuple[int, int], ...]
    """(length, number of block buckets of that length)."""
    group_counts: tuple[tuple[Group, int], ...]
    """(group, number of reduce groups alike), the root's group included."""

    bucket_counts: tuple[tuple[int, int], ...]
    """(length, number of buckets) with the root counted: what memory and the boundary walk."""
    total_units: int
    """Transformer blocks in all block buckets (the model's layers)."""
    largest_group: int
    """The length of the longest reduce group (the reduction buffer that memory holds)."""


_SERIAL = itertools.count()


@functools.lru_cache(maxsize=4096)
def _plan_facts(padded: tuple[int, ...], blocks: tuple[int, ...], groups: tuple[tuple[int, ...], ...]) -> tuple:
    ends = {g[-1]: tuple([padded[i] for i in g]) for g in groups}
    return (padded[0], padded[1:], blocks, tuple([ends.get(i, ()) for i in range(1, len(padded))]), ends[0])


@functools.lru_cache(maxsize=16384)
def _build(model: ModelSpec, sizes: tuple[int, ...], k: int, reduce_groups: tuple[tuple[int, ...], ...],
           spans: tuple[int, int, int, int | None], bits: tuple[int, int], padded: tuple[int, ...],
           blocks: tuple[int, ...]) -> Schedule:
    """The schedule of the plan of ``k`` blocks a bucket (``padded`` lengths, ``blocks`` in each block bucket, both
    read off ``model`` and the world by ``plan.bucket_layout``) cut into ``reduce_groups``."""
    L = len(sizes)  # noqa: N806
    P, G, O, H = spans  # noqa: E741, N806 (the paper's names)
    wb, gb = bits
    size = [math.prod(sizes[:n]) for n in range(L + 1)]
    root, lengths, units, group_end, root_group = _plan_facts(padded, blocks, reduce_groups)
    fwd, bwd, boundary, reduce, outer = {}, {}, {}, {}, {}

    def beyond_grad_span(n: int) -> tuple[Coll, Coll]:
        return ("reduce_scatter", (G + 1, O), n // size[G], gb), ("all_reduce", (O + 1, L), n // size[O], gb)

    for n in {root, *lengths}:
        fwd[n] = ("all_gather", (1, P), n // size[P], wb)
        bwd[n] = fwd[n] if H is None else ("all_gather", (1, H), n // size[H], 16)
        boundary[n] = (*beyond_grad_span(n), ("all_gather", (G + 1, O), n // size[O], 16),
                       ("all_gather", (P + 1, G), n // size[G], 16))
    groups = [g for g in (*group_end, root_group) if g]
    for g in set(groups):
        m = sum(g)
        reduce[g] = (("reduce_scatter", (1, P), m, gb), ("reduce_scatter", (P + 1, G), m // size[P], gb))
        outer[g] = tuple(c for n in g for c in boundary[n][:2])
    key = next(_SERIAL)
    block_counts = dict(Counter(lengths))
    buckets = dict(block_counts)
    buckets[root] = buckets.get(root, 0) + 1
    return Schedule(key, root, lengths, units, group_end, root_group, fwd, bwd, reduce, boundary, outer,
                    tuple(block_counts.items()), tuple(Counter(groups).items()), tuple(buckets.items()), sum(units),
                    max(map(sum, groups)))


@functools.lru_cache(maxsize=16384)
def _schedule_of(model: ModelSpec, sizes: tuple[int, ...], world: int, allgather_bucket_mb: float,
                 reduce_bucket_mb: float, spans: tuple[int, int, int, int | None], bits: tuple[int, int]) -> Schedule:
    k, padded, blocks = bucket_layout(model, world, allgather_bucket_mb)
    return _build(model, sizes, k, cut_reduce_groups(padded, reduce_bucket_mb), spans, bits, padded, blocks)


def build_schedule(model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Schedule:
    """The schedule of one step of ``s`` (cached: strategies that move the same bytes share it, bucket sizes that
    cut the same buckets and reduce groups included)."""
    return _schedule_of(model, cluster.sizes, cluster.world_size, s.allgather_bucket_mb, s.reduce_bucket_mb,
                        (s.param_span, s.grad_span, s.optim_span, s.secondary_span), (s.weight_bits, s.grad_bits))


def schedules_built() -> int:
    """Distinct schedules built since the last ``clear``: one per cut of the buckets met, not per bucket size."""
    return _build.cache_info().currsize


def clear() -> None:
    clear_cuts()
    _plan_facts.cache_clear()
    _build.cache_clear()
    _schedule_of.cache_clear()
