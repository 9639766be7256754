"""What a fused attention kernel reaches, as a fraction of dense peak on the attention's FLOPs as the model
counts them (``traffic.attention_flops``: the whole T x T square, the backward twice the forward), and which
kernel a run's attention is (``ATTENTION_KERNELS``, a table's ``attention``, ``profiles.profile_calibration``'s).

A kernel benchmark counts its FLOPs otherwise (the causal half, its backward 2.5 times its forward):
``causal_kernel_efficiency`` converts its figures, and ``kernel_forward_share`` says what share of its time a
recomputed forward pays again. A kernel swept over sequence lengths and head sizes keeps its curve
(``Calibration.attention_curve``), read at the model's own; ``python bench/attention_rate.py`` measures a device's
rate in both terms, the way a figure is added here.

Sources (cited by key below; ``hardware`` holds the device, link and host sources, [fa2] and [ibm-fsdp] among them):
- [fa2-kernel] T. Dao, FlashAttention-2 (arXiv 2307.08691; ``hardware`` [fa2]), abstract: FlashAttention-2
  reaches "50-73% of the theoretical maximum FLOPs/s on A100" over its attention benchmarks, whose FLOPs are
  counted as the repository's ``benchmarks/benchmark_flash_attention.py`` counts them: 4·T²·d per head forward,
  halved for a causal mask, the backward 2.5 times the forward.
- [fa2-bench] Dao-AILab/flash-attention ``assets/flash2_a100_fwd_bwd_benchmark.png`` and
  ``assets/flash2_h100_fwd_bwd_benchmark.png`` (4f285b35, 2023-07-17, the FlashAttention-2 release; the README's
  "Performance" section): attention forward + backward speed, TFLOPs/s as printed on the bars, on an A100 80GB SXM4
  and an H100 80GB SXM5, sequence lengths 512 to 16k, heads of 64 and 128 (``benchmarks/benchmark_flash_attention.py``:
  16k tokens per batch, hidden 2048, the FLOPs as [fa2-kernel] counts them), for FlashAttention-2 and, on the A100,
  "FlashAttention Triton" (the repository's ``flash_attn_triton.py``, which LLM Foundry's ``attn_impl: triton`` runs
  as its own copy). With causal mask, A100: FlashAttention-2 88, 119, 140, 156, 165, 171 (heads of 64) and 99, 133,
  155, 173, 182, 189 (128); Triton 59, 75, 79, 76, 79, 80 and 50, 61, 68, 74, 78, 80. H100: FlashAttention-2 141,
  192, 232, 257, 273, 284 and 163, 221, 265, 294, 308, 328.
- [fa3] Shah et al., "FlashAttention-3" (arXiv 2407.08608), abstract: "FlashAttention-2 achieving only 35%
  utilization on the H100 GPU".
- [triton-perf] triton-lang/triton ``python/test/regression/test_performance.py`` at 00693c1c,
  ``flash_attention_data["a100"]``: Triton's fused attention (``triton.ops.attention``), causal, fp16, 4 x 48
  heads of size 64 over 4,096 tokens: forward 0.37, backward 0.25 of the A100's tensor-core peak at the running
  clock, counted on the causal half with the backward 2.5 times the forward (the same file's 8k x 8k x 8k fp16
  matmul reaches 0.77 there: "A100 in the CI server is slow-ish").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerotune.core.spec import ModelSpec
from zerotune.costmodel.rates import Calibration, curve_rate

H200_ENGINE_ATTENTION = 0.58
"""The engine's attention (SDPA, cuDNN's kernels on Hopper) on the H200 runs its matmul figure was read off
(``hardware.H200_ENGINE_EFFICIENCY``: ``bench/kernel_split.py``, ``bench/data/h200-kernels``): its FLOPs as the
model counts them (the whole square: ``traffic.attention_flops``) over its kernels' device time, median of the four
micro-batches (0.50-0.63; ATTENTION_KERNELS["sdpa"])."""
H100_ENGINE_ATTENTION = 0.58
"""The engine's cuDNN attention on the H100 runs of ``hardware.H100_ENGINE_EFFICIENCY``
(``bench/data/h100-kernels``): 0.48-0.62, median 0.58 (FlashAttention-2's 35% of an H100's peak [fa3] is 0.60 in
these terms)."""
H200_ENGINE_ATTENTION_FORWARD = 0.24
"""The share of the engine's attention time (cuDNN's forward and backward kernels, the same H200 runs) its forward
takes: 0.237-0.246, median 0.24, where the model's FLOP count alone would give a third (the backward recomputes the
scores and runs at a lower rate). A recomputed forward pays this share again
(``Calibration.attention_forward_share``)."""
H100_ENGINE_ATTENTION_FORWARD = 0.24
"""The same on the H100 runs: 0.232-0.239, median 0.24."""


def kernel_forward_share(forward: float, backward: float) -> float:
    """The share of a causal attention kernel's forward-and-backward time its forward takes, from its passes'
    fractions of peak as its benchmarks count them (``causal_kernel_efficiency``'s terms): 0.5/f over
    0.5/f + 1.25/b. The FLOPs alone would give a third; a kernel whose backward does 2.5 times its forward's work
    (the scores recomputed) at the same rate gives 2/7, and one whose backward is also slower, less."""
    return (0.5 / forward) / (0.5 / forward + 1.25 / backward)


def causal_kernel_efficiency(forward: float, backward: float) -> float:
    """A causal attention kernel's rate on the attention's FLOPs as the model counts them
    (``traffic.attention_flops``: the whole T x T square, the backward twice the forward), from its forward's
    and backward's fractions of peak as its benchmarks count them (the unmasked half of the square, 2·T²·h
    FLOPs per layer and sequence forward, the backward 2.5 times that, its recomputation of the scores
    included): 3 model-FLOPs take 0.5/f + 1.25/b at peak, so 3 / (0.5/f + 1.25/b)."""
    return 3 / (0.5 / forward + 1.25 / backward)


@dataclass(frozen=True)
class AttentionKernel:
    """A fused attention kernel's rate on each device it was measured on, as a fraction of dense peak on the
    attention's FLOPs as the model counts them (``causal_kernel_efficiency`` converts a kernel benchmark's)."""

    rates: dict[str, float]
    """By key in ``DEVICES``."""
    source: str
    forward_shares: dict[str, float]
    """The share of its time its forward takes on each device of ``rates`` (``kernel_forward_share``): what a
    recomputed forward pays again."""
    curves: dict[str, tuple[tuple[int, int, float], ...]] = dataclasses.field(default_factory=dict)
    """Its published rate by sequence length and head size on the devices a benchmark swept it on
    (``Calibration.attention_curve``); there ``rates`` holds the curve at ``REFERENCE_POINT``."""

    @classmethod
    def from_curves(cls, curves: dict[str, tuple[tuple[int, int, float], ...]], source: str,
                    forward_shares: dict[str, float]) -> AttentionKernel:
        """A kernel known by its curves alone: its one figure per device read at ``REFERENCE_POINT``."""
        return cls({device: curve_rate(curve, *REFERENCE_POINT) for device, curve in curves.items()}, source,
                   forward_shares, curves)

    def __post_init__(self) -> None:
        if set(self.forward_shares) != set(self.rates):
            raise ValueError(f"AttentionKernel: forward_shares for {sorted(self.forward_shares)}, rates for "
                             f"{sorted(self.rates)}: must name the same devices")
        if not set(self.curves) <= set(self.rates):
            raise ValueError(f"AttentionKernel: curves for {sorted(self.curves)}, rates for {sorted(self.rates)}: "
                             "a device with a curve needs its rate")

    def efficiency(self, device: str, model: ModelSpec | None = None) -> float:
        """Its rate on ``device`` (for ``model``'s sequence length and head size where a curve has it); 0 where it
        was not measured there (charged at the compute rate)."""
        curve = self.curves.get(device)
        if curve and model is not None:
            return curve_rate(curve, model.seq_len, model.head_dim)
        return self.rates.get(device, 0.0)

    def forward_share(self, device: str) -> float:
        """Its forward's share of its time on ``device``; 0 where it has no rate there (the FLOPs' third)."""
        return self.forward_shares.get(device, 0.0)


BENCH_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
"""The sequence lengths of [fa2-bench]'s bars."""


def bench_curve(peak_tflops: float, by_head: dict[int, tuple[float, ...]]) -> tuple[tuple[int, int, float], ...]:
    """``Calibration.attention_curve`` points from a causal attention benchmark's forward-and-backward TFLOPS at
    ``BENCH_SEQS`` for each head size (its passes at one rate: ``causal_kernel_efficiency(f, f)``)."""
    return tuple((seq, head, round(causal_kernel_efficiency(tflops / peak_tflops, tflops / peak_tflops), 4))
                 for head, row in sorted(by_head.items()) for seq, tflops in zip(BENCH_SEQS, row, strict=True))


FA2_A100_CURVE = bench_curve(312.0, {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)})
"""[fa2-bench]: FlashAttention-2 on an A100, causal: 0.48-1.04 of peak in the model's terms (heads of 128: 0.54 at 512
tokens, 0.85 at 2k, 1.04 at 16k). It replaces the middle of the abstract's 50-73% ([fa2-kernel]: 1.05 at every
length), which is the forward alone at its best; the forward and backward together reach 0.28-0.61 of peak."""
FA2_H100_CURVE = bench_curve(989.0, {64: (141, 192, 232, 257, 273, 284), 128: (163, 221, 265, 294, 308, 328)})
"""[fa2-bench]: FlashAttention-2 on an H100, causal: 0.24-0.57 of peak in the model's terms (heads of 128: 0.46 at 2k,
0.57 at 16k; [fa3]'s "35%" is 0.60)."""
TRITON_A100 = causal_kernel_efficiency(0.37, 0.25)
"""[triton-perf]: Triton's causal fused attention on A100, forward 0.37 and backward 0.25: 0.47 of peak in the
model's terms (measured on a CI machine whose 8k matmuls ran at 0.77 of peak, where Triton's file notes 'about 90%'
elsewhere: a kernel on a faster A100 may reach more). One rate at every length: [fa2-bench]'s bars for the Triton
port (0.27-0.44 in these terms, flat from 2k on) put LLM Foundry's long-context runs 3-5 points slower than they ran
(bench/published/llm_foundry_context.toml 79 of 98 within 15%, not 88): those runs' Triton was faster."""
REFERENCE_POINT = (2048, 128)
"""Where a kernel's curve is read for its one figure per device (``AttentionKernel.efficiency``): 2,048 tokens, heads
of 128."""
FA2_A100 = curve_rate(FA2_A100_CURVE, *REFERENCE_POINT)
"""FlashAttention-2's one figure on an A100 (``FA2_A100_CURVE`` at ``REFERENCE_POINT``): 0.85 of peak in the model's
terms, where SDPA runs it (``ATTENTION_KERNELS['sdpa']``)."""
FA2_FORWARD = kernel_forward_share(0.5, 0.5)
"""FlashAttention-2's forward share, its passes at the same fraction of peak ([fa2-bench] times them together): 2/7,
its backward doing 2.5 times the forward's FLOPs."""
TRITON_A100_FORWARD = kernel_forward_share(0.37, 0.25)
"""Triton's on A100 ([triton-perf]'s two passes): 0.21."""
_FLASH2_CURVES = {"A100": FA2_A100_CURVE, "A100-40GB": FA2_A100_CURVE, "H100": FA2_H100_CURVE, "H200": FA2_H100_CURVE}
SCORE_PASSES: dict[str, tuple[int, int]] = {"eager": (6, 7), "fused-softmax": (2, 3)}
"""Element passes over each head's T x T scores, forward and backward, by the memory-bound kernels of an attention that
materializes them (``Calibration.score_passes``). ``eager``: eager PyTorch's unfused causal attention, as minGPT's
``CausalSelfAttention`` (karpathy/minGPT ``mingpt/model.py``: ``(q @ k.transpose(-2, -1)) * scale``, ``masked_fill``,
``F.softmax``, then ``att @ v``) and Hugging Face's GPT-2 ``_attn`` run it: the scale, the mask and the softmax each
read and write the scores (6); backward, the softmax's reads its output and the gradient and writes one (3), the
mask's and the scale's read and write one each (4). ``fused-softmax``: the same batched matmuls with the scale, the
causal mask and the softmax fused into one kernel that reads the scores and writes the probabilities (2), and
backward reads the probabilities and their gradient and writes the scores' (3): Megatron-LM's
``ScaledUpperTriangMaskedSoftmax`` (``megatron/fused_kernels/scaled_upper_triang_masked_softmax.h``, forward
``scaled_upper_triang_masked_softmax_warp_forward``, backward ``..._warp_backward``), which Megatron-DeepSpeed runs
where no flash attention is asked for (and cannot be on a V100), and DeepSpeed's transformer kernel's softmax
(``csrc/transformer/softmax_kernels.cu``: in place over the scores, then its backward from the output and its
gradient). Dropout on the probabilities, where a run has it, adds 2 and 3 more, and is not charged."""
ATTENTION_KERNELS: dict[str, AttentionKernel | None] = {
    "matmul": None,
    "eager": None,
    "fused-softmax": None,
    "flash2": AttentionKernel.from_curves(
        _FLASH2_CURVES, "[fa2-bench] on A100 (both A100 parts: the same SMs and clocks) and on H100 (and the H200: the "
        "same SMs and peak; attention's FLOPs do not wait on HBM)", dict.fromkeys(_FLASH2_CURVES, FA2_FORWARD)),
    "triton": AttentionKernel({"A100": TRITON_A100, "A100-40GB": TRITON_A100}, "[triton-perf]",
                              {"A100": TRITON_A100_FORWARD, "A100-40GB": TRITON_A100_FORWARD}),
    "sdpa": AttentionKernel({"A100": FA2_A100, "A100-40GB": FA2_A100,
                             "H100": H100_ENGINE_ATTENTION, "H200": H200_ENGINE_ATTENTION},
                            "PyTorch's scaled_dot_product_attention as zerotune's engine calls it: cuDNN's attention "
                            "on Hopper, measured (H100_ENGINE_ATTENTION, H200_ENGINE_ATTENTION); FlashAttention-2 on "
                            "A100, where SDPA has no cuDNN backend by default ([fa2-bench])",
                            {"A100": FA2_FORWARD, "A100-40GB": FA2_FORWARD, "H100": H100_ENGINE_ATTENTION_FORWARD,
                             "H200": H200_ENGINE_ATTENTION_FORWARD},
                            {"A100": FA2_A100_CURVE, "A100-40GB": FA2_A100_CURVE}),
}
"""The attention a run's kernels compute, by name (a table's ``attention``, ``profile_calibration``'s): ``matmul``
(charged at the stack's compute rate, as an unfused attention's batched matmuls, and a kernel without a published
rate, run), ``eager`` (those matmuls at that rate, and the scale, mask and softmax over the scores between them as
memory-bound kernels: ``SCORE_PASSES``), ``fused-softmax`` (the same with the three fused in one kernel:
Megatron-class stacks without flash attention), ``flash2`` (FlashAttention-2: its own package, and PyTorch's SDPA, whose
flash backend it is from PyTorch 2.2 on), ``triton`` (Triton's fused attention, and the FlashAttention port in Triton
that LLM Foundry's ``attn_impl: triton`` runs, by inference: it is built on the same tutorial kernel), ``sdpa``
(zerotune's engine: SDPA with the backend PyTorch picks on each device). ``python bench/attention_rate.py`` measures
a device's rate in both terms, the way a figure is added here."""
STACK_ATTENTION = {"zerotune": "sdpa", "flash": "flash2", "megatron": "fused-softmax"}
"""The attention kernel a stack runs where a run names none (``profile_calibration``, a table's default): zerotune's
engine its SDPA, a FlashAttention-2 stack FlashAttention-2, a Megatron-class stack its fused softmax between batched
matmuls (Megatron-DeepSpeed's default); any other, ``matmul`` (eager PyTorch ran all kinds: a run names its own, as
a Megatron-class run with flash attention does)."""
FIGURE_ATTENTION = {**STACK_ATTENTION, "pytorch": "flash2"}
"""The attention kernel of the runs each stack's figure came from: [ibm-fsdp]'s SDPA (FlashAttention-2 on A100 and
H100 with PyTorch 2.2), [fa2]'s own, zerotune's engine's SDPA (its own measured figures on Hopper; elsewhere it
takes the ``pytorch`` figure, whose kernel SDPA is too); Megatron's 1T run ([megatron-sc21], 2021: before flash
attention) and DeepSpeed's BERT ([ds-bert], its transformer kernel) ran their fused softmax between batched
matmuls."""


def _kernel(kernel: str) -> AttentionKernel | None:
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention={kernel!r}: must be one of {list(ATTENTION_KERNELS)}")
    return ATTENTION_KERNELS[kernel]


def attention_efficiency(kernel: str, device: str, model: ModelSpec | None = None) -> float:
    """``ATTENTION_KERNELS[kernel]``'s rate on ``device`` in the model's terms (for ``model`` where its curve has one;
    None: at ``REFERENCE_POINT``); 0: charged at the compute rate."""
    found = _kernel(kernel)
    return found.efficiency(device, model) if found else 0.0


def attention_forward_share(kernel: str, device: str) -> float:
    """``ATTENTION_KERNELS[kernel]``'s forward's share of its time on ``device``; 0: the FLOPs' third."""
    found = _kernel(kernel)
    return found.forward_share(device) if found else 0.0


def with_attention(calib: Calibration, kernel: str, device: str) -> Calibration:
    """``calib`` with its runs' attention ``kernel`` on ``device``: the kernel's rate and its forward's share, always
    set together (``profile_calibration``, and a table that names the kernel of a preset's runs)."""
    found = _kernel(kernel)
    return dataclasses.replace(calib, attention_efficiency=attention_efficiency(kernel, device),
                               attention_forward_share=attention_forward_share(kernel, device),
                               attention_curve=found.curves.get(device, ()) if found else (),
                               score_passes=SCORE_PASSES.get(kernel, (0, 0)))
