"""The executor interface: run one trial (a Strategy for a model on a cluster) and report back.

Executors are small classes behind this base (as Optuna's samplers are): ``model`` (the cost model
only), ``local`` (the trainer under torchrun on this machine), ``slurm`` (the same short run
through Slurm). ``run`` never raises for a failing trial: a crash, a timeout or an unhealthy run
comes back as a ``TrialResult`` with ``status="failed"`` and the reason, so only that trial fails.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zerotune.strategies.spec import ClusterSpec, ModelSpec, Strategy

TrialStatus = Literal["complete", "failed", "pruned", "infeasible"]


@dataclass(frozen=True)
class TrialSpec:
    """What to run."""

    model: ModelSpec
    cluster: ClusterSpec
    strategy: Strategy
    workdir: Path
    """A directory of this trial's own (run.json, logs, scripts)."""
    steps: int = 6
    warmup: int = 2
    global_batch: int | None = None
    timeout_s: float = 600.0
    dtype: str = "auto"
    extra_args: tuple[str, ...] = ()
    """More ``strategies.train`` arguments (e.g. ``--lr``)."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the run."""

    def train_args(self, out: Path) -> list[str]:
        """The ``python -m zerotune.strategies.train`` arguments for this trial (inputs from ``write_inputs``)."""
        args = ["--model", str(self.workdir / "model.json"), "--cluster", str(self.workdir / "cluster.json"),
                "--strategy", str(self.workdir / "strategy.json"),
                "--steps", str(self.steps), "--warmup", str(self.warmup), "--dtype", self.dtype, "--out", str(out)]
        if self.global_batch:
            args += ["--global-batch", str(self.global_batch)]
        return args + list(self.extra_args)

    def write_inputs(self) -> None:
        """Write the strategy, model and cluster as JSON files into the workdir."""
        import json

        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "strategy.json").write_text(json.dumps(self.strategy.to_dict(), indent=2))
        (self.workdir / "model.json").write_text(json.dumps(self.model.to_dict(), indent=2))
        (self.workdir / "cluster.json").write_text(json.dumps(self.cluster.to_dict(), indent=2))


@dataclass
class TrialResult:
    """What came back."""

    status: TrialStatus
    metrics: dict[str, Any] | None = None
    """The run.json (measured) or the prediction (model executor)."""
    reason: str | None = None
    """Why a trial failed or is infeasible, in words a user can act on."""
    logs: str = ""
    executor: str = ""
    proxy_model: dict[str, Any] | None = None
    """The scaled-down model actually run, when the requested one does not fit this machine."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Executor-specific facts (e.g. the Slurm job id and state)."""


Heartbeat = Callable[[], None]


class Executor(abc.ABC):
    """Runs trials. Subclasses set ``name`` and implement ``run``."""

    name: str = "base"

    @abc.abstractmethod
    def run(self, spec: TrialSpec, heartbeat: Heartbeat | None = None) -> TrialResult:
        """Run one trial to the end; call ``heartbeat`` at least every few seconds while waiting."""
