"""The executor interface: run one trial (a Strategy for a model on a cluster) and report back.

Executors are small classes behind this base (as Optuna's samplers are): ``model`` (the cost model
only), ``local`` (the trainer under torchrun on this machine), ``slurm`` (the same short run
through Slurm). ``run`` never raises for a failing trial: a crash, a timeout or an unhealthy run
comes back as a ``TrialResult`` with ``status="failed"`` and the reason, so only that trial fails.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zerotune.core.records import TrialMetrics
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy

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
    """More ``trainer.train`` arguments (e.g. ``--lr``)."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables for the run."""
    memory_reserve_gib: float | None = None
    """The request's reserve beside the predicted peak (``core.fields.Options.memory_reserve_gib``): what the
    ``model`` executor predicts fits with."""

    def train_args(self, out: Path) -> list[str]:
        """The ``python -m zerotune.trainer.train`` arguments for this trial (inputs from ``write_inputs``), with
        absolute paths: a runner may start the ranks in another directory (``srun --chdir``)."""
        wd = self.workdir.resolve()
        args = ["--model", str(wd / "model.json"), "--cluster", str(wd / "cluster.json"),
                "--strategy", str(wd / "strategy.json"),
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
    metrics: TrialMetrics | None = None
    """The run.json (measured) or the prediction (model executor)."""
    reason: str | None = None
    """Why a trial failed or is infeasible, in words a user can act on."""
    logs: str = ""
    executor: str = ""
    proxy_model: dict[str, Any] | None = None
    """The scaled-down model actually run, when the requested one does not fit this machine."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Executor-specific facts (e.g. the Slurm job id and state)."""


StepHook = Callable[[int, float], bool]
"""Called with each timed step a run reports (step number, seconds); returning True stops the run (pruned)."""


class Executor(abc.ABC):
    """Runs trials. Subclasses set ``name`` and implement ``run``.

    The caller owns everything around a run: the trial's lease and its heartbeats, pruning decisions,
    the database. An executor only runs the trial and says how it went.
    """

    name: str = "base"
    measures: bool = True
    """Whether a trial runs on hardware (and can fail, time out, be stopped); False for the cost model."""

    @abc.abstractmethod
    def run(self, spec: TrialSpec, *, stop: threading.Event, on_step: StepHook | None = None) -> TrialResult:
        """Run one trial to the end.

        Args:
            spec: what to run.
            stop: set by the caller when the run must end now (the runner is stopping, or its lease on
                the trial was lost): end the run, leave nothing running, and return :meth:`interrupted`.
            on_step: called for every timed step when the executor sees steps as they happen; an
                executor that does not (the cost model, a batch job) never calls it.
        """

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release what the executor holds between trials (the ``slurm`` executor: the allocation it held for the
        study); the study calls it when it ends. The next ``run`` may hold again."""

    def interrupted(self, why: str, **extra: Any) -> TrialResult:
        """The result of a run ended by ``stop``: the caller keeps the trial to be run again."""
        return TrialResult(status="failed", reason=f"interrupted: {why}", executor=self.name,
                           extra={**extra, "interrupted": True})
