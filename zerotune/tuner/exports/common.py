"""What the exports share: run dtypes, the global batch, bucket elements, ranks per node."""

from __future__ import annotations

import json
from typing import Any

from zerotune.core.plan import BYTES_PER_16BIT  # noqa: F401  (re-exported by tuner.exports)
from zerotune.core.spec import ClusterSpec, Strategy
from zerotune.costmodel import accumulation_steps
from zerotune.costmodel.coordinator import bucket_elements
from zerotune.errors import SpecError

DTYPES = ("bf16", "fp16", "fp32")
"""Run dtypes the exports accept (compute and unquantized communication)."""

MIN_DEEPSPEED = (0, 14, 0)
"""Oldest DeepSpeed the exports target (the ``deepspeed`` extra in pyproject.toml)."""

MICS_REMOVED_IN = (0, 19, 7)
"""First DeepSpeed release whose config parser rejects ``mics_shard_size``."""




def _check_dtype(dtype: Any, allowed: tuple[str, ...] = DTYPES, target: str = "the exports") -> str:
    if dtype not in allowed:
        raise SpecError("dtype", dtype, f"must be one of {list(allowed)} for {target}")
    return dtype


def _batch(cluster: ClusterSpec, strategy: Strategy, global_batch: int | None) -> tuple[int, int]:
    """(global batch, accumulation steps); the global batch defaults to world x micro_batch_size. The
    rule is the cost model's (``accumulation_steps``), so an export and its prediction refuse alike."""
    accum = accumulation_steps(cluster, strategy, global_batch)
    return cluster.world_size * strategy.micro_batch_size * accum, accum


_elements = bucket_elements
"""A bucket of ``mb`` MB of 16-bit values as an element count (``costmodel.deepspeed.bucket_elements``: the cost
model books DeepSpeed's buffers by the same rule)."""


def _ranks_per_node(cluster: ClusterSpec) -> int:
    """Ranks in one node: the node span on a multi-level cluster, the whole world on a 1-level one."""
    return cluster.span_size(cluster.node_span) if cluster.num_levels > 1 else cluster.world_size


def _span_words(cluster: ClusterSpec, span: int) -> str:
    """``"span 2 (node, 8 ranks)"`` for notes."""
    if span == 0:
        return "span 0 (one rank)"
    return f"span {span} ({cluster.levels[span - 1].name}, {cluster.span_size(span)} ranks)"


def _plain(value: Any) -> Any:
    """``value`` as plain JSON types (``to_dict`` keeps the levels as a tuple; JSON has lists)."""
    return json.loads(json.dumps(value))


def _prepare(cluster: ClusterSpec, strategy: Strategy, global_batch: int | None, dtype: Any,
             allowed: tuple[str, ...], target: str) -> tuple[Strategy, int, int]:
    strategy = strategy.validate_for(cluster)
    _check_dtype(dtype, allowed, target)
    gb, accum = _batch(cluster, strategy, global_batch)
    return strategy, gb, accum
