"""The ``model`` executor: the cost model only — instant, for clusters this service cannot reach."""

from __future__ import annotations

import threading

from zerotune.costmodel import Calibration, predict
from zerotune.tuner.executors.base import Executor, StepHook, TrialResult, TrialSpec


class ModelExecutor(Executor):
    """Predicts a trial with ``costmodel.predict`` (optionally calibrated); infeasible if it does not fit."""

    name = "model"
    measures = False

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = calibration

    def run(self, spec: TrialSpec, *, stop: threading.Event, on_step: StepHook | None = None) -> TrialResult:
        """One prediction: instant, so ``stop`` and ``on_step`` never come into play."""
        p = predict(spec.model, spec.cluster, spec.strategy, global_batch=spec.global_batch,
                    calibration=self.calibration, memory_reserve_gib=spec.memory_reserve_gib)
        if not p["feasible"]:
            return TrialResult(status="infeasible", metrics=p, reason=p["overflow"]["reason"], executor=self.name)
        return TrialResult(status="complete", metrics=p, executor=self.name)
