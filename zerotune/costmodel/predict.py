"""``predict``: the run.json the trainer would write for (model, cluster, strategy), without running it.

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
one small all-gather each (``persistent_params``); in the passes it gathers each sub-module, and the root, as often
as its parameter coordinator does (``deepspeed.simulate``): the root a second time at the turn to backward where
its reuse distance does not keep it, where zerotune's engine keeps it (the head's backward waits for it), and a
checkpointed block's sub-modules a third time where the recompute released them beyond that distance. A runner
whose optimizer hands out whole parameters (``Calibration.weight_sync = "broadcast"``: InternEvo) syncs the
updated weights with one broadcast per rank that holds any (``runners.broadcast_sync``) where the boundary would gather
them. The bytes booked per level stay the engine's; only the seconds are the runner's.

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

import functools
from typing import Any, NamedTuple

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import QUANT_BLOCK, wire_elem_bytes
from zerotune.costmodel.coordinator import settings_for, simulate
from zerotune.costmodel.error import error_band
from zerotune.costmodel.memory import GIB, memory_per_rank, overflow
from zerotune.costmodel.pipeline import pipeline
from zerotune.costmodel.profiles import calibration_for
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.runners import (
    all_reduced,
    broadcast_sync,
    by_module,
    copy_seconds,
    deepspeed_step,
    persistent_gathers,
)
from zerotune.costmodel.schedule import Group, Schedule, build_schedule
from zerotune.costmodel.tally import accumulation_steps, step_totals, volume_of
from zerotune.costmodel.timing import Costs, costs_for
from zerotune.costmodel.traffic import pass_seconds


class Seconds(NamedTuple):
    """The seconds of a schedule's collectives as one runner (``Costs.calib``) issues them; the same for every
    strategy that shares the schedule, whatever its micro-batch, prefetch or checkpointing."""

    fwd: dict[int, float]
    """Forward gather by bucket length (the root's included)."""
    bwd: dict[int, float]
    """Backward gather by bucket length."""
    reduce: dict[Group, float]
    """A reduce group's reduction within ``grad_span``."""
    final: dict[Group, float]
    """The same in the step's final micro-step: with the reduction beyond ``grad_span`` where the runner
    queues it in backward (``Calibration.outer_reduce``); ``reduce`` itself where nothing more is queued."""
    boundary: float
    """The step boundary's collectives."""
    passes: dict[tuple, tuple[float, float, float]]
    """``pipeline``'s passes over these collectives, by what else they read (``_pass``): strategies that share the
    schedule and their compute per block share them too."""


def _seconds(sched: Schedule, costs: Costs, model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Seconds:
    """``Seconds`` of ``sched`` on ``costs``, memoized there by schedule (whose key holds the model, the spans
    and the bits that every term reads)."""
    known = costs.seconds.get(sched.key)
    if known is not None:
        return known
    calib, ct = costs.calib, costs.time
    # a runner that reduces a bucket with an all-reduce where the schedule reduce-scatters it (DeepSpeed's stages 1
    # and 2: Calibration.grad_reduce) pays the all-reduce's seconds for the same buffer
    rt = all_reduced(ct) if calib.grad_reduce == "all_reduce" and not s.param_span else ct
    r_of = {g: rt(a) + rt(b) for g, (a, b) in sched.reduce.items()}
    outer_in_backward = calib.outer_reduce == "backward"
    # the final micro-step queues each group's reduction beyond grad_span after its own reduce-scatters
    outer_of = {g: sum(rt(c) for c in cs) for g, cs in sched.outer.items()} if outer_in_backward else {}
    r_final = {g: r + outer_of[g] for g, r in r_of.items()} if any(outer_of.values()) else r_of
    sync = broadcast_sync(costs, model, s) if calib.weight_sync == "broadcast" else None
    boundary_s = sum(k * sum((rt if i < 2 else ct)(c) for i, c in enumerate(sched.boundary[n])
                             if i >= 2 * outer_in_backward and (sync is None or i != 2))
                     for n, k in sched.bucket_counts) + (sync or 0.0)
    if calib.gathers == "module" and s.param_span:  # DeepSpeed ZeRO-3's persistent parameters, once a step
        boundary_s += persistent_gathers(ct, model, cluster, s)
    if len(costs.seconds) > 16_384:  # as many as the schedules kept (``schedule._build``), each with its passes
        costs.seconds.clear()
    known = costs.seconds[sched.key] = Seconds({n: ct(c) for n, c in sched.fwd.items()},
                                               {n: ct(c) for n, c in sched.bwd.items()}, r_of, r_final, boundary_s,
                                               {})
    return known


def _pass(memo: dict[tuple, tuple[float, float, float]] | None, key: tuple, *args: Any) -> tuple[float, float, float]:
    """``pipeline(*args)``, memoized in ``memo`` by ``key`` (None: not memoized), which must hold every argument the
    memo's ``Seconds`` does not fix."""
    if memo is None:
        return pipeline(*args)
    out = memo.get(key)
    if out is None:
        if len(memo) > 4096:
            memo.clear()
        out = memo[key] = pipeline(*args)
    return out


@functools.lru_cache(maxsize=4096)
def _runs_of(lengths: tuple[int, ...], units: tuple[int, ...], group_end: tuple[Group, ...],
             p: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Group, ...], list[int], list[int]]:
    """For the backward pass: bucket lengths, units and group ends in backward order; and for both
    passes of ``pipeline``, the last iteration of each iteration's run of identical inputs (units
    computed, the length gathered ahead, the group reduced). Iterations that issue no gather never
    join a run (their pending window shrinks)."""
    nb = len(lengths)

    def last_of(keys: list[tuple]) -> list[int]:
        out = list(range(nb))
        for i in range(nb - 2, -1, -1):
            if keys[i] == keys[i + 1] and keys[i][-1] is not None:
                out[i] = out[i + 1]
        return out

    r_lengths, r_units, r_groups = lengths[::-1], units[::-1], group_end[::-1]
    fwd = [(units[i], lengths[i + p] if i + p < nb else None) for i in range(nb)]
    bwd = [(r_units[i], r_groups[i], r_lengths[i + p] if i + p < nb else None) for i in range(nb)]
    return r_lengths, r_units, r_groups, last_of(fwd), last_of(bwd)


def predict(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int | None = None,
            global_batch: int | None = None, calibration: Calibration | None = None,
            block: int = QUANT_BLOCK) -> dict[str, Any]:
    """Predicted run.json of (model, cluster, strategy): the same field names as the trainer writes.

    Args:
        elem_bytes: bytes per element of the run's dtype (default: 4 on ``cpu`` clusters, else 2).
        global_batch: sequences per optimizer step, a multiple of world · micro-batch (else
            ``SpecError``). None = one micro-step.
        calibration: efficiencies to use; None = the cluster's own (``presets.calibration_for``).
    """
    calib = calibration or calibration_for(cluster)
    e = elem_bytes or (4 if cluster.device == "cpu" else 2)
    world, mbs = cluster.world_size, s.micro_batch_size
    accum = accumulation_steps(cluster, s, global_batch)
    sched = build_schedule(model, cluster, s)
    costs = costs_for(cluster, calib, e, s.quantize_above, block)
    ct = costs.time
    f_of, b_of, r_of, r_final, boundary_s, passes = _seconds(sched, costs, model, cluster, s)
    memo: dict[tuple, tuple[float, float, float]] | None = passes

    tokens = mbs * model.seq_len
    attention = calib.attention_rate(model.seq_len, model.head_dim)
    rates = (cluster.peak_tflops * 1e12 * calib.compute_efficiency, calib.memory_bytes_per_s)
    kernel = (cluster.peak_tflops * 1e12 * attention, calib.attention_forward_share)
    recompute = "full-early-stop" if s.recompute == "full" and calib.recompute_early_stop else s.recompute
    per_token = pass_seconds(model, e, *rates, recompute, *kernel, calib.loss_kernel, calib.score_passes,
                             calib.block_kernels)
    checkpointed = s.checkpointed_blocks(model.layers) / model.layers
    if 0 < checkpointed < 1:  # every checkpoint_every-th block checkpointed: the mean block
        per_token = pass_seconds(model, e, *rates, "none", *kernel, calib.loss_kernel, calib.score_passes,
                                 calib.block_kernels).blend(
            per_token, checkpointed)
    fwd_block, bwd_block = tokens * per_token.block_fwd, tokens * per_token.block_bwd
    head_fwd, head_bwd = tokens * per_token.head_fwd, tokens * per_token.head_bwd
    # of which the memory-bound kernels (the device's time: a host floor may hide part of it)
    memory_bound_s = tokens * (sched.total_units * per_token.block_memory + per_token.head_memory)
    attention_s = tokens * sched.total_units * per_token.block_attention  # and the attention kernel's
    if calib.copies and calib.memory_bytes_per_s:  # FSDP2's copy-out of each gather, copy-in of each reduction
        copy_fwd, copy_bwd = copy_seconds(sched, costs, wire_elem_bytes(e, s.grad_bits))
        fwd_block += copy_fwd / sched.total_units
        bwd_block += copy_bwd / sched.total_units
        memory_bound_s += copy_fwd + copy_bwd
    # the host floor: a block's forward and backward cannot take less than the host needs to issue
    # them (a third of it per forward pass: the backward is two, a recompute one more). A runner that
    # gathers per sub-module (DeepSpeed) has its ZeRO-3's floor, its hooks on every module and parameter:
    # its stages that keep parameters whole were not measured and are not charged one.
    host_fwd = (calib.host_s_per_layer if calib.gathers != "module" or s.param_span else 0.0) / 3
    host_bwd = host_fwd * (2 + checkpointed)  # selective too: the forward's ops are issued again
    host_wait_s = (max(0.0, host_fwd - fwd_block) + max(0.0, host_bwd - bwd_block)) * sched.total_units
    fwd_block, bwd_block = max(fwd_block, host_fwd), max(bwd_block, host_bwd)
    kappa = calib.overlap_slowdown

    # one micro-step: a FIFO communication queue and a compute stream, as the engine runs them
    p = s.prefetch_buckets
    stage3 = settings_for(model, cluster, s, calib.stage3_settings) if calib.gathers == "module" else None
    root_f, root_b, deepspeed = f_of[sched.root], 0.0, None
    fwd_times = bwd_times = None
    if stage3 is not None:  # DeepSpeed: a gather per sub-module, with no prefetch credited
        p, memo = 0, None  # its gathers are the strategy's own, not the schedule's
        if s.param_span:  # ZeRO-3: each sub-module as often as its coordinator gathers it (deepspeed.simulate)
            ds = simulate(model, stage3, s.activation_checkpointing)
            deepspeed = deepspeed_step(ds, stage3, calib.stage3_settings, e)
            fwd_times, bwd_times = ds.forward, ds.backward
            # the root's parameters (embeddings, final LayerNorm) are released after forward like every other
            # module's and gathered again for the head's backward where the reuse distance does not keep them
            # (counted on DeepSpeed 0.19.8 under the export: every parameter gathered twice a step,
            # tests/tuner/test_exports.py); zerotune's engine keeps the root
            root_f, root_b = root_f * ds.root[0], ct(sched.bwd[sched.root]) * ds.root[1]
        f_of = {**f_of, **by_module(ct, sched.fwd, sched.lengths, sched.units, model, fwd_times)}
        b_of = {**b_of, **by_module(ct, sched.bwd, sched.lengths, sched.units, model, bwd_times)}
    r_lengths, r_units, r_groups, fwd_runs, bwd_runs = _runs_of(sched.lengths, sched.units, sched.group_end, p)
    compute_s = (fwd_block + bwd_block) * sched.total_units + head_fwd + head_bwd

    # the root's gather and kappa are the memo's: the pass reads the compute per block and the prefetch beside them
    t0, comm0, lost_f = _pass(memo, ("forward", fwd_block, p), root_f, root_f, f_of, sched.lengths, fwd_block,
                              sched.units, None, None, p, fwd_runs, kappa)
    head_s = head_fwd + head_bwd
    if kappa and comm0 > t0:
        head_s += kappa * min(comm0 - t0, head_s)
    if root_b:  # the head's backward waits for the root's second gather, issued when the backward starts
        comm0 = max(t0 + head_fwd, comm0) + root_b
        t0 = comm0 + head_s - head_fwd
    else:
        t0 += head_s

    def micro_step(reductions: dict[Group, float]) -> tuple[float, float, float]:
        """(seconds, communication seconds, slow-down seconds) of one micro-step reducing by ``reductions``
        (the forward pass and the head, alike in every micro-step, are timed once, above)."""
        t, comm, lost_b = _pass(memo, ("backward", reductions is r_of, t0, comm0, bwd_block, p), t0, comm0, b_of,
                                r_lengths, bwd_block, r_units, reductions, r_groups, p, bwd_runs, kappa)
        comm = (comm if comm > t else t) + (reductions[sched.root_group] if sched.root_group else 0.0)
        comm_s = (root_f + root_b + sum(k * (f_of[n] + b_of[n]) for n, k in sched.block_counts)
                  + sum(k * reductions[g] for g, k in sched.group_counts))
        overlapped = t if t > comm else comm
        micro_s = calib.overlap * overlapped + (1 - calib.overlap) * (compute_s + comm_s)
        return micro_s, comm_s, calib.overlap * (lost_f + lost_b + head_s - head_fwd - head_bwd)

    # the step's micro-steps: all alike, but for the final one's reductions beyond grad_span
    final = micro_step(r_final)
    rest = micro_step(r_of) if accum > 1 and r_final is not r_of else final
    micros_s, comm_s, slowdown_s = (rest[i] * (accum - 1) + final[i] for i in range(3))
    optimizer_s = sum(n * k for n, k in sched.bucket_counts) / costs.prefix[s.optim_span] / calib.optimizer_elems_per_s
    step_s = micros_s + boundary_s + optimizer_s + calib.step_overhead_s

    memory = memory_per_rank(model, sched, cluster.sizes, s, e, stage3, calib.loss_kernel)
    capacity = int(cluster.device_memory_gib * GIB)
    feasible = memory["peak"] <= capacity
    global_tokens = world * tokens * accum
    out: dict[str, Any] = {
        "status": "predicted", "world_size": world, "step_time_s": step_s,
        "tokens_per_s": global_tokens / step_s,
        "tflops_per_rank": model.flops_per_token() * global_tokens / world / step_s / 1e12,
        "bytes_per_level": volume_of(sched, costs, accum),
        "quantization": {"elements": step_totals(sched, costs, accum)[1]},
        "memory_bytes": memory, "feasible": feasible, "headroom_bytes": capacity - memory["peak"],
        "grad_accum_steps": accum, "global_batch": world * mbs * accum, "calibration": calib.name,
        "error_band": error_band(calib, world, cluster.device),
        "breakdown": {"compute_s": accum * compute_s, "comm_s": comm_s,
                      "exposed_comm_s": max(0.0, micros_s - accum * compute_s - slowdown_s),
                      "overlap_slowdown_s": slowdown_s, "boundary_s": boundary_s,
                      "optimizer_s": optimizer_s, "overhead_s": calib.step_overhead_s,
                      "host_wait_s": accum * host_wait_s, "memory_bound_s": accum * memory_bound_s,
                      "attention_s": accum * attention_s, "attention_of_peak": attention or calib.compute_efficiency},
    }
    if deepspeed is not None:
        out["deepspeed"] = deepspeed
    if not feasible:
        out["overflow"] = overflow(memory, cluster.device_memory_gib)
    return out
