"""The compute stage of a prediction: one micro-step's seconds of compute, its blocks' and its head's, read off
the per-token FLOPs and memory-bound bytes of ``traffic`` at the calibration's rates, with the host's floor and the
runner's copies on the compute stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from zerotune.costmodel.gemm import curve_factor
from zerotune.costmodel.traffic import pass_seconds

if TYPE_CHECKING:
    from zerotune.costmodel.schedule import Schedule, Setup


class Compute(NamedTuple):
    """One micro-step's compute (``compute_seconds``): seconds per block and for the head, and what they hold."""

    block_fwd: float
    """A block's forward, in seconds (the host's floor included)."""
    block_bwd: float
    """A block's backward, its recompute included."""
    head_fwd: float
    head_bwd: float
    memory_bound_s: float
    """The memory-bound kernels' seconds of the whole micro-step (a host floor may hide part of them)."""
    attention_s: float
    """The attention kernel's seconds of the whole micro-step."""
    host_wait_s: float
    """Seconds the device waits for the host to issue the blocks."""


def compute_seconds(setup: Setup, sched: Schedule, copies: tuple[float, float] | None = None) -> Compute:
    """Seconds of one micro-step's blocks and head (``pass_seconds`` at the calibration's rates, the attention's at
    ``Setup.attention``, for the strategy's tokens and recompute; the mean block where only some are
    checkpointed), the matmuls at ``compute_efficiency`` times the GEMM law's factor at the micro-batch's tokens
    (``Calibration.gemm_curve``), each block's memory-bound kernels with their fixed cost
    (``Calibration.memory_floor_s_per_block``, a third in the forward, two in the backward, a third again in a
    recomputed forward), with ``copies`` (forward, backward: ``runners.copy_seconds``) on the compute stream beside
    them. A block's forward and backward take at least the host's time to issue them
    (``Calibration.host_s_per_layer``, a third of it per forward pass: the backward is two, a recompute one more).
    A runner that gathers per sub-module (DeepSpeed) has its ZeRO-3's floor, its hooks on every module and
    parameter: its stages that keep parameters whole were not measured and are not charged one."""
    model, calib, tokens, checkpointed = setup.model, setup.calib, setup.tokens, setup.checkpointed
    peak = setup.cluster.peak_tflops * 1e12
    rates = (peak * calib.compute_efficiency * curve_factor(calib.gemm_curve, tokens), calib.memory_bytes_per_s)
    kernel = (peak * setup.attention, calib.attention_forward_share)
    recompute = "full-early-stop" if setup.recompute == "full" and calib.recompute_early_stop else setup.recompute
    kernels = (calib.loss_kernel, calib.score_passes, calib.block_kernels)
    per_token = pass_seconds(model, setup.elem_bytes, *rates, recompute, *kernel, *kernels)
    if 0 < checkpointed < 1:  # every checkpoint_every-th block checkpointed: the mean block
        per_token = pass_seconds(model, setup.elem_bytes, *rates, "none", *kernel, *kernels).blend(per_token,
                                                                                                   checkpointed)
    units = sched.total_units
    floor = calib.memory_floor_s_per_block / 3  # a forward's share of the block's fixed memory-bound cost
    redo = floor * checkpointed if recompute != "none" else 0.0  # a recomputed forward's kernels run again
    fwd_block, bwd_block = tokens * per_token.block_fwd + floor, tokens * per_token.block_bwd + 2 * floor + redo
    memory_bound_s = tokens * (units * per_token.block_memory + per_token.head_memory) + units * (3 * floor + redo)
    if copies is not None:  # FSDP2's copy-out of each gather, copy-in of each reduction
        fwd_block += copies[0] / units
        bwd_block += copies[1] / units
        memory_bound_s += copies[0] + copies[1]
    host_fwd = (calib.host_s_per_layer if calib.gathers != "module" or setup.strategy.param_span else 0.0) / 3
    host_bwd = host_fwd * (2 + checkpointed)  # selective too: the forward's ops are issued again
    host_wait_s = (max(0.0, host_fwd - fwd_block) + max(0.0, host_bwd - bwd_block)) * units
    return Compute(max(fwd_block, host_fwd), max(bwd_block, host_bwd), tokens * per_token.head_fwd,
                   tokens * per_token.head_bwd, memory_bound_s, tokens * units * per_token.block_attention,
                   host_wait_s)
