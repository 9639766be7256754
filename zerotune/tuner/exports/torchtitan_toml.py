"""The torchtitan export: the ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]`` settings of a
torchtitan job, as a TOML file and as the command-line overrides torchtitan's ``ConfigManager`` takes.

Key names and values from torchtitan 0.3.0 (``torchtitan/config/configs.py``: ``ParallelismConfig``,
``TrainingConfig``; ``torchtitan/distributed/activation_checkpoint.py``: ``ActivationCheckpointingConfig``):

- ``parallelism.data_parallel_replicate_degree`` / ``data_parallel_shard_degree``: the FSDP2 export's mesh
  (``replicate``, ``shard``): HSDP when both are above 1.
- ``parallelism.fsdp_reshard_after_forward``: ``"always"`` (ZeRO-3), ``"never"`` (P kept gathered until backward,
  ZeRO-2-like); torchtitan has no partial reshard to a group of g ranks (``fully_shard``'s int, hpZ), so such a
  strategy gets ``"always"`` and a note.
- ``training.local_batch_size`` (the micro-batch per rank), ``training.global_batch_size`` (torchtitan derives the
  accumulation steps from it: ``trainer.py``), ``training.max_norm`` (the clipping zerotune's trials used),
  ``training.mixed_precision_param`` (``bfloat16`` or ``float32``: no float16) and
  ``training.mixed_precision_reduce`` (``float32`` only).
- activation checkpointing: ``mode`` ``full`` / ``selective`` / ``none`` (selective with ``selective_ac_option = "op"``,
  the per-op policy: torchtitan up to 0.2 read a number there as "every n-th block", and defaulted to "2"; 0.3.0's
  selective is per-op only). torchtitan 0.3.0 selects it as a tyro
  subcommand (``activation_checkpoint:full``); the TOML keeps the ``[activation_checkpoint] mode`` key of the
  TOML files that torchtitan up to 0.2 loaded with ``--job.config_file`` (0.3.0 dropped TOML files: its
  ``ConfigManager`` reads a ``--module``/``--config`` Python config and these overrides).
"""

from __future__ import annotations

import json
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.trainer.train import GRAD_CLIP
from zerotune.tuner.exports.common import DTYPES, _prepare
from zerotune.tuner.exports.fsdp import fsdp_config

_PARAM_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def toml_text(sections: dict[str, dict[str, Any]], header: list[str] | None = None) -> str:
    """``sections`` as TOML (one table each; scalar values only)."""
    lines = [f"# {line}" for line in header or []]
    for name, values in sections.items():
        lines += ["", f"[{name}]"] + [f"{key} = {_toml_value(v)}" for key, v in values.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def torchtitan_config(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, *,
                      global_batch: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """torchtitan settings for ``strategy``.

    Returns ``sections`` (``parallelism``, ``training``, ``activation_checkpoint``: key → value), ``toml`` (the
    same as a TOML file), ``args`` (the overrides torchtitan 0.3's ``ConfigManager.parse_args`` takes after
    ``--module``/``--config``) and ``notes`` (what torchtitan runs differently from the strategy).

    Raises:
        SpecError (a ValueError): a dtype other than bf16 / fp16 / fp32, a bad global batch, a strategy invalid for
            the cluster.
    """
    s, gb, _ = _prepare(cluster, strategy, global_batch, dtype, DTYPES, "torchtitan")
    fsdp = fsdp_config(model, cluster, s, global_batch=gb, dtype=dtype)
    notes: list[str] = []
    shape = fsdp["mesh_shape"]
    replicate, shard = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    reshard = fsdp["reshard_after_forward"]
    if reshard is True:
        policy = "always"
    elif reshard is False:
        policy = "never"
    else:
        policy = "always"
        notes.append(f"torchtitan's fsdp_reshard_after_forward has no partial reshard (fully_shard's "
                     f"reshard_after_forward={reshard}, the strategy's hpZ group): \"always\" reshards to the whole "
                     f"shard dim, so the backward all-gather crosses all {shard} ranks.")
    if s.param_span == 0 and s.optim_span:
        notes.append("P replicated (ZeRO-1/2) has no torchtitan form: FSDP with fsdp_reshard_after_forward "
                     "\"never\" keeps P gathered from forward to backward, and shards it between steps.")
    if dtype == "fp16":
        notes.append("torchtitan trains in bfloat16 or float32 only: mixed_precision_param float32 (the strategy "
                     "was chosen for fp16).")
    if s.grad_bits != 32 and dtype != "fp32":
        notes.append("torchtitan reduces gradients in float32 (mixed_precision_reduce has no other value): twice "
                     "the gradient bytes of the strategy's 16-bit reductions; recommend with "
                     "--grad-reduce-in-fp32 to choose for that.")
    if s.weight_bits < 16 or s.grad_bits < 16:
        notes.append("torchtitan has no quantized communication: the strategy's quantized collectives travel "
                     "unquantized.")
    mode = s.recompute if s.recompute in ("full", "selective") else "none"
    if mode != "none" and s.checkpoint_every > 1:
        notes.append(f"checkpoint_every {s.checkpoint_every}: torchtitan checkpoints every block; the strategy "
                     f"checkpoints every {s.checkpoint_every}th, so torchtitan recomputes more and holds less.")
    sections: dict[str, dict[str, Any]] = {
        "parallelism": {
            "data_parallel_replicate_degree": replicate,
            "data_parallel_shard_degree": shard,
            "fsdp_reshard_after_forward": policy,
        },
        "training": {
            "local_batch_size": s.micro_batch_size,
            "global_batch_size": gb,
            "max_norm": float(GRAD_CLIP),
            "mixed_precision_param": _PARAM_DTYPES.get(dtype, "float32"),
            "mixed_precision_reduce": "float32",
        },
        "activation_checkpoint": {"mode": mode, **({"selective_ac_option": "op"} if mode == "selective" else {})},
    }
    args: list[str] = []
    for section in ("parallelism", "training"):
        for key, value in sections[section].items():
            args += [f"--{section}.{key}", str(value)]
    args.append(f"activation-checkpoint:{mode}")
    header = [f"zerotune: {model.name} on {cluster.name} ({cluster.world_size} ranks)",
              "torchtitan 0.3 reads these as overrides: " + " ".join(args)]
    return {"sections": sections, "toml": toml_text(sections, header), "args": args, "notes": notes}
