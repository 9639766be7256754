"""``predict``: the run.json the trainer would write for (model, cluster, strategy), without running it.

One micro-step is the engine's pipeline (``timing.pipeline``): the root's gather (exposed: nothing
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
updated weights with one broadcast per rank that holds any (``_broadcast_sync``) where the boundary would gather
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
import heapq
from collections import Counter
from typing import Any

from zerotune.errors import SpecError
from zerotune.strategies.costmodel.deepspeed import Stage3Settings, Stage3Step, settings_for, simulate
from zerotune.strategies.costmodel.error import error_band
from zerotune.strategies.costmodel.memory import GIB, memory_per_rank, overflow
from zerotune.strategies.costmodel.presets import calibration_for
from zerotune.strategies.costmodel.rates import Calibration
from zerotune.strategies.costmodel.schedule import Coll, Group, Schedule, build_schedule
from zerotune.strategies.costmodel.timing import Costs, costs_for, pipeline
from zerotune.strategies.costmodel.traffic import pass_seconds
from zerotune.strategies.plan import block_modules, parameter_numels
from zerotune.strategies.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.strategies.volume import QUANT_BLOCK, Volume, wire_elem_bytes


def accumulation_steps(cluster: ClusterSpec, s: Strategy, global_batch: int | None) -> int:
    """Micro-steps per optimizer step: ``global_batch`` / (world · micro-batch), which must be whole
    (``SpecError`` otherwise: a prediction for a rounded batch would be one for another training).

    With no global batch, one micro-step (the batch is world · micro-batch sequences)."""
    per_micro = cluster.world_size * s.micro_batch_size
    if global_batch is None:
        return 1
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise SpecError("global_batch", global_batch, "must be a whole number of sequences >= 1")
    if global_batch % per_micro:
        raise SpecError("global_batch", global_batch,
                        f"must be a multiple of world size x micro_batch_size = {cluster.world_size} x "
                        f"{s.micro_batch_size} = {per_micro} (sequences per micro-step)")
    return global_batch // per_micro


def step_volume(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
                block: int = QUANT_BLOCK) -> Volume:
    """Bytes sent per rank per optimizer step, by level and collective kind."""
    sched = build_schedule(model, cluster, s)
    return _volume(sched, costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block), accum)


def step_calls(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
               block: int = QUANT_BLOCK) -> dict[str, dict[str, int]]:
    """Collectives issued per rank per optimizer step, by level and kind: one for each level a collective of
    the schedule moves bytes on, as the engine issues its primitives (each pays a launch and its hops)."""
    sched = build_schedule(model, cluster, s)
    costs = costs_for(cluster, Calibration(), elem_bytes, s.quantize_above, block)
    out: dict[str, dict[str, int]] = {}
    for c, times in sched.counts(accum).items():
        for (name, kind), _ in costs.flat_volume(c):
            kinds = out.setdefault(name, {})
            kinds[kind] = kinds.get(kind, 0) + times
    return out


def _step_totals(sched: Schedule, costs: Costs, accum: int) -> tuple[Volume, int]:
    """One optimizer step's bytes per rank by level and kind, and its elements block-quantized plus
    dequantized (``Costs.quant_elems`` over the quantized collectives: what run.json's
    ``quantization.elements`` counts), in one pass over the step's collectives, cached per schedule."""
    key = (sched.key, accum)
    known = costs.step_volumes.get(key)
    if known is None:
        flat: dict[tuple[str, str], int] = {}
        quant = 0
        for c, times in sched.counts(accum).items():
            for lk, n in costs.flat_volume(c):
                flat[lk] = flat.get(lk, 0) + n * times
            op, (lo, hi), numel, bits = c
            if bits < 16:
                quant += times * costs.quant_elems(op, lo, hi, numel)
        volume: Volume = {}
        for (name, kind), n in flat.items():
            volume.setdefault(name, {})[kind] = n
        if len(costs.step_volumes) > 100_000:
            costs.step_volumes.clear()
        known = costs.step_volumes[key] = (volume, quant)
    return known


def _volume(sched: Schedule, costs: Costs, accum: int) -> Volume:
    return {name: dict(kinds) for name, kinds in _step_totals(sched, costs, accum)[0].items()}  # callers own it


def step_latency(model: ModelSpec, cluster: ClusterSpec, s: Strategy, calib: Calibration, *, elem_bytes: int,
                 accum: int = 1, block: int = QUANT_BLOCK, all_to_all: bool = False) -> dict[str, float]:
    """Seconds per optimizer step the engine's ring collectives (with ``all_to_all``: its quantized
    all-to-alls) spend on latency (launch and hops), by level (``Costs.ring_latency`` over the step's
    schedule): what a run's measured seconds per level hold beside the time its bytes take on the wire."""
    costs = costs_for(cluster, calib, elem_bytes, s.quantize_above, block)
    out: dict[str, float] = {}
    for c, times in build_schedule(model, cluster, s).counts(accum).items():
        for name, seconds in costs.ring_latency(c, all_to_all):
            out[name] = out.get(name, 0.0) + seconds * times
    return out


def _copy_seconds(sched: Schedule, costs: Costs, reduce_bytes: int) -> tuple[float, float]:
    """Seconds of one micro-step's copies on the compute stream (``Calibration.copies``), forward and backward:
    each all-gather's output read and written once more into the parameters (``costs.e``: the gather's
    16-bit elements), each reduce-scatter's input read from the gradients and written in the reduction's
    dtype (``reduce_bytes``), summed over the buckets and reduce groups that gather or reduce at all
    (``Costs.moves``), at the calibration's memory-bound rate. Memoized on ``costs`` by schedule."""
    key = (sched.key, reduce_bytes)
    known = costs.copies.get(key)
    if known is not None:
        return known
    elem_bytes, bytes_per_s = costs.e, costs.calib.memory_bytes_per_s
    fwd = bwd = 0.0
    for n, k in sched.bucket_counts:
        if costs.moves(sched.fwd[n]):
            fwd += k * 2 * elem_bytes * n
        k_blocks = k - (n == sched.root)
        if k_blocks and costs.moves(sched.bwd[n]):
            bwd += k_blocks * 2 * elem_bytes * n
    for g, k in sched.group_counts:
        if any(costs.moves(c) for c in sched.reduce[g]):
            bwd += k * (elem_bytes + reduce_bytes) * sum(g)
    known = costs.copies[key] = (fwd / bytes_per_s, bwd / bytes_per_s)
    return known


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


def _by_module(ct: Any, gathers: dict[int, Coll], lengths: tuple[int, ...], units: tuple[int, ...],
               model: ModelSpec, times: tuple[float, ...] | None = None) -> dict[int, float]:
    """Seconds of each block bucket's gather issued as one all-gather per sub-module
    (``Calibration.gathers = "module"``): the bucket's shard split in the sub-modules' proportions
    (``plan.block_modules``, its LayerNorms shared among them), one collective per block and module, each
    sub-module gathered ``times`` times in the pass (``deepspeed.Stage3Step``: more than once where a recompute's
    gathers were released before its backward, less where what the pass before gathered is kept; None: once)."""
    modules = block_modules(model)
    times = times or (1.0,) * len(modules)
    total = sum(modules)
    out = {}
    for n, u in dict(zip(lengths, units, strict=True)).items():
        op, rng, numel, bits = gathers[n]
        out[n] = u * sum(k * ct((op, rng, max(1, round(numel * m / total / u)), bits))
                         for m, k in zip(modules, times, strict=True))
    return out


@functools.lru_cache(maxsize=256)
def persistent_params(model: ModelSpec) -> tuple[int, ...]:
    """The elements of each parameter DeepSpeed's ZeRO-3 keeps whole on every rank (``ds_persist``: fewer than
    ``stage3_param_persistence_threshold``, 1e5 by default and 10 x hidden in zerotune's export): a block's two
    LayerNorms' weights and biases and its four biases (qkv h + 2k, k = ``ModelSpec.kv``, proj h, fc ffn, out h),
    and the final LayerNorm's weight and bias. The block's weight matrices, the embeddings and an untied head are
    over either threshold. A Llama has no biases: its two RMSNorms' weights per block and the final one's."""
    h = model.hidden
    if model.llama:
        return (h, h) * model.layers + (h,)
    return (h, h, h + 2 * model.kv, h, h, h, model.ffn, h) * model.layers + (h, h)


def _persistent_gathers(ct: Any, model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> float:
    """Seconds of the all-gathers DeepSpeed's ZeRO-3 runs after every optimizer step to bring its persistent
    parameters up to date (``stage3.py`` ``_post_step``: ``persistent_parameters[0].all_gather(...)``, which
    ``partition_parameters.py``'s ``_allgather_params_coalesced`` launches as one ``all_gather_into_tensor`` per
    parameter on the partition group): 8 per block and 2, each a message of a few KB over the whole group, so
    a ring's latency each (34 on gpt-mini's 4 blocks, counted on DeepSpeed 0.19.8: ``tests/tuner/test_exports.py``)."""
    ranks = cluster.span_size(s.param_span)
    return sum(n * ct(("all_gather", (1, s.param_span), max(1, numel // ranks), 16))
               for numel, n in _counted(persistent_params(model)))


@functools.lru_cache(maxsize=256)
def _counted(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(size, how many) of ``sizes``: 354 persistent parameters of gpt-neox-20b are 3 sizes, 3 collectives to time."""
    return tuple(Counter(sizes).items())


def _all_reduced(ct: Any) -> Any:
    """``ct`` with each 16-bit reduce-scatter timed as an all-reduce of the same buffer over the same levels."""
    def time(c: Coll) -> float:
        op, levels, numel, bits = c
        return ct(("all_reduce", levels, numel, bits) if op == "reduce_scatter" and bits >= 16 else c)
    return time


@functools.lru_cache(maxsize=1024)
def _owners(model: ModelSpec, ranks: int, shard: int) -> tuple[tuple[int, int], ...]:
    """(elements, how many ranks hold that many) of the ranks that hold any parameter when whole parameters are
    handed out as InternEvo's ``_partition_param_list`` does: largest first, each to the rank holding the fewest
    elements so far (the lowest such rank), over ``ranks`` ranks; each parameter counted as its 1/``shard``
    (the slice its rank's gradient shard group holds). 4,096 ranks and 400 parameters take a millisecond."""
    load = [(0, r) for r in range(ranks)]
    for numel in sorted(parameter_numels(model), reverse=True):
        held, rank = heapq.heappop(load)
        heapq.heappush(load, (held + -(-numel // shard), rank))
    return _counted(tuple(held for held, _ in load if held))


def _broadcast_sync(costs: Costs, model: ModelSpec, s: Strategy) -> float:
    """Seconds of the weight sync of ``Calibration.weight_sync = "broadcast"``: one broadcast over the optimizer
    group beyond ``grad_span`` (levels grad_span + 1 .. optim_span) from each rank that holds parameters, of the
    elements it holds (``_owners``), one after the other on the group's communicator; in place of the boundary's
    all-gathers over those levels."""
    lo, hi = s.grad_span + 1, s.optim_span
    ranks = costs.prefix[hi] // costs.prefix[lo - 1] if lo <= hi else 1
    if ranks == 1:
        return 0.0
    return sum(n * costs.broadcast(lo, hi, numel) for numel, n in _owners(model, ranks, costs.prefix[s.grad_span]))


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
    # a runner that reduces a bucket with an all-reduce where the schedule reduce-scatters it (DeepSpeed's stages 1
    # and 2: Calibration.grad_reduce) pays the all-reduce's seconds for the same buffer
    rt = _all_reduced(ct) if calib.grad_reduce == "all_reduce" and not s.param_span else ct
    f_of = {n: ct(c) for n, c in sched.fwd.items()}
    b_of = {n: ct(c) for n, c in sched.bwd.items()}
    r_of = {g: rt(a) + rt(b) for g, (a, b) in sched.reduce.items()}
    outer_in_backward = calib.outer_reduce == "backward"
    # the final micro-step queues each group's reduction beyond grad_span after its own reduce-scatters
    outer_of = {g: sum(rt(c) for c in cs) for g, cs in sched.outer.items()} if outer_in_backward else {}
    r_final = {g: r + outer_of[g] for g, r in r_of.items()} if any(outer_of.values()) else r_of

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
        copy_fwd, copy_bwd = _copy_seconds(sched, costs, wire_elem_bytes(e, s.grad_bits))
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
    root_f, root_b, deepspeed = ct(sched.fwd[sched.root]), 0.0, None
    fwd_times = bwd_times = None
    if stage3 is not None:  # DeepSpeed: a gather per sub-module, with no prefetch credited
        p = 0
        if s.param_span:  # ZeRO-3: each sub-module as often as its coordinator gathers it (deepspeed.simulate)
            ds = simulate(model, stage3, s.activation_checkpointing)
            deepspeed = _deepspeed_step(ds, stage3, calib.stage3_settings, e)
            fwd_times, bwd_times = ds.forward, ds.backward
            # the root's parameters (embeddings, final LayerNorm) are released after forward like every other
            # module's and gathered again for the head's backward where the reuse distance does not keep them
            # (counted on DeepSpeed 0.19.8 under the export: every parameter gathered twice a step,
            # tests/tuner/test_exports.py); zerotune's engine keeps the root
            root_f, root_b = root_f * ds.root[0], ct(sched.bwd[sched.root]) * ds.root[1]
        f_of.update(_by_module(ct, sched.fwd, sched.lengths, sched.units, model, fwd_times))
        b_of.update(_by_module(ct, sched.bwd, sched.lengths, sched.units, model, bwd_times))
    r_lengths, r_units, r_groups, fwd_runs, bwd_runs = _runs_of(sched.lengths, sched.units, sched.group_end, p)
    compute_s = (fwd_block + bwd_block) * sched.total_units + head_fwd + head_bwd

    t0, comm0, lost_f = pipeline(root_f, root_f, f_of, sched.lengths, fwd_block, sched.units, None, None, p,
                                 fwd_runs, kappa)
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
        t, comm, lost_b = pipeline(t0, comm0, b_of, r_lengths, bwd_block, r_units, reductions,
                                   r_groups, p, bwd_runs, kappa)
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
    sync = _broadcast_sync(costs, model, s) if calib.weight_sync == "broadcast" else None
    boundary_s = sum(k * sum((rt if i < 2 else ct)(c) for i, c in enumerate(sched.boundary[n])
                             if i >= 2 * outer_in_backward and (sync is None or i != 2))
                     for n, k in sched.bucket_counts) + (sync or 0.0)
    if calib.gathers == "module" and s.param_span:  # DeepSpeed ZeRO-3's persistent parameters, once a step
        boundary_s += _persistent_gathers(ct, model, cluster, s)
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
        "bytes_per_level": _volume(sched, costs, accum),
        "quantization": {"elements": _step_totals(sched, costs, accum)[1]},
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


def _deepspeed_step(ds: Stage3Step, settings: Stage3Settings, which: str, elem_bytes: int) -> dict[str, Any]:
    """What a DeepSpeed ZeRO-3 run of the prediction does by its coordinator's rules (``deepspeed.simulate``): the
    stage-3 settings it runs under (``which``: zerotune's export or DeepSpeed's defaults), the times it gathers its
    partitioned parameters in a step, forward and backward, and the most bytes of them it holds gathered."""
    forward, backward = (n / ds.partitioned if ds.partitioned else 0.0 for n in ds.elements)
    return {"stage3_settings": which, "stage3": settings.config(),
            "gathered_per_step": forward + backward, "gathered_forward": forward, "gathered_backward": backward,
            "held_peak_bytes": ds.peak * elem_bytes}
