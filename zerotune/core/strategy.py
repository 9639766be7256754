"""A Strategy: one point of the search space, where P, G and OS live and how bytes move (DESIGN.md §2).

Each field says what it means and may hold (``core.fields.about``): a Strategy checks itself against those rules
(and the rules between fields, below), and the API's body model of a strategy is built from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from zerotune.core.cluster import MAX_LEVELS, ClusterSpec
from zerotune.core.fields import about, check_fields, from_dict
from zerotune.errors import SpecError

BITS = (16, 8, 4)  # communication widths: 16 = the run's dtype, unquantized
GRAD_BITS = (32, *BITS)
"""Gradient reductions may also run in fp32 (32): FSDP2's ``MixedPrecisionPolicy(reduce_dtype=float32)``,
torchtitan's default, DeepSpeed's ``communication_data_type: fp32``, and Megatron's and nanotron's fp32
gradient all-reduce. It moves twice the bytes of a 16-bit reduction and is an accuracy choice, never a speed
one: the search offers it only to a request whose training reduces in fp32 (``Space.grad_widths``)."""
CHECKPOINT_POLICIES = ("full", "selective")
"""What a checkpointed block keeps for its backward (``Strategy.checkpoint_policy``)."""
BUCKET_MB_MAX = 1e5
"""The API's bound on a bucket, MB."""


def _span(doc: str) -> dict[str, Any]:
    return about(doc, minimum=0, api_max=MAX_LEVELS)


@dataclass(frozen=True)
class Strategy:
    """One point of the search space: where P, G and OS live and how bytes move (DESIGN.md §2).

    Spans count levels from the innermost: 0 = not partitioned (replicated), L = the world.
    ZeRO-3 is (L, L, L), ZeRO-1 (0, 0, L), MiCS (node, node, node).
    """

    param_span: int = field(metadata=_span("Span over which the 16-bit parameters are sharded."))
    grad_span: int = field(metadata=_span("Span over which gradients are reduce-scattered (and kept) during backward."))
    optim_span: int = field(metadata=_span("Span over which fp32 master weights and Adam moments are sharded."))
    secondary_span: int | None = field(default=None, metadata=_span(
        "hpZ: span of a secondary weight shard kept after forward for the backward all-gather; null = off (backward "
        "gathers from param_span again). Must be < param_span."))
    weight_bits: int = field(default=16, metadata=about(
        "Width of the weight all-gather from the primary shard: 16 (the run's dtype), 8 or 4.", choices=BITS))
    grad_bits: int = field(default=16, metadata=about(
        "Width of gradient reductions: 16 (the run's dtype), 32 (fp32: cast up before reducing, the grad shard kept "
        "in fp32) or 8 / 4 (qgZ all-to-all).", choices=GRAD_BITS))
    quantize_above: int = field(default=1, metadata=about(
        "Innermost level (1-based) whose links carry quantized data; faster inner links stay 16-bit.", minimum=1,
        api_max=MAX_LEVELS))
    allgather_bucket_mb: float = field(default=25.0, metadata=about(
        "Target size of a flat parameter bucket (one gather), MB of 16-bit parameters.", above=0,
        api_max=BUCKET_MB_MAX))
    reduce_bucket_mb: float = field(default=25.0, metadata=about(
        "Target size of one gradient reduction, MB.", above=0, api_max=BUCKET_MB_MAX))
    prefetch_buckets: int = field(default=1, metadata=about(
        "Buckets gathered ahead of the one computing (0 = no prefetch).", minimum=0, api_max=64))
    micro_batch_size: int = field(default=1, metadata=about(
        "Sequences per rank per micro-step; accumulation steps derive from the global batch.", minimum=1,
        api_max=65536))
    activation_checkpointing: bool = field(default=False, metadata=about(
        "Recompute each block's activations in backward instead of storing them."))
    checkpoint_policy: str = field(default="full", metadata=about(
        "With activation_checkpointing, what a block keeps for its backward. full: its input only; the backward "
        "reruns its whole forward. selective: torchtitan's per-op policy (selective_ac_option = \"op\"): the "
        "attention kernel's outputs and every second matmul's output (the first, third, ... in the block's forward "
        "order) are kept; the other matmuls and every element-wise op (norms, activations, rotary positions, "
        "residual adds) run again in the backward. Less recompute than full, more memory.",
        choices=CHECKPOINT_POLICIES))
    checkpoint_every: int = field(default=1, metadata=about(
        "With full checkpointing, checkpoint every k-th block only (the k-th, 2k-th, ...; torchtitan's "
        "selective_ac_option = k, Megatron's uniform recompute of some layers): the others keep every activation. "
        "1: every block.", minimum=1, api_max=1024))
    name: str | None = field(default=None, metadata=about(
        "Label only (the preset it came from); never changes behaviour.", max_length=64))

    def __post_init__(self) -> None:
        check_fields(self, "strategy")
        if self.param_span > self.grad_span:
            raise SpecError("strategy.param_span", self.param_span,
                            f"must be <= grad_span={self.grad_span} (params are partitioned no wider than grads)")
        if self.grad_span > self.optim_span:
            raise SpecError("strategy.grad_span", self.grad_span,
                            f"must be <= optim_span={self.optim_span} "
                            "(grads are partitioned no wider than optimizer states)")
        if self.secondary_span is not None and self.secondary_span >= self.param_span:
            raise SpecError("strategy.secondary_span", self.secondary_span,
                            f"must be < param_span={self.param_span} (hpZ keeps a narrower copy) or null")
        if self.weight_bits < 16 and self.param_span < self.quantize_above:
            raise SpecError("strategy.weight_bits", self.weight_bits,
                            f"has no effect: param_span={self.param_span} crosses no level >= "
                            f"quantize_above={self.quantize_above}; use 16 or widen param_span")
        if self.checkpoint_policy != "full" and not self.activation_checkpointing:
            raise SpecError("strategy.checkpoint_policy", self.checkpoint_policy,
                            "needs activation_checkpointing = true (it says what a checkpointed block keeps)")
        if self.checkpoint_every > 1 and (not self.activation_checkpointing or self.checkpoint_policy != "full"):
            raise SpecError("strategy.checkpoint_every", self.checkpoint_every,
                            "must be 1 unless activation_checkpointing = true with checkpoint_policy = 'full' "
                            "(it says which blocks are fully checkpointed)")

    def validate_for(self, cluster: ClusterSpec) -> Strategy:
        """Check the rules that need the cluster (spans and levels exist); return self."""
        levels = cluster.num_levels
        check_spans(self.to_dict(), cluster)
        if self.quantize_above > levels:
            raise SpecError("strategy.quantize_above", self.quantize_above,
                            f"must be <= {levels}, the number of levels of cluster {cluster.name!r}")
        return self

    @property
    def recompute(self) -> str:
        """What a block's backward runs again: ``"none"``, ``"full"`` (its forward) or ``"selective"``
        (``checkpoint_policy``)."""
        return self.checkpoint_policy if self.activation_checkpointing else "none"

    @property
    def checkpointing(self) -> str:
        """The run's checkpointing as one word: ``"none"``, ``"full"`` (every block), ``"selective"`` or
        ``"some blocks"`` (``checkpoint_every`` > 1)."""
        return self.recompute if self.checkpoint_every == 1 else "some blocks"

    def checkpointed(self, block: int) -> bool:
        """Whether block ``block`` (0-based) is checkpointed: every one with checkpointing on, or every
        ``checkpoint_every``-th (the k-th, 2k-th, ...)."""
        return self.activation_checkpointing and (block + 1) % self.checkpoint_every == 0

    def checkpointed_blocks(self, layers: int) -> int:
        """How many of ``layers`` blocks are checkpointed."""
        return layers // self.checkpoint_every if self.activation_checkpointing else 0

    @property
    def quantized(self) -> bool:
        return self.weight_bits < 16 or self.grad_bits < 16

    def replace(self, **changes: Any) -> Strategy:
        """A copy with ``changes`` applied and validated (the label is dropped unless given)."""
        changes.setdefault("name", self.name)
        return from_dict(Strategy, {**self.to_dict(), **changes}, "strategy")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Strategy:
        return from_dict(cls, data, "strategy")


def check_spans(fields: dict[str, Any], cluster: ClusterSpec) -> None:
    """Every span in ``fields`` names a level of ``cluster`` (checked before the rules between spans,
    so ``param_span=5`` on a 3-level cluster is told what the levels are, not compared with grad_span)."""
    for f in ("param_span", "grad_span", "optim_span", "secondary_span"):
        value = fields.get(f)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= cluster.num_levels:
            raise SpecError(f"strategy.{f}", value, cluster.spans_rule())
