"""Activation checkpointing of one transformer block: full (keep the block's input, rerun its forward in the
backward) or selective (``Strategy.checkpoint_policy = "selective"``).

Selective is torchtitan's per-op policy (``selective_ac_option = "op"``, ``torchtitan/parallelisms/
parallelize_llama.py``: "Saves output of all compute ops, except every second mm"), through torch's own
selective-checkpoint contexts (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs
of the attention kernel and of the first, third, ... matmul of the block's forward are kept, every other op runs
again when the backward needs it. A linear with a bias runs as ``addmm`` (GPT's blocks) and counts as a matmul,
as ``mm`` does; torchtitan's Llama has no biases. The cost model charges the same split
(``costmodel.traffic.kept_matmuls``, ``recomputed_matmul_flops``; ``costmodel.memory``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

aten = torch.ops.aten
MATMULS = frozenset({aten.mm.default, aten.addmm.default})
ATTENTION = frozenset(op for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                      "_scaled_dot_product_cudnn_attention",
                                      "_scaled_dot_product_flash_attention_for_cpu")
                      if (op := getattr(getattr(aten, name, None), "default", None)) is not None)
"""SDPA's fused kernels (CUDA's flash, memory-efficient and cuDNN ones, the CPU flash kernel)."""


def selective_policy(on_keep: Callable[[Any], None] | None = None) -> Callable[..., CheckpointPolicy]:
    """A policy for one block's forward: keep the attention's outputs and every second matmul's (the first,
    third, ...); recompute the rest. ``on_keep`` is called with each kept output (the engine books its bytes)."""
    matmuls = [0]

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in MATMULS:
            matmuls[0] += 1
        keep = func in ATTENTION or (func in MATMULS and matmuls[0] % 2 == 1)
        if keep and on_keep is not None:
            on_keep(ctx.op_output)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _context(policy: str, on_keep: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """The checkpoint's keyword arguments for ``policy`` (``spec.CHECKPOINT_POLICIES``): none for full, the
    selective policy's contexts for selective."""
    if policy == "full":
        return {}
    if policy != "selective":
        raise ValueError(f"checkpoint policy must be 'full' or 'selective', not {policy!r}")
    return {"context_fn": lambda: create_selective_checkpoint_contexts(selective_policy(on_keep))}


def run_checkpointed(block: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, policy: str,
                     on_keep: Callable[[Any], None] | None = None) -> torch.Tensor:
    """``block(x)`` under activation checkpointing with ``policy`` (``spec.CHECKPOINT_POLICIES``)."""
    return checkpoint(block, x, use_reentrant=False, **_context(policy, on_keep))


def wrap_blocks(blocks: torch.nn.ModuleList, strategy: Any) -> None:
    """Wrap the modules of ``blocks`` the ``strategy`` checkpoints (``Strategy.checkpointed``) in torch's checkpoint
    wrapper (non-reentrant) with its policy: how a peer (FSDP2, DDP, DeepSpeed) built from the engine's model
    checkpoints as the engine does, and as the FSDP2 export's snippet writes it (``checkpoint_wrapper(block,
    context_fn=...)``)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(blocks):
        if strategy.checkpointed(i):
            blocks[i] = checkpoint_wrapper(block, **_context(strategy.checkpoint_policy))
