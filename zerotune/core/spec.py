"""The three values zerotune reasons about: ClusterSpec (``core.cluster``), ModelSpec (here) and Strategy
(``core.strategy``), imported from here.

Pure Python (no torch): the cost model, the tuner and the API build and validate these values
without any process group. Vocabulary follows DESIGN.md §2: a *level* is a tier of the cluster
(innermost first), a *span k* is the subtree of levels 1..k (span 0 = the rank alone, span L = the
world). Each value is frozen, validated in ``__post_init__`` against the rule each field carries
(``core.fields.about``) and the rules between its fields, and round-trips through JSON with ``to_dict`` /
``from_dict``; every invalid value raises :class:`SpecError` naming field, value and rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from zerotune.core.cluster import BUSBW_FIELDS, MAX_LEVEL_SIZE, MAX_LEVELS, ClusterSpec, Level
from zerotune.core.fields import about, check_fields, from_dict
from zerotune.core.strategy import BITS, CHECKPOINT_POLICIES, GRAD_BITS, Strategy, check_spans
from zerotune.errors import SpecError

ARCHS = ("gpt", "llama")
"""The block families a ModelSpec names (``ModelSpec.arch``)."""
QK_NORMS = ("none", "head", "full")
"""Normalization of the queries and keys of a Llama block (``ModelSpec.qk_norm``): none (Llama), an RMSNorm over each
head's width shared by the heads (Qwen3's ``q_norm`` / ``k_norm``), or one over all the heads' width (OLMo 2's)."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer of one of two block families (``arch``), with multi-head or grouped-query
    attention and an LM head tied to the token embedding or of its own.

    - ``"gpt"`` (GPT-2, the default): learned positions, pre-LayerNorm blocks with biases, a GELU MLP of width
      ``ffn_hidden`` (4h by default).
    - ``"llama"`` (Llama 2 and 3, Touvron et al. 2023; Dubey et al. 2024): rotary positions (no position table),
      pre-RMSNorm blocks without biases, a SwiGLU MLP of three h x f matrices, f = ``ffn_hidden`` (by default
      Llama's rule, 2/3 of 4h rounded up to a multiple of 256: 11,008 at h = 4,096)."""

    name: str = field(metadata=about("The model's name (a preset's, or your own).", min_length=1, max_length=64,
                                     api_default="custom"))
    layers: int = field(metadata=about("Transformer blocks, L.", minimum=1, api_max=1024))
    hidden: int = field(metadata=about("Hidden size, h.", minimum=1, api_max=131072))
    heads: int = field(metadata=about("Attention heads (a divisor of hidden).", minimum=1, api_max=1024))
    vocab: int = field(metadata=about("Vocabulary size, V.", minimum=1, api_max=4_194_304))
    seq_len: int = field(metadata=about("Tokens per sequence, T.", minimum=1, api_max=1_048_576))
    ffn_hidden: int | None = field(default=None, metadata=about("MLP width; null means 4 * hidden (GPT-2) or "
                                                                "Llama's rule (see arch).", minimum=1,
                                                                api_max=1_048_576))
    kv_heads: int | None = field(default=None, metadata=about(
        "Key and value heads: fewer than heads is grouped-query attention (Ainslie et al. 2023; Llama 2 70B and "
        "Llama 3 use 8), each shared by heads / kv_heads query heads (a divisor of heads); null means heads "
        "(multi-head attention).", minimum=1, api_max=1024))
    tied_head: bool = field(default=True, metadata=about(
        "The LM head is the token embedding (GPT-2); false: a V x h matrix of its own (Llama)."))
    arch: str = field(default="gpt", metadata=about(
        "The block family: gpt (GPT-2: LayerNorm, learned positions, GELU) or llama (RMSNorm, rotary positions, "
        "SwiGLU).", choices=ARCHS))
    qkv_bias: bool = field(default=False, metadata=about(
        "A Llama block's query, key and value projections have biases (Qwen2 and 2.5); a GPT block has them "
        "always."))
    qk_norm: str = field(default="none", metadata=about(
        "A Llama block's RMSNorm of queries and keys: none, head (one over a head's width, Qwen3) or full (one over "
        "all the heads', OLMo 2).", choices=QK_NORMS))
    positions: int | None = field(default=None, metadata=about(
        "Rows of a GPT block family's learned position table (GPT-2's n_positions); 0: rotary positions, no table "
        "(GPT-NeoX); null: seq_len (gpt) or 0 (llama).", minimum=0, api_max=1_048_576))

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if self.hidden % self.heads:
            raise SpecError("model.heads", self.heads, f"must divide hidden={self.hidden}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise SpecError("model.kv_heads", self.kv_heads, f"must divide heads={self.heads}")
        if not self.llama and (self.qkv_bias or self.qk_norm != "none"):
            raise SpecError("model.qkv_bias" if self.qkv_bias else "model.qk_norm",
                            self.qkv_bias if self.qkv_bias else self.qk_norm,
                            "is a Llama block's option (arch llama); a GPT block has its biases and no q/k norm")
        if self.llama and self.positions:
            raise SpecError("model.positions", self.positions, "a Llama block has rotary positions, no table")
        if self.positions is not None and self.seq_len > self.positions > 0:
            raise SpecError("model.seq_len", self.seq_len, f"must be at most positions={self.positions} (the rows "
                            "of the learned position table)")

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
        """The learned position table's rows x h (``positions``, T by default: GPT-2); none with rotary positions
        (Llama, GPT-NeoX)."""
        if self.llama:
            return 0
        return (self.seq_len if self.positions is None else self.positions) * self.hidden

    @property
    def extra_attention_numel(self) -> int:
        """A Llama block's parameters beyond its weight matrices and two norms: the q, k and v biases (h + 2k,
        ``qkv_bias``) and the query and key norms' weights (``qk_norm``: 2 x head width, or h + k)."""
        if not self.llama:
            return 0
        bias = self.hidden + 2 * self.kv if self.qkv_bias else 0
        norm = {"none": 0, "head": 2 * self.head_dim, "full": self.hidden + self.kv}[self.qk_norm]
        return bias + norm

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
        3h·f, i.e. 2h² + 2hk + 3hf + 2h (218,112,000 for Llama 3 8B), and q/k/v biases and q/k norms where the
        model has them (``extra_attention_numel``). Plus token embeddings V·h, the LM head's V·h
        when it is not tied to them, positions T·h (GPT only) and the final norm (2h for a LayerNorm, h for an
        RMSNorm): Llama 3 8B has 8,030,261,248.
        """
        h, f, k = self.hidden, self.ffn, self.kv
        if self.llama:
            block, final = 2 * h * h + 2 * h * k + 3 * h * f + 2 * h + self.extra_attention_numel, h
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
        """The fields as JSON; a GPT-2-shaped model leaves ``kv_heads``, ``tied_head`` and ``arch`` out, and every
        model ``qkv_bias``, ``qk_norm`` and ``positions`` at their defaults (so a model written before the fields
        existed keeps its form, and a request its key)."""
        out = dataclasses.asdict(self)
        for key, default in (("qkv_bias", False), ("qk_norm", "none"), ("positions", None)):
            if out[key] == default:
                del out[key]
        if out["arch"] == "gpt":
            del out["arch"]
        if out["kv_heads"] is None:
            del out["kv_heads"]
        if out["tied_head"]:
            del out["tied_head"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ModelSpec:
        return from_dict(cls, data, "model")


def count_label(n: float) -> str:
    """A count for people: ``104.5 K``, ``4.2 M``, ``6.66 B`` (never ``0.000 B`` for a small model)."""
    for scale, unit, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:g}"


__all__ = ["ARCHS", "QK_NORMS", "BITS", "BUSBW_FIELDS", "CHECKPOINT_POLICIES", "GRAD_BITS", "MAX_LEVELS",
           "MAX_LEVEL_SIZE", "check_spans", "count_label", "ClusterSpec", "Level", "ModelSpec", "Strategy"]
