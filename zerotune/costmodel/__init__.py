"""The analytic model of one training step: bytes, memory and time per rank (pure Python).

- ``schedule``: every collective one step issues, read off the engine's bucket plan — the one list
  that bytes, time and memory all read;
- ``tally``: one step's bytes per level, collectives issued, elements quantized and latency, summed over its
  schedule (exactly what the engine's counter books);
- ``timing``: seconds of one collective (α-β with ring step counts, launch cost and achievable
  bandwidth; one ring per level or one flat ring over the group), ``protocols`` the fastest of the
  collective library's protocols for each ring, tree or chain;
- ``pipeline``: the engine's bucket pipeline (prefetch, queued reductions, compute slow-down
  beside running collectives, exposed first and last buckets);
- ``runners``: the schedule's collectives timed as a runner issues them (all-reduced buckets for DeepSpeed's
  stages 1 and 2, broadcast weight syncs for InternEvo, FSDP2's copies); ``coordinator``: what DeepSpeed's ZeRO-3
  gathers and holds, sub-module by sub-module, by its parameter coordinator's rules;
- ``traffic``: FLOPs and memory-bound bytes per token of the model's kernels (the compute time's two
  parts: matmuls at the device's achievable rate, element-wise kernels and the loss at its HBM rate);
- ``memory``: bytes per rank by category, the accountant's categories;
- ``rates``: ``Calibration``, what one prediction is charged; ``hardware``, ``links``, ``attention`` the
  device, link and attention-kernel profiles, every constant with its hardware-level source; ``profiles`` the
  calibration each cluster preset carries (its source runs' efficiencies solved by ``rebase`` and read from
  ``rebased.json``, so that building one runs no prediction); ``error`` the model's measured error;
- ``predict``: the run.json the trainer would write (``core.records.Prediction``), a pipeline of the above: the
  schedule, its bytes, its collectives' seconds, the compute, the step, the memory, then ``result``.

Every formula is written in its module's docstring.
"""

import math

from zerotune.core.records import StepMetrics
from zerotune.core.spec import ClusterSpec
from zerotune.costmodel.memory import GIB, activation_memory, state_memory
from zerotune.costmodel.predict import predict
from zerotune.costmodel.profiles import calibration_for
from zerotune.costmodel.rates import Calibration, MeasuredError
from zerotune.costmodel.schedule import Schedule, accumulation_steps, build_schedule
from zerotune.costmodel.tally import step_calls, step_latency, step_volume

__all__ = ["GIB", "Calibration", "MeasuredError", "Schedule", "accumulation_steps", "activation_memory",
           "build_schedule", "calibration_for", "clear_caches", "cross_node_bytes", "predict", "scaling_efficiency",
           "state_memory", "step_calls", "step_latency", "step_volume"]


def clear_caches() -> None:
    """Forget every memoized plan, schedule, per-collective cost, step volume, pipeline run, memory and DeepSpeed
    gathered peak (what ``predict`` learns as it runs): the next call starts cold, e.g. to time it."""
    from zerotune.costmodel import coordinator, memory, pipeline, schedule, timing, traffic

    schedule.clear()
    timing.clear()
    traffic.traffic.cache_clear()
    traffic.pass_seconds.cache_clear()
    pipeline.clear()
    memory.clear()
    coordinator.simulate.cache_clear()


def cross_node_bytes(prediction: StepMetrics, cluster: ClusterSpec) -> int:
    """Bytes per rank per step on the outermost level."""
    return sum(prediction["bytes_per_level"].get(cluster.levels[-1].name, {}).values())


def scaling_efficiency(tflops: float, base_tflops: float) -> float:
    return tflops / base_tflops if base_tflops > 0 and math.isfinite(tflops) else float("nan")
