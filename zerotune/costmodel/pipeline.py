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

``predict`` runs it once for the forward pass and once a micro-step for the backward, with each bucket's
gather and each group's reduction timed by ``timing.Costs``.
"""

from __future__ import annotations

from zerotune.costmodel.schedule import Group


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
