"""The device profiles behind the cluster presets, every constant with its hardware-level source: peak, memory, the
fraction of peak each software stack reaches (and the published runs it was read off), the memory-bound rates, and the
bytes of the optimizer's and quantization's passes.

A preset's calibration (``rates.Calibration``) is built from the profiles of its device here and of each level's
links (``links``) by ``profiles.profile_calibration``; a fitted calibration (``zerotune calibrate``) replaces it for a
cluster this service can measure. No constant here was fitted to the strategy comparisons that
``bench/published.py`` reports: they come from GEMM and memory-bandwidth benchmarks, the engine's own profiles and
published training utilisation of each device (the links' and the collective libraries' from ``links``, the
attention kernels' from ``attention``).

Sources (cited by key below, in ``rates``, ``links`` and ``presets``; the collective libraries' and link benchmarks',
[nccl-tuning], [rccl-tuning], [nccl-tree], [nccl-netoverhead], [nccl-tests#...], [mi250x-ifabric] and [lumi-rccl],
are ``links``'s):
- [olcf-frontier] OLCF Frontier user guide: GCDs of one MI250X 200 GB/s, across packages 50-100
  GB/s, 4 × 25 GB/s Slingshot-11 NICs per node (12.5 GB/s per GCD), 64 GB HBM2e per GCD.
- [ds-fetch] deepspeedai/DeepSpeed ``deepspeed/runtime/zero/partitioned_param_coordinator.py``
  (00a31c99): ``fetch_sub_module`` issues ``__all_gather_params`` for the parameters of the sub-module
  about to run (one ``all_gather_coalesced`` per call), then prefetches parameters from the recorded
  trace until ``stage3_prefetch_bucket_size`` elements are in flight, by the same call.
- [liger-layernorm] linkedin/Liger-Kernel ``benchmark/data/all_benchmark_data.csv`` at ead96b61: the eager
  ``torch.nn.LayerNorm`` rows ('layer_norm', provider 'huggingface', M = 4096, fp32, N = 1,024 to 16,384) on
  "NVIDIA A100-SXM4-80GB" (liger 0.2.1) and "NVIDIA H100 80GB HBM3" (liger 0.6.0), timed by ``triton.testing.do_bench``.
- [megatron-sc21] Narayanan et al. 2021 (arXiv 2104.04473): 163 TFLOPS per A100 = 52% of peak.
- [fa2] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (arXiv
  2307.08691), Table 1: GPT-style models trained on 8 A100 80GB SXM4 with FlashAttention-2 and the fused
  kernels of its repository (Dao-AILab/flash-attention ``training/configs/experiment/pile/gpt3*-flash*.yaml``:
  fused MLP, fused dropout-add-LayerNorm, fused cross-entropy; DDP with a ZeRO-1 optimizer), GPT3-2.7B at
  2k context 205 TFLOPS per GPU (GPT3-1.3B 196; at 8k 220-225, up to "72% model FLOPs utilization"), counting
  6·params + 12·layers·hidden·seqlen FLOPs per token (the attention not halved for the causal mask);
  the same table's baseline without FlashAttention ran 142-149 at 2k.
- [megatron-core] Megatron-LM README (d98e8a64): "up to 47% Model FLOP Utilization (MFU) on H100".
- [ds-zero3-offload] DeepSpeed blog 2021-03-07 (deepspeed.ai/2021/03/07/zero3-offload.html):
  "standard data parallel training with PyTorch can only achieve 30 TFlops per GPU" (V100).
- [ds-bert] DeepSpeed blog "Microsoft DeepSpeed achieves the fastest BERT training time" (2020-05-28,
  deepspeedai/DeepSpeed ``docs/_posts/2020-05-28-fastest-bert-training.md``): BERT-Large on one V100
  with DeepSpeed's fused transformer kernels, "as high as 64 and 53 teraflops throughputs
  (corresponding to 272 and 52 samples/second) for sequence lengths 128 and 512", gradient
  accumulation 10; only the masked 15% of tokens reach the output projection.
- [mamf] stas00/ml-engineering ``compute/accelerator/README.md``, maximum achievable matmul FLOPS:
  A100 271.2 (86.9%), H100 794.5 (80.3%), MI250X one GCD 147.0 TFLOPS (76.7%, ROCm 6.2, at 15791b3).
- [ibm-fsdp] PyTorch blog "Maximizing training throughput using PyTorch FSDP" (2024-03-13), Table 1:
  a Llama-2-shaped 7B, batch 2 x 4096 tokens, no checkpointing, PyTorch FSDP/HSDP with SDPA: MFU 0.57
  on 128 A100 and 0.37 on 96 H100 (its larger models and bench/published/ibm_fsdp.toml hold the rest).
- [overlap-2507.03114] Lee et al., "Characterizing Compute-Communication Overlap" (arXiv
  2507.03114): compute overlapped with collectives runs 18.9% slower on average (A100, H100, MI250).
- [nersc-perlmutter] NERSC, docs.nersc.gov/systems/perlmutter/architecture: GPU nodes with 1 AMD EPYC
  7763, 4 A100 (40 GB on 1,536 nodes, 80 GB on 256) joined by third-generation NVLink (4 links, 100 GB/s
  per direction, between each pair), 4 HPE Slingshot-11 NICs (200 Gb/s each, one per GPU).
- [dgx-a100] NVIDIA DGX A100 user guide: 8 A100 on NVSwitch (12 NVLink3 links each), 8 single-port
  ConnectX-6 200 Gb/s HDR NICs for the compute fabric, each on a PCIe switch with a pair of GPUs, 2
  AMD EPYC 7742 hosts.
- [stream-azure] Azure/AI-benchmarking-guide ND H100 v5 / ND A100 v4 results: STREAM copy/triad
  reach 87-89% (H100) and 79-83% (A100) of datasheet HBM bandwidth.
- [h200] NVIDIA H200 Tensor Core GPU datasheet: H200 SXM 141 GB HBM3e at 4.8 TB/s, the H100 SXM's dense
  16-bit 989 TFLOPS and NVLink (900 GB/s per GPU); NVIDIA DGX H200: 8 H200 on NVSwitch, 8 single-port
  ConnectX-7 400 Gb/s NICs and two Intel Xeon Platinum 8480C, the DGX H100's network and hosts.
- Peaks: NVIDIA V100 / A100 / H100 SXM datasheets (125 / 312 / 989 dense 16-bit TFLOPS; HBM 900 /
  2,039 / 3,350 GB/s); AMD MI250X 383 TFLOPS per package = 191.5 per GCD, 1.6 TB/s per GCD
  [olcf-frontier].
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass
from typing import Any

from zerotune.core.spec import ModelSpec
from zerotune.costmodel.gemm import EAGER_BLOCK_FLOOR_S, memory_line
from zerotune.costmodel.traffic import attention_flops, pass_seconds

OVERLAP_SLOWDOWN = 0.19
"""Compute beside running collectives is 18.9% slower on average [overlap-2507.03114]."""
STREAM_FRACTION = 0.85
"""A memory-bound kernel reaches ~85% of datasheet HBM bandwidth (STREAM: 79-89%) [stream-azure]."""
H200_EAGER_MEMORY_FRACTION = round(memory_line("H200")[0] / 4800e9, 2)
"""The fraction of datasheet HBM bandwidth eager PyTorch's memory-bound kernels stream the bytes ``traffic`` counts
at on an H200: the slope of their device time against those bytes over micro-batches of 1, 2, 4 and 8 sequences of
gpt-1.3b in bf16 on one H200 (``python bench/kernel_split.py``, kept in
``bench/data/h200-kernels/kernel_split-gpt-1.3b.json``; ``gemm.memory_line``), 0.55 of its 4.8 TB/s, their fixed
cost per block charged apart (``gemm.EAGER_BLOCK_FLOOR_S``). Each micro-batch's time over its bytes, the fixed cost
in it, gave 0.46-0.54 (median 0.50, this constant until the fixed cost was charged apart). The same run's add of two
2 GiB tensors reached 0.82 (STREAM's figure, ``STREAM_FRACTION``), its LayerNorm 0.49: PyTorch's LayerNorm, GELU,
softmax and reduction kernels do not stream at the add's rate. Devices never measured keep ``STREAM_FRACTION``."""
H100_EAGER_MEMORY_FRACTION = round(memory_line("H100")[0] / 3350e9, 2)
"""The same figure on an H100 SXM (80 GB HBM3 at 3.35 TB/s), the same command on one H100
(``bench/data/h100-kernels/kernel_split-gpt-1.3b.json``): the slope gives 0.67 of its HBM bandwidth (each
micro-batch's time over its bytes, the fixed cost in it: 0.57-0.66, median 0.62, this constant until the fixed cost
was charged apart). On the H200's 43% faster HBM3e the same kernels stream 16% faster and reach a smaller fraction
of it; the fixed cost is the same on both (1.41 ms a forward and backward of the model)."""
LIGER_LAYERNORM_MS: dict[int, tuple[float, float]] = {
    1024: (0.118848, 0.080256), 2048: (0.196640, 0.133152), 4096: (0.431424, 0.241760),
    8192: (0.829584, 0.483264), 16384: (1.621280, 0.950576),
}
"""Eager ``torch.nn.LayerNorm`` forward and backward ('huggingface' provider, mode 'full', median ms) on 4,096 rows
of N fp32 values, by N: (A100-SXM4-80GB, H100 80GB HBM3) [liger-layernorm]."""
A100_OVER_H100_EAGER = statistics.median(h100 * 3350.0 / (a100 * 2039.0)  # the two parts' datasheet GB/s
                                         for a100, h100 in LIGER_LAYERNORM_MS.values())
"""The fraction of its datasheet HBM bandwidth the same eager kernel reaches on an A100 SXM over the fraction it
reaches on an H100 SXM (the same bytes: the ratio of times x the ratio of bandwidths, 3,350 / 2,039 GB/s), median of
``LIGER_LAYERNORM_MS``' five shapes: 0.96 (0.92-1.11; the forward alone 0.89-1.14)."""
A100_EAGER_MEMORY_FRACTION = round(H100_EAGER_MEMORY_FRACTION * A100_OVER_H100_EAGER, 2)
"""The fraction of datasheet HBM bandwidth eager PyTorch's memory-bound kernels reach on an A100, for the bytes
``traffic`` counts: the H100's measured 0.67 (``H100_EAGER_MEMORY_FRACTION``, every kernel of the engine's step)
re-based by ``A100_OVER_H100_EAGER``, as no GPU run of the engine on an A100 is kept here: 0.64 (0.60 while the
H100's figure held the kernels' fixed cost, now ``Device.eager_block_floor_s``). The published eager
figures on A100 agree: torch's LayerNorm 936-993 GB/s forward and 480-750 backward (allenai/OLMo#258, 0.24-0.49 of
the 80 GB part's 2,039 GB/s), and [liger-layernorm]'s A100 rows, counting 8 bytes an element forward (x read, y
written) and 20 forward and backward (and x, dy read, dx written): 0.48-0.57 forward, 0.35-0.42 both;
the adds and GELUs of a step stream faster. It was ``STREAM_FRACTION`` (0.85, a copy kernel's) until then. The 40 GB
part keeps the same fraction of its 1,555 GB/s (same SMs; no eager figure names it)."""
H200_ENGINE_EFFICIENCY = 0.73
"""The fraction of dense bf16 peak zerotune's engine's matmuls reach on an H200: the same H200 runs
(``bench/kernel_split.py``), the matmuls' FLOPs over their kernels' device time, median of the four
micro-batches (0.70-0.77). A kernel-level figure of the engine itself, so no re-base (``gemm_efficiency``)
applies; the IBM FSDP figure (0.37 MFU of a whole 128-GPU run) stays the ``pytorch`` stack's. Its attention
runs at its own rate (``attention.H200_ENGINE_ATTENTION``); the two together were 0.70 of peak on that model."""
H100_ENGINE_EFFICIENCY = 0.76
"""The same figure on an H100 SXM (``bench/data/h100-kernels``): matmuls 0.72-0.77 of its 989 TFLOPS, median
0.76 (with the attention, 0.72)."""
QUANT_BYTES_PER_ELEM = 3.0
"""Block quantization reads a 16-bit element and writes one 8-bit code (dequantization the reverse):
~3 bytes of HBM traffic per element; the fp32 scale per 2048-element block is negligible."""
ADAMW_BYTES_PER_ELEM = 28.0
"""An fp32 AdamW update reads master, gradient, exp_avg, exp_avg_sq (4 × 4 B) and writes master,
exp_avg, exp_avg_sq (3 × 4 B): 28 bytes per element, memory-bound (torch's fused AdamW is one pass)."""


def step_pass_bytes(elem_bytes: int, clip: bool = True) -> float:
    """HBM bytes per optimizer-shard element of the step's passes around the AdamW update, as
    ``engine.step`` makes them: the reduced ``elem_bytes`` gradient upcast to fp32 (read + write; none
    in fp32), its norm (read 4 B), the clip's scaling (read + write 4 B, when clipping), the gradient
    shard zeroed (write), and the updated master cast to ``elem_bytes`` for the gathers (read 4 B +
    write). 16-bit training with clipping: 6 + 4 + 8 + 2 + 6 = 26 B. DeepSpeed's stage-3 step (unscale
    and clip, the fp16 copy) and FSDP2 with ``clip_grad_norm_`` make the same passes."""
    upcast = elem_bytes + 4 if elem_bytes < 4 else 0
    return upcast + 4 + (8 if clip else 0) + elem_bytes + 4 + elem_bytes


STEP_BYTES_PER_ELEM = ADAMW_BYTES_PER_ELEM + step_pass_bytes(2)
"""A 16-bit step with clipping moves 54 bytes per optimizer-shard element: AdamW's 28 and the 26 of
the passes around it. An H200 profile of the engine's step (gpt-1.3b at world 1, no clipping:
``bench/data/h200-1gpu/fused-adamw/b1.json``) spent 10.3 ms in the fused AdamW and 8.5 ms in the
upcast, norm, zeroing and cast over 1.32e9 elements."""
MEGATRON_MFU_PER_GEMM = (0.52 / 0.869 + 0.47 / 0.803) / 2
"""Transformer training reaches ~0.59 of the device's best GEMM rate: A100 0.52 of 0.869
[megatron-sc21, mamf], H100 0.47 of 0.803 [megatron-core, mamf] — two devices within 2% of each
other; used to carry a GEMM figure over to a device without a published training MFU."""


@dataclass(frozen=True)
class Device:
    """One accelerator: peak dense 16-bit TFLOPS, memory, and the fraction of peak training reaches.

    The fraction depends on the software as much as on the chip: Megatron-class stacks (fused kernels,
    Transformer Engine) and eager PyTorch (what zerotune's own engine and FSDP/torchtitan without
    compilation run) are published separately; a device without a PyTorch figure uses its Megatron one."""

    name: str
    peak_tflops: float
    memory_gib: float
    hbm_gbps: float
    """Datasheet memory bandwidth, GB/s: sets the rate of the memory-bound kernels (quantization, optimizer step)."""
    megatron_efficiency: float
    pytorch_efficiency: float | None
    source: str
    protocols: str = "nccl"
    """How its collective library picks protocols (``Calibration.protocols``): ``nccl`` for NVIDIA,
    ``rccl`` for AMD; also sets the base latency of its collectives (the Simple row's)."""
    ll_max_busbw_gbps: float | None = None
    """NCCL's cap on LL's bus bandwidth inside one node (``llMaxBws``, by GPU generation) [nccl-netoverhead]."""
    ring_plateau: float = 1.0
    """NCCL's ring all-reduce plateau for its compute capability: 1.9 on Volta, 1.4 from Ampere on [nccl-tree]."""
    flash_efficiency: float | None = None
    """The whole-step MFU of a FlashAttention-2 stack (the ``flash`` stack: FlashAttention-2 with fused MLP,
    LayerNorm and loss kernels) where one is published for this device; elsewhere the Megatron figure."""
    engine_efficiency: float | None = None
    """The fraction of peak zerotune's own engine's matmuls reach, where it was measured on this device's
    architecture (the ``zerotune`` stack; elsewhere the ``pytorch`` figure stands for it); its attention has
    its own measured rate there (``attention.ATTENTION_KERNELS["sdpa"]``)."""
    eager_memory_fraction: float = STREAM_FRACTION
    """The fraction of ``hbm_gbps`` eager PyTorch's memory-bound kernels reach (the ``zerotune`` and
    ``pytorch`` stacks; the fused kernels of the ``megatron`` and ``flash`` stacks keep ``STREAM_FRACTION``)."""
    eager_block_floor_s: float = 0.0
    """The fixed seconds of a block's eager memory-bound kernels per micro-step, beyond their bytes at
    ``eager_memory_fraction`` (``gemm.EAGER_BLOCK_FLOOR_S``, measured on the H100 and H200; the A100 takes it with the
    H100's eager rate, the same kernels launched by the same software): the ``zerotune`` and ``pytorch`` stacks
    only, where the fraction was read off the same profiles; 0 elsewhere (fused kernels, parts never profiled)."""
    measured_on: tuple[tuple[str, ModelSpec, str], ...] = ()
    """(stack, model, key in ``DEVICES`` of the device it ran on) for each efficiency whose source names its model:
    that figure is a whole step's, memory-bound kernels included, and ``compute_efficiency`` is re-based
    on it (``gemm_efficiency``). The figures of unnamed models are taken as they are: their sources'
    models are 10B parameters or more, where the memory-bound share of a step is 1-3%."""

    def _figure(self, stack: str) -> str:
        """The stack whose figure ``stack`` takes: its own; zerotune's engine, where it was not measured on
        this device, the eager PyTorch one; that, where none is published, Megatron's."""
        if stack not in STACKS:
            raise ValueError(f"stack={stack!r}: must be one of {list(STACKS)}")
        if stack == "zerotune" and self.engine_efficiency:
            return "zerotune"
        if stack == "flash" and self.flash_efficiency:
            return "flash"
        return "pytorch" if stack in ("zerotune", "pytorch") and self.pytorch_efficiency else "megatron"

    def efficiency(self, stack: str) -> float:
        figure = {"zerotune": self.engine_efficiency, "pytorch": self.pytorch_efficiency,
                  "flash": self.flash_efficiency}.get(self._figure(stack))
        return figure or self.megatron_efficiency

    def memory_fraction(self, stack: str) -> float:
        """The fraction of ``hbm_gbps`` the memory-bound kernels of ``stack`` reach."""
        return STREAM_FRACTION if stack in ("megatron", "flash") else self.eager_memory_fraction

    def memory_floor(self, stack: str) -> float:
        """The fixed seconds of a block's memory-bound kernels of ``stack`` per micro-step (``eager_block_floor_s``)."""
        return 0.0 if stack in ("megatron", "flash") else self.eager_block_floor_s

    def source_model(self, stack: str) -> tuple[ModelSpec, str] | None:
        """The model behind ``efficiency(stack)`` and the ``DEVICES`` key it ran on, if its source names one."""
        used = self._figure(stack)
        return next(((m, on) for k, m, on in self.measured_on if k == used), None)


def gemm_efficiency(mfu: float, model: ModelSpec, peak_tflops: float, memory_bytes_per_s: float,
                    attention_efficiency: float = 0.0, score_passes: tuple[int, int] = (0, 0)) -> float:
    """The fraction of peak the matmuls reach in a run of ``model`` whose whole step reached
    ``mfu``: the step's compute time (this model's FLOPs at ``mfu``) less its memory-bound kernels' time
    (``traffic.traffic`` in 16-bit at ``memory_bytes_per_s``) and, where the run's attention kernel has its
    own rate (``attention_efficiency``, 0: none), the attention's time at that rate, so that ``predict`` gives
    that model the published figure's compute time back, and a model of another shape its own share of
    memory-bound work and of attention. ``score_passes``: the run's kernels' passes over the attention scores
    (``attention.SCORE_PASSES``), memory-bound work of its own."""
    at_peak = pass_seconds(model, 2, peak_tflops * 1e12, memory_bytes_per_s, score_passes=score_passes)
    kernels = model.layers * at_peak.block_memory + at_peak.head_memory
    flops_s = at_peak.step(model.layers) - kernels  # its FLOPs at the whole peak
    if not attention_efficiency:
        return flops_s / (flops_s / mfu - kernels)
    attention_s = 3 * model.layers * attention_flops(model) / (peak_tflops * 1e12)  # forward and backward, at peak
    return (flops_s - attention_s) / (flops_s / mfu - kernels - attention_s / attention_efficiency)


IBM_FSDP_7B = ModelSpec("llama2-7b", layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, ffn_hidden=11008,
                        tied_head=False, arch="llama")
"""The model of [ibm-fsdp]'s 7B MFU, as bench/published/ibm_fsdp.toml writes it: Llama-2-7B (SwiGLU of width
11,008, its own LM head, vocab 32,000, 4,096-token sequences)."""

MEGATRON_1T = ModelSpec("megatron-1t", layers=128, hidden=25600, heads=160, vocab=51200, seq_len=2048)
"""The model of [megatron-sc21]'s 163 TFLOPS per A100 (its Table 1, 1,008B parameters: 128 layers of
hidden size 25,600, 160 heads, sequence 2,048; vocabulary 51,200)."""
GPT3_2_7B_2K = ModelSpec("gpt3-2.7b", layers=32, hidden=2560, heads=32, vocab=50257, seq_len=2048)
"""The model of [fa2]'s 205 TFLOPS per A100: GPT3-2.7B (32 layers of hidden 2,560; its repository's config
``gpt3-2.7B-flash.yaml``), GPT-2's vocabulary, 2,048-token context."""
FA2_A100_TFLOPS = 205.0
"""[fa2] Table 1: GPT3-2.7B at 2k context with FlashAttention-2 on 8 A100 80GB, TFLOPS per GPU."""
A100_SOURCES = (("pytorch", IBM_FSDP_7B, "A100"), ("megatron", MEGATRON_1T, "A100"), ("flash", GPT3_2_7B_2K, "A100"))
"""All three A100 figures were measured on A100 80GB."""
BERT_LARGE_512 = ModelSpec("bert-large", layers=24, hidden=1024, heads=16, vocab=4578, seq_len=512)
"""The model of [ds-bert]'s 53 TFLOPS on one V100: BERT-Large (24 layers, hidden 1,024, 16 heads) at
sequence 512, its 30,522-word output projection run on the masked 15% of tokens only, which is the
FLOPs and loss bytes per token of all tokens through 4,578 rows."""
V100_BERT_SAMPLES_PER_S = 52.0
"""[ds-bert]: BERT-Large sequences per second on one V100 at sequence 512."""


@dataclass(frozen=True)
class SourceRun:
    """The published run a device's efficiency figure was measured in, as the model predicts it, so the
    efficiency is re-based on the run's whole step (its exposed communication and the slow-down of
    compute beside its collectives too), not on its compute alone."""

    levels: tuple[tuple[str, int, str, float | None], ...]
    """(level, size, link key in ``LINKS``, bandwidth per rank in GB/s or None for the link's own) innermost first."""
    strategy: tuple[tuple[str, Any], ...]
    """The fields ``catalog.build_strategy`` builds its strategy from."""
    micro_batch: int
    tokens_per_s_per_gpu: float
    """What the run measured: the step the model is held to (its MFU, computed with the source's own
    FLOP count, says the same only roughly: [ibm-fsdp]'s 0.57 on A100 is 4% more than its 3,700 tokens/s
    with this model's FLOPs)."""
    rings: str
    outer_reduce: str


IBM_HSDP = (("preset", "mics"), ("allgather_bucket_mb", 1), ("reduce_bucket_mb", 1))
"""HSDP as [ibm-fsdp]'s 7B ran it: shards within a node, replicas across nodes (MiCS's partitioning)."""
SOURCE_RUNS: dict[tuple[str, str], SourceRun] = {
    ("A100", "pytorch"): SourceRun((("node", 8, "nvlink3-nvswitch", None), ("inter-node", 16, "ib-hdr-200", 6.25)),
                                   IBM_HSDP, 2, 3700.0, "flat", "backward"),
    ("H100", "pytorch"): SourceRun((("node", 8, "nvlink4-nvswitch", None), ("inter-node", 12, "ib-ndr-400", 12.5)),
                                   IBM_HSDP, 2, 7500.0, "flat", "backward"),
}
"""The runs of [ibm-fsdp]'s 7B figures (128 A100 with 400 Gb/s per node, 96 H100 with 800 Gb/s; 8 GPUs per
node; HSDP at 2 sequences of 4,096 tokens per GPU; 3,700 and 7,500 tokens/s per GPU), by (key in
``DEVICES``, stack): the clusters, strategy, micro-batch and figure ``bench/published/ibm_fsdp.toml``
writes (a test holds the two equal). Megatron's 1T run
used tensor and pipeline parallelism, which the model does not express: its figure is re-based on its
compute alone."""

STACKS = ("zerotune", "pytorch", "megatron", "flash")
"""Software stacks with their own efficiencies: zerotune's engine (``ENGINE_STACK``; eager PyTorch, measured
on the devices ``Device.engine_efficiency`` names, else taking the ``pytorch`` figure), eager PyTorch
(FSDP, torchtitan without compilation), Megatron-class stacks (fused kernels, attention unfused: Megatron-LM
and Megatron-DeepSpeed before FlashAttention, DeepSpeed's ZeRO runtimes), and FlashAttention-2 stacks (fused
kernels with FlashAttention-2: its own GPT training, InternEvo; ``Device.flash_efficiency``, else the
Megatron figure)."""
ENGINE_STACK = "zerotune"

DEVICES: dict[str, Device] = {
    "V100": Device("NVIDIA V100 32GB", 125.0, 32.0, 900.0,
                   round(BERT_LARGE_512.flops_per_token() * V100_BERT_SAMPLES_PER_S * 512 / 125e12, 3), 30 / 125,
                   "[ds-bert]: DeepSpeed's fused kernels, BERT-Large at 52 sequences of 512 per second on one V100 "
                   "(53 TFLOPS); [ds-zero3-offload]: 'standard data parallel training with PyTorch can only achieve "
                   "30 TFlops per GPU'", ll_max_busbw_gbps=39.0, ring_plateau=1.9,
                   measured_on=(("megatron", BERT_LARGE_512, "V100"),)),
    "A100": Device("NVIDIA A100 80GB", 312.0, 80.0, 2039.0, 0.52, 0.57,
                   "[megatron-sc21]: 163 TFLOPS = 52%; [ibm-fsdp]: PyTorch FSDP 7B 0.57 MFU; [fa2]: FlashAttention-2 "
                   "GPT3-2.7B 205 TFLOPS; eager kernels: the H100's, re-based by [liger-layernorm] "
                   "(A100_EAGER_MEMORY_FRACTION)", ll_max_busbw_gbps=87.7,
                   eager_memory_fraction=A100_EAGER_MEMORY_FRACTION, eager_block_floor_s=EAGER_BLOCK_FLOOR_S,
                   ring_plateau=1.4, flash_efficiency=round(FA2_A100_TFLOPS / 312.0, 3), measured_on=A100_SOURCES),
    "H100": Device("NVIDIA H100 80GB", 989.0, 80.0, 3350.0, 0.47, 0.37,
                   "[megatron-core]: up to 47% MFU; [ibm-fsdp]: PyTorch FSDP 7B 0.37 MFU; zerotune's engine and "
                   "eager kernels measured on it (H100_ENGINE_EFFICIENCY, H100_EAGER_MEMORY_FRACTION)",
                   ll_max_busbw_gbps=141.0, ring_plateau=1.4, engine_efficiency=H100_ENGINE_EFFICIENCY,
                   eager_memory_fraction=H100_EAGER_MEMORY_FRACTION, eager_block_floor_s=EAGER_BLOCK_FLOOR_S,
                   measured_on=(("pytorch", IBM_FSDP_7B, "H100"),)),
    "MI250X": Device("AMD MI250X GCD", 191.5, 64.0, 1600.0, round(0.767 * MEGATRON_MFU_PER_GEMM, 3), None,
                     "[mamf] GEMM 76.7% of peak × MEGATRON_MFU_PER_GEMM (no published MFU of a training run on "
                     "MI250X outside the papers bench/published.py compares against)", protocols="rccl"),
}

DEVICES["A100-40GB"] = dataclasses.replace(
    DEVICES["A100"], name="NVIDIA A100 40GB", memory_gib=40.0, hbm_gbps=1555.0,
    source="the A100's efficiencies ([megatron-sc21], [ibm-fsdp], [fa2]: all measured on A100 80GB); 40 GB HBM2 "
           "at 1,555 GB/s (A100 datasheet)")
"""The A100 40GB: the A100 80GB's profile (peak, stack figures and the runs they came from, NVLink, NCCL's
tables) with its own memory."""

DEVICES["H200"] = dataclasses.replace(
    DEVICES["H100"], name="NVIDIA H200", memory_gib=141.0, hbm_gbps=4800.0,
    engine_efficiency=H200_ENGINE_EFFICIENCY, eager_memory_fraction=H200_EAGER_MEMORY_FRACTION,
    source="[h200]: the H100 SXM's peak and NVLink with 141 GB HBM3e at 4.8 TB/s; zerotune's engine and eager "
           "kernels measured on this device (H200_ENGINE_EFFICIENCY, H200_EAGER_MEMORY_FRACTION); the H100's "
           "published stack figures and their runs ([megatron-core], [ibm-fsdp]: on H100, the same SMs and peak)")
"""The H200 SXM: the H100's profile (peak, stack figures and the runs they came from, NVLink, NCCL's tables)
with its own memory [h200] and its own measured kernel rates."""


@functools.lru_cache(maxsize=256)
def device_key_of(name: str) -> str | None:
    """The key in ``DEVICES`` of the device ``name`` names (``torch.cuda.get_device_name``), else None: the
    profile whose key's words (``A100-40GB``: ``a100`` and ``40gb``) all appear in the name, the most specific
    one where several do (``NVIDIA A100-SXM4-40GB`` is the ``A100-40GB``, ``NVIDIA A100-SXM4-80GB`` the
    ``A100``). A PCIe or NVL card names no profile: the profiles are the SXM parts, and those cards run at other
    clocks and power with other memory (H100 PCIe: 756 dense BF16 TFLOPS and 2.0 TB/s against the SXM's 989 and
    3.35, NVIDIA H100 datasheet; A100 80GB PCIe: 1,935 GB/s against 2,039), so a caller asks for the figure.
    Memoized: ``profiles.calibration_for`` asks it for every prediction of a cluster that is no preset."""
    low = name.lower()
    if "pcie" in low or "nvl" in low.split():
        return None
    fits = [k for k in DEVICES if all(w in low for w in k.lower().split("-"))]
    return max(fits, key=lambda k: len(k.split("-"))) if fits else None


def device_of(name: str) -> Device | None:
    """The profile of the device ``name`` names (``device_key_of``), else None."""
    key = device_key_of(name)
    return DEVICES[key] if key is not None else None


def peak_tflops_of(name: str) -> float | None:
    """The datasheet dense 16-bit peak of the device ``name`` names (``device_of``), else None."""
    d = device_of(name)
    return d.peak_tflops if d else None
