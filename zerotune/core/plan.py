"""How the engine cuts a model into buckets — pure Python, shared by the engine and the cost model.

Units (``model.unit_params``): ``root`` = token (and GPT's position) embeddings + final norm (and an untied LM
head), gathered at the start of forward and kept until the end of backward (the head uses its weights at the
other end of the network, as FSDP keeps its root unit unsharded); then one unit per block.

- A *parameter bucket* is one flat buffer: the root alone, or consecutive blocks whose parameters
  fit ``allgather_bucket_mb`` (counted as 16-bit elements, 2 bytes each, whatever the run dtype,
  so a bucket plan is the same on CPU fp32 and GPU bf16; a block larger than the bucket is a bucket
  of its own). Its length is padded to a multiple of the world size, so every span's shard is an
  exact slice.
- A *reduce group* is the set of parameter buckets whose gradients are reduce-scattered together:
  consecutive block buckets in backward order up to ``reduce_bucket_mb``; the root's gradients are
  complete only at the end of backward and form the last group.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass

from zerotune.core.spec import ModelSpec

BYTES_PER_16BIT = 2


def pad_to(numel: int, multiple: int) -> int:
    """``numel`` rounded up to a multiple of ``multiple`` (a bucket's length for a world of ranks, a buffer's for
    the ranks that split it: ``volume.py``)."""
    return math.ceil(numel / multiple) * multiple


def block_modules(spec: ModelSpec) -> tuple[int, ...]:
    """Parameters of a block's linear sub-modules, weight and bias, in the order its forward runs them
    (``costmodel.traffic.block_matmuls``). GPT: qkv (h + 2k outputs, k = ``ModelSpec.kv``), proj, fc, out.
    Llama (no biases): wq, wk, wv, wo, w1, w3, w2."""
    h, f, k = spec.hidden, spec.ffn, spec.kv
    if spec.llama:
        return h * h, h * k, h * k, h * h, h * f, h * f, f * h
    q = h + 2 * k
    return h * q + q, h * h + h, h * f + f, f * h + h


@functools.lru_cache(maxsize=256)
def _tensors(spec: ModelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The elements of each parameter tensor of the engine's model (``model.GPT``), in its order: the root's (the
    token and, GPT's, position embeddings, the final norm's weight and a LayerNorm's bias, an untied head) and one
    block's (GPT: LayerNorm, qkv, proj, LayerNorm, fc and out, weight then bias; Llama: RMSNorm, wq, wk, wv, wo,
    RMSNorm, w1, w2, w3). Their sums are ``ModelSpec.num_params``' per-block and outer terms."""
    h, f, k = spec.hidden, spec.ffn, spec.kv
    head = (spec.untied_head_numel,) if spec.untied_head_numel else ()
    if spec.llama:
        return (spec.vocab * h, h, *head), (h, h * h, h * k, h * k, h * h, h, h * f, f * h, h * f)
    q = h + 2 * k
    return (spec.vocab * h, spec.position_numel, h, h, *head), (h, h, h * q, q, h * h, h, h, h, h * f, f, f * h, h)


def block_numel(spec: ModelSpec) -> int:
    """Parameters of one block: its linear sub-modules and two norms (see ``ModelSpec.num_params``)."""
    return sum(_tensors(spec)[1])


def parameter_numels(spec: ModelSpec) -> tuple[int, ...]:
    """The elements of each parameter tensor of the engine's model, in its order (``_tensors``): the root's, then
    every block's. What an optimizer that hands out whole parameters partitions (``predict``'s
    ``weight_sync = "broadcast"``)."""
    root, block = _tensors(spec)
    return root + block * spec.layers


def root_numel(spec: ModelSpec) -> int:
    """Embeddings (V·h, and GPT's positions T·h), the final norm (2h for a LayerNorm, h for an RMSNorm) and an
    untied LM head (``ModelSpec.untied_head_numel``)."""
    return sum(_tensors(spec)[0])


@dataclass(frozen=True)
class Bucket:
    index: int
    units: tuple[str, ...]
    numel: int
    """Parameters in the bucket."""
    padded: int
    """Flat buffer length: numel rounded up to a multiple of the world size."""

    @property
    def is_root(self) -> bool:
        return self.units == ("root",)


@dataclass(frozen=True)
class Plan:
    buckets: tuple[Bucket, ...]
    """Root first, then block buckets in forward order."""
    reduce_groups: tuple[tuple[int, ...], ...]
    """Bucket indices reduced together, in the order the reductions are issued."""
    padded: tuple[int, ...]
    """Every bucket's ``padded`` length, root first (what the cost model's schedule reads)."""
    blocks: tuple[int, ...]
    """Transformer blocks in each block bucket, forward order."""

    @property
    def block_buckets(self) -> tuple[Bucket, ...]:
        return self.buckets[1:]


@functools.lru_cache(maxsize=64)
def _block_names(layers: int) -> tuple[str, ...]:
    return tuple(f"block{i}" for i in range(layers))


def blocks_per_bucket(per_block: int, allgather_bucket_mb: float) -> int:
    """The most whole blocks of ``per_block`` parameters whose 16-bit bytes fit ``allgather_bucket_mb``, at least
    one (a block larger than the bucket is a bucket of its own)."""
    cap = allgather_bucket_mb * 1e6 / BYTES_PER_16BIT
    k = max(1, int(cap // per_block))
    while k > 1 and k * per_block > cap:  # the float division's rounding, settled against the exact products
        k -= 1
    while (k + 1) * per_block <= cap:
        k += 1
    return k


@functools.lru_cache(maxsize=1024)
def _buckets(spec: ModelSpec, world_size: int, k: int) -> tuple[tuple[Bucket, ...], tuple[int, ...], tuple[int, ...]]:
    """The root's bucket, then the blocks ``k`` to a bucket (the last holds the rest), padded for ``world_size``; their
    padded lengths; the blocks in each block bucket."""
    per_block = block_numel(spec)
    names = _block_names(spec.layers)
    root = root_numel(spec)
    buckets = [Bucket(0, ("root",), root, pad_to(root, world_size))]
    for start in range(0, spec.layers, k):
        units = names[start:start + k]
        n = len(units) * per_block
        buckets.append(Bucket(len(buckets), units, n, pad_to(n, world_size)))
    return tuple(buckets), tuple(b.padded for b in buckets), tuple(len(b.units) for b in buckets[1:])


def bucket_layout(spec: ModelSpec, world_size: int,
                  allgather_bucket_mb: float) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The blocks a bucket holds at ``allgather_bucket_mb``, the buckets' padded lengths (root first) and the blocks
    in each block bucket: all that the all-gather bucket size decides (bucket sizes that hold the same number of
    blocks share it, memoized)."""
    k = blocks_per_bucket(block_numel(spec), allgather_bucket_mb)
    _, padded, blocks = _buckets(spec, world_size, k)
    return k, padded, blocks


def cut_reduce_groups(padded: tuple[int, ...], reduce_bucket_mb: float) -> tuple[tuple[int, ...], ...]:
    """The reduce groups of buckets of ``padded`` lengths (root first): from the last block bucket back, as many
    whole buckets as fit ``reduce_bucket_mb`` (at least one), then the root alone.

    The cut compares the bucket size only with sums of consecutive buckets, so sizes that fall between the same two
    such sums cut alike: the cut is memoized on where the size falls among them (``_run_sums``)."""
    reduce_cap = reduce_bucket_mb * 1e6 / BYTES_PER_16BIT
    key = (padded, bisect.bisect_right(_run_sums(padded), reduce_cap))
    groups = _CUTS.get(key)
    if groups is None:
        if len(_CUTS) > 16384:
            _CUTS.clear()
        groups = _CUTS[key] = _cut(padded, reduce_cap)
    return groups


_CUTS: dict[tuple[tuple[int, ...], int], tuple[tuple[int, ...], ...]] = {}
"""Reduce groups by (padded lengths, how many sums of consecutive buckets the cap is not below)."""


def clear_cuts() -> None:
    """Forget the memoized reduce groups (``cut_reduce_groups``)."""
    _CUTS.clear()
    _run_sums.cache_clear()


@functools.lru_cache(maxsize=1024)
def _run_sums(padded: tuple[int, ...]) -> tuple[int, ...]:
    """Every sum of consecutive block buckets of ``padded`` (root first, left out), sorted, each once."""
    ends = (0, *itertools.accumulate(padded[1:]))
    return tuple(sorted({ends[b] - ends[a] for a in range(len(ends)) for b in range(a + 1, len(ends))}))


def _cut(padded: tuple[int, ...], reduce_cap: float) -> tuple[tuple[int, ...], ...]:
    """``cut_reduce_groups`` at a cap of ``reduce_cap`` elements."""
    groups: list[tuple[int, ...]] = []
    group: list[int] = []
    size = 0
    for i in range(len(padded) - 1, 0, -1):
        if group and size + padded[i] > reduce_cap:
            groups.append(tuple(group))
            group, size = [], 0
        group.append(i)
        size += padded[i]
    groups.append(tuple(group))
    groups.append((0,))
    return tuple(groups)


def plan_buckets(spec: ModelSpec, world_size: int, allgather_bucket_mb: float, reduce_bucket_mb: float) -> Plan:
    """The bucket plan of ``spec`` for ``world_size`` ranks (see the module docstring). Bucket sizes that hold the
    same number of blocks share their buckets (memoized): only the reduce groups are cut for each call."""
    k, padded, blocks = bucket_layout(spec, world_size, allgather_bucket_mb)
    return Plan(_buckets(spec, world_size, k)[0], cut_reduce_groups(padded, reduce_bucket_mb), padded, blocks)
