"""The transformer zerotune trains, built from a ModelSpec: a GPT-2 (``arch="gpt"``, nanoGPT-shaped) or a Llama
(``arch="llama"``).

GPT: learned positions, pre-LayerNorm blocks, GELU MLP. Llama (as Hugging Face's ``LlamaForCausalLM`` writes it,
op for op, so a CPU and a GPU run the same kernels): rotary positions on queries and keys (θ = 500,000, Llama 3's),
pre-RMSNorm blocks (the norm computed in fp32, ``LlamaRMSNorm``), no biases, a SwiGLU MLP (w2(silu(w1 x) · w3 x)).
Both: multi-head or grouped-query attention
(``ModelSpec.kv_heads``: a group of query heads shares its keys and values, SDPA's ``enable_gqa``), and an LM
head tied to the token embedding (so ``ModelSpec.num_params`` counts it once) or of its own
(``tied_head=False``). Initialization follows GPT-2 (normal 0.02, residual projections scaled by
1/sqrt(2·layers), norms' weights 1) from one seed, so every rank builds the same weights.

The model is split into *units* the engine shards: ``root`` (token and position embeddings, the
final norm and an untied head — used at both ends of the network) and one unit per block. ``unit_params`` lists
each unit's parameters in a fixed order; ``plan.py`` counts the same numbers without torch.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from zerotune.core.spec import ModelSpec

SDPA_GQA = torch.__version__ >= "2.5"  # TorchVersion: compared as versions, not as strings
"""Whether SDPA takes ``enable_gqa`` (torch 2.5 on): grouped-query attention without copying keys and values."""


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with a causal mask: q (B, nh, T, hs), k and v (B, nkv, T, hs), each key and value head shared by
    nh / nkv query heads (grouped-query attention when nkv < nh); returns (B, nh, T, hs)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads and SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if kv_heads != heads:  # torch 2.4: each key and value head repeated for its query heads
        k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn
        self.heads, self.kv_heads, self.kv = spec.heads, spec.kv_heads or spec.heads, spec.kv
        self.rotary, self.seq_len = spec.position_numel == 0, spec.seq_len  # no position table: GPT-NeoX's rotary
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, h + 2 * self.kv)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, f)
        self.out = nn.Linear(f, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape  # (B, T, h)
        hs = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).split((h, self.kv, self.kv), dim=2)
        q = q.view(b, t, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (z.view(b, t, self.kv_heads, hs).transpose(1, 2) for z in (k, v))  # (B, nkv, T, hs)
        if self.rotary:
            cos, sin = (z[:t] for z in rope_tables(self.seq_len, hs, x.device, x.dtype))
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        x = x + self.proj(causal_attention(q, k, v).transpose(1, 2).reshape(b, t, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


ROPE_THETA = 500_000.0
"""Llama 3's rotary base (Dubey et al. 2024, Table 3); Llama 2's is 10,000."""
RMS_EPS = 1e-5


class RMSNorm(nn.Module):
    """Hugging Face's ``LlamaRMSNorm``: x · rsqrt(mean(x²) + ε) in fp32, cast back, times the weight."""

    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return self.weight * x32.to(x.dtype)


@functools.lru_cache(maxsize=16)
def rope_tables(seq_len: int, head_size: int, device: torch.device, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (T, head size), the half-size frequencies repeated as Hugging Face
    lays them out; computed in fp32, then cast to the run's dtype once (one table per run, shared by every
    block)."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1).to(device)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x · cos + rotate_half(x) · sin over the last dimension (Hugging Face's ``apply_rotary_pos_emb``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Pre-RMSNorm Llama block: x + wo(attn(rope(wq n), rope(wk n), wv n)), n = norm(x); then
    x + w2(silu(w1 n) · w3 n), n = norm(x). No biases but q, k and v's where the model has them (Qwen2); queries
    and keys normalized where it says (``ModelSpec.qk_norm``: per head, Qwen3; over all heads, OLMo 2)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn
        self.heads, self.kv_heads, self.seq_len = spec.heads, spec.kv_heads or spec.heads, spec.seq_len
        self.attention_norm = RMSNorm(h)
        self.wq = nn.Linear(h, h, bias=spec.qkv_bias)
        self.wk = nn.Linear(h, spec.kv, bias=spec.qkv_bias)
        self.wv = nn.Linear(h, spec.kv, bias=spec.qkv_bias)
        self.qk_norm = spec.qk_norm
        widths = {"head": (spec.head_dim, spec.head_dim), "full": (h, spec.kv)}.get(spec.qk_norm)
        self.q_norm: RMSNorm | None = RMSNorm(widths[0]) if widths else None
        self.k_norm: RMSNorm | None = RMSNorm(widths[1]) if widths else None
        self.wo = nn.Linear(h, h, bias=False)
        self.ffn_norm = RMSNorm(h)
        self.w1 = nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.w3 = nn.Linear(h, f, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape  # (B, T, h)
        hs = h // self.heads
        n = self.attention_norm(x)
        q, k, v = self.wq(n), self.wk(n), self.wv(n)
        if self.q_norm is not None and self.k_norm is not None and self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = (z.view(b, t, self.kv_heads, hs).transpose(1, 2) for z in (k, v))  # (B, nkv, T, hs)
        if self.q_norm is not None and self.k_norm is not None and self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = (z[:t] for z in rope_tables(self.seq_len, hs, x.device, x.dtype))
        y = causal_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v)  # (B, nh, T, hs)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, h))
        n = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


class GPT(nn.Module):
    """The engine's model of either family (``ModelSpec.arch``): embeddings, blocks, final norm and head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab, spec.hidden)
        rows = spec.position_numel // spec.hidden
        self.wpe = nn.Embedding(rows, spec.hidden) if rows else None
        block = LlamaBlock if spec.llama else Block
        self.blocks = nn.ModuleList(block(spec) for _ in range(spec.layers))
        self.ln_f: nn.Module = RMSNorm(spec.hidden) if spec.llama else nn.LayerNorm(spec.hidden)
        self.lm_head = None if spec.tied_head else nn.Parameter(torch.empty(spec.vocab, spec.hidden))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        if self.wpe is None:  # rotary positions: applied in each block's attention
            return self.wte(idx)  # (B, T, h)
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        return self.wte(idx) + self.wpe(pos)  # (B, T, h)

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        head = self.wte.weight if self.lm_head is None else self.lm_head
        logits = F.linear(self.ln_f(x), head)  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, targets)


NORMS = (".ln", "ln_", "_norm.")
"""Parameter names of the norms (LayerNorm, RMSNorm): their weights start at 1."""
RESIDUAL = ("proj.weight", "out.weight", "wo.weight", "w2.weight")
"""The projections back into the residual stream: GPT-2 scales their init by 1/sqrt(2·layers)."""


def build_gpt(spec: ModelSpec, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    """The model of ``spec`` with GPT-2 initialization from ``seed`` (identical on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    model = GPT(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif any(n in name for n in NORMS):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * spec.layers) if name.endswith(RESIDUAL) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.to(dtype)


def unit_params(model: GPT) -> list[tuple[str, list[tuple[str, torch.Tensor]]]]:
    """The model's units in forward order: ("root", …) then ("block{i}", …), each with its params."""
    root: list[tuple[str, torch.Tensor]] = [("wte.weight", model.wte.weight)]
    if model.wpe is not None:
        root.append(("wpe.weight", model.wpe.weight))
    root += [(f"ln_f.{name}", p) for name, p in model.ln_f.named_parameters()]
    if model.lm_head is not None:
        root.append(("lm_head", model.lm_head))
    units: list[tuple[str, list[tuple[str, torch.Tensor]]]] = [("root", root)]
    for i, block in enumerate(model.blocks):
        units.append((f"block{i}", list(block.named_parameters())))
    return units
