"""The user's own config as the baseline: a DeepSpeed ``ds_config.json``, FSDP settings or a torchtitan TOML read back
into the Strategy it runs, so that an answer can say how much faster than today the recommendation is.

Each reader inverts an export (``tuner.exports``): a key the Strategy cannot express is refused with one
:class:`SpecError` naming the key, its value and why (``baseline.zero_optimization.offload_optimizer``...); a key that
does not change what moves or is held (the optimizer, the scheduler, logging) is passed over. The strategy read is
what the tool *runs*, so an export that had to approximate (``deepspeed_notes``, the FSDP notes) reads back as that
approximation, and exporting it again gives the same config (``tests/tuner/test_baseline.py``).

- DeepSpeed: ``zero_optimization.stage`` 0-3 gives the spans (P, G, OS over the world by stage), ``mics_shard_size``
  the span of that many ranks, ``zero_hpz_partition_size`` hpZ's secondary span, ``zero_quantized_weights`` /
  ``_gradients`` int8 weights / int4 gradients, the buckets (elements x 2 bytes), ``communication_data_type`` fp32
  gradient reductions, the batch keys the micro-batch and global batch, an ``activation_checkpointing`` block full
  checkpointing. ``"auto"`` (the HF Trainer's) buckets take the values the HF Trainer fills in
  (``transformers.integrations.deepspeed``: reduce h², prefetch 0.9 h²); an ``"auto"`` batch takes the request's.
- FSDP: zerotune's own FSDP2 export (``mesh_shape``, ``reshard_after_forward``...), or Accelerate's ``fsdp_config``
  keys (``fsdp_sharding_strategy`` / ``fsdp_reshard_after_forward``, ``fsdp_activation_checkpointing``,
  ``fsdp_auto_wrap_policy``), alone or as an accelerate config's ``fsdp_config`` block. Size-based auto-wrap
  (``SIZE_BASED_WRAP`` with ``fsdp_min_num_params``) makes units that are not the model's blocks; the FSDP runner's
  cost model gathers one block per unit, so such a config is refused by that key rather than timed as something else.
- torchtitan: ``[parallelism]`` ``data_parallel_shard_degree`` / ``data_parallel_replicate_degree`` (-1: the rest of
  the world), ``fsdp_reshard_after_forward``, ``[activation_checkpoint]`` ``mode`` / ``selective_ac_option``,
  ``[training]`` ``local_batch_size`` / ``global_batch_size`` and ``mixed_precision_reduce``; tensor, pipeline,
  context and expert parallelism above 1 are refused.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerotune.core.fields import described
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import build_strategy
from zerotune.errors import SpecError

FORMATS = ("deepspeed", "fsdp", "torchtitan")
"""What a baseline may be, and the runner whose collectives time it (``Baseline.runner``)."""

BYTES = 2
"""Bytes of one element of a DeepSpeed bucket (16-bit; ``costmodel.coordinator.bucket_elements``)."""

_DS_IGNORED = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
               "dump_state", "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
               "fp16", "bf16", "amp", "tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler",
               "checkpoint", "data_types", "seed", "memory_breakdown", "zero_force_ds_cpu_optimizer"}
"""Top-level DeepSpeed keys that change neither what moves nor what is held (precision is the request's dtype)."""
_DS_ZERO_IGNORED = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "round_robin_gradients",
                    "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                    "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
                    "stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save",
                    "elastic_checkpoint", "load_from_fp32_weights", "ignore_unused_parameters",
                    "memory_efficient_linear", "mics_hierarchical_params_gather", "zero_hpz_partition_size",
                    "zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
                    "mics_shard_size", "reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                    "allgather_partitions", "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings"}
"""Keys under ``zero_optimization`` read below or that follow from the strategy (the stage-3 caps the export derives
from the buckets: ``costmodel.coordinator.export_settings``; persistence: only small vectors stay whole either way)."""
_FSDP_KEYS = {"mesh_shape", "mesh_dim_names", "reshard_after_forward", "mixed_precision", "global_batch",
              "micro_batch_size", "grad_accum_steps", "activation_checkpointing", "checkpoint_policy", "grad_clip",
              "notes", "checkpoint_every", "code",
              "fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy",
              "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params", "fsdp_activation_checkpointing",
              "fsdp_offload_params", "fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_state_dict_type",
              "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_use_orig_params",
              "fsdp_cpu_offload", "sharding_strategy"}
_SHARDING = {"FULL_SHARD": ("shard", True), "SHARD_GRAD_OP": ("shard", False), "NO_SHARD": ("none", True),
             "HYBRID_SHARD": ("node", True), "_HYBRID_SHARD_ZERO2": ("node", False),
             "HYBRID_SHARD_ZERO2": ("node", False),
             "1": ("shard", True), "2": ("shard", False), "3": ("none", True), "4": ("node", True),
             "5": ("node", False)}
"""FSDP1 sharding strategies (names or Accelerate's numbers): what is sharded, and whether P is resharded after
forward (``torch.distributed.fsdp.ShardingStrategy``)."""


@dataclass(frozen=True)
class Baseline:
    """What the user runs today: the Strategy, the runner whose collectives it issues, and its global batch."""

    strategy: Strategy
    runner: str
    source: str
    """``deepspeed``, ``fsdp`` or ``torchtitan``: the format it was read from."""
    global_batch: int | None = None
    """Sequences per optimizer step, where the config names it."""


def read_baseline_file(path: str) -> dict[str, Any]:
    """The object in a baseline file: JSON, TOML (torchtitan) or YAML (an accelerate config)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError("baseline", path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml  # pyyaml: uvicorn[standard]'s, installed with the service
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise SpecError("baseline", path, f"is not valid {p.suffix.lstrip('.') or 'JSON'} ({exc})") from None
    except Exception as exc:  # yaml.YAMLError: pyyaml's own
        raise SpecError("baseline", path, f"is not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError("baseline", path, "must hold an object (a DeepSpeed config, FSDP settings or a TOML)")
    return data


def detect(data: dict[str, Any]) -> str:
    """Which format ``data`` is (``FORMATS``), by its keys."""
    if "parallelism" in data or "activation_checkpoint" in data:
        return "torchtitan"
    if "zero_optimization" in data or any(k.startswith("train_") for k in data):
        return "deepspeed"
    if "fsdp_config" in data or set(data) & _FSDP_KEYS:
        return "fsdp"
    raise SpecError("baseline", sorted(data)[:6], "is not a DeepSpeed config (zero_optimization), FSDP settings "
                    "(mesh_shape / fsdp_* keys) or a torchtitan TOML ([parallelism])")


def parse_baseline(data: dict[str, Any], model: ModelSpec, cluster: ClusterSpec,
                   global_batch: int | None = None) -> Baseline:
    """The Strategy ``data`` runs on ``cluster`` (see the module docstring); ``global_batch``: the request's, for
    ``"auto"`` batch keys."""
    kind = detect(data)
    if kind == "deepspeed":
        return _deepspeed(data, model, cluster, global_batch)
    if kind == "torchtitan":
        return _torchtitan(data, cluster)
    return _fsdp(data.get("fsdp_config", data) if isinstance(data.get("fsdp_config"), dict) else data, cluster)


def _span_of(cluster: ClusterSpec, size: int, key: str) -> int:
    """The span of ``size`` ranks (the innermost one with that many); refused when no span has it."""
    for span in range(cluster.num_levels + 1):
        if cluster.span_size(span) == size:
            return span
    sizes = [cluster.span_size(k) for k in range(cluster.num_levels + 1)]
    raise SpecError(f"baseline.{key}", size, f"must be the ranks of one span of {cluster.name} (one of {sizes}): "
                    "groups that cut across a level are not modelled")


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"baseline.{key}", value, f"must be a whole number >= {minimum}")
    return value


def _mb(value: Any, key: str, auto: float) -> float:
    """A DeepSpeed bucket of ``value`` elements as MB of 16-bit values; ``"auto"``: ``auto`` elements."""
    elements = auto if value == "auto" else value
    if isinstance(elements, bool) or not isinstance(elements, int | float) or elements <= 0:
        raise SpecError(f"baseline.{key}", value, "must be a number of elements > 0 or \"auto\"")
    return elements * BYTES / 1e6


def _build(fields: dict[str, Any], cluster: ClusterSpec, where: str) -> Strategy:
    try:
        strategy = build_strategy({**fields, "name": "baseline"}, cluster)
    except SpecError as exc:
        raise SpecError(f"baseline ({where})", exc.value, f"runs {exc.field} {exc.rule}") from None
    for d in described(Strategy):  # the service's bounds: every number it stores and predicts with stays finite
        value = getattr(strategy, d.name)
        if d.about.api_max is not None and isinstance(value, int | float) and value > d.about.api_max:
            raise SpecError(f"baseline ({where})", value, f"runs strategy.{d.name} above {d.about.api_max:g}")
    return strategy


def _deepspeed(cfg: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, request_batch: int | None) -> Baseline:
    for key in cfg:
        if key not in _DS_IGNORED | {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps", "communication_data_type",
                                     "activation_checkpointing"}:
            raise SpecError(f"baseline.{key}", _short(cfg[key]), "is a DeepSpeed key zerotune's strategies do not "
                            "express (pipeline, tensor or sequence parallelism, offload...)")
    zero = cfg.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise SpecError("baseline.zero_optimization", _short(zero), "must be an object")
    for key, value in zero.items():
        if key in ("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params"):
            device = value.get("device", "none") if isinstance(value, dict) else value
            if device not in ("none", None, False):
                raise SpecError(f"baseline.zero_optimization.{key}", _short(value), "offloading to the CPU or NVMe "
                                "is not modelled")
        elif key not in _DS_ZERO_IGNORED:
            raise SpecError(f"baseline.zero_optimization.{key}", _short(value), "is not a key zerotune can map to a "
                            "strategy")
    stage = _int(zero.get("stage", 0), "zero_optimization.stage")
    if stage > 3:
        raise SpecError("baseline.zero_optimization.stage", stage, "must be 0, 1, 2 or 3")
    world = cluster.num_levels
    span = world
    if stage == 3 and zero.get("mics_shard_size", -1) not in (-1, None):
        span = _span_of(cluster, _int(zero["mics_shard_size"], "zero_optimization.mics_shard_size", 1),
                        "zero_optimization.mics_shard_size")
    fields: dict[str, Any] = {"param_span": span if stage == 3 else 0, "grad_span": span if stage >= 2 else 0,
                              "optim_span": span if stage >= 1 else 0}
    h2 = model.hidden * model.hidden
    if stage:  # stage 0 has no ZeRO buckets: the strategy's defaults stand
        fields["reduce_bucket_mb"] = _mb(zero.get("reduce_bucket_size", 5e8), "zero_optimization.reduce_bucket_size",
                                         h2)
    if stage == 3:
        prefetch = _mb(zero.get("stage3_prefetch_bucket_size", 5e7), "zero_optimization.stage3_prefetch_bucket_size",
                       0.9 * h2)
        fields.update(allgather_bucket_mb=prefetch, prefetch_buckets=1)
        hpz = _int(zero.get("zero_hpz_partition_size", 1), "zero_optimization.zero_hpz_partition_size", 1)
        if hpz > 1:
            fields["secondary_span"] = _span_of(cluster, hpz, "zero_optimization.zero_hpz_partition_size")
        if zero.get("zero_quantized_weights"):
            fields["weight_bits"] = 8
        if zero.get("zero_quantized_gradients"):
            fields["grad_bits"] = 4
    elif stage in (1, 2):
        fields["allgather_bucket_mb"] = _mb(zero.get("allgather_bucket_size", 5e8),
                                            "zero_optimization.allgather_bucket_size", 5e8)
    if cfg.get("communication_data_type") in ("fp32", "float32"):
        fields["grad_bits"] = 32
    elif cfg.get("communication_data_type") not in (None, "bf16", "fp16", "bfp16"):
        raise SpecError("baseline.communication_data_type", cfg["communication_data_type"], "must be fp32, bf16 or "
                        "fp16")
    micro = cfg.get("train_micro_batch_size_per_gpu")
    if micro not in (None, "auto"):
        fields["micro_batch_size"] = _int(micro, "train_micro_batch_size_per_gpu", 1)
    batch = cfg.get("train_batch_size")
    if batch in (None, "auto") and micro not in (None, "auto"):
        accum = cfg.get("gradient_accumulation_steps", 1)
        batch = None if accum == "auto" else fields["micro_batch_size"] * _int(accum, "gradient_accumulation_steps",
                                                                               1) * cluster.world_size
    global_batch = request_batch if batch in (None, "auto") else _int(batch, "train_batch_size", 1)
    if "activation_checkpointing" in cfg:
        fields["activation_checkpointing"] = True
    return Baseline(_build(fields, cluster, "DeepSpeed"), "deepspeed", "deepspeed", global_batch)


def _fsdp(cfg: dict[str, Any], cluster: ClusterSpec) -> Baseline:
    for key in cfg:
        if key not in _FSDP_KEYS:
            raise SpecError(f"baseline.{key}", _short(cfg[key]), "is not an FSDP setting zerotune reads")
    for key in ("fsdp_offload_params", "fsdp_cpu_offload"):
        if cfg.get(key) not in (None, False, "false"):
            raise SpecError(f"baseline.{key}", cfg[key], "offloading to the CPU is not modelled")
    wrap = cfg.get("fsdp_auto_wrap_policy")
    if wrap == "SIZE_BASED_WRAP" or (wrap is None and "fsdp_min_num_params" in cfg):
        raise SpecError("baseline.fsdp_min_num_params", cfg.get("fsdp_min_num_params", 100_000_000),
                        "size-based auto-wrap makes FSDP units that are not the model's blocks, which the FSDP "
                        "runner's model (one unit per block) cannot express; wrap by transformer block "
                        "(TRANSFORMER_BASED_WRAP)")
    if wrap not in (None, "TRANSFORMER_BASED_WRAP"):
        raise SpecError("baseline.fsdp_auto_wrap_policy", wrap, "must be TRANSFORMER_BASED_WRAP (one unit per "
                        "block): other units are not modelled")
    world = cluster.world_size
    fields: dict[str, Any] = {}
    if "mesh_shape" in cfg:  # zerotune's own FSDP2 export
        shape = cfg["mesh_shape"]
        if not isinstance(shape, list) or not 1 <= len(shape) <= 2 or any(_int(x, "mesh_shape", 1) < 1 for x in shape):
            raise SpecError("baseline.mesh_shape", _short(shape), "must be [shard] or [replicate, shard]")
        if shape[0] * (shape[1] if len(shape) == 2 else 1) != world:
            raise SpecError("baseline.mesh_shape", shape, f"must hold the world's {world} ranks")
        shard = shape[-1]
        reshard: Any = cfg.get("reshard_after_forward", True)
    else:
        strategy = str(cfg.get("fsdp_sharding_strategy", cfg.get("sharding_strategy", "FULL_SHARD"))).upper()
        resharding = cfg.get("fsdp_reshard_after_forward")
        if isinstance(resharding, str) and resharding.upper() in _SHARDING:  # newer Accelerate writes the strategy
            strategy, resharding = resharding.upper(), None
        if strategy not in _SHARDING:
            raise SpecError("baseline.fsdp_sharding_strategy", strategy, f"must be one of {sorted(_SHARDING)[:5]}")
        what, reshard = _SHARDING[strategy]
        if isinstance(resharding, bool):
            reshard = resharding
        elif resharding not in (None, "true", "false"):
            raise SpecError("baseline.fsdp_reshard_after_forward", resharding, "must be true or false")
        elif resharding is not None:
            reshard = resharding == "true"
        shard = 1 if what == "none" else world if what == "shard" else cluster.span_size(cluster.node_span)
    span = _span_of(cluster, shard, "mesh_shape")
    if span == 0:
        fields.update(param_span=0, grad_span=0, optim_span=0)
    else:
        fields.update(param_span=span, grad_span=span, optim_span=span)
        if reshard is False:
            fields["secondary_span"] = 0  # unsharded parameters kept from forward into backward
        elif reshard is not True:
            fields["secondary_span"] = _span_of(cluster, _int(reshard, "reshard_after_forward", 1),
                                                "reshard_after_forward")
            if fields["secondary_span"] >= span:
                del fields["secondary_span"]
    mixed = cfg.get("mixed_precision") or {}
    if isinstance(mixed, dict) and mixed.get("reduce_dtype") == "float32" and mixed.get("param_dtype") != "float32":
        fields["grad_bits"] = 32
    if "micro_batch_size" in cfg:
        fields["micro_batch_size"] = _int(cfg["micro_batch_size"], "micro_batch_size", 1)
    checkpointing = cfg.get("activation_checkpointing", cfg.get("fsdp_activation_checkpointing", False))
    if checkpointing in (True, "true"):
        fields["activation_checkpointing"] = True
        if cfg.get("checkpoint_policy") == "selective":
            fields["checkpoint_policy"] = "selective"
        if cfg.get("checkpoint_every", 1) != 1:
            fields["checkpoint_every"] = _int(cfg["checkpoint_every"], "checkpoint_every", 1)
    batch = cfg.get("global_batch")
    return Baseline(_build(fields, cluster, "FSDP"), "fsdp", "fsdp",
                    None if batch is None else _int(batch, "global_batch", 1))


def _torchtitan(cfg: dict[str, Any], cluster: ClusterSpec) -> Baseline:
    par = cfg.get("parallelism", {}) or {}
    world = cluster.world_size
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                "expert_parallel_degree"):
        if par.get(key, 1) != 1:
            raise SpecError(f"baseline.parallelism.{key}", par[key], "only data parallelism (FSDP / HSDP) is "
                            "modelled")
    shard = par.get("data_parallel_shard_degree", -1)
    replicate = par.get("data_parallel_replicate_degree", 1)
    if replicate == -1 and shard == -1:
        raise SpecError("baseline.parallelism.data_parallel_replicate_degree", -1, "only one degree may be -1")
    if shard == -1:
        shard = world // _int(replicate, "parallelism.data_parallel_replicate_degree", 1)
    elif replicate == -1:
        replicate = world // _int(shard, "parallelism.data_parallel_shard_degree", 1)
    if _int(shard, "parallelism.data_parallel_shard_degree", 1) * _int(
            replicate, "parallelism.data_parallel_replicate_degree", 1) != world:
        raise SpecError("baseline.parallelism.data_parallel_shard_degree", shard,
                        f"x data_parallel_replicate_degree={replicate} must be the world's {world} ranks")
    span = _span_of(cluster, shard, "parallelism.data_parallel_shard_degree")
    fields: dict[str, Any] = {"param_span": span, "grad_span": span, "optim_span": span}
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if reshard not in ("default", "always", "never"):
        raise SpecError("baseline.parallelism.fsdp_reshard_after_forward", reshard, "must be default, always or "
                        "never")
    if reshard == "never" and span:
        fields["secondary_span"] = 0
    ac = cfg.get("activation_checkpoint", {}) or {}
    mode = ac.get("mode", "selective")
    if mode not in ("none", "full", "selective"):
        raise SpecError("baseline.activation_checkpoint.mode", mode, "must be none, full or selective")
    if mode != "none":
        fields["activation_checkpointing"] = True
        if mode == "selective":
            option = str(ac.get("selective_ac_option", "2"))
            if option == "op":
                fields["checkpoint_policy"] = "selective"
            elif option.isdigit() and int(option) >= 1:
                fields["checkpoint_every"] = int(option)
            else:
                raise SpecError("baseline.activation_checkpoint.selective_ac_option", option, "must be op or a "
                                "whole number >= 1")
    training = cfg.get("training", {}) or {}
    if "local_batch_size" in training:
        fields["micro_batch_size"] = _int(training["local_batch_size"], "training.local_batch_size", 1)
    if training.get("mixed_precision_reduce", "float32") == "float32" and training.get(
            "mixed_precision_param", "bfloat16") != "float32":
        fields["grad_bits"] = 32
    batch = training.get("global_batch_size", -1)
    global_batch = None if batch in (-1, None) else _int(batch, "training.global_batch_size", 1)
    return Baseline(_build(fields, cluster, "torchtitan"), "fsdp", "torchtitan", global_batch)


def _short(value: Any) -> Any:
    """A value small enough to name in an error."""
    text = json.dumps(value, default=str)
    return value if len(text) <= 80 else text[:77] + "..."


def load_baseline(path: str, model: ModelSpec, cluster: ClusterSpec, global_batch: int | None = None) -> Baseline:
    """``--baseline FILE``: the Baseline of a ds_config.json, FSDP settings (JSON or YAML) or a torchtitan TOML."""
    return parse_baseline(read_baseline_file(path), model, cluster, global_batch)
