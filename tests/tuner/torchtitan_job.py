"""A torchtitan config for its ``ConfigManager`` (``--module tests.tuner.torchtitan_job --config job``) built from
torchtitan's own config dataclasses: its model registry imports triton, which has no CPU build, so the tests load
the sections zerotune writes (parallelism, training, activation checkpointing) into these, through the same
``ConfigManager.parse_args`` and tyro rules a torchtitan run uses."""

from dataclasses import dataclass, field

from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


@dataclass
class Job:
    hf_assets_path: str = "."
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)


def job() -> Job:
    return Job()
