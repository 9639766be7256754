"""Exports of a recommended Strategy: zerotune trainer JSON, a DeepSpeed config and FSDP2 settings.

DESIGN.md §5 "Recommend": the chosen (ModelSpec, ClusterSpec, Strategy) is handed back in three
forms a user can run. Pure Python (no torch, no deepspeed import): the API and the Slurm prologue
client call these without either installed.

- :func:`zerotune_config` — the JSON our own trainer (``trainer.train``) takes, plus the exact
  ``torchrun`` command line for the target cluster.
- :func:`deepspeed_config` — a complete DeepSpeed config dict holding only keys DeepSpeed reads, and
  :func:`deepspeed_notes` — where the Strategy had no exact DeepSpeed equivalent, what was mapped to
  what and why. The notes are kept out of the config on purpose: ``DeepSpeedConfig`` reads known
  top-level keys and silently ignores unknown ones (it rejects only a list of removed ones), so a
  note key would be indistinguishable from a typo, and every key under ``zero_optimization`` is
  checked by a pydantic model with ``extra="forbid"``.
- :func:`validate_deepspeed_config` — the rules DeepSpeed checks only at run time (or never) (``deepspeed_rules.py``).
- :func:`fsdp_config` — PyTorch FSDP2 ``fully_shard`` settings: mesh shape, ``reshard_after_forward``,
  mixed precision, notes and a code snippet.

The DeepSpeed mapping and its nearest settings are documented in ``zerotune/tuner/exports/deepspeed.py``.
- :func:`torchtitan_config` — torchtitan's ``[parallelism]``, ``[training]`` and ``[activation_checkpoint]`` (TOML
  and the overrides its ``ConfigManager`` takes); :func:`accelerate_config` — ``accelerate launch`` YAML with the
  FSDP2 and the DeepSpeed plugin; :func:`hf_trainer_config` — the DeepSpeed config with ``"auto"`` where the HF
  Trainer's TrainingArguments set the value, and those TrainingArguments.
"""

from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.tuner.exports.accelerate_yaml import accelerate_config
from zerotune.tuner.exports.common import BYTES_PER_16BIT, DTYPES, MICS_REMOVED_IN, MIN_DEEPSPEED
from zerotune.tuner.exports.deepspeed import deepspeed_config, deepspeed_notes
from zerotune.tuner.exports.deepspeed_rules import validate_deepspeed_config
from zerotune.tuner.exports.fsdp import fsdp_config
from zerotune.tuner.exports.hf_trainer import hf_trainer_config
from zerotune.tuner.exports.native import zerotune_config
from zerotune.tuner.exports.torchtitan_toml import torchtitan_config

__all__ = [
    "BYTES_PER_16BIT",
    "DTYPES",
    "MICS_REMOVED_IN",
    "MIN_DEEPSPEED",
    "deepspeed_config",
    "deepspeed_notes",
    "validate_deepspeed_config",
    "fsdp_config",
    "zerotune_config",
    "torchtitan_config",
    "accelerate_config",
    "hf_trainer_config",
    "all_exports",
]


def all_exports(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy,
                global_batch: int | None = None) -> dict[str, Any]:
    """The recommendation in every format, as an answer's ``exports`` carries it (the API's ``?format=`` and the
    prologue's ``--format`` name the same keys)."""
    gb = global_batch
    return {"zerotune": zerotune_config(model, cluster, strategy, global_batch=gb),
            "deepspeed": deepspeed_config(model, cluster, strategy, global_batch=gb),
            "deepspeed_notes": deepspeed_notes(model, cluster, strategy, global_batch=gb),
            "fsdp": fsdp_config(model, cluster, strategy, global_batch=gb),
            "torchtitan": torchtitan_config(model, cluster, strategy, global_batch=gb),
            "accelerate": accelerate_config(model, cluster, strategy, global_batch=gb),
            "hf-trainer": hf_trainer_config(model, cluster, strategy, global_batch=gb)}
