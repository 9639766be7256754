"""``predict``: the run.json the trainer would write for (model, cluster, strategy), without running it.

``predict`` is a pipeline, each stage a function of the stages before it, each output a typed value:

1. the question (``schedule.Setup``): the specs, the calibration, the dtype, the micro-steps per step
   (``schedule.accumulation_steps``) and what the specs say of the step;
2. the schedule (``schedule.build_schedule`` → ``Schedule``): every collective one step issues;
3. its bytes (``tally.step_bytes`` → ``StepBytes``): per level and kind, and the elements quantized;
4. the collectives' seconds as the runner issues them (``runners.schedule_seconds`` → ``Seconds``, per schedule),
   each collective timed by ``timing.Costs``;
5. the compute (``compute.compute_seconds`` → ``Compute``), with the runner's copies (``runners.copy_seconds``);
6. the gathers of the strategy's micro-step (``coordinator.gathers_of`` → ``Gathers``): the schedule's, or
   DeepSpeed's sub-module by sub-module, and what DeepSpeed holds;
7. the step (``pipeline.time_step`` → ``StepTime``): the bucket pipeline, the micro-steps and the boundary;
8. the memory (``memory.memory_of`` → ``MemoryBytes``) and the runtime's reserve beside it
   (``memory.runtime_reserve`` → ``MemoryReserve``);
9. the result (``result.assemble`` → ``Prediction``, ``core.records``).

``bench/predict_walk.py`` follows one strategy through it call by call.

One micro-step is the engine's pipeline (``pipeline.pipeline``): the root's gather (exposed: nothing
computes before it), the forward pass with gathers ``prefetch_buckets`` ahead, the head, then the
backward pass last bucket first — its first gather exposed, each reduce group's reduce-scatter
queued after the group's last bucket, the root's reduction exposed at the end. The step is
A micro-steps, then the step-boundary collectives (serial: nothing left to compute), the AdamW
update of the optimizer shard with the passes around it (``hardware.STEP_BYTES_PER_ELEM``), and a
fixed overhead. Under ``Calibration.outer_reduce = "backward"`` the step's final micro-step queues
the gradient reduction beyond ``grad_span`` (reduce-scatter to ``optim_span``, all-reduce across its
replicas) after each reduce group in backward, as zerotune's engine, DeepSpeed's ``overlap_comm`` and
DDP's buckets do on their accumulation boundary; the boundary keeps the gathers of the updated weights.
A runner that gathers per sub-module (DeepSpeed's ZeRO-3) also gathers its persistent parameters there,
one small all-gather each (``runners.persistent_params``); in the passes it gathers each sub-module, and the root, as
often as its parameter coordinator does (``coordinator.simulate``): the root a second time at the turn to backward
where its reuse distance does not keep it, where zerotune's engine keeps it (the head's backward waits for it), and a
checkpointed block's sub-modules a third time where the recompute released them beyond that distance. A runner
whose optimizer hands out whole parameters (``Calibration.weight_sync = "broadcast"``: InternEvo) syncs the
updated weights with one broadcast per rank that holds any (``runners.broadcast_sync``) where the boundary would
gather them. The bytes booked per level stay the engine's; only the seconds are the runner's.

Compute: forward of a block is (2·params + 4·h·T) FLOPs per token (matmuls, and the attention
scores and weighted sum); backward twice that (+ a forward recompute with checkpointing: the whole forward, all but
its last matmul where the checkpoint stops early (``Calibration.recompute_early_stop``), or with
selective checkpointing the matmuls whose outputs were not kept and the memory-bound kernels); the head
2·V·h per token forward (``traffic.block_flops``, ``traffic.head_flops``). Seconds = FLOPs / (peak ·
``compute_efficiency``), the device's achievable fraction of peak on those compute-bound kernels
(``hardware.py``), plus the bytes the memory-bound kernels move (LayerNorms, GELU, adds, the loss
over the vocabulary: ``traffic.traffic``) at ``memory_bytes_per_s`` where the calibration charges them
apart. A block's forward and backward take at least the host's time to issue them
(``host_s_per_layer``).
"""

from __future__ import annotations

from zerotune.core.records import Prediction
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import QUANT_BLOCK
from zerotune.costmodel.compute import compute_seconds
from zerotune.costmodel.coordinator import gathers_of
from zerotune.costmodel.memory import memory_of, runtime_reserve
from zerotune.costmodel.pipeline import time_step
from zerotune.costmodel.profiles import calibration_for
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.result import assemble
from zerotune.costmodel.runners import copy_seconds, schedule_seconds
from zerotune.costmodel.schedule import Setup, accumulation_steps, build_schedule
from zerotune.costmodel.tally import step_bytes
from zerotune.costmodel.timing import costs_for


def predict(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int | None = None,
            global_batch: int | None = None, calibration: Calibration | None = None,
            block: int = QUANT_BLOCK, memory_reserve_gib: float | None = None) -> Prediction:
    """Predicted run.json of (model, cluster, strategy): the same field names as the trainer writes.

    Args:
        elem_bytes: bytes per element of the run's dtype (default: 4 on ``cpu`` clusters, else 2).
        global_batch: sequences per optimizer step, a multiple of world · micro-batch (else
            ``SpecError``). None = one micro-step.
        calibration: efficiencies to use; None = the cluster's own (``profiles.calibration_for``).
        block: elements per quantization block (``volume.QUANT_BLOCK``).
        memory_reserve_gib: GiB per rank kept for the runtime beside the peak (>= 0, under the device's memory);
            None = the computed reserve (``memory.runtime_reserve``).
    """
    calib = calibration or calibration_for(cluster)
    e = elem_bytes or (4 if cluster.device == "cpu" else 2)
    # what the specs say of the step, read once here for every stage
    tokens, recompute = s.micro_batch_size * model.seq_len, s.recompute
    checkpointed, flops_per_token = s.checkpointed_blocks(model.layers) / model.layers, model.flops_per_token()
    attention = calib.attention_rate(model.seq_len, model.head_dim)
    setup = Setup(model, cluster, s, calib, e, accumulation_steps(cluster, s, global_batch), tokens, recompute,
                  checkpointed, flops_per_token, attention)
    sched = build_schedule(model, cluster, s)
    costs = costs_for(cluster, calib, e, s.quantize_above, block)
    moved = step_bytes(sched, costs, setup.accum)
    seconds = schedule_seconds(setup, sched, costs)
    compute = compute_seconds(setup, sched, copy_seconds(setup, sched, costs))
    gathers = gathers_of(setup, sched, costs, seconds)
    step = time_step(setup, sched, costs, seconds, gathers, compute)
    memory = memory_of(setup, sched, gathers.held)
    reserve = runtime_reserve(setup, sched, memory["peak"], memory_reserve_gib)
    return assemble(setup, moved, step, compute, memory, gathers.deepspeed, reserve)
