"""The rules DeepSpeed checks only at run time (or never): :func:`validate_deepspeed_config` checks a config's batch
arithmetic and group sizes against the real world size before any process group exists. The DeepSpeed export
(``zerotune/tuner/exports/deepspeed.py``) builds every config to pass it."""

from __future__ import annotations

from typing import Any

from zerotune.errors import SpecError


def _positive_int(field: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(field, value, "must be a positive integer")
    return value


def validate_deepspeed_config(config: dict[str, Any], world_size: int) -> None:
    """Check what DeepSpeed's parser does not: batch arithmetic against the real world size, and the
    group sizes it only checks (or silently ignores) once process groups exist.

    - ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world``
      (DeepSpeedConfig asserts it only against the live world size).
    - ``mics_shard_size`` (> 0) divides the world and needs stage 3.
    - ``zero_hpz_partition_size`` (> 1) needs stage 3, divides the world (DeepSpeed's
      ``groups._create_zero_param_parallel_group`` asserts it at ``deepspeed.initialize``), is smaller
      than and divides the ZeRO partition group (the world or the MiCS shard) and is not combined
      with MiCS.
    - ``zero_quantized_weights`` / ``zero_quantized_gradients`` need stage 3 (ignored otherwise).
    - ``gradient_clipping``, where given, is a number >= 0.

    Raises:
        SpecError (a ValueError) naming the field, its value and the rule.
    """
    world = _positive_int("world_size", world_size)
    train = _positive_int("train_batch_size", config.get("train_batch_size"))
    micro = _positive_int("train_micro_batch_size_per_gpu", config.get("train_micro_batch_size_per_gpu"))
    accum = _positive_int("gradient_accumulation_steps", config.get("gradient_accumulation_steps"))
    if train != micro * accum * world:
        raise SpecError("train_batch_size", train,
                        f"must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size "
                        f"= {micro} x {accum} x {world} = {micro * accum * world}")
    clip = config.get("gradient_clipping", 0.0)
    if not isinstance(clip, int | float) or isinstance(clip, bool) or not 0 <= clip < float("inf"):
        raise SpecError("gradient_clipping", clip, "must be a number >= 0 (0: no clipping)")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise SpecError("zero_optimization", zero, "must be an object")
    stage = zero.get("stage", 0)
    mics = zero.get("mics_shard_size", -1)
    if isinstance(mics, int) and mics > 0:
        if stage != 3:
            raise SpecError("zero_optimization.mics_shard_size", mics, f"needs stage 3, not stage {stage}")
        if world % mics:
            raise SpecError("zero_optimization.mics_shard_size", mics, f"must divide the world size {world}")
    group = mics if isinstance(mics, int) and mics > 0 else world
    hpz = zero.get("zero_hpz_partition_size", 1)
    field = "zero_optimization.zero_hpz_partition_size"
    if not isinstance(hpz, int) or isinstance(hpz, bool) or hpz < 0:
        raise SpecError(field, hpz, "must be an integer >= 0")
    if hpz > 1:
        if stage != 3:
            raise SpecError(field, hpz, f"takes effect only with stage 3, not stage {stage}")
        if group != world:
            raise SpecError(field, hpz, "cannot be combined with mics_shard_size (MiCS bypasses hpZ)")
        if world % hpz:
            raise SpecError(field, hpz, f"must divide the world size {world}")
        if hpz >= group:
            raise SpecError(field, hpz, f"must be smaller than the ZeRO partition group of {group} ranks")
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if zero.get(key) and stage != 3:
            raise SpecError(f"zero_optimization.{key}", zero[key], f"takes effect only with stage 3, not stage {stage}")
