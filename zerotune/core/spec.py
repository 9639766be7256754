"""The three values zerotune reasons about: ClusterSpec, ModelSpec and Strategy.

Pure Python (no torch): the cost model, the tuner and the API build and validate these values
without any process group. Vocabulary follows DESIGN.md §2: a *level* is a tier of the cluster
(innermost first), a *span k* is the subtree of levels 1..k (span 0 = the rank alone, span L = the
world). Each value is frozen, validated in ``__post_init__`` and round-trips through JSON with
``to_dict`` / ``from_dict``; every invalid value raises :class:`SpecError` naming field, value and
rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from zerotune.errors import SpecError

BITS = (16, 8, 4)  # communication widths: 16 = the run's dtype, unquantized
GRAD_BITS = (32, *BITS)
CHECKPOINT_POLICIES = ("full", "selective")
"""What a checkpointed block keeps for its backward (``Strategy.checkpoint_policy``)."""
"""Gradient reductions may also run in fp32 (32): FSDP2's ``MixedPrecisionPolicy(reduce_dtype=float32)``,
torchtitan's default, DeepSpeed's ``communication_data_type: fp32``, and Megatron's and nanotron's fp32
gradient all-reduce. It moves twice the bytes of a 16-bit reduction and is an accuracy choice, never a speed
one: the search offers it only to a request whose training reduces in fp32 (``Space.grad_widths``)."""

ARCHS = ("gpt", "llama")
"""The block families a ModelSpec names (``ModelSpec.arch``)."""

T = TypeVar("T")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(name, value, "must be an integer")
    if value < minimum:
        raise SpecError(name, value, f"must be >= {minimum}")


def _check_pos(name: str, value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise SpecError(name, value, "must be a finite number")
    if value <= 0:
        raise SpecError(name, value, "must be > 0")


def _from_dict(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from a dict, refusing unknown keys by name."""
    if not isinstance(data, dict):
        raise SpecError(where, data, f"must be a JSON object with the fields of {cls.__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", data[unknown[0]], f"unknown field; known: {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as exc:  # a missing required field
        raise SpecError(where, data, f"incomplete {cls.__name__}: {exc}") from None


@dataclass(frozen=True)
class Level:
    """One tier of a cluster's interconnect."""

    name: str
    """Label used everywhere bytes are reported ("gcd-pair", "node", "inter-node")."""
    size: int
    """Fan-out: how many children of the level below form one group of this level."""
    bandwidth_gbps: float
    """Per-rank bandwidth of this level's links, GB/s, when all ranks send at once."""
    latency_us: float = 5.0
    """Per-message latency of this level's links, microseconds."""
    busbw_gbps: float | None = None
    """A measured bus bandwidth, GB/s, of one collective whose ranks span this level and every level under it
    at this size (nccl-tests' or rccl-tests' ``busbw`` at a large message, e.g. ``all_reduce_perf -b 256M``
    across the nodes): the level's collectives then reach it instead of the nominal share of
    ``bandwidth_gbps`` (``costmodel.presets.calibration_for``). At most what the level's links carry:
    ``bandwidth_gbps`` times the ranks under it (a ring leaves a group through that many links)."""
    all_gather_busbw_gbps: float | None = None
    """``busbw_gbps`` of the all-gather alone (``all_gather_perf``), where it was measured apart: a cluster's
    collectives need not reach one rate (an EFA cluster's all-gather reached 28 GB/s on 32 nodes where its all-reduce
    reached 65, bench/published/hf_playbook.toml). The level's all-gathers reach it; ``busbw_gbps`` where not given."""
    reduce_scatter_busbw_gbps: float | None = None
    """``busbw_gbps`` of the reduce-scatter alone (``reduce_scatter_perf``), as ``all_gather_busbw_gbps``."""
    all_reduce_busbw_gbps: float | None = None
    """``busbw_gbps`` of the all-reduce alone (``all_reduce_perf``), as ``all_gather_busbw_gbps``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("level.name", self.name, "must be a non-empty string")
        _check_int(f"level[{self.name}].size", self.size, 1)
        _check_pos(f"level[{self.name}].bandwidth_gbps", self.bandwidth_gbps)
        if not isinstance(self.latency_us, int | float) or self.latency_us < 0:
            raise SpecError(f"level[{self.name}].latency_us", self.latency_us, "must be a number >= 0")
        for field, value in self.measured_busbw():
            _check_pos(f"level[{self.name}].{field}", value)

    def measured_busbw(self) -> tuple[tuple[str, float], ...]:
        """The bus bandwidths measured on this level, as (field name, GB/s): ``busbw_gbps`` and each collective's."""
        return tuple((f, v) for f in BUSBW_FIELDS if (v := getattr(self, f)) is not None)

    def collective_busbw(self) -> tuple[tuple[str, float], ...]:
        """The collectives measured apart on this level, as (collective, GB/s); the others reach ``busbw_gbps``
        where it was measured (``Calibration.level_efficiency`` holds that rule, ``presets.with_measured_links``
        fills it)."""
        return tuple((op, v) for op, f in zip(COLLECTIVES, BUSBW_FIELDS[1:], strict=True)
                     if (v := getattr(self, f)) is not None)


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives a level's bus bandwidth may be measured for apart (``Level.collective_busbw``)."""
BUSBW_FIELDS = ("busbw_gbps", *(f"{op}_busbw_gbps" for op in COLLECTIVES))
"""A level's measured bus bandwidths: one for every collective, and each collective's own."""
MAX_LEVELS = 8
"""The most levels a cluster has (explicit specs, local:AxB… presets and the API alike)."""
MAX_LEVEL_SIZE = 65536
"""The largest fan-out of one level."""


@dataclass(frozen=True)
class ClusterSpec:
    """The hardware: levels innermost first; the product of their sizes is the world size."""

    name: str
    levels: tuple[Level, ...]
    device: str = "cpu"
    device_memory_gib: float = 16.0
    """Memory per rank (one GPU / GCD)."""
    peak_tflops: float = 1.0
    """Peak dense 16-bit TFLOPS per rank."""

    def __post_init__(self) -> None:
        levels = tuple(lv if isinstance(lv, Level) else _from_dict(Level, lv, "cluster.levels[]")
                       for lv in self.levels)
        object.__setattr__(self, "levels", levels)
        if not levels:
            raise SpecError("cluster.levels", [], "needs at least one level")
        if len(levels) > MAX_LEVELS:
            raise SpecError("cluster.levels", f"{len(levels)} levels", f"at most {MAX_LEVELS} levels")
        for lv in levels:
            if lv.size > MAX_LEVEL_SIZE:
                raise SpecError(f"level[{lv.name}].size", lv.size, f"must be <= {MAX_LEVEL_SIZE}")
        names = [lv.name for lv in levels]
        if len(set(names)) != len(names):
            raise SpecError("cluster.levels", names, "level names must be unique")
        _check_pos("cluster.device_memory_gib", self.device_memory_gib)
        _check_pos("cluster.peak_tflops", self.peak_tflops)
        below = 1
        for lv in levels:
            for field, value in lv.measured_busbw():
                if value > below * lv.bandwidth_gbps:
                    raise SpecError(f"level[{lv.name}].{field}", value,
                                    f"must be at most what the level's links carry: {below} rank(s) under it x "
                                    f"bandwidth_gbps {lv.bandwidth_gbps:g} = {below * lv.bandwidth_gbps:g} GB/s")
            below *= lv.size

    @property
    def num_levels(self) -> int:
        """L, the number of levels; spans run 0..L."""
        return len(self.levels)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:  # read on every prediction: computed once (levels are immutable)
        return tuple(lv.size for lv in self.levels)

    @functools.cached_property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    @property
    def node_span(self) -> int:
        """The span of one node: every level but the outermost (all of them on a 1-level cluster)."""
        return max(self.num_levels - 1, 1)

    def span_size(self, span: int) -> int:
        """Ranks in a span-``span`` group: the product of the sizes of levels 1..span."""
        if not 0 <= span <= self.num_levels:
            raise SpecError("span", span, f"must be within 0..{self.num_levels} (the cluster's levels)")
        return math.prod(self.sizes[:span])

    def spans_rule(self) -> str:
        """What each span means on this cluster, for errors: ``"must be within 0..3 on frontier:48
        (0 = unsharded, 1 = gcd-pair (2 ranks), 2 = node (8 ranks), 3 = inter-node (384 ranks))"``."""
        levels = ", ".join(f"{k} = {lv.name} ({self.span_size(k)} ranks)" for k, lv in enumerate(self.levels, 1))
        return f"must be within 0..{self.num_levels} on {self.name} (0 = unsharded, {levels})"

    def with_outer_size(self, size: int) -> ClusterSpec:
        """The same cluster with ``size`` groups of the outermost level (e.g. nodes). A bus bandwidth measured on
        the outermost level holds at the size it was measured at only, so another size drops it."""
        _check_int(f"cluster {self.name}: outermost level size", size, 1)
        outer = self.levels[-1]
        if size != outer.size:  # every bus bandwidth measured there
            cleared: dict[str, Any] = dict.fromkeys(BUSBW_FIELDS)
            outer = dataclasses.replace(outer, **cleared)
        levels = self.levels[:-1] + (dataclasses.replace(outer, size=size),)
        return dataclasses.replace(self, levels=levels)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON; a level leaves out each bus bandwidth it has not measured (``BUSBW_FIELDS``: so a
        cluster written before those fields existed keeps its form, and a request its key)."""
        out = dataclasses.asdict(self)
        for lv in out["levels"]:
            for field in BUSBW_FIELDS:
                if lv[field] is None:
                    del lv[field]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ClusterSpec:
        return _from_dict(cls, data, "cluster")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer of one of two block families (``arch``), with multi-head or grouped-query
    attention and an LM head tied to the token embedding or of its own.

    - ``"gpt"`` (GPT-2, the default): learned positions, pre-LayerNorm blocks with biases, a GELU MLP of width
      ``ffn_hidden`` (4h by default).
    - ``"llama"`` (Llama 2 and 3, Touvron et al. 2023; Dubey et al. 2024): rotary positions (no position table),
      pre-RMSNorm blocks without biases, a SwiGLU MLP of three h x f matrices, f = ``ffn_hidden`` (by default
      Llama's rule, 2/3 of 4h rounded up to a multiple of 256: 11,008 at h = 4,096)."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn_hidden: int | None = None
    """MLP width; None means 4 * hidden."""
    kv_heads: int | None = None
    """Key and value heads: fewer than ``heads`` is grouped-query attention (Ainslie et al. 2023; Llama 2 70B and
    Llama 3 use 8), each shared by heads / kv_heads query heads; None means ``heads`` (multi-head attention)."""
    tied_head: bool = True
    """The LM head is the token embedding (GPT-2); False: a V x h matrix of its own (Llama)."""
    arch: str = "gpt"
    """The block family: ``"gpt"`` or ``"llama"`` (``ARCHS``; see the class docstring)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            _check_int(f"model.{name}", getattr(self, name), 1)
        if self.ffn_hidden is not None:
            _check_int("model.ffn_hidden", self.ffn_hidden, 1)
        if self.hidden % self.heads:
            raise SpecError("model.heads", self.heads, f"must divide hidden={self.hidden}")
        if self.kv_heads is not None:
            _check_int("model.kv_heads", self.kv_heads, 1)
            if self.heads % self.kv_heads:
                raise SpecError("model.kv_heads", self.kv_heads, f"must divide heads={self.heads}")
        if not isinstance(self.tied_head, bool):
            raise SpecError("model.tied_head", self.tied_head, "must be true or false")
        if self.arch not in ARCHS:
            raise SpecError("model.arch", self.arch, f"must be one of {list(ARCHS)}")

    @property
    def llama(self) -> bool:
        return self.arch == "llama"

    @property
    def ffn(self) -> int:
        """MLP width: ``ffn_hidden``, else 4h (GPT-2) or Llama's 256 x ceil(8h / 3 / 256)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return -(-8 * self.hidden // (3 * 256)) * 256 if self.llama else 4 * self.hidden

    @property
    def position_numel(self) -> int:
        """The learned position table's T·h (GPT-2); none with rotary positions (Llama)."""
        return 0 if self.llama else self.seq_len * self.hidden

    @property
    def untied_head_numel(self) -> int:
        """The LM head's own weights: V·h where it is not tied to the token embedding, else none."""
        return 0 if self.tied_head else self.vocab * self.hidden

    @property
    def head_dim(self) -> int:
        """The width of one attention head: ``hidden`` / ``heads``."""
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Width of the keys (and of the values): kv_heads x head size; ``hidden`` without GQA."""
        return self.head_dim * (self.kv_heads or self.heads)

    def num_params(self) -> int:
        """Ψ, every trainable parameter.

        Per GPT block (k = ``kv``, h without GQA): LN 2h, QKV h(h+2k) + h+2k, attention projection h²+h, LN 2h,
        MLP h·f+f and f·h+h, i.e. 2h² + 2hk + 2hf + 7h + 2k + f (12h² + 13h for k = h and f = 4h, as Narayanan
        et al. 2021, eq. 2). Per Llama block: RMSNorm h, q and o h² each, k and v h·k each, RMSNorm h, SwiGLU
        3h·f, i.e. 2h² + 2hk + 3hf + 2h (218,112,000 for Llama 3 8B). Plus token embeddings V·h, the LM head's V·h
        when it is not tied to them, positions T·h (GPT only) and the final norm (2h for a LayerNorm, h for an
        RMSNorm): Llama 3 8B has 8,030,261,248.
        """
        h, f, k = self.hidden, self.ffn, self.kv
        if self.llama:
            block, final = 2 * h * h + 2 * h * k + 3 * h * f + 2 * h, h
        else:
            block, final = 2 * h * h + 2 * h * k + 2 * h * f + 7 * h + 2 * k + f, 2 * h
        return self.layers * block + self.vocab * h + self.untied_head_numel + self.position_numel + final

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6Ψ + 12·L·h·T, Ψ without the token embedding of an untied head.

        6Ψ for the forward and backward matmuls of every weight, 12·L·h·T for the attention
        scores and weighted sums (Chowdhery et al. 2022, PaLM, Appendix B; nanoGPT's
        ``estimate_mfu``). A tied embedding is counted once, as the head's matmul; an untied one
        is a lookup, no matmul, and is left out (torchtitan's count). Recomputation under activation
        checkpointing is not counted: this is *model* FLOPs, so TFLOPS figures compare across strategies.
        """
        lookup = self.untied_head_numel  # as many weights as the untied head: V·h
        return 6 * (self.num_params() - lookup) + 12 * self.layers * self.hidden * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON; a GPT-2-shaped model leaves ``kv_heads``, ``tied_head`` and ``arch`` out (so a model
        written before the fields existed keeps its form, and a request its key)."""
        out = dataclasses.asdict(self)
        if out["arch"] == "gpt":
            del out["arch"]
        if out["kv_heads"] is None:
            del out["kv_heads"]
        if out["tied_head"]:
            del out["tied_head"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        return _from_dict(cls, data, "model")


@dataclass(frozen=True)
class Strategy:
    """One point of the search space: where P, G and OS live and how bytes move (DESIGN.md §2).

    Spans count levels from the innermost: 0 = not partitioned (replicated), L = the world.
    ZeRO-3 is (L, L, L), ZeRO-1 (0, 0, L), MiCS (node, node, node).
    """

    param_span: int
    """Span over which the 16-bit parameters are sharded."""
    grad_span: int
    """Span over which gradients are reduce-scattered (and kept) during backward."""
    optim_span: int
    """Span over which fp32 master weights and Adam moments are sharded."""
    secondary_span: int | None = None
    """hpZ: span of a secondary weight shard kept after forward for the backward all-gather;
    None = off (backward gathers from ``param_span`` again). Must be < param_span."""
    weight_bits: int = 16
    """Width of the weight all-gather from the primary shard: 16 (the run's dtype), 8 or 4."""
    grad_bits: int = 16
    """Width of gradient reductions: 16 (the run's dtype), 32 (fp32: cast up before reducing, the grad
    shard kept in fp32) or 8 / 4 (qgZ all-to-all)."""
    quantize_above: int = 1
    """Innermost level (1-based) whose links carry quantized data; faster inner links stay 16-bit."""
    allgather_bucket_mb: float = 25.0
    """Target size of a flat parameter bucket (one gather), MB of 16-bit parameters."""
    reduce_bucket_mb: float = 25.0
    """Target size of one gradient reduction, MB."""
    prefetch_buckets: int = 1
    """Buckets gathered ahead of the one computing (0 = no prefetch)."""
    micro_batch_size: int = 1
    """Sequences per rank per micro-step; accumulation steps derive from the global batch."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of storing them."""
    checkpoint_policy: str = "full"
    """With ``activation_checkpointing``, what a block keeps for its backward. ``"full"``: its input only; the
    backward reruns its whole forward. ``"selective"``: torchtitan's per-op policy (``selective_ac_option =
    "op"``): the attention kernel's outputs and every second matmul's output (the first, third, ... in the
    block's forward order) are kept; the other matmuls and every element-wise op (norms, activations, rotary
    positions, residual adds) run again in the backward. Less recompute than ``"full"``, more memory."""
    checkpoint_every: int = 1
    """With full checkpointing, checkpoint every k-th block only (the k-th, 2k-th, ...; torchtitan's
    ``selective_ac_option = k``, Megatron's uniform recompute of some layers): the others keep every activation.
    1: every block."""
    name: str | None = None
    """Label only (the preset it came from); never changes behaviour."""

    def __post_init__(self) -> None:
        for f in ("param_span", "grad_span", "optim_span"):
            _check_int(f"strategy.{f}", getattr(self, f), 0)
        if self.param_span > self.grad_span:
            raise SpecError("strategy.param_span", self.param_span,
                            f"must be <= grad_span={self.grad_span} (params are partitioned no wider than grads)")
        if self.grad_span > self.optim_span:
            raise SpecError("strategy.grad_span", self.grad_span,
                            f"must be <= optim_span={self.optim_span} "
                            "(grads are partitioned no wider than optimizer states)")
        if self.secondary_span is not None:
            _check_int("strategy.secondary_span", self.secondary_span, 0)
            if self.secondary_span >= self.param_span:
                raise SpecError("strategy.secondary_span", self.secondary_span,
                                f"must be < param_span={self.param_span} (hpZ keeps a narrower copy) or null")
        for f, allowed in (("weight_bits", BITS), ("grad_bits", GRAD_BITS)):
            if getattr(self, f) not in allowed:
                raise SpecError(f"strategy.{f}", getattr(self, f), f"must be one of {list(allowed)}")
        _check_int("strategy.quantize_above", self.quantize_above, 1)
        if self.weight_bits < 16 and self.param_span < self.quantize_above:
            raise SpecError("strategy.weight_bits", self.weight_bits,
                            f"has no effect: param_span={self.param_span} crosses no level >= "
                            f"quantize_above={self.quantize_above}; use 16 or widen param_span")
        _check_pos("strategy.allgather_bucket_mb", self.allgather_bucket_mb)
        _check_pos("strategy.reduce_bucket_mb", self.reduce_bucket_mb)
        _check_int("strategy.prefetch_buckets", self.prefetch_buckets, 0)
        _check_int("strategy.micro_batch_size", self.micro_batch_size, 1)
        if not isinstance(self.activation_checkpointing, bool):
            raise SpecError("strategy.activation_checkpointing", self.activation_checkpointing, "must be true or false")
        if self.checkpoint_policy not in CHECKPOINT_POLICIES:
            raise SpecError("strategy.checkpoint_policy", self.checkpoint_policy,
                            f"must be one of {list(CHECKPOINT_POLICIES)}")
        if self.checkpoint_policy != "full" and not self.activation_checkpointing:
            raise SpecError("strategy.checkpoint_policy", self.checkpoint_policy,
                            "needs activation_checkpointing = true (it says what a checkpointed block keeps)")
        _check_int("strategy.checkpoint_every", self.checkpoint_every, 1)
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
        return _from_dict(Strategy, {**self.to_dict(), **changes}, "strategy")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Strategy:
        return _from_dict(cls, data, "strategy")


def check_spans(fields: dict[str, Any], cluster: ClusterSpec) -> None:
    """Every span in ``fields`` names a level of ``cluster`` (checked before the rules between spans,
    so ``param_span=5`` on a 3-level cluster is told what the levels are, not compared with grad_span)."""
    for f in ("param_span", "grad_span", "optim_span", "secondary_span"):
        value = fields.get(f)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= cluster.num_levels:
            raise SpecError(f"strategy.{f}", value, cluster.spans_rule())


def count_label(n: float) -> str:
    """A count for people: ``104.5 K``, ``4.2 M``, ``6.66 B`` (never ``0.000 B`` for a small model)."""
    for scale, unit, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:g}"


__all__ = ["ARCHS", "BITS", "GRAD_BITS", "check_spans", "count_label", "ClusterSpec", "Level", "ModelSpec", "Strategy"]
