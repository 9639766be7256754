"""The PyTorch FSDP2 export: ``fully_shard`` settings (mesh, ``reshard_after_forward``, mixed precision), notes
and a code snippet that runs as written."""

from __future__ import annotations

from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.trainer.train import GRAD_CLIP
from zerotune.tuner.exports.common import (
    DTYPES,
    _prepare,
    _span_words,
)

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

BLOCK_PATHS = ("model.layers", "layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers", "blocks")
"""Where the snippet looks for the transformer blocks (``get_submodule`` paths from the model): Hugging Face's
``*ForCausalLM`` of Llama, Mistral, Qwen2/3 and OLMo 2 (``model.layers``), their base models (``layers``), GPT-2
(``transformer.h``), GPT-NeoX (``gpt_neox.layers``), OPT (``model.decoder.layers``), zerotune's GPT (``blocks``)."""


def fsdp_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                global_batch: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) settings for ``strategy``.

    From the ``fully_shard`` docs (https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html):
    a 2-D mesh ``(replicate, shard)`` is HSDP — shard inside the ``shard`` dim, all-reduce across
    ``replicate``; a 1-D mesh shards over all ranks. ``reshard_after_forward``: True reshards after
    forward and re-gathers in backward (ZeRO-3); False keeps the unsharded parameters until backward
    (ZeRO-2-like, FSDP1's SHARD_GRAD_OP); an int g, a non-trivial divisor of the shard dim size,
    reshards to groups of g contiguous ranks (``mesh.view(-1, g)`` in torch's
    ``_get_post_forward_mesh_info``) — hpZ's secondary group, as our innermost-first rank layout.

    Mapping: shard = ``span_size(param_span)`` and replicate = world / shard when P, G and OS share
    a span; ``reshard_after_forward`` = ``span_size(secondary_span)`` when hpZ is on (True when that
    group is the whole shard group, False when it is a single rank), else True. FSDP2 shards G and
    OS like P, so when they are sharded wider (``3level-a``) the shard dim is the OS span and the P
    span becomes the ``reshard_after_forward`` group (the DeepSpeed export does the same with hpZ).
    With P replicated (ZeRO-1/2) the shard dim is the OS span with ``reshard_after_forward=False``.

    Returns ``mesh_shape``, ``mesh_dim_names`` (``["shard"]`` when nothing is replicated),
    ``reshard_after_forward``, ``mixed_precision`` (torch dtype names for ``MixedPrecisionPolicy``: gradients
    reduce in float32 when ``grad_bits`` is 32, else in the parameters' dtype),
    ``global_batch``, ``micro_batch_size``, ``grad_accum_steps``, ``activation_checkpointing``, ``checkpoint_policy``
    (None without checkpointing),
    ``grad_clip`` (the global gradient norm zerotune's trials clip to: the snippet's ``clip_gradients(model)``
    before each optimizer step), ``notes`` (what FSDP2 cannot express) and ``code`` (a Python snippet).
    """
    s, gb, accum = _prepare(cluster, strategy, global_batch, dtype, DTYPES, "FSDP2")
    world = cluster.world_size
    notes: list[str] = []
    reshard: bool | int
    if s.param_span > 0:
        if s.grad_span == s.param_span and s.optim_span == s.param_span:
            shard_span, secondary = s.param_span, s.secondary_span
        else:
            shard_span = s.optim_span
            secondary = s.secondary_span if s.secondary_span is not None else s.param_span
            notes.append(f"FSDP2 shards P, G and OS over one mesh dim; the strategy shards P over "
                         f"{_span_words(cluster, s.param_span)}, G over {_span_words(cluster, s.grad_span)} and "
                         f"OS over {_span_words(cluster, s.optim_span)}. The shard dim is the OS span and "
                         f"reshard_after_forward keeps P after forward sharded over "
                         f"{_span_words(cluster, secondary)}; the forward all-gather spans the whole shard dim.")
        shard = cluster.span_size(shard_span)
        if secondary is None:
            reshard = True
        else:
            g = cluster.span_size(secondary)
            if g == 1:
                reshard = False
            elif g >= shard:
                reshard = True
                notes.append(f"the secondary (hpZ) group of {g} ranks is the whole shard group on this cluster; "
                             f"reshard_after_forward=True.")
            else:
                reshard = g
                notes.append(f"reshard_after_forward={g} (hpZ: keep P after forward sharded over {g} ranks) makes "
                             f"each fully_shard call build its own post-forward process group; PyTorch issues "
                             f"#147179, #149029 and #153302 report out-of-memory at scale from those groups. If "
                             f"NCCL memory grows with the number of blocks, use reshard_after_forward=True (the "
                             f"ZeRO-3 form: the backward all-gather then crosses the whole shard dim).")
    else:
        shard_span = s.optim_span
        shard = cluster.span_size(shard_span)
        reshard = False
        if shard_span:
            zero = "ZeRO-1" if s.grad_span == 0 else "ZeRO-2"
            notes.append(f"{zero} (P replicated) has no exact FSDP2 form; the nearest is sharding over "
                         f"{_span_words(cluster, shard_span)} with reshard_after_forward=False (FSDP1's "
                         f"SHARD_GRAD_OP): without accumulation the same bytes (one all-gather, one "
                         f"reduce-scatter), but P is sharded between steps and gathered in every forward.")
            if s.grad_span == 0:
                notes.append("ZeRO-1 exactly: DistributedDataParallel with "
                             "torch.distributed.optim.ZeroRedundancyOptimizer instead of fully_shard.")
            elif s.grad_span < s.optim_span:
                notes.append(f"gradients are sharded over {_span_words(cluster, shard_span)} like the "
                             f"optimizer states, not over {_span_words(cluster, s.grad_span)}.")
        else:
            notes.append("nothing is sharded: a 1-rank shard dim makes fully_shard plain data parallelism "
                         "(DistributedDataParallel does the same).")
    replicate = world // shard
    if s.weight_bits < 16 or s.grad_bits < 16:
        quantized = [f"int{bits} {what}" for what, bits in (("weights", s.weight_bits), ("gradients", s.grad_bits))
                     if bits < 16]
        above = (f" (links from level {s.quantize_above}, {cluster.levels[s.quantize_above - 1].name}, up)"
                 if s.quantize_above > 1 else "")
        notes.append(f"FSDP2 has no quantized communication: the strategy's {' and '.join(quantized)}{above} "
                     f"travel as param_dtype / reduce_dtype.")
    param_dtype = _TORCH_DTYPES[dtype]
    reduce_dtype = "float32" if s.grad_bits == 32 else param_dtype
    mixed = {"param_dtype": param_dtype, "reduce_dtype": reduce_dtype}
    if dtype != "fp32" and s.grad_bits != 32:
        notes.append(f"reduce_dtype={param_dtype}, the strategy's 16-bit gradient reductions (torchtitan's default, "
                     f"float32, moves twice the gradient bytes: tune with grad_bits=32 to keep it).")
    if dtype == "fp16":
        notes.append("fp16 needs loss scaling, which fully_shard does not do; bf16 does not.")
    if replicate == 1:
        mesh_shape, names = [shard], ["shard"]
    else:
        mesh_shape, names = [replicate, shard], ["replicate", "shard"]
    return {
        "mesh_shape": mesh_shape,
        "mesh_dim_names": names,
        "reshard_after_forward": reshard,
        "mixed_precision": mixed,
        "global_batch": gb,
        "micro_batch_size": s.micro_batch_size,
        "grad_accum_steps": accum,
        "activation_checkpointing": s.activation_checkpointing,
        "checkpoint_policy": s.checkpoint_policy if s.activation_checkpointing else None,
        "grad_clip": GRAD_CLIP,
        "notes": notes,
        "checkpoint_every": s.checkpoint_every,
        "code": _fsdp_code(mesh_shape, names, reshard, mixed, s.recompute, s.checkpoint_every),
    }


def _py_tuple(items: list[Any]) -> str:
    """``(48, 8)``, ``("shard",)``: a Python tuple literal with double-quoted strings."""
    parts = [f'"{x}"' if isinstance(x, str) else str(x) for x in items]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _fsdp_code(mesh_shape: list[int], names: list[str], reshard: bool | int, mixed: dict[str, str],
               recompute: str, every: int = 1) -> str:
    """A runnable snippet (under torchrun) applying the settings to ``model``, its blocks found at ``BLOCK_PATHS``,
    and clipping gradients in code (``clip_gradients``); ``recompute``
    (``Strategy.recompute``) wraps each block (each ``every``-th: ``Strategy.checkpoint_every``) in torch's
    checkpoint wrapper, with the selective policy (``trainer.checkpointing``, written out: the snippet needs
    nothing but torch) where it is selective."""
    lines = [
        "import torch",
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
    ]
    if recompute != "none":
        lines.append("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper")
    if recompute == "selective":
        lines += [
            "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts",
            "",
            "MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}",
            "ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention.default,",
            "             torch.ops.aten._scaled_dot_product_efficient_attention.default,",
            "             torch.ops.aten._scaled_dot_product_cudnn_attention.default}",
            "",
            "",
            "def selective():  # keep the attention's and every second matmul's outputs (torchtitan's op policy)",
            "    count = [0]",
            "",
            "    def policy(ctx, func, *args, **kwargs):",
            "        count[0] += func in MATMULS",
            "        keep = func in ATTENTION or (func in MATMULS and count[0] % 2 == 1)",
            "        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE",
            "",
            "    return create_selective_checkpoint_contexts(policy)",
            "",
        ]
    lines += [
        "",
        "",
        "def transformer_blocks(model):",
        "    \"\"\"The ModuleList of transformer blocks of common model classes: Hugging Face's Llama, Mistral,",
        "    Qwen2/3, OLMo 2 (model.model.layers), their base models (model.layers), GPT-2 (model.transformer.h),",
        "    GPT-NeoX (model.gpt_neox.layers), zerotune's and nanoGPT-like models (model.blocks).\"\"\"",
        f"    for path in {BLOCK_PATHS!r}:",
        "        try:",
        "            blocks = model.get_submodule(path)",
        "        except AttributeError:",
        "            continue",
        "        if isinstance(blocks, torch.nn.ModuleList):",
        "            return blocks",
        "    raise ValueError(f\"no transformer blocks at the usual paths in {type(model).__name__}: wrap each of \"",
        "                     \"its blocks in fully_shard by hand\")",
        "",
        "",
        "def clip_gradients(model):",
        "    \"\"\"After backward, before optimizer.step(): the global gradient norm zerotune's trials clip to.\"\"\"",
        f"    return torch.nn.utils.clip_grad_norm_(model.parameters(), {GRAD_CLIP})",
        "",
        "",
        f"mesh = init_device_mesh(\"cuda\", {_py_tuple(mesh_shape)}, mesh_dim_names={_py_tuple(names)})",
        f"mp_policy = MixedPrecisionPolicy(param_dtype=torch.{mixed['param_dtype']}, "
        f"reduce_dtype=torch.{mixed['reduce_dtype']})",
        "blocks = transformer_blocks(model)",
        "for i, block in enumerate(blocks):  # one FSDP unit per transformer block",
    ]
    if recompute == "full":
        wrap = "block = blocks[i] = checkpoint_wrapper(block)  # recompute activations in backward"
        lines += [f"    if (i + 1) % {every} == 0:  # every {every}th block: the others keep their activations",
                  f"        {wrap}"] if every > 1 else [f"    {wrap}"]
    elif recompute == "selective":
        lines += ["    block = blocks[i] = checkpoint_wrapper(block, context_fn=selective)  # recompute the rest"]
    lines += [
        f"    fully_shard(block, mesh=mesh, reshard_after_forward={reshard!r}, mp_policy=mp_policy)",
        "# the root (embeddings, head): its parameters are needed again as soon as backward starts, so resharding",
        "# them after forward would only cost a gather",
        "fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy)",
        "# each step: loss.backward(); clip_gradients(model); optimizer.step(); optimizer.zero_grad()",
    ]
    return "\n".join(lines) + "\n"
