"""The last stage of ``predict``'s pipeline: the run.json the trainer would write (``core.records.Prediction``).

The step's seconds (``pipeline.StepTime``) become the trainer's figures (tokens per second, TFLOPS per rank), beside
the bytes per level and the elements quantized (``tally.StepBytes``) and the memory whether it fits beside the
runtime's reserve (``memory.runtime_reserve``; where not, why: ``memory.overflow``); beside them what only a prediction
says: where the seconds go (``breakdown``), which calibration it was made with and the error band that calibration
carries (``error.error_band``).
"""

from __future__ import annotations

from zerotune.core.records import DeepSpeedStep, MemoryBytes, MemoryReserve, Prediction
from zerotune.costmodel.compute import Compute
from zerotune.costmodel.error import error_band
from zerotune.costmodel.memory import GIB, overflow
from zerotune.costmodel.pipeline import StepTime
from zerotune.costmodel.schedule import Setup
from zerotune.costmodel.tally import StepBytes


def assemble(setup: Setup, moved: StepBytes, step: StepTime, compute: Compute, memory: MemoryBytes,
             deepspeed: DeepSpeedStep | None, reserve: MemoryReserve) -> Prediction:
    """The prediction of ``setup`` from its stages' outputs: the trainer's run.json fields, then the model's own. It
    fits where ``memory``'s peak is within the device's memory less ``reserve`` (``memory.runtime_reserve``)."""
    cluster, calib, accum = setup.cluster, setup.calib, setup.accum
    world, step_s = cluster.world_size, step.step_s
    capacity = int(cluster.device_memory_gib * GIB) - reserve["total_bytes"]
    feasible = memory["peak"] <= capacity
    global_tokens = world * setup.tokens * accum
    out: Prediction = {
        "status": "predicted", "world_size": world, "step_time_s": step_s,
        "tokens_per_s": global_tokens / step_s,
        "tflops_per_rank": setup.flops_per_token * global_tokens / world / step_s / 1e12,
        "bytes_per_level": moved.volume, "quantization": {"elements": moved.quant_elements},
        "memory_bytes": memory, "feasible": feasible, "headroom_bytes": capacity - memory["peak"],
        "memory_reserve": reserve,
        "grad_accum_steps": accum, "global_batch": world * setup.strategy.micro_batch_size * accum,
        "calibration": calib.name, "error_band": error_band(calib, world, cluster.device),
        "breakdown": {"compute_s": accum * step.compute_s, "comm_s": step.comm_s,
                      "exposed_comm_s": max(0.0, step.micros_s - accum * step.compute_s - step.slowdown_s),
                      "overlap_slowdown_s": step.slowdown_s, "boundary_s": step.boundary_s,
                      "optimizer_s": step.optimizer_s, "overhead_s": calib.step_overhead_s,
                      "host_wait_s": accum * compute.host_wait_s, "memory_bound_s": accum * compute.memory_bound_s,
                      "attention_s": accum * compute.attention_s,
                      "attention_of_peak": setup.attention or calib.compute_efficiency},
    }
    if deepspeed is not None:
        out["deepspeed"] = deepspeed
    if not feasible:
        out["overflow"] = overflow(memory, cluster.device_memory_gib, reserve["total_bytes"])
    return out
