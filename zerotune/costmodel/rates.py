"""``Calibration``: the rates that turn bytes and FLOPs into seconds, and how each runner of a strategy
(zerotune's engine, DeepSpeed, FSDP) moves its bytes and waits for its host.

A cluster preset's calibration is built from its device's, links' and host's profiles
(``profiles.profile_calibration``); a fitted one (``zerotune calibrate``, ``costmodel.calibration``)
replaces it for a cluster this service can measure; custom and ``local:`` clusters take ``NOMINAL``.
Sources are cited by the keys of ``links``' docstring ([nccl-netoverhead]) and ``hardware``'s ([ds-fetch]).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

from zerotune.costmodel.traffic import BLOCK_KERNELS, LOSS_KERNELS

RINGS = ("hierarchical", "flat")
"""How multi-level collectives run (``Calibration.rings``)."""
PROTOCOLS = ("simple", "nccl", "rccl")
"""How a collective's protocol is chosen (``Calibration.protocols``)."""
OUTER_REDUCE = ("boundary", "backward")
"""Where the gradient reduction beyond ``grad_span`` runs (``Calibration.outer_reduce``)."""
GATHERS = ("bucket", "module")
"""How many all-gathers fetch a bucket's parameters (``Calibration.gathers``)."""
GRAD_REDUCE = ("reduce_scatter", "all_reduce")
"""How a runner that shards no parameters reduces a gradient bucket (``Calibration.grad_reduce``)."""
WEIGHT_SYNC = ("gather", "broadcast")
"""How the updated weights reach every rank after the optimizer step (``Calibration.weight_sync``)."""
STAGE3_SETTINGS = ("export", "defaults")
"""Which stage-3 prefetch, live and reuse settings a DeepSpeed run held its parameters under
(``Calibration.stage3_settings``)."""


@functools.lru_cache(maxsize=4096)
def curve_rate(curve: tuple[tuple[int, int, float], ...], seq_len: int, head_dim: int) -> float:
    """The rate ``curve`` (``Calibration.attention_curve``: (sequence length, head size, rate) points) gives a model
    of ``seq_len`` tokens and heads of ``head_dim``: along each measured head size, linear in log2 of the sequence
    length between its two nearest points; across head sizes, linear between the two that bracket ``head_dim``.
    Beyond the benchmark's ends the nearest measured point holds (a kernel's rate levels off at long sequences: the
    published curves gain 4-7% from 8k to 16k tokens)."""
    heads = sorted({head for _, head, _ in curve})

    def along(head: int) -> float:
        points = sorted((seq, rate) for seq, h, rate in curve if h == head)
        x = min(max(math.log2(seq_len), math.log2(points[0][0])), math.log2(points[-1][0]))
        for (s0, r0), (s1, r1) in itertools.pairwise(points):
            if x <= math.log2(s1):
                return r0 + (r1 - r0) * (x - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return points[-1][1]

    if head_dim <= heads[0] or len(heads) == 1:
        return along(heads[0])
    for h0, h1 in itertools.pairwise(heads):
        if head_dim <= h1:
            return along(h0) + (along(h1) - along(h0)) * (head_dim - h0) / (h1 - h0)
    return along(heads[-1])


@dataclass(frozen=True)
class MeasuredError:
    """How far a fitted calibration's predictions were from measured runs it was not fitted on
    (cross-validated: each run predicted by a fit of the others), as relative errors."""

    row_median: float
    """Median |predicted / measured - 1| of step times."""
    row_p90: float
    comparison_median: float
    """Median |predicted ratio / measured ratio - 1| over pairs of runs of the same model: the error of a decision."""
    comparison_p90: float
    runs: int
    source: str


NOMINAL_LINK_EFFICIENCY = 0.8
"""What collectives achieve of a level's bandwidth where nothing measured its links (a round figure, not a
measured constant): the nominal calibration's every level, and a custom cluster's levels that are no profiled
link's."""


@dataclass(frozen=True)
class Calibration:
    """The efficiencies that turn bytes and FLOPs into seconds (fitted, or a preset's profile).

    The defaults are the *nominal* calibration of clusters without a profile (custom and ``local:``
    clusters): round figures meant to be replaced by ``zerotune calibrate``, not measured constants."""

    name: str = "nominal"
    compute_efficiency: float = 0.45
    """Achieved fraction of ``peak_tflops`` on the model's kernels, recomputation included."""
    attention_efficiency: float = 0.0
    """Achieved fraction of ``peak_tflops`` on the attention's FLOPs as the model counts them (the whole
    T x T square, the backward twice the forward: ``traffic.attention_flops``), where the run's attention
    kernel has its own published rate on this device (``attention.ATTENTION_KERNELS``); 0 = at
    ``compute_efficiency``, as an unfused attention's batched matmuls run (and fitted calibrations, which
    measured both together)."""
    attention_forward_share: float = 0.0
    """The share of the attention kernel's forward-and-backward time its forward takes (``attention.ATTENTION_KERNELS``:
    a fused kernel's backward recomputes the scores and runs slower, so its forward takes less than the third its
    FLOPs give): what a recomputed forward pays again, and how the kernel's time splits between the passes. 0 = the
    FLOPs' third (no kernel rate, fitted and nominal calibrations)."""
    score_passes: tuple[int, int] = (0, 0)
    """Element passes over the T x T attention scores of each head the run's memory-bound kernels make, forward and
    backward (``attention.SCORE_PASSES``; ``traffic.traffic``): an unfused attention writes its scores to HBM and runs
    its scale, causal mask and softmax over them as kernels of their own. (0, 0): a fused kernel keeps them on chip."""
    attention_curve: tuple[tuple[int, int, float], ...] = ()
    """(sequence length, head size, rate) points of the run's attention kernel's published benchmark on this device,
    the rate in ``attention_efficiency``'s terms (``attention.ATTENTION_KERNELS``): a fused kernel's rate grows with the
    sequence (FlashAttention-2 on an A100, heads of 128: 0.54 of peak at 512 tokens, 1.04 at 16k in these terms) and
    with the head size, so a model's rate is read off the curve at its own (``attention_rate``); empty =
    ``attention_efficiency`` for every model."""
    bandwidth_efficiency: tuple[float, ...] = ()
    """Achieved fraction of each level's bandwidth, innermost first; empty = ``NOMINAL_LINK_EFFICIENCY`` for every
    level."""
    collective_efficiency: tuple[tuple[str, int, float], ...] = ()
    """(collective, level, fraction): where one collective was measured apart on a level
    (``Level.all_gather_busbw_gbps`` and its kin: ``profiles.with_measured_links``), what that collective achieves
    there instead of ``bandwidth_efficiency``'s."""
    latency_scale: float = 1.0
    """Multiplies every level's ``latency_us`` (per ring step)."""
    quant_elems_per_s: float = 1e11
    """Elements quantized or dequantized per second."""
    optimizer_elems_per_s: float = 5e10
    """Optimizer-shard elements stepped per second: the fp32 AdamW update and the passes around it
    (upcast, norm, clip, zeroing, the 16-bit cast: ``STEP_BYTES_PER_ELEM``)."""
    memory_bytes_per_s: float = 0.0
    """Rate of the model's memory-bound kernels (LayerNorms, GELU, residual adds, bias gradients, the
    loss over the vocabulary: ``traffic.traffic``), bytes per second; 0 = not charged apart, their
    time inside ``compute_efficiency`` (fitted calibrations, which measured it so, and the nominal one)."""
    gemm_curve: tuple[tuple[int, float], ...] = ()
    """(tokens per micro-batch, factor) points by which a model's matmuls run at ``compute_efficiency`` times the
    factor at its own micro-batch (``gemm.curve_factor``): the device's GEMM rate by tokens over its rate at the
    micro-batch of the run ``compute_efficiency`` was read off (``gemm.gemm_curve``; 1 on the GEMM plateau, below it
    for fewer tokens). Empty: every micro-batch at ``compute_efficiency`` (fitted and nominal calibrations)."""
    memory_floor_s_per_block: float = 0.0
    """Seconds a block's memory-bound kernels take per micro-step beyond their bytes at ``memory_bytes_per_s``: their
    launches and ramps, whatever the tokens (``gemm.EAGER_BLOCK_FLOOR_S`` for the eager stacks on the devices whose
    eager kernels were profiled; 0: fused kernels, fitted and nominal calibrations)."""
    overlap: float = 1.0
    """1 = the simulated schedule (communication hidden behind compute), 0 = everything serialized."""
    step_overhead_s: float = 0.0
    """Fixed cost per step (launches, host work)."""
    collective_launch_us: float = 0.0
    """Fixed cost of each primitive collective (one per level crossed): launch + the library's base latency."""
    overlap_slowdown: float = 0.0
    """κ: compute that runs beside a busy communication queue takes (1 + κ) times as long."""
    all_to_all_efficiency: float = 1.0
    """What an all-to-all (ZeRO++'s quantized gradient exchange) achieves of its level's ring rate:
    1 = as fast per byte as an all-gather. Pairwise exchanges can be slower (gloo over TCP measured
    0.2-0.4 of its rings' rate on emulated links here); ``fit(bandwidths="measured")`` reads it off
    run.json's seconds per level. The GPU profiles keep 1: no all-to-all busbw beside a ring's was
    found for their links."""
    rings: str = "hierarchical"
    """How a collective over several levels runs: ``hierarchical`` (zerotune's engine: one ring per
    level, one level after the other) or ``flat`` (one NCCL ring over every rank of the span, as
    DeepSpeed and FSDP issue it on their data-parallel group; ``timing.Costs._flat_ring``)."""
    protocols: str = "simple"
    """``simple``: every collective is charged the Simple protocol's latencies (as fitted calibrations
    and gloo runs are); ``nccl``: each collective the fastest of NCCL's ring protocols
    (``NCCL_RING_PROTOCOLS``), as NCCL picks them — the profiles of NVIDIA devices; ``rccl``: the
    fastest of RCCL's (``RCCL_RING_PROTOCOLS``) — the MI250X profile."""
    net_overhead_us: float = 0.0
    """Per-step network post overhead of the library's multi-node rings (``Host.net_overhead_us``):
    with ``protocols`` nccl or rccl, every step of a ring spanning 2+ nodes costs at least this (three
    times it under Simple) [nccl-netoverhead]. 0 for fitted calibrations and gloo."""
    ll_max_busbw_gbps: tuple[float, ...] = ()
    """LL's bus-bandwidth cap, GB/s, for a ring on 1 node, 2 nodes, more (``Device``/``Host``); empty = none."""
    ll128: bool = True
    """Whether the library may run LL128 (``Host.nic_beside_gpu``): NCCL enables it by default only then."""
    ring_plateau: float = 1.0
    """NCCL's multi-node Simple ring all-reduce pays its latency this many times (``Device.ring_plateau``)."""
    outer_reduce: str = "backward"
    """Where a step reduces gradients beyond ``grad_span``: ``backward`` (queued after each reduce
    group while the final micro-step's backward runs on: zerotune's engine, DeepSpeed's
    ``overlap_comm``, DDP's and HSDP's bucketed all-reduce on their accumulation boundary, AMSP's "AR
    overlap") or ``boundary`` (after the backward pass, serial: engines that reduce in their optimizer
    step)."""
    gathers: str = "bucket"
    """How a runner fetches a bucket's parameters: ``bucket`` (one all-gather per bucket: zerotune's
    engine, and FSDP2's ``fully_shard`` per block, which gathers a block's parameters into one buffer)
    or ``module`` (one per sub-module that holds partitioned parameters: DeepSpeed ZeRO-3's
    ``fetch_sub_module`` gathers the parameters of the module about to run with one coalesced
    all-gather, and prefetches the next ones by the same calls [ds-fetch]). Of the project's GPT block
    that is four all-gathers (qkv, proj, fc, out; its LayerNorms hold fewer elements than
    ``stage3_param_persistence_threshold``, 1e5 by default, and stay gathered). The bytes are the
    same; a block pays four collectives' latency instead of one, which is what a ring over a whole
    large data-parallel group is made of. After each optimizer step ``module`` also gathers the persistent
    parameters (LayerNorms and biases, kept whole on every rank), one small all-gather each, at the step
    boundary (``runners.persistent_params``; DeepSpeed's ``_post_step``, counted on DeepSpeed 0.19.8). No
    prefetch is credited to ``module``: DeepSpeed's published
    ZeRO-3 and ZeRO++ figures show the gathers exposed, and its developers' own timelines of ZeRO-3
    found "the prefetching only partially overlaps with computation" (deepspeedai/DeepSpeed#1170).
    Crediting ``fetch_sub_module``'s prefetch as written (the next sub-modules' gathers, up to the
    prefetch window, running beside the current one's compute) put 41 of bench/published.py's 102
    figures within 15%, where the model without it had 62 when this was decided, every DeepSpeed row
    over-predicted (the ZeRO++ blog's ZeRO-3 rows by up to 62%)."""
    copies: bool = False
    """The runner copies each all-gather's output into the parameters it holds and each reduce-scatter's input out of
    the gradients it holds, on the compute stream: FSDP2's per-parameter sharding (torch 2.13
    ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``: ``foreach_all_gather_copy_out`` waits for the
    gather on the current stream and runs ``split_with_sizes_copy`` into each unsharded parameter;
    ``foreach_reduce`` runs ``foreach_reduce_scatter_copy_in``, a ``_chunk_cat`` of the unsharded gradients into a
    reduce-dtype buffer, on the current stream before the reduce-scatter stream waits for it). Each gathered
    element is read and written once more, and each reduced one read in its own dtype and written in the
    reduction's: memory-bound passes at ``memory_bytes_per_s``. False: the engine gathers into the buffer its
    parameters are views of and reduces the buffer its gradients are views of (zerotune's engine, FSDP1's
    FlatParameter, DeepSpeed's flat partitions)."""
    recompute_early_stop: bool = True
    """A fully checkpointed block's backward does not run its last matmul again: torch's non-reentrant checkpoint
    (``use_reentrant=False``; zerotune's engine, FSDP2's ``checkpoint_wrapper``, NO_REENTRANT by default from
    torch 2.2) stops recomputing as soon as every tensor the backward needs is back
    (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default since torch 2.1, pytorch/pytorch#96866),
    and the last matmul's output only feeds the residual add, whose backward needs no input (counted on the
    engine's blocks in ``tests/costmodel/test_traffic.py``). False: reentrant checkpointing reruns the whole
    forward (Megatron's and DeepSpeed's ``CheckpointFunction``, InternEvo's, and torch 2.0's non-reentrant one).
    Selective checkpointing runs under the non-reentrant one only: it always stops early."""
    grad_reduce: str = "reduce_scatter"
    """How a runner that shards no parameters (``param_span`` 0: ZeRO-1 and ZeRO-2) reduces each gradient bucket
    over the group it partitions gradients or optimizer states on: ``reduce_scatter`` (zerotune's engine, FSDP's
    SHARD_GRAD_OP) or ``all_reduce`` (DeepSpeed's stages 1 and 2 as 0.19.8 runs them with its defaults,
    ``reduce_scatter`` and ``use_multi_rank_bucket_allreduce`` both true: ``stage_1_and_2.py``'s ``average_tensor``
    hands each bucket to ``allreduce_and_scatter``, one all-reduce of the whole bucket after which every rank
    keeps its partition's slice; counted on DeepSpeed itself in ``tests/tuner/test_exports.py``, as DeepSpeed's
    own comm log shows it, deepspeedai/DeepSpeed#7059). An all-reduce sends twice a reduce-scatter's bytes: the
    bytes booked per level stay the schedule's, the seconds are the all-reduce's. Stage 3 reduce-scatters."""
    weight_sync: str = "gather"
    """How a step brings the weights its optimizer group updated to every rank of the group: ``gather`` (one
    all-gather per bucket of the shards each rank updated: zerotune's engine, DeepSpeed, FSDP) or ``broadcast``
    (InternEvo's HybridZeroOptimizer: its ``_partition_param_list`` hands out *whole* parameters, largest first,
    each to the rank holding the fewest elements so far, and ``broadcast_params`` then runs one ``dist.broadcast``
    per rank that holds any, from that rank over the whole group; ``runners.owners``). The bytes each rank
    receives are the same; a broadcast is a chain along the ring, whose pipeline fills hop by hop
    (``timing.Costs.broadcast``), so a group of R ranks pays about min(R, parameter tensors) such fills where a
    gather per bucket pays one ring latency a bucket."""
    loss_kernel: str = "torch"
    """The loss over the vocabulary the run computes (``traffic.loss_bytes``, ``memory.activation_memory``): ``torch``
    (``F.cross_entropy`` on fp32 logits: zerotune's engine, torchtitan, Hugging Face) or ``fused`` (one kernel on
    the run-dtype logits that keeps their log-sum-exp: flash-attn's ``CrossEntropyLoss``, llm-foundry's MPT)."""
    block_kernels: str = "eager"
    """The memory-bound kernels of a Llama's blocks (``traffic.BLOCK_KERNELS``): ``eager`` (Hugging Face's and
    zerotune's engine's, op by op) or ``nanotron`` (flash-attn's Triton RMSNorm and rotary in nanotron's block)."""
    stage3_settings: str = "export"
    """With ``gathers = "module"``, the ``zero_optimization`` settings DeepSpeed's ZeRO-3 held its gathered parameters
    under (``coordinator``: what it gathers and what ``memory.memory_per_rank`` books): ``export`` (zerotune's export
    of the strategy: ``coordinator.export_settings``) or ``defaults`` (DeepSpeed's own,
    ``coordinator.DEEPSPEED_DEFAULTS``: a published run whose config left them out)."""
    host_s_per_layer: float = 0.0
    """Host floor: the seconds a micro-step's forward and backward of one transformer block take the host
    to issue (kernel launches, the framework's Python), whatever the batch. A block whose device time is
    shorter waits for the host (``RUNNER_HOST_S_PER_LAYER``). 0 = never host-bound: fitted calibrations,
    whose compute efficiency already holds the host they ran on. With ``gathers = "module"`` (DeepSpeed) it is
    its ZeRO-3's floor, charged only to strategies that shard parameters."""
    measured_error: MeasuredError | None = None
    """A fitted calibration's cross-validated error on the runs it came from (its predictions' band)."""

    def __post_init__(self) -> None:
        for field, allowed in (("rings", RINGS), ("protocols", PROTOCOLS), ("outer_reduce", OUTER_REDUCE),
                               ("gathers", GATHERS), ("grad_reduce", GRAD_REDUCE), ("weight_sync", WEIGHT_SYNC),
                               ("stage3_settings", STAGE3_SETTINGS), ("loss_kernel", LOSS_KERNELS),
                               ("block_kernels", BLOCK_KERNELS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r}: must be one of {list(allowed)}")

    def attention_rate(self, seq_len: int, head_dim: int) -> float:
        """The attention kernel's rate for a model of ``seq_len`` tokens and heads of ``head_dim``: ``attention_curve``
        at that point (``curve_rate``), or ``attention_efficiency`` where there is no curve."""
        if not self.attention_curve:
            return self.attention_efficiency
        return curve_rate(self.attention_curve, seq_len, head_dim)

    def level_efficiency(self, level: int, op: str | None = None) -> float:
        """The fraction of level ``level``'s bandwidth collective ``op`` achieves (None: any collective)."""
        for kind, at, efficiency in self.collective_efficiency:
            if kind == op and at == level:
                return efficiency
        return self.bandwidth_efficiency[level - 1] if self.bandwidth_efficiency else NOMINAL_LINK_EFFICIENCY

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        data = dict(data)
        data["bandwidth_efficiency"] = tuple(data.get("bandwidth_efficiency", ()))
        data["collective_efficiency"] = tuple((str(op), int(level), float(eff))
                                              for op, level, eff in data.get("collective_efficiency", ()))
        data["ll_max_busbw_gbps"] = tuple(data.get("ll_max_busbw_gbps", ()))
        data["score_passes"] = tuple(int(n) for n in data.get("score_passes", (0, 0)))
        data["attention_curve"] = tuple((int(seq), int(head), float(rate))
                                        for seq, head, rate in data.get("attention_curve", ()))
        data["gemm_curve"] = tuple((int(tokens), float(factor)) for tokens, factor in data.get("gemm_curve", ()))
        if isinstance(data.get("measured_error"), dict):
            data["measured_error"] = MeasuredError(**data["measured_error"])
        return cls(**{k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}})


RUNNERS: dict[str, tuple[str, str, str, bool, str, bool]] = {
    "zerotune": ("hierarchical", "backward", "bucket", False, "reduce_scatter", True),
    "deepspeed": ("flat", "backward", "module", False, "all_reduce", False),
    "fsdp": ("flat", "backward", "bucket", True, "reduce_scatter", True),
}
"""How each runner of a strategy moves its bytes (``Calibration.rings``, ``Calibration.outer_reduce``,
``Calibration.gathers``, ``Calibration.copies``, ``Calibration.grad_reduce``): zerotune's engine, and the exported
configs as DeepSpeed (the export sets ``overlap_comm``; ZeRO-3 fetches sub-module by sub-module; stages 1 and 2
all-reduce their gradient buckets) and FSDP2 (it reduces across replicas in its post-backward hook, and copies each
gather's output and each reduction's input) run them; and how each recomputes a checkpointed block
(``Calibration.recompute_early_stop``: DeepSpeed's ``deepspeed.checkpointing`` is reentrant)."""


RUNNER_HOST_S_PER_LAYER: dict[str, float] = {
    "zerotune": (77.2 - 19.1) / 24 * 1e-3,
    "fsdp": ((109.6 + 102.4) / 2 - 14.0) / 24 * 1e-3,
    "deepspeed": (337.0 - 14.6) / 24 * 1e-3,
}
"""Each runner's host floor per transformer block (``Calibration.host_s_per_layer``), measured on one GPU
machine's host with ``bench/trainer_vs_fsdp.py --worlds 1 --model gpt-1.3b --batch 1`` (24 blocks, AdamW
fused). At one sequence of 2,048 tokens these steps are host-bound: the device waits between many short
kernels (over 200 gaps of 50 µs or more in a step) and the step ends one optimizer phase after the host's
last backward launch. So a block costs the host (timed step - optimizer phase) / 24, the optimizer phase
being the device time from the fused AdamW's first kernel on (``bench/trace_phases.py``):

- zerotune's engine (collectives on the caller's thread), on an H100's host (bench/data/h100-1gpu-fused):
  77.2 ms with a 19.1 ms phase, 2.4 ms;
- FSDP2 (fully_shard per block), the same host: 109.6 and 102.4 ms in two runs with a 14.0 ms phase, 3.8 ms;
- DeepSpeed 0.19.8's ZeRO-3 running zerotune's export (torch's fused AdamW as the client optimizer), on an
  H200's host (bench/data/h200-runner-peers, ``bench/runner_peers.sh``): 337.0 ms with a 14.6 ms phase,
  13.4 ms. Its step is the host's: the device is busy 70 ms of it, and a profiled step's host time goes to
  its per-parameter hooks (AccumulateGrad 117 ms for 292 parameters, its pre- and post-backward module
  hooks 82 ms). At 4 sequences it is still host-bound (383.5 ms, device busy 160 ms).

The same run on the H200's host puts the other two within the spread of hosts: our engine 2.3 ms a block
(69.7 ms, 14.4 ms phase; 5% under the H100 host's) and FSDP2 4.8 ms (126.3 ms, 10.5 ms phase; 26% over).
On a CPU (bench/data/cpu-host-per-block: narrow models of 4 and 24 blocks, where a step is the runners' own
work) DeepSpeed's ZeRO-3 did 2.8-5.0x our engine's host work per block and FSDP2 1.4x; on the H200's host
5.8x and 2.1x. Another host's single-thread speed moves these."""


def with_host_floor(calib: Calibration) -> Calibration:
    """``calib`` with the host floor of the engine its ``gathers`` name, for a table's engine that is none of
    ``RUNNERS``: DeepSpeed ZeRO-3's where it gathers per sub-module (``RUNNER_HOST_S_PER_LAYER["deepspeed"]``,
    which ``predict`` charges only where parameters are sharded), none where it gathers per bucket (FSDP1,
    Megatron, InternEvo: the floors measured for zerotune's engine and FSDP2 are not theirs). A fitted
    calibration keeps its own, as in ``run_by``."""
    if calib.protocols == "simple":
        return calib
    return dataclasses.replace(calib, host_s_per_layer=RUNNER_HOST_S_PER_LAYER["deepspeed"]
                               if calib.gathers == "module" else 0.0)


def run_by(calib: Calibration, runner: str) -> Calibration:
    """``calib`` with the collectives of ``runner`` (a key of ``RUNNERS``), and, for a device profile
    (``protocols`` nccl or rccl), the runner's host floor; a fitted calibration keeps its own."""
    if runner not in RUNNERS:
        raise ValueError(f"runner={runner!r}: must be one of {sorted(RUNNERS)}")
    rings, outer_reduce, gathers, copies, grad_reduce, early_stop = RUNNERS[runner]
    host = RUNNER_HOST_S_PER_LAYER[runner] if calib.protocols != "simple" else calib.host_s_per_layer
    return dataclasses.replace(calib, rings=rings, outer_reduce=outer_reduce, gathers=gathers, copies=copies,
                               grad_reduce=grad_reduce, host_s_per_layer=host, recompute_early_stop=early_stop)


NOMINAL = Calibration()
"""The calibration of clusters without a profile or a fit: round figures, not measured constants."""
