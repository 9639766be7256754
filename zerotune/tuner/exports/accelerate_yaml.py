"""The Accelerate export: ``accelerate launch --config_file`` YAML files, one with the FSDP2 plugin and one with the
DeepSpeed plugin (which points at the DeepSpeed export's ``ds_config.json``).

Keys from accelerate 1.15.0 (``accelerate/commands/config/config_args.py`` ``ClusterConfig``, the questions of
``accelerate/commands/config/cluster.py`` that write them): ``distributed_type`` (``FSDP`` / ``DEEPSPEED``),
``num_machines``, ``num_processes`` (all ranks), ``mixed_precision``; ``fsdp_config`` with ``fsdp_version: 2``,
``fsdp_reshard_after_forward`` (FSDP2: a bool), ``fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP`` without a class
list (accelerate then wraps the model's ``_no_split_modules``, its transformer blocks, as zerotune's units) and
``fsdp_activation_checkpointing``; ``parallelism_config`` (``parallelism_config_dp_replicate_size`` /
``_dp_shard_size``) for HSDP; ``deepspeed_config`` with ``deepspeed_config_file`` and ``zero3_init_flag``.
"""

from __future__ import annotations

import json
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.tuner.exports.common import DTYPES, _prepare, _ranks_per_node
from zerotune.tuner.exports.fsdp import fsdp_config

DS_CONFIG_FILE = "ds_config.json"
"""The DeepSpeed plugin's ``deepspeed_config_file``: the DeepSpeed export, written beside the YAML."""


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a double-quoted YAML scalar (JSON strings are YAML)


def yaml_text(config: dict[str, Any], header: list[str] | None = None) -> str:
    """``config`` (scalars and one level of nested mappings) as YAML."""
    lines = [f"# {line}" for line in header or []]
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {_yaml_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def accelerate_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                      global_batch: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """Accelerate config files for ``strategy``.

    Returns ``fsdp`` and ``deepspeed`` (each the config as a dict), ``fsdp_yaml`` and ``deepspeed_yaml`` (the
    files), ``deepspeed_config_file`` (the name the DeepSpeed plugin reads: write the DeepSpeed export there) and
    ``notes``. Accelerate takes the micro-batch from the script's DataLoader and the accumulation steps from
    ``Accelerator(gradient_accumulation_steps=...)``: the notes say which.
    """
    s, gb, accum = _prepare(cluster, strategy, global_batch, dtype, DTYPES, "Accelerate")
    fsdp = fsdp_config(model, cluster, s, global_batch=gb, dtype=dtype)
    per_node = _ranks_per_node(cluster)
    common = {
        "compute_environment": "LOCAL_MACHINE",
        "machine_rank": 0,
        "num_machines": cluster.world_size // per_node,
        "num_processes": cluster.world_size,
        "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(dtype, "no"),
        "main_training_function": "main",
        "rdzv_backend": "static" if cluster.world_size == per_node else "c10d",
        "same_network": True,
        "use_cpu": cluster.device == "cpu",
    }
    notes = [f"the training script sets the batch: a DataLoader of {s.micro_batch_size} sequences per rank and "
             f"Accelerator(gradient_accumulation_steps={accum}) ({gb} sequences per optimizer step), and clips "
             f"with accelerator.clip_grad_norm_(model.parameters(), {fsdp['grad_clip']})."]
    shape = fsdp["mesh_shape"]
    replicate, shard = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    reshard = fsdp["reshard_after_forward"]
    if not isinstance(reshard, bool):
        notes.append(f"FSDP2: accelerate's fsdp_reshard_after_forward is a bool: true reshards to the whole shard "
                     f"dim, not to the strategy's {reshard}-rank hpZ group (fully_shard's int).")
    notes += [f"FSDP2: {n}" for n in fsdp["notes"]]
    fsdp_plugin: dict[str, Any] = {
        **common,
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": reshard is not False,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": s.activation_checkpointing,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": False,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        },
    }
    if replicate > 1:
        fsdp_plugin["parallelism_config"] = {"parallelism_config_dp_replicate_size": replicate,
                                             "parallelism_config_dp_shard_size": shard,
                                             "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 1}
    if s.checkpoint_policy == "selective" and s.activation_checkpointing:
        notes.append("FSDP2: accelerate's fsdp_activation_checkpointing recomputes whole blocks; the strategy's "
                     "selective policy is in the FSDP2 export's snippet.")
    stage3 = s.param_span > 0
    deepspeed_plugin = {
        **common,
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": DS_CONFIG_FILE, "zero3_init_flag": stage3},
    }
    header = [f"zerotune: {model.name} on {cluster.name} ({cluster.world_size} ranks); accelerate launch "
              "--config_file THIS train.py"]
    return {"fsdp": fsdp_plugin, "deepspeed": deepspeed_plugin, "deepspeed_config_file": DS_CONFIG_FILE,
            "fsdp_yaml": yaml_text(fsdp_plugin, header), "deepspeed_yaml": yaml_text(deepspeed_plugin, header),
            "notes": notes}
