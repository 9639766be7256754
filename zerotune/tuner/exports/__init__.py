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
- :func:`validate_deepspeed_config` — the rules DeepSpeed checks only at run time (or never).
- :func:`fsdp_config` — PyTorch FSDP2 ``fully_shard`` settings: mesh shape, ``reshard_after_forward``,
  mixed precision, notes and a code snippet.

The DeepSpeed mapping and its nearest settings are documented in ``zerotune/tuner/exports/deepspeed.py``.
"""

from zerotune.tuner.exports.common import BYTES_PER_16BIT, DTYPES, MICS_REMOVED_IN, MIN_DEEPSPEED
from zerotune.tuner.exports.deepspeed import deepspeed_config, deepspeed_notes, validate_deepspeed_config
from zerotune.tuner.exports.fsdp import fsdp_config
from zerotune.tuner.exports.native import zerotune_config

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
]
