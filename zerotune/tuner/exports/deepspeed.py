"""The DeepSpeed export: a complete config dict and the notes of what had no exact equivalent (the rules
DeepSpeed checks only at run time: ``deepspeed_rules.py``).

DeepSpeed mapping (``zero_optimization``; key names and types from DeepSpeed's
``deepspeed/runtime/zero/config.py`` ``DeepSpeedZeroConfig``, the config reference
https://www.deepspeed.ai/docs/config-json/ and the ZeRO++ tutorial
https://www.deepspeed.ai/tutorials/zeropp/):

=================================== ==============================================================
DeepSpeed key                        from the Strategy
=================================== ==============================================================
stage                                3 if param_span > 0; 2 if grad_span > 0; 1 if optim_span > 0; else 0
reduce_bucket_size                   reduce_bucket_mb * 1e6 / 2 elements (stages 1-3)
allgather_bucket_size                allgather_bucket_mb * 1e6 / 2 elements (stages 1-2)
stage3_prefetch_bucket_size          allgather bucket elements * prefetch_buckets (stage 3)
stage3_param_persistence_threshold   10 * hidden (Hugging Face Transformers' "auto" value) (stage 3)
stage3_max_live_parameters           the root (tied embedding or untied head, which DeepSpeed holds all
                                     pass) + the larger of a bucket and the largest sub-module + the prefetch
                                     window: what DeepSpeed holds while it runs a sub-module and prefetches
                                     (stage 3; with a 1-rank secondary group, the whole model and the prefetch)
stage3_max_reuse_distance            0: each gathered parameter is released after its use and backward
                                     gathers it again, as the strategy does (stage 3; with a 1-rank secondary
                                     group, 2 x the model's elements: every parameter stays gathered; with
                                     activation checkpointing, 2 x a block's elements: a block's parameters,
                                     gathered again for its recompute, stay gathered into its backward)
overlap_comm, contiguous_gradients   true (stages 1-3)
zero_hpz_partition_size              span_size(secondary_span) — hpZ, ZeRO++ — else 1 (stage 3)
zero_quantized_weights               weight_bits < 16 — qwZ, int8 block quantization (stage 3)
zero_quantized_gradients             grad_bits == 4 — qgZ, int4 hierarchical all-to-all (stage 3)
mics_shard_size                      span_size(optim_span) when P, G, OS are sharded below the world
                                     (MiCS; only for a target DeepSpeed 0.14 - 0.19.6, see below)
mics_hierarchical_params_gather      true only when the MiCS shard spans several nodes
communication_data_type (top level)  "fp32" when grad_bits == 32 and the run is 16-bit (gradient reductions
                                     in fp32; DeepSpeed's ``get_communication_data_type``)
gradient_clipping (top level)        the global gradient norm zerotune's trials clip to (``trainer.train.GRAD_CLIP``,
                                     ``gradient_clipping=`` to change it, 0 = none), always written: DeepSpeed's
                                     default is 0 (no clipping) in older releases and 1.0 in 0.19.8
                                     (``runtime/constants.py`` ``GRADIENT_CLIPPING_DEFAULT``), so a config without
                                     it trains differently by version
=================================== ==============================================================

The two stage-3 keys DeepSpeed would otherwise default to 1e9 elements each decide what it moves and holds:
with ``stage3_max_reuse_distance`` 1e9 it keeps every parameter that is used again within the next 1e9
gathered elements, so the last blocks of the forward stay gathered into the backward (and a model under
about 0.5e9 parameters is gathered once a step, not twice: measured with DeepSpeed 0.19.8 on 4 gloo ranks,
``tests/tuner/test_exports.py``), holding up to 1e9 elements (2 GB in bf16) per rank that the strategy's
memory does not count. The export sets both, so that DeepSpeed gathers and holds what the strategy was
measured and predicted with. Under activation checkpointing DeepSpeed's forward hooks fire again in the recompute,
so with a reuse distance of 0 it gathers each block three times a step (forward, recompute, backward: 2.49 times
gpt-mini's parameters on 4 gloo ranks against the strategy's 1.75); with 2 x a block's elements it keeps what the
recompute gathered for the block's backward, which comes within that distance (a sub-module's backward follows
the recompute and the backward of the sub-modules after it in the block), and gathers each block twice, as the
strategy does (``tests/tuner/test_exports.py``). With hpZ the recompute's gathers are the backward's, inside the
secondary group: since 0.13.2 (#4906, "hpz will be enabled in ... activation checkpointing"; every version the
export accepts) DeepSpeed gathers from a parameter's secondary partition whenever it has one, where 0.10.0 to
0.13.1 chose by the hook (the recompute's forward hooks: the primary partition, across nodes).

The live cap also bounds DeepSpeed's prefetch, and it releases no parameter its prefetch has scanned past a later
use of, so a cap above what a step holds lets it keep the whole model gathered (measured on DeepSpeed 0.19.8, 4
gloo ranks, gpt-mini: 4.23M of its 4.23M partitioned elements held at once with reuse distance 0 and the default
cap, against 1.77M under the export's). The root's parameters (the tied embedding the head reads, or an untied
head) are held from the start of each pass to its end and count against the cap, as does the sub-module running,
so the cap is the root, the larger of a bucket and the largest sub-module, and the prefetch window: a cap of a
bucket and the window alone is below every preset model's root (39M to 525M elements) and leaves DeepSpeed no
prefetch. The cost model books what DeepSpeed holds and gathers under these settings
(``zerotune/costmodel/coordinator.py``, ``export_settings``, ``simulate``) and credits a DeepSpeed run no prefetch.

Bucket sizes count 16-bit elements, as ``zerotune/core/plan.py`` does (2 bytes each whatever the dtype).
``DeepSpeedConfig`` reads the batch keys ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps`` and the precision blocks ``bf16`` / ``fp16`` (``{"enabled": true}``;
neither for fp32). ``activation_checkpointing`` uses the keys of DeepSpeed's
``deepspeed/runtime/activation_checkpointing/config.py``.

DeepSpeed versions: MiCS (``mics_shard_size``, ``mics_hierarchical_params_gather``) exists from
0.9.2 and was removed in 0.19.7, whose ``DeepSpeedConfig`` raises on those keys
(``_REMOVED_ZERO_CONFIG_KEYS``, DeepSpeed issue #8489). The default export therefore targets the
newest DeepSpeed and never writes MiCS keys — it is accepted by every DeepSpeed >= 0.14 — and
``deepspeed_version="0.19.6"`` (or older) opts into MiCS for strategies that shard inside a node.

Nearest settings where DeepSpeed has no equivalent (each one is also written to the notes):

- DeepSpeed shards P, G and OS over one group (the world, or the MiCS shard). When the Strategy
  shards them over different spans (e.g. ``3level-a`` = (1, node, L)), the group is the OS span and
  the narrower P span becomes the hpZ group, so memory stays at or below the Strategy's: the
  forward all-gather then crosses the whole group, the backward one stays inside the P span.
- MiCS + hpZ/qwZ/qgZ: DeepSpeed's ``MiCS_Init`` replaces the parameter all-gather with its own
  (no hpZ, no quantization) and ``MiCS_Optimizer`` reduces across the shard group, so under MiCS
  those three are switched off.
- ``grad_bits`` 8: qgZ is int4 only (``all_to_all_quant_reduce``); the export keeps 16-bit
  gradients rather than quantize harder than the measured strategy. ``weight_bits`` 4: qwZ is int8
  only (``CUDAQuantizer``); the export uses int8 (less lossy, twice the bytes).
- ``quantize_above`` > 1: DeepSpeed quantizes every link of the collective, the fast inner ones too.
- On CPU (``cluster.device == "cpu"``, gloo) the export never asks for what DeepSpeed lacks there: qwZ and qgZ are
  off (its quantizer op has no CPU build: ``deepspeed.initialize`` fails with "This op had not been implemented on
  CPU backend") and so is MiCS (its all-gather coalesces collectives, and gloo raises "Backend gloo does not
  implement startCoalescing" in DeepSpeed <= 0.19.6); the notes say so. A study for the deepspeed runner on CPU
  does not search quantized strategies at all (``tuner.space.runner_rule``).
- Stages 1-2 partition over the whole data-parallel world; a narrower G/OS span is widened.
"""

from __future__ import annotations

import re
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.coordinator import export_settings
from zerotune.errors import SpecError
from zerotune.trainer.train import GRAD_CLIP
from zerotune.tuner.exports.common import (
    DTYPES,
    MICS_REMOVED_IN,
    MIN_DEEPSPEED,
    _elements,
    _prepare,
    _ranks_per_node,
    _span_words,
)
from zerotune.tuner.exports.deepspeed_rules import validate_deepspeed_config


def _parse_version(version: str | None) -> tuple[int, int, int] | None:
    """``"0.19.6"`` (also ``"v0.19.6"``, ``"0.19.6+cu121"``) → (0, 19, 6); None → None (the newest)."""
    if version is None:
        return None
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not match:
        raise SpecError("deepspeed_version", version, "must look like '0.19.6' or be null (the newest)")
    parsed = (int(match[1]), int(match[2]), int(match[3] or 0))
    if parsed < MIN_DEEPSPEED:
        raise SpecError("deepspeed_version", version,
                        f"must be >= {'.'.join(map(str, MIN_DEEPSPEED))} (ZeRO++ keys and the pydantic config)")
    return parsed


def _deepspeed(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, global_batch: int | None, dtype: str,
               deepspeed_version: str | None, gradient_clipping: float = GRAD_CLIP) -> tuple[dict[str, Any], list[str]]:
    """The DeepSpeed config and its notes (see the module docstring for the mapping)."""
    s, gb, accum = _prepare(cluster, strategy, global_batch, dtype, DTYPES, "DeepSpeed")
    version = _parse_version(deepspeed_version)
    mics_available = version is not None and version < MICS_REMOVED_IN
    world = cluster.world_size
    notes: list[str] = []

    stage = 3 if s.param_span > 0 else 2 if s.grad_span > 0 else 1 if s.optim_span > 0 else 0
    zero: dict[str, Any] = {"stage": stage}
    if stage in (1, 2):
        zero.update({
            "allgather_bucket_size": _elements(s.allgather_bucket_mb),
            "reduce_bucket_size": _elements(s.reduce_bucket_mb),
            "overlap_comm": True,
            "contiguous_gradients": True,
        })
        what = "optimizer states" if stage == 1 else "gradients and optimizer states"
        narrower = [(name, span) for name, span in (("gradients", s.grad_span), ("optimizer states", s.optim_span))
                    if span and cluster.span_size(span) < world]  # group sizes: on one node span 1 is the world
        if narrower:
            spans = ", ".join(f"{name} over {_span_words(cluster, span)}" for name, span in narrower)
            notes.append(f"DeepSpeed stage {stage} partitions {what} over the whole data-parallel world "
                         f"({world} ranks); the strategy has {spans}. Memory per rank is lower, and the "
                         f"reduce-scatter / all-gather cross every level.")
    if stage == 3:
        zero.update(_stage3(model, cluster, s, mics_available, notes))
    if stage < 3 and s.grad_bits < 16:
        notes.append(f"grad_bits={s.grad_bits}: DeepSpeed quantizes gradients (qgZ) only in stage 3; "
                     f"stage {stage} reduces gradients in {dtype}.")

    config: dict[str, Any] = {
        "train_batch_size": gb,
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": gradient_clipping,  # checked with the rest below, then written as a float
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True}  # dynamic loss scaling: DeepSpeed's default loss_scale 0
    if s.grad_bits == 32 and dtype != "fp32":
        config["communication_data_type"] = "fp32"
    config["zero_optimization"] = zero
    if s.activation_checkpointing:
        config["activation_checkpointing"] = {
            "partition_activations": False,  # only meaningful with tensor (model) parallelism
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": model.layers,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
        notes.append("activation_checkpointing: DeepSpeed's block only configures "
                     "deepspeed.checkpointing.checkpoint; call it around each transformer block's forward "
                     "(or use the model's own gradient checkpointing) to recompute activations.")
        if s.checkpoint_every > 1:
            notes.append(f"checkpoint_every {s.checkpoint_every}: checkpoint only every {s.checkpoint_every}th "
                         "transformer block's forward (the k-th, 2k-th, ...); the others keep their activations.")
        if s.checkpoint_policy == "selective":
            notes.append("checkpoint_policy selective: DeepSpeed's checkpointing recomputes whole blocks. To run what "
                         "was chosen, wrap each block in torch.utils.checkpoint.checkpoint(block, x, "
                         "use_reentrant=False, context_fn=...) with torch's create_selective_checkpoint_contexts, "
                         "keeping the attention's and every second matmul's outputs (the FSDP2 export's snippet "
                         "writes the policy out); with DeepSpeed's own, each step recomputes more and keeps less.")
    validate_deepspeed_config(config, world)
    config["gradient_clipping"] = float(gradient_clipping)
    return config, notes


def _stage3(model: ModelSpec, cluster: ClusterSpec, s: Strategy, mics_available: bool,
            notes: list[str]) -> dict[str, Any]:
    """The stage-3 keys: partition group (world or MiCS), hpZ, qwZ, qgZ, buckets."""
    world = cluster.world_size
    per_node = _ranks_per_node(cluster)
    group_span = s.optim_span  # DeepSpeed shards P, G and OS together: take the widest (OS) span
    # what DeepSpeed will do depends on group sizes, not span numbers: on one node (dgx-h100:1) span 1
    # is the whole world already, and plain stage 3 is exactly the strategy
    below_world = cluster.span_size(group_span) < world
    cpu = cluster.device == "cpu"
    use_mics = below_world and mics_available and not cpu
    out: dict[str, Any] = {}
    if below_world and mics_available and cpu:
        notes.append(f"MiCS off on CPU: DeepSpeed's MiCS all-gather coalesces its collectives, which gloo does not "
                     f"implement (\"Backend gloo does not implement startCoalescing\", DeepSpeed <= 0.19.6), so "
                     f"stage 3 shards over the whole world ({world} ranks), not over "
                     f"{_span_words(cluster, group_span)}.")
    if use_mics:
        group = cluster.span_size(group_span)
        out["mics_shard_size"] = group
        # DeepSpeed's hierarchical MiCS gather is intra-node then inter-node and asserts that the shard
        # spans more than one node (mics_utils.create_mics_comm_groups); inside a node it stays flat.
        out["mics_hierarchical_params_gather"] = group > per_node and group % per_node == 0
        replicas = world // group
        notes.append(f"MiCS: P, G and OS sharded over {_span_words(cluster, group_span)} and replicated "
                     f"{replicas}x; build the model under deepspeed.zero.MiCS_Init (not deepspeed.zero.Init).")
        if s.param_span < group_span or s.grad_span < group_span:
            notes.append(f"MiCS shards P, G and OS over one group: the strategy's P over "
                         f"{_span_words(cluster, s.param_span)} and G over {_span_words(cluster, s.grad_span)} "
                         f"become {group} ranks (less memory, a wider parameter all-gather).")
        dropped = [what for what, on in (("hpZ (secondary_span)", s.secondary_span is not None),
                                         (f"int{s.weight_bits} weights (qwZ)", s.weight_bits < 16),
                                         (f"int{s.grad_bits} gradients (qgZ)", s.grad_bits < 16)) if on]
        if dropped:
            notes.append(f"{', '.join(dropped)} switched off: DeepSpeed's MiCS replaces the parameter all-gather "
                         f"with its own (no secondary partition, no quantization) and reduces gradients across "
                         f"its shard and replica groups.")
        hpz_span: int | None = None
        quant_weights = quant_grads = False
    else:
        group = world
        if below_world:
            notes.append(f"DeepSpeed stage 3 shards P, G and OS over the whole world ({world} ranks), not over "
                         f"{_span_words(cluster, group_span)} with replication above it: DeepSpeed >= 0.19.7 "
                         f"removed MiCS (pass deepspeed_version <= 0.19.6 to use it). Memory per rank is lower "
                         f"and the parameter all-gather and gradient reduce-scatter cross every level.")
        elif cluster.span_size(s.grad_span) < world:
            notes.append(f"DeepSpeed stage 3 shards gradients like everything else over the world ({world} "
                         f"ranks); the strategy keeps them over {_span_words(cluster, s.grad_span)}.")
        # hpZ: the strategy's secondary span; else, when P is sharded narrower than the ZeRO group, the
        # P span itself, so the backward all-gather stays inside it as in the strategy.
        hpz_span = s.secondary_span
        if cluster.span_size(s.param_span) < group:
            if hpz_span is None:
                hpz_span = s.param_span
            text = (f"P is sharded over {_span_words(cluster, s.param_span)} in the strategy but over all {world} "
                    f"ranks in DeepSpeed stage 3, so the forward all-gather crosses every level")
            if cluster.span_size(hpz_span) > 1:
                text += (f"; zero_hpz_partition_size={cluster.span_size(hpz_span)} keeps a secondary copy over "
                         f"{_span_words(cluster, hpz_span)}, so the backward all-gather stays inside it")
            notes.append(text + ".")
        quant_weights = s.weight_bits < 16
        quant_grads = s.grad_bits == 4
        if cpu and (quant_weights or quant_grads):
            off = " and ".join(w for w, on in (("int8 weights", quant_weights), ("int4 gradients", quant_grads)) if on)
            notes.append(f"qwZ and qgZ off on CPU: DeepSpeed's quantizer has no CPU build (deepspeed.initialize fails "
                         f"with \"This op had not been implemented on CPU backend\"), so the strategy's {off} "
                         f"travel 16-bit: more bytes per step than predicted.")
            quant_weights = quant_grads = False
        if s.weight_bits == 4:
            notes.append("weight_bits=4: DeepSpeed's qwZ quantizes weights to int8 only; zero_quantized_weights "
                         "uses int8 (less lossy, twice the bytes of int4).")
        if s.grad_bits == 8:
            notes.append("grad_bits=8: DeepSpeed's qgZ is int4 only; gradients stay 16-bit "
                         "(zero_quantized_gradients false) rather than being quantized harder than measured.")
        if s.quantized and s.quantize_above > 1:
            inner = ", ".join(lv.name for lv in cluster.levels[:s.quantize_above - 1])
            notes.append(f"quantize_above={s.quantize_above}: DeepSpeed quantizes every link of the collective, "
                         f"including the {inner} links the strategy keeps 16-bit.")
        if quant_grads and world // per_node <= 1:
            notes.append("qgZ: DeepSpeed applies quantized gradient all-to-all only across nodes; on one node it "
                         "falls back to a 16-bit reduce-scatter.")

    hpz = cluster.span_size(hpz_span) if hpz_span is not None else 1
    keep_all = s.secondary_span is not None and hpz_span is not None and hpz == 1
    if keep_all:
        notes.append(f"secondary_span={s.secondary_span} keeps the whole gathered P after forward (a 1-rank "
                     f"secondary group): stage3_max_reuse_distance and stage3_max_live_parameters let DeepSpeed "
                     f"keep every parameter it gathered in forward for backward, which then gathers nothing.")
    elif hpz >= group > 1:
        notes.append(f"the secondary (hpZ) group of {hpz} ranks is as wide as the ZeRO group ({group} ranks) on "
                     f"this cluster, so it saves nothing; zero_hpz_partition_size=1.")
        hpz = 1
    # the cost model books what DeepSpeed holds under these (zerotune/costmodel/coordinator.py)
    held = export_settings(model, s.allgather_bucket_mb, s.prefetch_buckets, s.activation_checkpointing, keep_all)
    out.update({
        "reduce_bucket_size": _elements(s.reduce_bucket_mb),
        **held.config(),
        "overlap_comm": True,
        "contiguous_gradients": True,
        "zero_hpz_partition_size": hpz,
        "zero_quantized_weights": quant_weights,
        "zero_quantized_gradients": quant_grads,
    })
    return out


def deepspeed_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                     global_batch: int | None = None, dtype: str = "bf16",
                     deepspeed_version: str | None = None, gradient_clipping: float = GRAD_CLIP) -> dict[str, Any]:
    """A complete DeepSpeed config for ``strategy``: only keys and values DeepSpeed accepts.

    The mapping table and its sources are in the module docstring; everything that is not an exact
    equivalent is explained by :func:`deepspeed_notes` (same arguments). The result passes
    :func:`validate_deepspeed_config` for the cluster's world size.

    Args:
        global_batch: sequences per optimizer step (``train_batch_size``); default world x
            micro_batch_size, i.e. ``gradient_accumulation_steps`` 1.
        dtype: ``"bf16"`` → ``{"bf16": {"enabled": true}}``, ``"fp16"`` → ``{"fp16": {"enabled": true}}``
            (dynamic loss scaling), ``"fp32"`` → neither.
        deepspeed_version: the DeepSpeed the config is for; None = the newest (no MiCS keys, valid for
            every DeepSpeed >= 0.14). 0.14 - 0.19.6 may use ``mics_shard_size``.
        gradient_clipping: the global gradient norm to clip to (default: what zerotune's trials clip to);
            0 = none. Always written (DeepSpeed's own default changed between releases).

    Raises:
        SpecError (a ValueError) naming the field and value: a bad global batch, dtype, version or clipping, a
        strategy invalid for the cluster, or a config that breaks :func:`validate_deepspeed_config`.
    """
    return _deepspeed(model, cluster, strategy, global_batch, dtype, deepspeed_version, gradient_clipping)[0]


def deepspeed_notes(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                    global_batch: int | None = None, dtype: str = "bf16",
                    deepspeed_version: str | None = None) -> list[str]:
    """Human-readable notes on what :func:`deepspeed_config` could not express exactly ([] if nothing)."""
    return _deepspeed(model, cluster, strategy, global_batch, dtype, deepspeed_version)[1]
