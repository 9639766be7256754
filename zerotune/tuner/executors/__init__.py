"""Executors: how a trial is evaluated (``model`` predicts, ``local`` and ``slurm`` run short trainings)."""

from __future__ import annotations

from typing import Any

from zerotune.core.fields import EXECUTORS as NAMES  # the executors a request may name, one branch each below


def make_executor(name: str, *, calibration: Any = None, partition: str | None = None, emulate: bool = False,
                  slurm_mode: str = "steps", slurm_hold_s: float | None = None) -> Any:
    """The one constructor of executors (the CLI, the worker and the tests use it).

    Args:
        name: ``model``, ``local`` or ``slurm``.
        calibration: the ``Calibration`` the model executor predicts with (None: the cluster's own
            profile, ``costmodel.calibration_for``) — the same one the tuner stores its
            predictions with, so a trial is ranked by the model it is shown with.
        partition: the Slurm partition (``slurm``).
        emulate: run the short runs on an emulated cluster (``local``).
        slurm_mode: ``steps`` (inside an allocation each trial is a job step of it) or ``jobs`` (each trial a batch
            job of its own) (``slurm``); outside an allocation, ``steps`` holds one for the study's trials.
        slurm_hold_s: the time limit of the allocation held for a study (``slurm``, mode ``steps``).
    """
    if name == "model":
        from zerotune.tuner.executors.predicted import ModelExecutor

        return ModelExecutor(calibration)
    if name == "local":
        from zerotune.tuner.executors.local import LocalExecutor

        return LocalExecutor(emulate=emulate)
    if name == "slurm":
        from zerotune.tuner.executors.slurm import SlurmExecutor

        return SlurmExecutor(partition=partition, mode=slurm_mode, hold_time_s=slurm_hold_s)
    raise ValueError(f"executor={name!r}: must be one of {', '.join(NAMES)}")
