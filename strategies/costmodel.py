"""The analytic model of one training step: bytes, memory and time per rank (pure Python).

**Bytes.** ``step_collectives`` lists every collective the engine issues in one step, walking the
same bucket plan (``plan.py``); ``step_volume`` sums their closed forms (``volume.py``), so the
prediction equals the trainer's counted bytes exactly. Per micro-step (A per step), for a bucket
of padded length n, spans P ≤ G ≤ O, hpZ span H:
- forward all-gather over span P of n/S_P elements (``weight_bits`` at levels ≥ quantize_above);
- backward all-gather (block buckets; the root stays gathered): over span H of n/S_H, 16-bit,
  with hpZ, else the forward gather again;
- per reduce group of total length m: reduce-scatter over levels 1..P of m, then P+1..G of m/S_P.
Per step and bucket: reduce-scatter over G+1..O of n/S_G, all-reduce over O+1..L of n/S_O (both
``grad_bits``), all-gather over G+1..O, then P+1..G, 16-bit.

**Memory** per rank (e = bytes per element of the run's dtype): P = n·e/S_P, G = n·e/S_G,
OS = 12·n/S_O (fp32 master, exp_avg, exp_avg_sq), hpZ = n·e/S_H per block bucket, summed over
buckets — for ZeRO-3, (2 + 2 + 12)·Ψ/N with 16-bit e (ZeRO, Rajbhandari et al. 2020, §5).
Activations per micro-batch of t = B·T tokens, per block: 8·t·h·e + 2·t·f·e saved tensors (two
LN inputs and outputs, the QKV output (3), the attention output, the GELU input and output; cf.
Korthikanti et al. 2022 §4, without dropout) plus fp32 LayerNorm statistics and attention
log-sum-exp; only the block input t·h·e with checkpointing; the head keeps the final LN's input
and output and the fp32 log-softmax (t·V·4); the embedding keeps the token and position ids.
Communication buffers: the root and (1 + prefetch) gathered buckets, and two reduce groups of full
gradients. Peak = their sum (an upper bound).

**Time** (α-β model, Hockney 1994; Thakur et al. 2005 for the ring step counts): compute =
FLOPs / (peak · efficiency) with FLOPs from ``ModelSpec.flops_per_token`` (+ a forward recompute
with checkpointing); a collective over levels lo..hi costs Σ_i (steps_i·α_i + bytes_i/β_i) with
β_i = bandwidth_gbps · efficiency_i (bandwidths are per rank with all ranks sending, so NIC
sharing is in the figure), steps = s_i − 1 per all-gather/reduce-scatter/all-to-all; quantization
costs elements / quant throughput. One communication queue (FIFO, as the engine's comm thread) and
one compute stream are simulated bucket by bucket, so prefetched gathers and bucketed reductions
hide behind compute; ``overlap`` blends that schedule with full serialization. The step adds the
step-boundary collectives and the optimizer. All efficiencies come from a ``Calibration``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

from strategies.plan import Plan, block_numel, plan_buckets, root_numel
from strategies.spec import ClusterSpec, ModelSpec, Strategy
from strategies.volume import QUANT_BLOCK, Volume, all_gather_volume, all_reduce_volume, reduce_scatter_volume

GIB = 2**30


@dataclass(frozen=True)
class Calibration:
    """The fitted (or nominal) efficiencies that turn bytes and FLOPs into seconds."""

    name: str = "nominal"
    compute_efficiency: float = 0.45
    """Achieved fraction of ``peak_tflops`` for the model's matmuls (typical MFU of large GPT runs)."""
    bandwidth_efficiency: tuple[float, ...] = ()
    """Achieved fraction of each level's bandwidth, innermost first; empty = 0.8 for every level."""
    latency_scale: float = 1.0
    """Multiplies every level's ``latency_us`` (per ring step, including launch overhead)."""
    quant_elems_per_s: float = 1e11
    """Elements quantized or dequantized per second."""
    optimizer_elems_per_s: float = 5e10
    """fp32 AdamW elements updated per second."""
    overlap: float = 1.0
    """1 = the simulated schedule (communication hidden behind compute), 0 = everything serialized."""
    step_overhead_s: float = 0.0
    """Fixed cost per step (launches, host work)."""

    def level_efficiency(self, level: int) -> float:
        return self.bandwidth_efficiency[level - 1] if self.bandwidth_efficiency else 0.8

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        data = dict(data)
        data["bandwidth_efficiency"] = tuple(data.get("bandwidth_efficiency", ()))
        return cls(**{k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(cls)}})


class Collective(NamedTuple):
    """One collective the engine issues: ``numel`` is the shard for all-gathers, the buffer otherwise."""

    op: str
    levels: tuple[int, int]
    numel: int
    bits: int


_plan = functools.lru_cache(maxsize=4096)(plan_buckets)


def _strategy_plan(model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Plan:
    return _plan(model, cluster.world_size, s.allgather_bucket_mb, s.reduce_bucket_mb)


def step_collectives(model: ModelSpec, cluster: ClusterSpec, s: Strategy,
                     plan: Plan | None = None) -> dict[str, Any]:
    """The step's collectives: per bucket index its ``fwd`` and ``bwd`` gathers, per reduce group
    (keyed by the group's last bucket) its two reduce-scatters, and the step ``boundary`` list."""
    plan = plan or _strategy_plan(model, cluster, s)
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size = [math.prod(cluster.sizes[:k]) for k in range(L + 1)]
    h = s.secondary_span
    fwd, bwd, reduce, boundary = {}, {}, {}, []
    memo: dict[tuple[str, int], Any] = {}  # buckets of one size share their collectives (speed)
    for b in plan.buckets:
        n = b.padded
        if ("f", n) not in memo:
            memo["f", n] = Collective("all_gather", (1, P), n // size[P], s.weight_bits)
            memo["b", n] = memo["f", n] if h is None else Collective("all_gather", (1, h), n // size[h], 16)
            memo["s", n] = [Collective("reduce_scatter", (G + 1, O), n // size[G], s.grad_bits),
                            Collective("all_reduce", (O + 1, L), n // size[O], s.grad_bits),
                            Collective("all_gather", (G + 1, O), n // size[O], 16),
                            Collective("all_gather", (P + 1, G), n // size[G], 16)]
        fwd[b.index] = memo["f", n]
        if not b.is_root:
            bwd[b.index] = memo["b", n]
        boundary += memo["s", n]
    for group in plan.reduce_groups:
        m = sum(plan.buckets[i].padded for i in group)
        if ("r", m) not in memo:
            memo["r", m] = (Collective("reduce_scatter", (1, P), m, s.grad_bits),
                            Collective("reduce_scatter", (P + 1, G), m // size[P], s.grad_bits))
        reduce[group[-1]] = memo["r", m]
    return {"fwd": fwd, "bwd": bwd, "reduce": reduce, "boundary": boundary}


_VOLUME = {"all_gather": all_gather_volume, "reduce_scatter": reduce_scatter_volume, "all_reduce": all_reduce_volume}


class _Costs:
    """Memoized bytes and seconds of collectives on one cluster with one calibration (hot path)."""

    def __init__(self, cluster: ClusterSpec, calib: Calibration, elem_bytes: int, quantize_above: int,
                 block: int) -> None:
        self.cluster, self.calib, self.e, self.qa, self.block = cluster, calib, elem_bytes, quantize_above, block
        self.prefix = [math.prod(cluster.sizes[:k]) for k in range(cluster.num_levels + 1)]
        self._vol: dict[tuple, Volume] = {}
        self._time: dict[tuple, float] = {}

    def volume(self, c: Collective) -> Volume:
        key = (c.op, c.levels, c.numel, c.bits)
        if key not in self._vol:
            self._vol[key] = _VOLUME[c.op](self.cluster, c.levels, c.numel, self.e, c.bits, self.qa, self.block)
        return self._vol[key]

    def time(self, c: Collective) -> float:
        """Σ over the collective's levels of ring steps · latency + bytes / bandwidth, + quantization."""
        key = (c.op, c.levels, c.numel, c.bits)
        cached = self._time.get(key)
        if cached is not None:
            return cached
        lo, hi = c.levels
        t, quant_elems = 0.0, 0
        if lo <= hi and self.prefix[hi] != self.prefix[lo - 1]:
            vol, calib = self.volume(c), self.calib
            for level in range(lo, hi + 1):
                lv = self.cluster.levels[level - 1]
                if lv.size == 1:
                    continue
                steps = (lv.size - 1) * (2 if c.op == "all_reduce" else 1)
                t += steps * lv.latency_us * 1e-6 * calib.latency_scale
                t += sum(vol.get(lv.name, {}).values()) / (lv.bandwidth_gbps * 1e9 * calib.level_efficiency(level))
                if c.bits < 16 and level >= self.qa:  # quantize before, dequantize after the level
                    gathered = self.prefix[hi] // self.prefix[level - 1] if c.op == "all_gather" else 1
                    quant_elems += 2 * c.numel * gathered
            t += quant_elems / calib.quant_elems_per_s
        self._time[key] = t
        return t


_COSTS: dict[tuple, _Costs] = {}


def _costs(cluster: ClusterSpec, calib: Calibration, e: int, qa: int, block: int) -> _Costs:
    key = (cluster, calib, e, qa, block)
    costs = _COSTS.get(key)
    if costs is None:
        if len(_COSTS) > 256:
            _COSTS.clear()
        costs = _COSTS[key] = _Costs(cluster, calib, e, qa, block)
    return costs


def _merge_into(total: dict[str, dict[str, int]], vol: Volume, times: int = 1) -> None:
    for name, kinds in vol.items():
        level = total.setdefault(name, {})
        for kind, n in kinds.items():
            level[kind] = level.get(kind, 0) + n * times


def step_volume(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int, accum: int = 1,
                block: int = QUANT_BLOCK, plan: Plan | None = None) -> Volume:
    """Bytes sent per rank per optimizer step, by level and collective kind."""
    return _volume_of(step_collectives(model, cluster, s, plan),
                      _costs(cluster, Calibration(), elem_bytes, s.quantize_above, block), accum)


def _volume_of(sc: dict[str, Any], costs: _Costs, accum: int) -> Volume:
    counts: Counter[Collective] = Counter()
    for c in (*sc["fwd"].values(), *sc["bwd"].values(), *(c for pair in sc["reduce"].values() for c in pair)):
        counts[c] += accum
    counts.update(sc["boundary"])
    total: dict[str, dict[str, int]] = {}
    for c, times in counts.items():
        _merge_into(total, costs.volume(c), times)
    return {name: {k: n for k, n in kinds.items() if n} for name, kinds in total.items() if any(kinds.values())}


def _fast_volume(cluster: ClusterSpec, s: Strategy, costs: _Costs, accum: int, root: int, blocks: list[int],
                 group_ends: list[int]) -> Volume:
    """``step_volume`` counted by distinct bucket and group lengths (the hot path; the same numbers)."""
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size, h = costs.prefix, s.secondary_span
    counts: Counter[Collective] = Counter()
    for n, k in Counter(blocks + [root]).items():
        k_blocks = k - (n == root)
        fwd = Collective("all_gather", (1, P), n // size[P], s.weight_bits)
        counts[fwd] += k * accum
        if k_blocks:
            bwd = fwd if h is None else Collective("all_gather", (1, h), n // size[h], 16)
            counts[bwd] += k_blocks * accum
        for c in (Collective("reduce_scatter", (G + 1, O), n // size[G], s.grad_bits),
                  Collective("all_reduce", (O + 1, L), n // size[O], s.grad_bits),
                  Collective("all_gather", (G + 1, O), n // size[O], 16),
                  Collective("all_gather", (P + 1, G), n // size[G], 16)):
            counts[c] += k
    for m, k in Counter(m for m in group_ends if m).items():
        counts[Collective("reduce_scatter", (1, P), m, s.grad_bits)] += k * accum
        counts[Collective("reduce_scatter", (P + 1, G), m // size[P], s.grad_bits)] += k * accum
    total: dict[str, dict[str, int]] = {}
    for c, times in counts.items():
        _merge_into(total, costs.volume(c), times)
    return {name: {k: n for k, n in kinds.items() if n} for name, kinds in total.items() if any(kinds.values())}


def state_memory(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int,
                 plan: Plan | None = None) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    plan = plan or _strategy_plan(model, cluster, s)
    size = [math.prod(cluster.sizes[:k]) for k in range(cluster.num_levels + 1)].__getitem__
    out = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    for b in plan.buckets:
        out["params"] += b.padded // size(s.param_span) * elem_bytes
        out["grads"] += b.padded // size(s.grad_span) * elem_bytes
        out["optim_states"] += 12 * (b.padded // size(s.optim_span))
        if s.secondary_span is not None and not b.is_root:
            out["secondary_params"] += b.padded // size(s.secondary_span) * elem_bytes
    return out


def activation_memory(model: ModelSpec, s: Strategy, elem_bytes: int) -> int:
    """Bytes autograd keeps for one micro-batch (see the module docstring)."""
    t, h, f = s.micro_batch_size * model.seq_len, model.hidden, model.ffn
    if s.activation_checkpointing:
        per_block = t * h * elem_bytes  # the block's input only
    else:  # 8·t·h + 2·t·f in the run dtype, fp32 LayerNorm mean/rstd, fp32 attention log-sum-exp
        per_block = (8 * t * h + 2 * t * f) * elem_bytes + 2 * 2 * t * 4 + t * model.heads * 4
    head = 2 * t * h * elem_bytes + 2 * t * 4 + t * model.vocab * 4 + 4  # LN in/out, stats, log-softmax, loss
    # ids are views of (B, T+1) token rows; flattening B > 1 rows of targets copies them
    embed = s.micro_batch_size * (model.seq_len + 1) * 8 + model.seq_len * 8 + (t * 8 if s.micro_batch_size > 1 else 0)
    return model.layers * per_block + head + embed


@functools.lru_cache(maxsize=4096)
def _summary(model: ModelSpec, world: int, allgather_bucket_mb: float, reduce_bucket_mb: float) -> tuple:
    """Plan facts the hot path needs: root length, block bucket lengths and units (forward order),
    reduce-group length ending at each bucket (0 if none), and the root's group length."""
    plan = _plan(model, world, allgather_bucket_mb, reduce_bucket_mb)
    ends = {g[-1]: sum(plan.buckets[i].padded for i in g) for g in plan.reduce_groups}
    blocks = plan.block_buckets
    return (plan, plan.buckets[0].padded, [b.padded for b in blocks], [len(b.units) for b in blocks],
            [ends.get(b.index, 0) for b in blocks], ends[0])


def predict(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int | None = None,
            global_batch: int | None = None, calibration: Calibration | None = None,
            block: int = QUANT_BLOCK) -> dict[str, Any]:
    """Predicted run.json of (model, cluster, strategy): the same field names as the trainer writes."""
    calib = calibration or Calibration()
    e = elem_bytes or (4 if cluster.device == "cpu" else 2)
    world, mbs = cluster.world_size, s.micro_batch_size
    accum = max(1, (global_batch or world * mbs) // (world * mbs))
    plan, root, blocks, units, group_end, root_group = _summary(model, world, s.allgather_bucket_mb,
                                                               s.reduce_bucket_mb)
    costs = _costs(cluster, calib, e, s.quantize_above, block)
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size, h, ct = costs.prefix, s.secondary_span, costs.time
    memo: dict[tuple[str, int], float] = {}

    def fwd_t(n: int) -> float:
        if ("f", n) not in memo:
            memo["f", n] = ct(Collective("all_gather", (1, P), n // size[P], s.weight_bits))
        return memo["f", n]

    def bwd_t(n: int) -> float:
        if h is None:
            return fwd_t(n)
        if ("b", n) not in memo:
            memo["b", n] = ct(Collective("all_gather", (1, h), n // size[h], 16))
        return memo["b", n]

    def red_t(m: int) -> float:
        if ("r", m) not in memo:
            memo["r", m] = ct(Collective("reduce_scatter", (1, P), m, s.grad_bits)) + ct(
                Collective("reduce_scatter", (P + 1, G), m // size[P], s.grad_bits)) if m else 0.0
        return memo["r", m]

    def boundary_t(n: int) -> float:
        if ("s", n) in memo:
            return memo["s", n]
        memo["s", n] = (ct(Collective("reduce_scatter", (G + 1, O), n // size[G], s.grad_bits))
                + ct(Collective("all_reduce", (O + 1, L), n // size[O], s.grad_bits))
                + ct(Collective("all_gather", (G + 1, O), n // size[O], 16))
                + ct(Collective("all_gather", (P + 1, G), n // size[G], 16)))
        return memo["s", n]

    # compute, seconds: forward of a block is (2·params + 4·h·T) FLOPs per token; backward twice that
    rate = cluster.peak_tflops * 1e12 * calib.compute_efficiency
    tokens = mbs * model.seq_len
    per_block = (2 * block_numel(model) + 4 * model.hidden * model.seq_len) * tokens / rate
    head = 2 * root_numel(model) * tokens / rate
    bwd_factor = 3.0 if s.activation_checkpointing else 2.0  # + a forward recompute
    cf = [per_block * u for u in units]
    gf, gb, rd = [fwd_t(n) for n in blocks], [bwd_t(n) for n in blocks], [red_t(m) for m in group_end]

    # one micro-step: a FIFO communication queue and a compute stream, as the engine runs them
    nb, p = len(blocks), s.prefetch_buckets
    comm = t = fwd_t(root)  # the root is gathered before anything computes
    ends, issued = [0.0] * nb, 0
    for i in range(nb):  # forward: gathers run ahead by `prefetch` buckets
        limit = min(nb, i + 1 + p)
        while issued < limit:
            comm = (comm if comm > t else t) + gf[issued]
            ends[issued], issued = comm, issued + 1
        t = (t if t > ends[i] else ends[i]) + cf[i]
    t += 3 * head  # the head's forward and backward
    issued = 0
    for i in range(nb):  # backward, last bucket first; a group's reduction queues after its last bucket
        limit = min(nb, i + 1 + p)
        while issued < limit:
            comm = (comm if comm > t else t) + gb[nb - 1 - issued]
            ends[issued], issued = comm, issued + 1
        t = (t if t > ends[i] else ends[i]) + bwd_factor * cf[nb - 1 - i]
        r = rd[nb - 1 - i]
        if r:
            comm = (comm if comm > t else t) + r
    comm = max(comm, t) + red_t(root_group)
    compute_s = sum(cf) * (1 + bwd_factor) + 3 * head
    comm_s = fwd_t(root) + sum(gf) + sum(gb) + sum(rd) + red_t(root_group)
    micro_s = calib.overlap * max(t, comm) + (1 - calib.overlap) * (compute_s + comm_s)
    boundary_s = boundary_t(root) + sum(boundary_t(n) for n in blocks)
    optimizer_s = (root + sum(blocks)) / size[O] / calib.optimizer_elems_per_s
    step_s = accum * micro_s + boundary_s + optimizer_s + calib.step_overhead_s

    memory = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    for n, k in Counter(blocks).items():
        memory["params"] += k * (n // size[P] * e)
        memory["grads"] += k * (n // size[G] * e)
        memory["optim_states"] += k * 12 * (n // size[O])
        memory["secondary_params"] += k * (n // size[h] * e) if h is not None else 0
    memory["params"] += root // size[P] * e
    memory["grads"] += root // size[G] * e
    memory["optim_states"] += 12 * (root // size[O])
    group = max(max(group_end, default=0), root_group)
    gathered = (root + (1 + s.prefetch_buckets) * max(blocks, default=0)) if s.param_span else 0
    memory["comm_buffers"] = (gathered + 2 * group) * e
    memory["activations"] = activation_memory(model, s, e)
    memory["peak"] = sum(memory.values())
    capacity = int(cluster.device_memory_gib * GIB)
    feasible = memory["peak"] <= capacity
    global_tokens = world * tokens * accum
    out: dict[str, Any] = {
        "status": "predicted", "world_size": world, "step_time_s": step_s,
        "tokens_per_s": global_tokens / step_s,
        "tflops_per_rank": model.flops_per_token() * global_tokens / world / step_s / 1e12,
        "bytes_per_level": _fast_volume(cluster, s, costs, accum, root, blocks, group_end + [root_group]),
        "memory_bytes": memory, "feasible": feasible, "headroom_bytes": capacity - memory["peak"],
        "grad_accum_steps": accum, "global_batch": world * mbs * accum, "calibration": calib.name,
        "breakdown": {"compute_s": accum * compute_s, "comm_s": accum * comm_s,
                      "exposed_comm_s": accum * max(0.0, micro_s - compute_s), "boundary_s": boundary_s,
                      "optimizer_s": optimizer_s, "overhead_s": calib.step_overhead_s},
    }
    if not feasible:
        category = max(("params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations"),
                       key=lambda k: memory[k])
        out["overflow"] = {"category": category, "bytes": memory[category], "over_by_bytes": -out["headroom_bytes"],
                           "reason": f"needs {memory['peak'] / GIB:.1f} GiB of {cluster.device_memory_gib:g} GiB; "
                                     f"largest: {category} {memory[category] / GIB:.1f} GiB"}
    return out


def cross_node_bytes(prediction: dict[str, Any], cluster: ClusterSpec) -> int:
    """Bytes per rank per step on the outermost level."""
    return sum(prediction["bytes_per_level"].get(cluster.levels[-1].name, {}).values())


def scaling_efficiency(tflops: float, base_tflops: float) -> float:
    return tflops / base_tflops if base_tflops > 0 and math.isfinite(tflops) else float("nan")
