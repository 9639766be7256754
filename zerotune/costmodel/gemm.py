"""The device's matmul rate by shape, from GEMM measurements only, and the fixed cost of a block's memory-bound kernels.

**The GEMM law.** ``bench/gemm_efficiency.py`` times a GPT layer's twelve products (QKV, projection and the two MLP
products, each forward, input gradient and weight gradient) at ``T`` tokens per micro-batch (the products' M, and the
weight gradients' K) and hidden size ``h`` (their K and N), each product alone between two CUDA events after a
synchronize, and reports the layer's FLOPs (72·T·h²) over the summed times (``SWEEPS``: one H100 SXM and one H200 SXM,
bf16, torch 2.11). Timed so, each product's time holds the host's dispatch of that one product (the device starts
its event at once and waits for the launch): a least-squares fit of ``time = FLOPs / (e·peak) + 12·t0`` to each
sweep (``dispatch_fit``) gives t0 = 15.5 µs a product on the H100's host and 25.8 µs on the H200's, with the same
e (0.72 of peak) on both: the same SMs, two hosts, so t0 is the host's. In a training step the host issues kernels
ahead of the device and its cost is the runner's host floor (``rates.RUNNER_HOST_S_PER_LAYER``), so the law takes
each point's *device* rate, the layer's FLOPs over its time less 12·t0 (``device_rates``).

What is left depends on the tokens and not, in the range measured, on the hidden size: at 2,048 tokens and more
every hidden size from 1,024 to 8,192 runs at 0.68-0.82 of peak on the device (the smallest widths the fastest:
the largest products run at lower clocks), at 1,024 tokens 0.56-0.98 (median 0.69 on the H100, 0.71 on the H200),
at 512 tokens 0.26-0.70 (median 0.64 and 0.62: the weight gradient's K is the 512 tokens; ``proj.wgrad`` is the
slowest product of every row at 512 and 1,024 tokens on the H100). The engine's own kernels agree: its matmuls ran
at 0.72-0.77 of peak on an H100 at 2,048-16,384 tokens of gpt-1.3b (h = 2,048; the fewest tokens the fastest:
``bench/data/h100-kernels/kernel_split-gpt-1.3b.json``) and at 0.72-0.74 on an H200 at 8,192 and 32,768 tokens of
gpt-125m (h = 768, ``bench/data/h200-kernels/kernel_split-gpt-125m.txt``), the same as gpt-1.3b's 0.70-0.77 there.
So ``gemm_law`` is a function of the tokens per micro-batch: the median over the hidden sizes of each token count's
device rates, held non-decreasing in the tokens (a larger M never slower: the dips past 2,048 tokens are the clocks
of the largest products), over its largest value: 1 on the plateau, below it under 2,048 tokens, linear in log
tokens between the measured counts and held at the ends (nothing under 512 tokens was measured). The hidden size is
no argument: no sweep shows a slower rate at a smaller width at any token count (``tests/costmodel/test_gemm.py``
holds this on both sweeps).

A device with no sweep of its own takes the nearest documented one (``SWEEP_OF``): the H100's for the A100, V100 and
MI250X. No printed sweep of a layer's products over the tokens was found for those parts. Anthony et al. ("The Case
for Co-Designing Model Architectures with Hardware", arXiv 2401.14489) plot theirs; their outputs
(EleutherAI/cookbook commit 27dff48, ``sizing/results/gemm_data/mm/*/{a100,v100,mi250x}.out``, deleted at 405f573)
time fp16 ``torch.mm`` by the host clock at M = N = 32-8,192 with K = 4,096 (the output widens with the tokens: no
layer's shape) or at one M (2,304; 27,648). NVIDIA's matrix multiplication guide plots; stas00/ml-engineering's MAMF
tables (``hardware`` [mamf]) give the best shape only; XLA's matmul tables (``matmul_interpolator_data.h``) hold
Hopper, Blackwell, MI300 and MI350 parts only. Vidur's profiles (microsoft/vidur 7d47513,
``data/profiling/compute/{a100,h100}/*/mlp.csv``: kernel times of six to eight models' four forward products at
1-4,096 tokens and tensor-parallel degrees 1-8; one A100 80GB profile serves a PCIe and a DGX node) hold no
gradient products, so no layer's rate, and they cannot say how the A100's curve differs from the H100's: read as
``law_points`` reads a sweep, the whole layer on one GPU (TP 1) falls to 0.93 of the 4,096-token rate at 512
tokens on their A100 and 0.95 on their H100, all degrees pooled to 0.90 and 0.82 (the sign flips with the reading,
and leaving one model out moves either by up to 0.02), and on the H100 the forward products alone (0.95) miss this
sweep's 0.84 at 512 tokens: the weight gradients, whose K is the tokens, are what falls. So the A100 keeps the
H100's curve.

**The memory-bound kernels' fixed cost.** The same H100 and H200 profiles of the engine's step on gpt-1.3b
(``bench/kernel_split.py``: memory-bound kernels' device time against the bytes ``traffic`` counts, at 1, 2, 4 and 8
sequences of 2,048 tokens) lie on a line: time = bytes / (f·HBM) + c, with c = 1.41 ms a forward and backward on both
devices (``EAGER_KERNELS``, ``memory_line``). c is the same on HBM3 and HBM3e, so it is no bandwidth: it is the
kernels' launch and ramp, paid per kernel whatever its size, 24 blocks' worth (the head's few kernels in it):
``EAGER_BLOCK_FLOOR_S`` = 59 µs a block's forward and backward. The slope gives the rate the bytes stream at
(``hardware.H100_EAGER_MEMORY_FRACTION``, ``H200_EAGER_MEMORY_FRACTION``). A block of a narrow model over few tokens
is charged the floor beside its bytes, not its bytes at bandwidth alone.
"""

from __future__ import annotations

import functools
import math
import statistics

SWEEPS: dict[str, tuple[tuple[int, int, float], ...]] = {
    "H100": (
        (512, 1024, 0.146), (1024, 1024, 0.262), (2048, 1024, 0.413), (4096, 1024, 0.544), (8192, 1024, 0.648),
        (16384, 1024, 0.718), (512, 2048, 0.372), (1024, 2048, 0.512), (2048, 2048, 0.657), (4096, 2048, 0.730),
        (8192, 2048, 0.708), (16384, 2048, 0.721), (512, 4096, 0.544), (1024, 4096, 0.657), (2048, 4096, 0.718),
        (4096, 4096, 0.708), (8192, 4096, 0.714), (16384, 4096, 0.676), (512, 6144, 0.567), (1024, 6144, 0.659),
        (2048, 6144, 0.690), (4096, 6144, 0.694), (8192, 6144, 0.697), (16384, 6144, 0.712), (512, 8192, 0.610),
        (1024, 8192, 0.659), (2048, 8192, 0.669), (4096, 8192, 0.710), (8192, 8192, 0.693), (16384, 8192, 0.690)),
    "H200": (
        (512, 1024, 0.085), (1024, 1024, 0.174), (2048, 1024, 0.302), (4096, 1024, 0.451), (8192, 1024, 0.563),
        (16384, 1024, 0.630), (512, 2048, 0.291), (1024, 2048, 0.497), (2048, 2048, 0.616), (4096, 2048, 0.650),
        (8192, 2048, 0.687), (16384, 2048, 0.689), (512, 4096, 0.522), (1024, 4096, 0.604), (2048, 4096, 0.676),
        (4096, 4096, 0.701), (8192, 4096, 0.699), (16384, 4096, 0.673), (512, 6144, 0.545), (1024, 6144, 0.679),
        (2048, 6144, 0.690), (4096, 6144, 0.696), (8192, 6144, 0.684), (16384, 6144, 0.691), (512, 8192, 0.572),
        (1024, 8192, 0.666), (2048, 8192, 0.668), (4096, 8192, 0.692), (8192, 8192, 0.683), (16384, 8192, 0.682)),
}
"""(tokens, hidden, fraction of the 989 TFLOPS dense bf16 peak) of one layer's twelve products, as
``python bench/gemm_efficiency.py`` measured them on one "NVIDIA H100 80GB HBM3" and one "NVIDIA H200" (torch
2.11.0+cu130): ``bench/data/h100-1gpu/gemm-efficiency.json`` (also ``gemm.txt``) and
``bench/data/h200-1gpu/gemm-efficiency.json``, their ``of_peak`` rounded to 3 decimals
(``tests/costmodel/test_gemm.py`` holds these to the files)."""

SWEEP_PEAK_TFLOPS = 989.0
"""The peak both sweeps are fractions of (the H100 SXM's dense bf16, the H200's the same)."""

GEMMS_PER_LAYER = 12
"""Products a sweep row times (four weights, three products each)."""

SWEEP_OF: dict[str, str] = {"H100": "H100", "H200": "H200", "A100": "H100", "A100-40GB": "H100", "V100": "H100",
                            "MI250X": "H100"}
"""The sweep each device in ``hardware.DEVICES`` takes: its own where measured, else the H100's (module docstring)."""

PLATEAU_TOKENS = 2048
"""Tokens per micro-batch from which both sweeps' device rates sit on their plateau (``gemm_law`` is 1 there): the
source figures whose micro-batch is not stated are taken to run there (one sequence of 2,048 tokens or more)."""


def layer_flops(tokens: int, hidden: int) -> float:
    """FLOPs of a sweep row's twelve products: 3 layouts x 2·T·(3h² + h² + 4h² + 4h²)."""
    return 72.0 * tokens * hidden * hidden


@functools.lru_cache(maxsize=8)
def dispatch_fit(sweep: str) -> tuple[float, float]:
    """(e, t0): the least-squares fit of each row's time to FLOPs / (e·peak) + 12·t0 (the fraction of peak of the
    products' device time and the host's seconds to dispatch one product), each row weighted by its own time."""
    peak = SWEEP_PEAK_TFLOPS * 1e12
    rows = [(layer_flops(t, h) / peak, layer_flops(t, h) / (e * peak)) for t, h, e in SWEEPS[sweep]]
    # minimise sum((a·x + 12·t0) / s - 1)^2 over (1/e, t0), x the row's seconds at peak, s its measured seconds
    sxx = sum((x / s) ** 2 for x, s in rows)
    sxy = sum((x / s) * (GEMMS_PER_LAYER / s) for x, s in rows)
    syy = sum((GEMMS_PER_LAYER / s) ** 2 for _, s in rows)
    bx, by = sum(x / s for x, s in rows), sum(GEMMS_PER_LAYER / s for _, s in rows)
    det = sxx * syy - sxy * sxy
    inverse_e, t0 = (bx * syy - by * sxy) / det, (by * sxx - bx * sxy) / det
    return 1.0 / inverse_e, t0


@functools.lru_cache(maxsize=8)
def device_rates(sweep: str) -> tuple[tuple[int, int, float], ...]:
    """(tokens, hidden, fraction of peak) of each row's products on the device: the layer's FLOPs over its measured
    time less the host's dispatch of its twelve products (``dispatch_fit``)."""
    peak, (_, t0) = SWEEP_PEAK_TFLOPS * 1e12, dispatch_fit(sweep)
    out = []
    for t, h, e in SWEEPS[sweep]:
        flops = layer_flops(t, h)
        out.append((t, h, flops / peak / (flops / (e * peak) - GEMMS_PER_LAYER * t0)))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def law_points(sweep: str) -> tuple[tuple[int, float], ...]:
    """(tokens, ``gemm_law``) at each measured token count: the median over the hidden sizes of the device rates,
    held non-decreasing in the tokens, over the largest."""
    rates = device_rates(sweep)
    tokens = sorted({t for t, _, _ in rates})
    medians = [statistics.median(e for t, _, e in rates if t == n) for n in tokens]
    held = [max(medians[: i + 1]) for i in range(len(medians))]
    return tuple((n, v / held[-1]) for n, v in zip(tokens, held, strict=True))


def gemm_law(device: str, tokens: int) -> float:
    """The rate of a micro-batch of ``tokens`` tokens' matmuls on ``device`` (a key of ``SWEEP_OF``) as a fraction of
    the same device's rate on the plateau (module docstring): linear in log tokens between the measured counts,
    held at the ends (``curve_factor`` on ``law_points``)."""
    return curve_factor(law_points(SWEEP_OF[device]), tokens)


def gemm_curve(device: str, source_tokens: int) -> tuple[tuple[int, float], ...]:
    """``gemm_law`` at each measured token count over its value at ``source_tokens`` (the micro-batch of the run a
    device's efficiency figure was read off): the points ``Calibration.gemm_curve`` holds. Empty for a device with
    no sweep to take."""
    if device not in SWEEP_OF:
        return ()
    base = gemm_law(device, source_tokens)
    return tuple((t, v / base) for t, v in law_points(SWEEP_OF[device]))


def curve_factor(curve: tuple[tuple[int, float], ...], tokens: int) -> float:
    """The factor ``curve`` (``gemm_curve``'s points) gives a micro-batch of ``tokens``: linear in log tokens between
    its points, held at the ends; 1 where there is no curve."""
    if not curve:
        return 1.0
    if tokens <= curve[0][0]:
        return curve[0][1]
    for (t0, v0), (t1, v1) in zip(curve, curve[1:], strict=False):
        if tokens <= t1:
            w = (math.log(tokens) - math.log(t0)) / (math.log(t1) - math.log(t0))
            return v0 + w * (v1 - v0)
    return curve[-1][1]


EAGER_KERNELS: dict[str, tuple[tuple[float, float], ...]] = {
    "H100": ((15.278383104, 7.958005600), (30.56, 15.06), (61.11, 29.05), (122.23, 55.70)),
    "H200": ((15.278383104, 6.89), (30.56, 13.02), (61.11, 25.19), (122.23, 47.58)),
}
"""(GB the memory-bound kernels move as ``traffic`` counts them, their device ms) of one forward and backward of
gpt-1.3b (24 blocks, h = 2,048) at 1, 2, 4 and 8 sequences of 2,048 tokens, eager bf16, on one H100 SXM and one
H200 SXM (``python bench/kernel_split.py``: ``bench/data/h100-kernels/kernel_split-gpt-1.3b.json`` and
``bench/data/h200-kernels/kernel_split-gpt-1.3b.json``, ``passes[*].memory_bytes`` and ``memory_ms``; the
tables in ``kernel_split-gpt-1.3b.txt``)."""

EAGER_KERNELS_BLOCKS = 24
"""gpt-1.3b's blocks, over which ``memory_line``'s fixed cost is spread."""


@functools.lru_cache(maxsize=4)
def memory_line(device: str) -> tuple[float, float]:
    """(bytes per second, fixed seconds) of the least-squares line through ``EAGER_KERNELS[device]``: the eager
    memory-bound kernels' streaming rate and their fixed cost per forward and backward of the profiled model."""
    pts = EAGER_KERNELS[device]
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)  # ms per GB
    return 1e9 / (slope * 1e-3), (my - slope * mx) * 1e-3


EAGER_BLOCK_FLOOR_S = statistics.mean(memory_line(d)[1] for d in EAGER_KERNELS) / EAGER_KERNELS_BLOCKS
"""Seconds of a block's forward and backward that its eager memory-bound kernels take beyond their bytes at their
streaming rate: ``memory_line``'s fixed cost (1.41 ms on both devices) over gpt-1.3b's 24 blocks, 59 µs. Charged to
the eager stacks' blocks on the devices whose eager rates were measured or carried over (``hardware``); a forward
takes a third of it, as of the block's bytes, a recomputed forward a third again."""
