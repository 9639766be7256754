"""Bytes per token of the memory-bound kernels of nanotron's Llama block, counted off its own code on one CPU rank.

    git clone https://github.com/huggingface/nanotron && git -C nanotron checkout 67c5ebb
    pip install dacite datasets     # nanotron's config package imports them
    python bench/nanotron_kernels.py --nanotron nanotron/src

The run behind ``bench/published/hf_playbook.toml`` (the Ultra-Scale Playbook's sweep) ran nanotron's branch
nouamane/bench2 at 67c5ebb. This script builds that commit's ``LlamaDecoderLayer`` (a tensor-parallel group of one
gloo rank) in bf16 and runs a forward and a backward under a byte counter. Every aten kernel reads each input once
and writes each output once, in-place ones included; views move nothing; matmuls are compute. flash-attn is not
imported. Its kernels are stood in by autograd Functions that compute with the counter off and book one kernel
each, as its Triton and CUDA kernels run:

- ``layer_norm_fn`` with ``is_rms_norm``: x and the weight in, y and the fp32 rstd out; backward dy, x, the weight
  and rstd in, dx out (the weight's gradient is per-block partial sums: per parameter, not per token);
- the rotary embedding in place on q and k;
- the attention as compute (the model charges it at its kernel's rate).

Per token = (bytes at 3 sequences - bytes at 1) / (2 x seq), so per-parameter bytes cancel. The script prints each
shape's count beside ``traffic.nanotron_block_bytes``, which is written from these counts;
``bench/data/nanotron-kernels/report.txt`` keeps them.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerotune.core.spec import ModelSpec  # noqa: E402
from zerotune.costmodel.traffic import nanotron_block_bytes, traffic  # noqa: E402

COMPUTE = {"mm", "addmm", "bmm", "baddbmm"}
SHAPES = ((2048, 32, 32, 8192), (3072, 32, 32, 8192), (2048, 32, 32, 4096), (2048, 32, 8, 8192), (2048, 32, 16, 8192))
"""(hidden, heads, key/value heads, SwiGLU width): the Playbook's 1.34B block, then each width moved alone."""
SEQ = 64


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class KernelBytes(TorchDispatchMode):
    """Bytes each kernel reads and writes, by kernel name (``book`` adds the stood-in fused kernels), by the rules of
    ``tests/costmodel/test_traffic.py``'s counter for the kernels this block runs (it has no index or embedding
    kernels): every input once, every output once; an in-place kernel reads its inputs (``copy_`` its source) and
    writes its output; views move nothing."""

    active: KernelBytes | None = None

    def __init__(self) -> None:
        super().__init__()
        self.by_op: collections.Counter[str] = collections.Counter()

    def __enter__(self) -> KernelBytes:
        KernelBytes.active = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        KernelBytes.active = None
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in COMPUTE:
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        if name.endswith("_") or (kwargs or {}).get("out") is not None:  # in place
            reads = [a for a in tree_flatten(args[1:] if name == "copy_" else args)[0] if isinstance(a, torch.Tensor)]
            self.by_op[name] += _bytes(reads) + _bytes(outs)
            return out
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if outs and all(o.untyped_storage().data_ptr() in storages for o in outs):
            return out  # a view
        self.by_op[name] += _bytes(ins) + _bytes(outs)
        return out


def book(name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """One fused kernel: its inputs read once, its outputs written once."""
    if KernelBytes.active is not None:
        KernelBytes.active.by_op[name] += _bytes(ins) + _bytes(outs)


class RMSNorm(torch.autograd.Function):
    """flash-attn's ``layer_norm_fn(..., is_rms_norm=True)``: one kernel each way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        with _disable_current_modes():
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            y = (x.float() * rstd).to(x.dtype) * weight
        ctx.save_for_backward(x, weight, rstd)
        book("rmsnorm_fwd", [x, weight], [y, rstd])
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        with _disable_current_modes():
            n, g = x.float() * rstd, dy.float() * weight.float()
            dx = (rstd * (g - n * (g * n).mean(-1, keepdim=True))).to(x.dtype)
            dw = (dy.float() * n).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        book("rmsnorm_bwd", [dy, x, weight, rstd], [dx])
        return dx, dw, None


def layer_norm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: Any = None,
                  eps: float = 1e-6, is_rms_norm: bool = True, **_: Any) -> torch.Tensor:
    if residual is not None or bias is not None or not is_rms_norm:
        raise ValueError(f"layer_norm_fn(residual={residual is not None}, bias={bias is not None}, "
                         f"is_rms_norm={is_rms_norm}): this stand-in is the RMS norm without residual or bias, as "
                         f"nanotron's Llama calls it")
    return RMSNorm.apply(x, weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = cos.shape[-1]
    x1, x2 = x[..., :d], x[..., d:2 * d]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, x[..., 2 * d:]], -1)


class Rotary(torch.autograd.Function):
    """flash-attn's rotary embedding on q and the packed kv: in place on q and k (v untouched)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with _disable_current_modes():
            q_out, k_out = _rotate(q, cos[:, None], sin[:, None]), _rotate(kv[:, :, 0], cos[:, None], sin[:, None])
            kv_out = kv.clone()
            kv_out[:, :, 0] = k_out
        ctx.save_for_backward(cos, sin)
        book("rotary_fwd", [q, kv[:, :, 0]], [q_out, k_out])
        return q_out, kv_out

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        with _disable_current_modes():
            dq_out, dk = _rotate(dq, cos[:, None], -sin[:, None]), _rotate(dkv[:, :, 0], cos[:, None], -sin[:, None])
            dkv_out = dkv.clone()
            dkv_out[:, :, 0] = dk
        book("rotary_bwd", [dq, dkv[:, :, 0]], [dq_out, dk])
        return dq_out, dkv_out, None, None


class RotaryEmbedding(torch.nn.Module):
    """``flash_attn.layers.rotary.RotaryEmbedding`` as nanotron calls it: ``(q, kv=...)``."""

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False, **_: Any) -> None:
        super().__init__()
        self.dim, self.base = dim, base

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2).float() / self.dim))
        freqs = torch.outer(torch.arange(q.shape[1]).float(), inv)
        return Rotary.apply(q, kv, freqs.cos().to(q.dtype), freqs.sin().to(q.dtype))


class Attention(torch.autograd.Function):
    """``flash_attn_varlen_func``: compute, outside the count."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        with _disable_current_modes():
            heads = q.shape[1]
            qq, kk, vv = (t.view(batch, seq, t.shape[1], -1).transpose(1, 2).float() for t in (q, k, v))
            kk, vv = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (kk, vv))
            out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            out = out.transpose(1, 2).reshape(batch * seq, heads, -1).to(q.dtype)
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        with _disable_current_modes():
            dq, dk, dv = (torch.zeros_like(t) for t in ctx.saved_tensors)
        return dq, dk, dv, None, None


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           **_: Any) -> torch.Tensor:
    return Attention.apply(q, k, v, cu_seqlens_q.numel() - 1, max_seqlen_q)


def stand_in_flash_attn() -> None:
    """flash-attn's modules as nanotron imports them, holding the stand-ins above."""
    names = ("flash_attn", "flash_attn.bert_padding", "flash_attn.flash_attn_interface", "flash_attn.ops",
             "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm", "flash_attn.layers",
             "flash_attn.layers.rotary")
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    for fn in ("pad_input", "unpad_input", "index_first_axis"):
        setattr(sys.modules["flash_attn.bert_padding"], fn, None)
    interface = sys.modules["flash_attn.flash_attn_interface"]
    interface.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    interface.flash_attn_with_kvcache = interface.flash_attn_func = None  # type: ignore[attr-defined]
    sys.modules["flash_attn.ops.triton.layer_norm"].layer_norm_fn = layer_norm_fn  # type: ignore[attr-defined]
    sys.modules["flash_attn.layers.rotary"].RotaryEmbedding = RotaryEmbedding  # type: ignore[attr-defined]


def count(hidden: int, heads: int, kv_heads: int, ffn: int, seq: int = SEQ) -> tuple[float, float, dict[str, float]]:
    """Bytes per token of one block's forward and backward, and by kernel (both passes)."""
    from nanotron.config import LlamaConfig, ParallelismArgs
    from nanotron.models import llama

    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         intermediate_size=ffn, num_hidden_layers=1, vocab_size=128, max_position_embeddings=seq,
                         rope_interleaved=False)
    empty = torch.empty  # its unused eager rotary tables are made on "cuda": here on the CPU
    torch.empty = lambda *a, **k: empty(*a, **({**k, "device": "cpu"} if k.get("device") == "cuda" else k))
    try:
        layer = llama.LlamaDecoderLayer(config, ParallelismArgs(dp=1, pp=1, tp=1), dist.new_group([0]), layer_idx=0)
    finally:
        torch.empty = empty
    layer = layer.to(torch.bfloat16)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    moved = {}
    for batch in (1, 3):
        for p in layer.parameters():
            p.grad = None
        x = torch.randn(seq, batch, hidden, dtype=torch.bfloat16, requires_grad=True)
        grad, mask = torch.ones_like(x), torch.ones(batch, seq, dtype=torch.bool)
        with KernelBytes() as counter:
            out = layer(hidden_states=x, sequence_mask=mask)["hidden_states"]
            forward = sum(counter.by_op.values())
            out.backward(grad)
        moved[batch] = (forward, sum(counter.by_op.values()) - forward, dict(counter.by_op))
    tokens = 2 * seq
    by_op = {k: (moved[3][2].get(k, 0) - moved[1][2].get(k, 0)) / tokens for k in moved[3][2]}
    return (moved[3][0] - moved[1][0]) / tokens, (moved[3][1] - moved[1][1]) / tokens, by_op


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanotron", type=Path, required=True, help="nanotron's src directory at 67c5ebb")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.nanotron))
    stand_in_flash_attn()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29611"), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    print("hidden heads kv  ffn    forward  backward   formula (traffic.nanotron_block_bytes)")
    for hidden, heads, kv, ffn in SHAPES:
        forward, backward, by_op = count(hidden, heads, kv, ffn)
        spec = ModelSpec("nanotron", layers=1, hidden=hidden, heads=heads, kv_heads=kv, ffn_hidden=ffn, vocab=128,
                         seq_len=SEQ, arch="llama")
        print(f"{hidden:6d} {heads:5d} {kv:2d} {ffn:5d} {forward:9.0f} {backward:9.0f}   "
              + " ".join(str(n) for n in nanotron_block_bytes(spec, 2)))
        if (hidden, heads, kv, ffn) == SHAPES[0]:
            first, eager = by_op, traffic(spec, 2)
    print(f"\nBy kernel at {SHAPES[0]} (bytes / 2h a token): " + ", ".join(
        f"{k} {v / (2 * SHAPES[0][0]):.0f}" for k, v in sorted(first.items(), key=lambda kv: -kv[1]) if v))
    print(f"The eager Hugging Face block at that shape (kernels = \"eager\"): {eager.block_fwd} and {eager.block_bwd}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
