"""How the engine cuts a model into buckets — pure Python, shared by the engine and the cost model.

Units (``model.unit_params``): ``root`` = token + position embeddings + final LayerNorm, gathered at
the start of forward and kept until the end of backward (the tied head uses the embedding at the
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

from dataclasses import dataclass

from zerotune.strategies.spec import ModelSpec
from zerotune.strategies.volume import pad_to

BYTES_PER_16BIT = 2


def block_modules(spec: ModelSpec) -> tuple[int, ...]:
    """Parameters of a block's linear sub-modules, weight and bias: qkv, proj, fc, out."""
    h, f = spec.hidden, spec.ffn
    return 3 * h * h + 3 * h, h * h + h, h * f + f, f * h + h


def block_numel(spec: ModelSpec) -> int:
    """Parameters of one block: its linear sub-modules and two LayerNorms, 4h² + 2hf + 9h + f (see
    ``ModelSpec.num_params``)."""
    return sum(block_modules(spec)) + 4 * spec.hidden


def root_numel(spec: ModelSpec) -> int:
    """Embeddings (V·h + T·h) and the final LayerNorm (2h)."""
    return spec.vocab * spec.hidden + spec.seq_len * spec.hidden + 2 * spec.hidden


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

    @property
    def block_buckets(self) -> tuple[Bucket, ...]:
        return self.buckets[1:]


def plan_buckets(spec: ModelSpec, world_size: int, allgather_bucket_mb: float, reduce_bucket_mb: float) -> Plan:
    """The bucket plan of ``spec`` for ``world_size`` ranks (see the module docstring)."""
    cap = allgather_bucket_mb * 1e6 / BYTES_PER_16BIT
    per_block = block_numel(spec)
    buckets = [Bucket(0, ("root",), root_numel(spec), pad_to(root_numel(spec), world_size))]
    current: list[str] = []
    for i in range(spec.layers):
        if current and (len(current) + 1) * per_block > cap:
            n = len(current) * per_block
            buckets.append(Bucket(len(buckets), tuple(current), n, pad_to(n, world_size)))
            current = []
        current.append(f"block{i}")
    n = len(current) * per_block
    buckets.append(Bucket(len(buckets), tuple(current), n, pad_to(n, world_size)))

    reduce_cap = reduce_bucket_mb * 1e6 / BYTES_PER_16BIT
    groups: list[tuple[int, ...]] = []
    group: list[int] = []
    for b in reversed(buckets[1:]):
        if group and sum(buckets[i].padded for i in group) + b.padded > reduce_cap:
            groups.append(tuple(group))
            group = []
        group.append(b.index)
    groups.append(tuple(group))
    groups.append((0,))
    return Plan(tuple(buckets), tuple(groups))
