"""The engine's bucket pipeline: one pass over the buckets, a FIFO communication queue beside a compute stream.

``pipeline`` simulates the engine's own dependency structure: one FIFO communication thread and one
compute stream. It is also DeepSpeed's and FSDP's, though they issue gathers and reductions on CUDA streams of
their own: NCCL launches each kernel of a communicator after the one before it, whatever the stream
(``ncclLaunchPrepare`` makes the launch stream wait on the communicator's ``deviceStream``: NVIDIA/nccl
``src/enqueue.cc`` at 01e6dd91), so the collectives of one data-parallel group run one at a time, in launch
order. (Collectives on different communicators, such as ZeRO++'s secondary-group gathers, may run side by side;
the model queues them too.) Iteration i issues the gathers of buckets up to i + prefetch (each starts when the
queue is free and the compute stream has reached the point that issues it), waits for bucket i's gather,
computes bucket i, then queues its group's reduction. Compute that runs while the queue is busy is slowed by
``overlap_slowdown`` (collectives take SMs/CUs and memory bandwidth from the kernels beside them): a compute
span of c seconds that overlaps w seconds of queued communication takes c + κ·w. The first gathers, the last
reduction and everything at the step boundary are exposed by construction.

``time_step``, the pipeline stage of ``predict``, runs it once for the forward pass and once a micro-step for the
backward, with each bucket's gather and each group's reduction as the runner issues them (``timing.Seconds``,
``coordinator.Gathers``) and each block's compute (``compute.Compute``); then the step: A micro-steps, the step-boundary
collectives (serial: nothing left to compute), the AdamW update of the optimizer shard and a fixed overhead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from zerotune.costmodel.schedule import Group, Schedule, Setup

if TYPE_CHECKING:
    from zerotune.costmodel.compute import Compute
    from zerotune.costmodel.coordinator import Gathers
    from zerotune.costmodel.timing import Costs, Seconds


def pipeline(t: float, comm: float, gathers: dict[int, float], lengths: tuple[int, ...], compute: float,
             units: tuple[int, ...], reductions: dict[Group, float] | None, groups: tuple[Group, ...] | None, p: int,
             runs: list[int], slowdown: float = 0.0) -> tuple[float, float, float]:
    """Simulate one pass over the buckets: returns (compute stream end, queue end, seconds of slow-down).

    Iteration i issues the gathers up to bucket i + p on the FIFO queue (each starts when the queue
    and the compute stream that issues it are both past; bucket j's gather takes
    ``gathers[lengths[j]]``), waits for bucket i's gather, computes it (``compute · units[i]``,
    stretched by ``slowdown`` times its overlap with the busy queue), then queues its reduction
    (``reductions[groups[i]]``, if a group ends there). ``runs[i]``: the last iteration whose
    inputs equal those of iteration i. Inside such a run, once the state (t, comm, pending gathers)
    has moved by the same δ in one iteration it moves by δ in every later one — the step is
    translation invariant in time — so the rest of the run is skipped in one jump. So it is when the
    queue stood idle through the iteration (nothing to gather or reduce: a replicated model's forward),
    where only t and the pending gathers move. Exact up to
    float rounding; it makes the O(buckets) loop O(runs) for the uniform transformer blocks that
    make up a plan.
    """
    nb = len(lengths)
    ends = [0.0] * nb
    issued = 0
    pt = pc = lost = pl = 0.0
    i = 0
    while i < nb:
        limit = i + 1 + p
        if limit > nb:
            limit = nb
        while issued < limit:
            g = gathers[lengths[issued]]
            if g:
                comm = (comm if comm > t else t) + g
                ends[issued] = comm
            else:  # nothing to gather (a replicated bucket): no place in the queue, nothing to wait for
                ends[issued] = t
            issued += 1
        e = ends[i]
        if e > t:
            t = e
        c = compute * units[i]
        if slowdown and comm > t:  # the queue is busy for part of this compute span
            extra = slowdown * (comm - t if comm - t < c else c)
            c += extra
            lost += extra
        t += c
        if groups is not None and groups[i]:
            r = reductions[groups[i]]  # type: ignore[index]
            comm = (comm if comm > t else t) + r
        last = runs[i]
        if i and last > i and runs[i - 1] == last:  # inside a run, with more of it to come
            d, moved = t - pt, comm - pc
            tol = 1e-12 * t
            # the queue moved with the compute stream, or stood idle (nothing queued, nothing running) throughout
            idle = not moved and comm <= pt
            if ((idle or abs(moved - d) <= tol)
                    and (issued <= i + 1 or all(abs(ends[m + 1] - ends[m] - d) <= tol for m in range(i, issued - 1)))):
                k = last - i
                shift = k * d
                ends[i + 1 + k:issued + k] = [x + shift for x in ends[i + 1:issued]]
                lost += k * (lost - pl)  # the slow-down depends on (queue - compute) only: the same each time
                t, comm, issued, i = t + shift, comm if idle else comm + shift, issued + k, last
        pt, pc, pl = t, comm, lost
        i += 1
    return t, comm, lost


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


Runs = tuple[tuple[int, ...], tuple[int, ...], tuple[Group, ...], list[int], list[int]]

_RUNS: dict[tuple[int, int], Runs] = {}
"""``runs_of`` by (schedule key, prefetch)."""


def runs_of(sched: Schedule, p: int) -> Runs:
    """For the backward pass: bucket lengths, units and group ends in backward order; and for both
    passes of ``pipeline``, the last iteration of each iteration's run of identical inputs (units
    computed, the length gathered ahead ``p`` buckets ahead, the group reduced). Iterations that issue no gather
    never join a run (their pending window shrinks). Memoized by schedule and prefetch."""
    known = _RUNS.get((sched.key, p))
    if known is not None:
        return known
    lengths, units, group_end = sched.lengths, sched.units, sched.group_end
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
    if len(_RUNS) > 16_384:
        _RUNS.clear()
    known = _RUNS[sched.key, p] = (r_lengths, r_units, r_groups, last_of(fwd), last_of(bwd))
    return known


def clear() -> None:
    _RUNS.clear()


class StepTime(NamedTuple):
    """One optimizer step's seconds (``time_step``)."""

    step_s: float
    micros_s: float
    """The A micro-steps."""
    compute_s: float
    """One micro-step's compute: its blocks' forward and backward and the head's."""
    comm_s: float
    """Every collective of the micro-steps, overlapped or not."""
    slowdown_s: float
    """Compute slowed by the collectives beside it (``Calibration.overlap_slowdown``), over the micro-steps."""
    boundary_s: float
    optimizer_s: float


def time_step(setup: Setup, sched: Schedule, costs: Costs, seconds: Seconds, gathers: Gathers,
              compute: Compute) -> StepTime:
    """One micro-step is the engine's pipeline: the root's gather (exposed: nothing computes before it), the forward
    pass with gathers ``prefetch`` ahead, the head, then the backward pass last bucket first — its first gather
    exposed, each reduce group's reduction queued after the group's last bucket, the root's reduction exposed at
    the end; the final micro-step's reductions are ``Seconds.final``. The step is A micro-steps, then the
    step-boundary collectives, the AdamW update of the optimizer shard (``Calibration.optimizer_elems_per_s``) and
    a fixed overhead (``Calibration.step_overhead_s``)."""
    calib, s, accum = setup.calib, setup.strategy, setup.accum
    fwd_block, bwd_block, head_fwd, head_bwd = compute.block_fwd, compute.block_bwd, compute.head_fwd, compute.head_bwd
    f_of, b_of, root_f, root_b, p, memo = gathers.fwd, gathers.bwd, gathers.root_fwd, gathers.root_bwd, \
        gathers.prefetch, gathers.passes
    r_of, r_final, kappa = seconds.reduce, seconds.final, calib.overlap_slowdown
    r_lengths, r_units, r_groups, fwd_runs, bwd_runs = runs_of(sched, p)
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
    step_s = micros_s + seconds.boundary + optimizer_s + calib.step_overhead_s
    return StepTime(step_s, micros_s, compute_s, comm_s, slowdown_s, seconds.boundary, optimizer_s)
