"""Bytes per rank by category, from the schedule's bucket lengths (the accountant's categories).

With e = bytes per element of the run's dtype and S_k the ranks of span k, summed over buckets of
padded length n: P = n·e/S_P, G = n·e/S_G (4·n/S_G with fp32 reductions, ``grad_bits`` 32),
OS = 12·n/S_O (fp32 master, exp_avg, exp_avg_sq), hpZ = n·e/S_H per block bucket — for ZeRO-3,
(2 + 2 + 12)·Ψ/N with 16-bit e (ZeRO, Rajbhandari et al. 2020, §5).

Activations per micro-batch of t = B·T tokens, per block: (6h + 2k)·t·e + 2·t·f·e saved tensors (two LN
inputs and outputs, the QKV output (h + 2k, k = ``ModelSpec.kv``: 3h without grouped-query attention, so
8·t·h·e), the attention output, the GELU input and output; cf.
Korthikanti et al. 2022 §4, without dropout) plus fp32 LayerNorm statistics and attention
log-sum-exp; only the block input t·h·e with checkpointing (on every ``checkpoint_every``-th block, the others
keeping all of theirs); with selective checkpointing the block input, the
outputs of the matmuls it keeps (``traffic.kept_matmuls``: GPT's qkv and fc, a Llama's wq, wv, w1 and w2), the
attention's output and its log-sum-exp — what torch's selective-checkpoint cache holds; the head keeps the final LN's
input and output and the fp32 log-softmax (t·V·4); the embedding keeps the token and position ids.
A Llama block keeps 8·t·h + (6h + 2k)·t·e + 4·t·f·e: each RMSNorm's input in fp32 (its own cast: the run's
input itself in fp32), normalized value, output and fp32 rstd, the rotated q and k, v, the attention output, and
the SwiGLU's two projections, silu and product; its head the final RMSNorm's four and the log-softmax; the
rotary cos and sin tables once per run.
The predicted ``activations`` add the head's backward transient, t·V·(4 + e): when backward starts,
every activation is still held, and the cross-entropy's backward allocates the fp32 gradient of the
log-probabilities and then the run-dtype gradient of the logits beside them — the step's largest
temporary, which the accountant (saved tensors only) does not book. Measured on one H200 (gpt-1.3b,
bf16, micro-batches of 1-8 sequences of 2,048 tokens: bench/data/h200-1gpu/report.txt), the
prediction without it was 3.6-10.6% under ``torch.cuda.max_memory_allocated``, the gap growing as t·V.
A run whose loss is one fused kernel (``Calibration.loss_kernel = "fused"``: flash-attn's ``CrossEntropyLoss``,
which saves its run-dtype input and the rows' log-sum-exp) keeps t·V·e + 8·t for the head's loss in place of the
log-softmax, and its backward allocates only the logits' gradient, t·V·e. Megatron's vocabulary-parallel loss
(``vocab-parallel``, nanotron's) keeps its fp32 softmax, t·V·4 as the log-softmax, and works its backward in place on
it: only the cast back to the run's dtype is new, t·V·e.
Communication buffers: the root and (1 + prefetch) gathered buckets, and two reduce groups of full
gradients (the one staged for reduction in fp32 with ``grad_bits`` 32). A run by DeepSpeed's ZeRO-3
(``Calibration.gathers = "module"``) holds instead what its coordinator gathers at its fullest under the run's
stage-3 settings, and the gradients it stages in and beside its reduce bucket (``coordinator.held_bytes``).
Peak = their sum (an upper bound).

What fits is ``peak`` within the device's memory less the runtime's reserve (``runtime_reserve``), which the
allocator's counters never see: the device context, the collective library's buffers per communicator, and what the
caching allocator reserves beyond what it hands out. A request may set the reserve itself (``memory_reserve_gib``).
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from zerotune.core.records import (
    MEMORY_CATEGORIES,
    MemoryBytes,
    MemoryCategory,
    MemoryNote,
    MemoryReserve,
    Overflow,
    Prediction,
)
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import wire_elem_bytes
from zerotune.costmodel.hardware import device_key_of
from zerotune.costmodel.schedule import Schedule, Setup, build_schedule
from zerotune.costmodel.traffic import kept_matmuls
from zerotune.errors import SpecError

GIB = 2**30
MIB = 2**20
CATEGORIES = MEMORY_CATEGORIES


def schedule_state_memory(sched: Schedule, sizes: tuple[int, ...], s: Strategy, elem_bytes: int) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    prefix = [math.prod(sizes[:k]) for k in range(len(sizes) + 1)]
    s_p, s_g, s_o = prefix[s.param_span], prefix[s.grad_span], prefix[s.optim_span]
    out = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    grad_bytes = wire_elem_bytes(elem_bytes, s.grad_bits)  # fp32 reductions keep fp32 grad shards
    for n, k in sched.bucket_counts:
        out["params"] += k * (n // s_p * elem_bytes)
        out["grads"] += k * (n // s_g * grad_bytes)
        out["optim_states"] += k * 12 * (n // s_o)
    if s.secondary_span is not None:  # block buckets only: the root stays gathered
        out["secondary_params"] = sum(k * (n // prefix[s.secondary_span] * elem_bytes) for n, k in sched.block_counts)
    return out


def state_memory(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    return schedule_state_memory(build_schedule(model, cluster, s), cluster.sizes, s, elem_bytes)


def activation_memory(model: ModelSpec, s: Strategy, elem_bytes: int, loss: str = "torch") -> int:
    """Bytes autograd keeps for one micro-batch (see the module docstring), the loss computed by ``loss``
    (``traffic.LOSS_KERNELS``)."""
    t, h, f, e = s.micro_batch_size * model.seq_len, model.hidden, model.ffn, elem_bytes
    lse = t * model.heads * 4  # fp32 attention log-sum-exp
    if model.llama:
        # per RMSNorm its fp32 input, normalized value, output and fp32 rstd; q, k, v, the attention output; SwiGLU
        saved = 2 * (4 * t * h + 2 * t * h * e + t * 4) + ((2 * h + 2 * model.kv) * t + 4 * t * f) * e + lse
        head = 4 * t * h + 2 * t * h * e + t * 4  # the final RMSNorm's four
        # the rotary cos and sin tables (T x head size, one pair per run, saved by its first block's products)
        # (saved once any block keeps its activations)
        positions = 0 if s.checkpointed_blocks(model.layers) == model.layers else 2 * model.seq_len * model.head_dim * e
    else:
        # (6h + 2k)·t + 2·t·f in the run dtype, fp32 LayerNorm mean and rstd
        saved = ((6 * h + 2 * model.kv) * t + 2 * t * f) * e + 2 * 2 * t * 4 + lse
        head = 2 * t * h * e + 2 * t * 4  # the final LayerNorm's input and output, its statistics
        positions = model.seq_len * 8  # the position ids
    if s.recompute == "full":  # the block's input only
        checkpointed = t * h * e
    elif s.recompute == "selective":  # its input, the kept matmuls' outputs, the attention's output and lse
        checkpointed = t * e * (h + sum(out for _, out in kept_matmuls(model)) + h) + lse
    else:
        checkpointed = saved
    n = s.checkpointed_blocks(model.layers)  # the others keep every activation
    # the fp32 log-softmax and the loss; a fused loss keeps the run-dtype logits, their log-sum-exp and the losses
    head += t * model.vocab * 4 + 4 if loss in ("torch", "vocab-parallel") else t * model.vocab * e + 8 * t
    # ids are views of (B, T+1) token rows; flattening B > 1 rows of targets copies them
    embed = s.micro_batch_size * (model.seq_len + 1) * 8 + (t * 8 if s.micro_batch_size > 1 else 0) + positions
    return n * checkpointed + (model.layers - n) * saved + head + embed


def head_backward_transient(model: ModelSpec, s: Strategy, elem_bytes: int, loss: str = "torch") -> int:
    """Bytes the cross-entropy's backward allocates while every activation is held (module docstring); a fused
    loss writes only the logits' gradient, in the run's dtype."""
    return s.micro_batch_size * model.seq_len * model.vocab * ((4 if loss == "torch" else 0) + elem_bytes)


def memory_per_rank(model: ModelSpec, sched: Schedule, sizes: tuple[int, ...], s: Strategy,
                    elem_bytes: int, held: int | None = None, loss: str = "torch") -> MemoryBytes:
    """Every category and their sum ``peak`` (see the module docstring); ``held``: the communication buffers of a
    run by DeepSpeed's ZeRO-3, which are its own (``coordinator.held_bytes``; None: zerotune's engine, or a runner
    that holds whole buckets); ``loss``: the run's loss kernel (``traffic.LOSS_KERNELS``). The memory stage of
    ``predict``'s pipeline."""
    state = schedule_state_memory(sched, sizes, s, elem_bytes)
    if held is not None:
        comm_buffers = held
    else:
        staged = wire_elem_bytes(elem_bytes, s.grad_bits)
        gathered = (sched.root + (1 + s.prefetch_buckets) * max(sched.lengths, default=0)) if s.param_span else 0
        # two reduce groups: one autograd fills (run dtype), one staged for its reduction (the wire's width)
        comm_buffers = (gathered + sched.largest_group) * elem_bytes + sched.largest_group * staged
    activations = (activation_memory(model, s, elem_bytes, loss) + head_backward_transient(model, s, elem_bytes, loss))
    return {"params": state["params"], "secondary_params": state["secondary_params"], "grads": state["grads"],
            "optim_states": state["optim_states"], "comm_buffers": comm_buffers, "activations": activations,
            "peak": sum(state.values()) + comm_buffers + activations}


_MEMORY: dict[tuple, MemoryBytes] = {}
"""``memory_of`` by what it reads beside the schedule."""


def memory_of(setup: Setup, sched: Schedule, held: int | None) -> MemoryBytes:
    """``memory_per_rank`` of ``setup``'s strategy on ``sched`` (``held``: ``coordinator.Gathers.held``), memoized by
    schedule and what else it reads (the strategy's prefetch, micro-batch and recompute, the dtype and the loss
    kernel): the strategies of a search share them. A fresh dict per call."""
    s = setup.strategy
    key = (sched.key, setup.elem_bytes, s.prefetch_buckets, s.micro_batch_size, setup.recompute, setup.checkpointed,
           held, setup.calib.loss_kernel)
    known = _MEMORY.get(key)
    if known is None:
        if len(_MEMORY) > 65_536:
            _MEMORY.clear()
        known = _MEMORY[key] = memory_per_rank(setup.model, sched, setup.cluster.sizes, s, setup.elem_bytes, held,
                                               setup.calib.loss_kernel)
    return known.copy()


def clear() -> None:
    _MEMORY.clear()


DEVICE_CONTEXT_BYTES = 400 * MIB
"""The device context a training process holds outside the allocator: the CUDA driver's context with the kernels it
has loaded. "The first CUDA operation will create the CUDA context which uses around 400MB if CUDA >= 11.7 is used
and lazy module loading enabled (default in PyTorch)" (ptrblck, pytorch/pytorch#109888, 2023-09-23; "~300MB" in
#107667, where without lazy loading, before CUDA 11.7, it "took >1000MB"). No published figure was found for the HIP
runtime's context on an MI250X GCD: ROCm devices are booked the same until one is measured."""

CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""cuBLAS's workspace as PyTorch sets it per handle and stream (its default ``CUBLAS_WORKSPACE_CONFIG`` of
``:4096:2:16:8``, two 4 MiB and eight 16 KiB buffers): 8,519,680 bytes, the fixed allocation a matmul adds to
``torch.cuda.memory_snapshot()`` ("It always occupies this fixed size: 8519680B", discuss.pytorch.org/t/178671).
It is allocated through the caching allocator, yet it is no tensor the cost model books."""

BLASLT_WORKSPACE_BYTES = {"H100": 32 * MIB, "H200": 32 * MIB, "A100": 4 * MIB}
"""cuBLASLt's workspace PyTorch allocates per handle, by device: 32 MiB on Hopper, 4 MiB on an Ampere part of 24 GB
or more, else (and on ROCm, hipBLASLt) 1 MiB (``_parseChosenWorkspaceSize`` in aten/src/ATen/cuda/CUDABlas.cpp,
pytorch/pytorch#120925, after the cuBLAS API reference's recommended sizes)."""

NCCL_SIMPLE_BUFFER = 1 << 22
"""The Simple protocol's buffer per connection: ``DEFAULT_BUFFSIZE`` (1 << 22, 4 MiB) in NCCL's src/init.cc, the
default of ``NCCL_BUFFSIZE`` (NCCL's env.html: 4194304); RCCL's init.cc keeps the same."""
NCCL_LL_BUFFER = 8 * 512 * 8 * 16
"""LL's buffer per connection: ``DEFAULT_LL_BUFFSIZE`` = NCCL_LL_LINES_PER_THREAD (8) · NCCL_LL_MAX_NTHREADS (512) ·
NCCL_STEPS (8) · sizeof(ncclLLFifoLine) (16) = 524,288 bytes (src/init.cc, src/include/device.h)."""
NCCL_LL128_BUFFER = 120 * 640 * 8 * 8
"""LL128's buffer per connection: ``DEFAULT_LL128_BUFFSIZE`` = NCCL_LL128_ELEMS_PER_THREAD (120) ·
NCCL_LL128_MAX_NTHREADS (640) · NCCL_STEPS (8) · sizeof(uint64_t) = 4,915,200 bytes (src/init.cc)."""
NCCL_ALLOC_GRANULARITY = 2 * MIB
"""NCCL allocates its buffers with cuMem, in multiples of 2 MiB: a connection's three protocol buffers, 9.19 MiB,
come as one allocation of 10,485,760 bytes, as ``NCCL_DEBUG_SUBSYS=ALLOC`` shows on 8 H100s (NVIDIA/nccl#1685)."""
CONNECTION_BYTES = -(-(NCCL_SIMPLE_BUFFER + NCCL_LL_BUFFER + NCCL_LL128_BUFFER) // NCCL_ALLOC_GRANULARITY) \
    * NCCL_ALLOC_GRANULARITY
"""The buffers of one ring connection on one channel: 10 MiB. A rank of a ring holds one connection's worth per
channel (it receives from one peer; with P2P read the Simple buffer sits at the sender, which is the same rank's
other connection)."""
CHANNELS = 32
"""Channels per communicator: NCCL's ``MAXCHANNELS`` (32), which 8 H100s on NVSwitch reach (channels 00-31 per pair
of GPUs, NVIDIA/nccl#1685). An upper bound elsewhere: one RCCL log on MI250X nodes shows 4 tree channels at 8 ranks
(ROCm/rccl#1026), and a group over fewer or slower links gets fewer. Per communicator this books 32 · 10 MiB = 320
MiB, under what was measured per group on 4 A100s with NVLink (544 MB at 2 ranks, 688 MB at 3 and 4, with tree and
peer-to-peer connections beside the rings: NVIDIA/nccl#964). Not booked: trees (an all-reduce across nodes adds up to
three connections a channel), NVLink SHARP's buffers (NVLS, NVSwitch systems from NCCL 2.17; no published size
found), and the send/receive buffers of peer-to-peer calls, which no strategy here issues."""


class AllocatorPeaks(NamedTuple):
    """One published training run's caching-allocator peaks, in the unit its log prints: ``allocated``, the most torch
    handed out (``max_memory_allocated``; the peak of active memory where that is all the source gives, which is at
    least as large), and ``reserved``, the most it reserved from the device (``max_memory_reserved``). ``counted``:
    whether ``FRAGMENTATION`` takes the run's ratio; ``note``: why not, where it does not, or what else the source
    shows."""
    run: str
    engine: str
    allocated: float
    reserved: float
    source: str
    counted: bool = True
    note: str = ""

    @property
    def excess(self) -> float:
        """Reserved over allocated, less one: what the allocator held beyond its peak, per byte of that peak."""
        return self.reserved / self.allocated - 1


FRAGMENTATION_RUNS: tuple[AllocatorPeaks, ...] = (
    AllocatorPeaks("Mixtral 8x7B, 16 H100s (MB, after iteration 1, rank 1)", "Megatron-LM (Megatron-core)",
                   54250.98583984375, 61480.0, "https://github.com/NVIDIA/Megatron-LM/issues/756"),
    AllocatorPeaks("Qwen3-30B-A3B pretraining (bytes, global step 11, rank 0)", "NeMo 2 (Megatron-core)",
                   53930270720, 57675874304, "https://github.com/NVIDIA-NeMo/Speech/issues/14850"),
    AllocatorPeaks("Nemotron 12B DPO, sequence 5,500, 8 H100s, baseline row (GB)", "NeMo-RL DTensor (FSDP2)",
                   61.66, 67.69, "https://github.com/NVIDIA-NeMo/RL/pull/926"),
    AllocatorPeaks("DeepSeek-V3 proxy (14 layers), TP1 PP4 EP16, H100s, no offloading (MB, after 10 iterations, "
                   "rank 0, the stage with the highest peak; ranks 16/32/48: +12.5/+14.5/+16.9%)", "Megatron-LM",
                   65203.93359375, 74306.0, "https://github.com/NVIDIA/Megatron-LM/blob/"
                   "7d867ab9632a808c785a733d76af16176835be10/megatron/core/transformer/README.md"),
    AllocatorPeaks("Llama 2 70B, pure bf16, 16 A100-80GB (GB)", "FSDP (FSDP1, llama-recipes)",
                   42, 63, "https://github.com/meta-llama/llama-cookbook/issues/120",
                   note="its peak active memory, 59 GB, is 17 GB over the allocated peak: blocks freed but held for "
                        "another stream (FSDP1's record_stream), the larger part of this run's excess"),
    AllocatorPeaks("Llama 2 7B, 8 GPUs, use_cache=True (GB, peak active)", "FSDP (per-parameter prototype)",
                   14.93, 19.52, "https://github.com/meta-llama/llama-cookbook/pull/165"),
    AllocatorPeaks("Ling-mini-2.0 continual pretraining (MB, after iteration 1, rank 0)", "Megatron-LM (Ling-V2)",
                   63359.77001953125, 66802.0, "https://github.com/inclusionAI/Ling-V2/blob/"
                   "af8837e677a1aa36895845da084f9c91acf4fed2/docs/gpu_based_training.md", counted=False,
                   note="its script sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                        "(examples/pretrain/run_pretrain_8k.sh), which zerotune's runs do not"),
    AllocatorPeaks("GPT-2 2.6B, fp16, MP 2 x DP 8 on V100s (MB, after 5 iterations)", "Megatron-LM (2020)",
                   12606.06201171875, 17482.0, "https://github.com/NVIDIA/Megatron-LM/issues/60", counted=False,
                   note="all five iterations were skipped by the loss scaler, so no optimizer step had run: not a "
                        "steady-state peak"),
)
"""Published caching-allocator peaks of LLM training runs with sharded data parallelism, each as its log prints it
(Megatron's "memory (MB) | allocated | max allocated | reserved | max reserved" report after the first logged
iterations, NeMo's ``max_memory_reserved``/``max_memory_allocated`` per step, the peaks quoted beside an FSDP run):
reserved over allocated less one, counted runs +6.9% (Qwen3-30B-A3B), +9.8% (Nemotron 12B), +13.3% (Mixtral),
+14.0% (DeepSeek-V3 proxy), +30.7% (Llama 2 7B), +50% (Llama 2 70B); left out, +5.4% (expandable segments) and
+38.7% (no optimizer step yet)."""

FRAGMENTATION = statistics.median(r.excess for r in FRAGMENTATION_RUNS if r.counted)
"""What the caching allocator reserves beyond its peak allocation, per byte of that peak (max reserved over max
allocated, less one): the median over the counted runs of ``FRAGMENTATION_RUNS``, +13.6% (the mean of Mixtral's +13.3%
and the DeepSeek-V3 proxy's +14.0%; spread +6.9% to +50%), 12.0% of what the allocator reserves. The median, not a
high percentile, because the reserve decides what a user is told fits: the Megatron-core, NeMo and FSDP2 runs sit at
+7% to +14%, and the two runs above +30% are llama-recipes' FSDP fine-tunes of 2023, one of which shows
its excess as memory freed but held for another stream (its peak active memory 17 GB over its allocated peak: the
record_stream that FSDP1 and DeepSpeed's ZeRO use and FSDP2 does not, pytorch/pytorch#114299). A reserve at that tail
would refuse configurations that typical runs fit; a run that fragments like the tail can keep more with the request's
``memory_reserve_gib``. GMLake (Guo et al., ASPLOS 2024, arXiv 2401.08156, abstract: "15% (up to 33%) fragmentation",
a share of what is reserved: +18% to +49% of the peak) measured eight LLMs under LoRA, recomputation, ZeRO and
offloading, the workloads that fragment most: the heavy case, not the typical one. Published measurements of other
runs: the project's own GPU runs replace it when measured (run.json's ``cuda_max_reserved`` over
``cuda_max_allocated``, which ``bench/one_gpu.sh`` prints)."""


def communicators(sched: Schedule, sizes: tuple[int, ...], rings: str) -> int:
    """The communicators a run of ``sched`` creates on each rank: one per process group its collectives use, and the
    default group (the loss's all-reduce, the runners' own bookkeeping) where there are two ranks or more.
    ``rings``: ``hierarchical`` (zerotune's engine: a collective over levels lo..hi runs on each level's group, so one
    communicator per level of two ranks or more), ``flat`` (DeepSpeed, FSDP2: one group over the whole range). torch
    creates an NCCL communicator at a group's first collective, so a group no collective uses costs none."""
    colls = [*sched.fwd.values(), *sched.bwd.values(), *(c for pair in sched.reduce.values() for c in pair),
             *(c for four in sched.boundary.values() for c in four), *(c for cs in sched.outer.values() for c in cs)]
    spans = {c[1] for c in colls if c[1][0] <= c[1][1]}
    if rings == "hierarchical":
        groups = {(lv, lv) for lo, hi in spans for lv in range(lo, hi + 1) if sizes[lv - 1] > 1}
    else:
        groups = {(lo, hi) for lo, hi in spans if math.prod(sizes[lo - 1:hi]) > 1}
    return len(groups) + (1 if math.prod(sizes) > 1 else 0)


def runtime_reserve(setup: Setup, sched: Schedule, peak: int, reserve_gib: float | None = None) -> MemoryReserve:
    """What a rank of ``setup``'s run needs beside ``peak`` (the allocator's own): the device context and BLAS
    workspaces (``DEVICE_CONTEXT_BYTES``, ``CUBLAS_WORKSPACE_BYTES``, ``BLASLT_WORKSPACE_BYTES``), the collective
    library's ring buffers (``CHANNELS`` · ``CONNECTION_BYTES`` per communicator, ``communicators``) and the caching
    allocator's fragmentation (``FRAGMENTATION`` of the peak it hands out). A CPU cluster keeps
    none: gloo's buffers and the process live in host memory, which the CPU runs' figures already hold.
    ``reserve_gib``: the request's reserve, which replaces the total (the parts are still reported); it must be
    >= 0 and under the device's memory (``SpecError`` naming ``memory_reserve_gib``)."""
    cluster = setup.cluster
    if reserve_gib is not None:
        check_reserve(reserve_gib, cluster.device_memory_gib)
    if cluster.device == "cpu":
        context = collective = fragmentation = comms = 0
    else:
        lt = BLASLT_WORKSPACE_BYTES.get(device_key_of(cluster.device) or "", 1 * MIB)
        context = DEVICE_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + lt
        comms = communicators(sched, cluster.sizes, setup.calib.rings)
        collective = comms * CHANNELS * CONNECTION_BYTES
        fragmentation = int(peak * FRAGMENTATION)
    computed = context + collective + fragmentation
    total = computed if reserve_gib is None else int(reserve_gib * GIB)
    parts = (f"context {context / GIB:.2f} GiB, {comms} communicators' buffers {collective / GIB:.2f} GiB, "
             f"fragmentation {fragmentation / GIB:.2f} GiB")
    reason = (f"kept {total / GIB:.2f} GiB for the runtime: {parts}" if reserve_gib is None else
              f"kept {total / GIB:.2f} GiB for the runtime, as the request set (computed: {computed / GIB:.2f} GiB: "
              f"{parts})")
    return {"context_bytes": context, "collective_bytes": collective, "communicators": comms,
            "fragmentation_bytes": fragmentation, "total_bytes": total,
            "source": "computed" if reserve_gib is None else "request", "reason": reason}


def memory_note(p: Prediction, capacity_gib: float) -> MemoryNote:
    """What a prediction uses of a device of ``capacity_gib`` and what it kept for the runtime, in GiB and in words:
    what an answer says of its memory."""
    r = p["memory_reserve"]
    peak, headroom = p["memory_bytes"]["peak"] / GIB, p["headroom_bytes"] / GIB
    why = ("as the request set" if r["source"] == "request" else
           f"the device context {r['context_bytes'] / GIB:.2f} GiB, the buffers of {r['communicators']} "
           f"communicators {r['collective_bytes'] / GIB:.2f} GiB and the allocator's fragmentation "
           f"{r['fragmentation_bytes'] / GIB:.2f} GiB")
    left = f"{headroom:.1f} GiB to spare" if headroom >= 0 else f"{-headroom:.1f} GiB over"
    return {"peak_gib": peak, "capacity_gib": capacity_gib, "reserve_gib": r["total_bytes"] / GIB,
            "context_gib": r["context_bytes"] / GIB, "collective_gib": r["collective_bytes"] / GIB,
            "communicators": r["communicators"], "fragmentation_gib": r["fragmentation_bytes"] / GIB,
            "headroom_gib": headroom, "source": r["source"],
            "reason": f"peak {peak:.1f} GiB of {capacity_gib:g} GiB per rank, with {r['total_bytes'] / GIB:.1f} GiB "
                      f"kept for the runtime ({why}): {left}"}


def check_reserve(reserve_gib: float, capacity_gib: float) -> None:
    """Refuse (``SpecError`` naming ``memory_reserve_gib``) a reserve that is no number, below 0, or not under the
    device's memory."""
    if isinstance(reserve_gib, bool) or not isinstance(reserve_gib, int | float) or not math.isfinite(reserve_gib):
        raise SpecError("memory_reserve_gib", reserve_gib, "must be a finite number of GiB")
    if not 0 <= reserve_gib < capacity_gib:
        raise SpecError("memory_reserve_gib", reserve_gib,
                        f"must be >= 0 and under the device's memory ({capacity_gib:g} GiB)")


def overflow(memory: MemoryBytes, capacity_gib: float, reserve_bytes: int = 0) -> Overflow:
    """What to report when ``memory`` does not fit ``capacity_gib`` less ``reserve_bytes``: the largest category and
    by how much."""
    def size_of(category: MemoryCategory) -> int:
        return memory[category]

    category = max(CATEGORIES, key=size_of)
    over = memory["peak"] + reserve_bytes - int(capacity_gib * GIB)
    size = size_of(category)
    kept = f" less a {reserve_bytes / GIB:.1f} GiB reserve" if reserve_bytes else ""
    return {"category": category, "bytes": size, "over_by_bytes": over,
            "reason": f"needs {memory['peak'] / GIB:.1f} GiB of {capacity_gib:g} GiB{kept}; "
                      f"largest: {category} {size / GIB:.1f} GiB"}
