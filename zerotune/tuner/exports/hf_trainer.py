"""The Hugging Face Trainer mode of the DeepSpeed export: the config for ``TrainingArguments(deepspeed=...)`` with
``"auto"`` exactly where the Trainer fills the value from its arguments, and the TrainingArguments that make those
values the measured ones.

What TrainingArguments sets (transformers 5.23.0, ``transformers/integrations/deepspeed.py``,
``HfTrainerDeepSpeedConfig.trainer_config_process``): ``train_micro_batch_size_per_gpu`` ←
``per_device_train_batch_size``, ``gradient_accumulation_steps`` ← ``gradient_accumulation_steps``,
``train_batch_size`` ← world x both, ``gradient_clipping`` ← ``max_grad_norm``, ``fp16.enabled`` / ``bf16.enabled``
← ``fp16`` / ``bf16``. A number there that differs from the arguments is a mismatch the Trainer refuses to start
on; ``"auto"`` takes the arguments. Everything else (the ZeRO keys: what was measured) stays a number: the keys
the Trainer would fill from the model's hidden size (``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
``stage3_param_persistence_threshold``) are set, so they stay the measured ones.
"""

from __future__ import annotations

from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.tuner.exports.deepspeed import _deepspeed

AUTO = "auto"


def hf_trainer_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                      global_batch: int | None = None, dtype: str = "bf16",
                      deepspeed_version: str | None = None) -> dict[str, Any]:
    """The HF Trainer's DeepSpeed config for ``strategy`` and the TrainingArguments to run it with.

    Returns ``config`` (the ``ds_config.json`` to pass as ``--deepspeed``), ``training_arguments`` (keyword
    arguments of ``TrainingArguments``: per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm,
    bf16, fp16, gradient_checkpointing) and ``notes`` (the DeepSpeed export's notes, and how to pass them).
    """
    ds, notes = _deepspeed(model, cluster, strategy, global_batch, dtype, deepspeed_version)
    config = dict(ds)
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping"):
        config[key] = AUTO
    for key in ("bf16", "fp16"):
        if key in config:
            config[key] = {**config[key], "enabled": AUTO}
    args = {
        "per_device_train_batch_size": ds["train_micro_batch_size_per_gpu"],
        "gradient_accumulation_steps": ds["gradient_accumulation_steps"],
        "max_grad_norm": ds["gradient_clipping"],
        "bf16": dtype == "bf16",
        "fp16": dtype == "fp16",
        "gradient_checkpointing": "activation_checkpointing" in ds,
    }
    if "activation_checkpointing" in config:
        del config["activation_checkpointing"]  # the Trainer checkpoints through the model (gradient_checkpointing)
    said = ", ".join(f"{k}={v!r}" for k, v in args.items())
    notes = [f"HF Trainer: TrainingArguments({said}, deepspeed=\"ds_config.json\") on {cluster.world_size} ranks: "
             f"{ds['train_batch_size']} sequences per optimizer step, as measured"] + [f"DeepSpeed: {n}" for n in notes]
    return {"config": config, "training_arguments": args, "notes": notes}
