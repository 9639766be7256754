"""The GPT that zerotune trains: nanoGPT-shaped, built from a ModelSpec.

Learned positions, pre-LayerNorm blocks, GELU MLP, multi-head or grouped-query attention
(``ModelSpec.kv_heads``: a group of query heads shares its keys and values, SDPA's ``enable_gqa``), and an LM
head tied to the token embedding (so ``ModelSpec.num_params`` counts it once) or of its own
(``tied_head=False``). Initialization follows GPT-2 (normal 0.02, residual projections scaled by
1/sqrt(2·layers)) from one seed, so every rank builds the same weights.

The model is split into *units* the engine shards: ``root`` (token and position embeddings, the
final LayerNorm and an untied head — used at both ends of the network) and one unit per block. ``unit_params`` lists
each unit's parameters in a fixed order; ``plan.py`` counts the same numbers without torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zerotune.strategies.spec import ModelSpec

SDPA_GQA = torch.__version__ >= "2.5"  # TorchVersion: compared as versions, not as strings
"""Whether SDPA takes ``enable_gqa`` (torch 2.5 on): grouped-query attention without copying keys and values."""


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn
        self.heads, self.kv_heads, self.kv = spec.heads, spec.kv_heads or spec.heads, spec.kv
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
        if self.kv_heads != self.heads and SDPA_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, nh, T, hs)
        else:
            if self.kv_heads != self.heads:  # torch 2.4: each key and value head repeated for its query heads
                k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab, spec.hidden)
        self.wpe = nn.Embedding(spec.seq_len, spec.hidden)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.hidden)
        self.lm_head = None if spec.tied_head else nn.Parameter(torch.empty(spec.vocab, spec.hidden))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
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


def build_gpt(spec: ModelSpec, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    """A GPT with GPT-2 initialization from ``seed`` (identical on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    model = GPT(spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * spec.layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.to(dtype)


def unit_params(model: GPT) -> list[tuple[str, list[tuple[str, torch.Tensor]]]]:
    """The model's units in forward order: ("root", …) then ("block{i}", …), each with its params."""
    root: list[tuple[str, torch.Tensor]] = [("wte.weight", model.wte.weight), ("wpe.weight", model.wpe.weight),
            ("ln_f.weight", model.ln_f.weight), ("ln_f.bias", model.ln_f.bias)]
    if model.lm_head is not None:
        root.append(("lm_head", model.lm_head))
    units: list[tuple[str, list[tuple[str, torch.Tensor]]]] = [("root", root)]
    for i, block in enumerate(model.blocks):
        units.append((f"block{i}", list(block.named_parameters())))
    return units
