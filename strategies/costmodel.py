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
costs (elements quantized + elements dequantized) / quant throughput, counted as ``comm.py`` runs
them (``_Costs.quant_elems``): a weight gather quantizes its shard once and dequantizes once what
it gathered over the quantized levels; a gradient reduce-scatter quantizes and dequantizes, at
every quantized level, the buffer that level sees. One communication queue (FIFO, as the
engine's comm thread) and one compute stream are simulated bucket by bucket, so prefetched gathers
and bucketed reductions hide behind compute; ``overlap`` blends that schedule with full
serialization. The step adds the step-boundary collectives and the optimizer. All efficiencies
come from a ``Calibration``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter, defaultdict
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
        self._flat: dict[tuple, tuple[tuple[tuple[str, str], int], ...]] = {}
        self._time: dict[tuple, float] = {}
        self.step_volumes: dict[tuple, Volume] = {}
        """``_fast_volume`` results by (spans, bits, accumulation, plan): strategies that differ only in
        what does not move bytes (prefetch, micro-batch at a fixed accumulation, checkpointing) share one."""

    # A collective is any (op, levels, numel, bits) tuple: a ``Collective`` or, in the hot path, a plain one.
    def volume(self, c: tuple[str, tuple[int, int], int, int]) -> Volume:
        vol = self._vol.get(c)
        if vol is None:
            op, levels, numel, bits = c
            vol = self._vol[c] = _VOLUME[op](self.cluster, levels, numel, self.e, bits, self.qa, self.block)
        return vol

    def flat_volume(self, c: tuple[str, tuple[int, int], int, int]) -> tuple[tuple[tuple[str, str], int], ...]:
        """``volume(c)`` as ((level, kind), bytes) pairs with bytes > 0 (cheap to accumulate)."""
        flat = self._flat.get(c)
        if flat is None:
            flat = self._flat[c] = tuple(((name, kind), n) for name, kinds in self.volume(c).items()
                                         for kind, n in kinds.items() if n)
        return flat

    def quant_elems(self, op: str, lo: int, hi: int, numel: int) -> int:
        """Elements quantized plus elements dequantized by a collective at bits < 16, as ``comm.py`` runs it.

        Quantized levels are those ≥ ``quantize_above`` with 2+ ranks. An all-gather of a
        ``numel``-element shard quantizes the shard once and dequantizes once, on leaving the
        quantized (outer) levels, the c · Π s_l elements gathered over them. A reduce-scatter of a
        ``numel``-element buffer quantizes and dequantizes, at each quantized level l, the buffer
        that level sees: numel / Π_{lo ≤ k < l} s_k. An all-reduce is a reduce-scatter, then an
        all-gather of its result."""
        sizes = self.cluster.sizes
        quantized = [lv for lv in range(max(lo, self.qa), hi + 1) if sizes[lv - 1] > 1]
        if not quantized:
            return 0
        if op == "all_gather":
            return numel + numel * math.prod(sizes[lv - 1] for lv in quantized)
        total, seen = 0, numel
        for level in range(lo, hi + 1):
            if level in quantized:
                total += 2 * seen
            seen //= sizes[level - 1]
        if op == "all_reduce":  # seen is now the shard each rank keeps
            total += self.quant_elems("all_gather", lo, hi, seen)
        return total

    def time(self, c: tuple[str, tuple[int, int], int, int]) -> float:
        """Σ over the collective's levels of ring steps · latency + bytes / bandwidth, + quantization."""
        key = c
        cached = self._time.get(key)
        if cached is not None:
            return cached
        c = Collective(*c)  # named fields below
        lo, hi = c.levels
        t = 0.0
        if lo <= hi and self.prefix[hi] != self.prefix[lo - 1]:
            vol, calib = self.volume(c), self.calib
            for level in range(lo, hi + 1):
                lv = self.cluster.levels[level - 1]
                if lv.size == 1:
                    continue
                steps = (lv.size - 1) * (2 if c.op == "all_reduce" else 1)
                t += steps * lv.latency_us * 1e-6 * calib.latency_scale
                t += sum(vol.get(lv.name, {}).values()) / (lv.bandwidth_gbps * 1e9 * calib.level_efficiency(level))
            if c.bits < 16:
                t += self.quant_elems(c.op, lo, hi, c.numel) / calib.quant_elems_per_s
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


def clear_caches() -> None:
    """Forget every memoized plan, per-collective cost and step volume (what ``predict`` learns as it
    runs): the next call starts cold, e.g. to time it."""
    _COSTS.clear()
    for cached in (_plan, _summary, _runs):
        cached.cache_clear()


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


def _fast_volume(cluster: ClusterSpec, s: Strategy, costs: _Costs, accum: int, root: int,
                 block_counts: tuple[tuple[int, int], ...], group_counts: tuple[tuple[int, int], ...]) -> Volume:
    """``step_volume`` counted by distinct bucket and group lengths (the hot path; the same numbers).

    ``block_counts``: (padded length, number of block buckets of that length); ``group_counts``:
    (reduce-group length, number of groups), the root's group included."""
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size, h, wb, gb = costs.prefix, s.secondary_span, s.weight_bits, s.grad_bits
    memo_key = (P, G, O, h, wb, gb, accum, root, block_counts, group_counts)
    known = costs.step_volumes.get(memo_key)
    if known is not None:
        return {name: dict(kinds) for name, kinds in known.items()}  # a copy: callers own their result
    counts: defaultdict[tuple, int] = defaultdict(int)
    lengths = dict(block_counts)
    lengths[root] = lengths.get(root, 0)  # the root: forward gather and step boundary, no backward gather
    for n, k_blocks in lengths.items():
        k = k_blocks + (n == root)
        fwd = ("all_gather", (1, P), n // size[P], wb)
        counts[fwd] += k * accum
        if k_blocks:
            bwd = fwd if h is None else ("all_gather", (1, h), n // size[h], 16)
            counts[bwd] += k_blocks * accum
        for c in (("reduce_scatter", (G + 1, O), n // size[G], gb), ("all_reduce", (O + 1, L), n // size[O], gb),
                  ("all_gather", (G + 1, O), n // size[O], 16), ("all_gather", (P + 1, G), n // size[G], 16)):
            counts[c] += k
    for m, k in group_counts:
        for c in (("reduce_scatter", (1, P), m, gb), ("reduce_scatter", (P + 1, G), m // size[P], gb)):
            counts[c] += k * accum
    flat: defaultdict[tuple[str, str], int] = defaultdict(int)
    fv = costs.flat_volume
    for c, times in counts.items():
        for key, n in fv(c):
            flat[key] += n * times
    total: dict[str, dict[str, int]] = {}
    for (name, kind), n in flat.items():
        total.setdefault(name, {})[kind] = n
    if len(costs.step_volumes) > 100_000:
        costs.step_volumes.clear()
    costs.step_volumes[memo_key] = total
    return {name: dict(kinds) for name, kinds in total.items()}


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


class _Summary(NamedTuple):
    """Plan facts the hot path needs (cached per plan)."""

    root: int
    """The root bucket's padded length."""
    lengths: list[int]
    """Block bucket padded lengths, forward order."""
    units: list[int]
    """Transformer blocks in each block bucket."""
    group_end: list[int]
    """Length of the reduce group that ends at each block bucket (0: none ends there)."""
    root_group: int
    """Length of the group ending at the root (the last reduction of the backward pass)."""
    block_counts: tuple[tuple[int, int], ...]
    """(length, number of block buckets) pairs."""
    group_counts: tuple[tuple[int, int], ...]
    """(length, number of groups) pairs, the root's group included."""
    block_group_counts: tuple[tuple[int, int], ...]
    """(length, number) of the groups ending at block buckets."""
    total_units: int


@functools.lru_cache(maxsize=4096)
def _summary(model: ModelSpec, world: int, allgather_bucket_mb: float, reduce_bucket_mb: float) -> _Summary:
    plan = _plan(model, world, allgather_bucket_mb, reduce_bucket_mb)
    ends = {g[-1]: sum(plan.buckets[i].padded for i in g) for g in plan.reduce_groups}
    blocks = plan.block_buckets
    lengths = [b.padded for b in blocks]
    units = [len(b.units) for b in blocks]
    group_end = [ends.get(b.index, 0) for b in blocks]
    return _Summary(plan.buckets[0].padded, lengths, units, group_end, ends[0],
                    tuple(Counter(lengths).items()), tuple(Counter(m for m in [*group_end, ends[0]] if m).items()),
                    tuple(Counter(m for m in group_end if m).items()), sum(units))


def _pipeline(t: float, comm: float, gathers: dict[int, float], lengths: list[int], compute: float,
              units: list[int], reductions: dict[int, float] | None, groups: list[int] | None, p: int,
              runs: list[int]) -> tuple[float, float]:
    """Simulate one pass over the buckets: returns (compute stream end, communication queue end).

    Iteration i issues the gathers up to bucket i + p on the FIFO queue (each starts when the queue
    and the compute stream that issues it are both past; bucket j's gather takes
    ``gathers[lengths[j]]``), waits for bucket i's gather, computes it (``compute · units[i]``), then
    queues its reduction (``reductions[groups[i]]``, if a group ends there). ``runs[i]``: the last
    iteration whose inputs equal those of iteration i. Inside such a run, once the state (t, comm,
    pending gathers) has moved by the same δ in one iteration it moves by δ in every later one — the
    step is translation invariant in time — so the rest of the run is skipped in one jump. Exact up
    to float rounding; it makes the O(buckets) loop O(runs) for the uniform transformer blocks that
    make up a plan.
    """
    nb = len(lengths)
    ends = [0.0] * nb
    issued = 0
    pt = pc = 0.0
    i = 0
    while i < nb:
        limit = i + 1 + p
        if limit > nb:
            limit = nb
        while issued < limit:
            comm = (comm if comm > t else t) + gathers[lengths[issued]]
            ends[issued] = comm
            issued += 1
        e = ends[i]
        t = (t if t > e else e) + compute * units[i]
        if groups is not None and groups[i]:
            r = reductions[groups[i]]  # type: ignore[index]
            comm = (comm if comm > t else t) + r
        last = runs[i]
        if i and last > i and runs[i - 1] == last:  # inside a run, with more of it to come
            d = t - pt
            tol = 1e-12 * t
            if abs(comm - pc - d) <= tol and all(abs(ends[m + 1] - ends[m] - d) <= tol for m in range(i, issued - 1)):
                k = last - i
                shift = k * d
                ends[i + 1 + k:issued + k] = [x + shift for x in ends[i + 1:issued]]
                t, comm, issued, i = t + shift, comm + shift, issued + k, last
        pt, pc = t, comm
        i += 1
    return t, comm


@functools.lru_cache(maxsize=4096)
def _runs(model: ModelSpec, world: int, allgather_bucket_mb: float, reduce_bucket_mb: float,
          p: int) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """For the backward pass: bucket lengths, units and group ends in backward order; and for both
    passes of ``_pipeline``, the last iteration of each iteration's run of identical inputs (units
    computed, the length gathered ahead, the group reduced). Iterations that issue no gather never
    join a run (their pending window shrinks)."""
    sm = _summary(model, world, allgather_bucket_mb, reduce_bucket_mb)
    lengths, units, group_end, nb = sm.lengths, sm.units, sm.group_end, len(sm.lengths)

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


def predict(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int | None = None,
            global_batch: int | None = None, calibration: Calibration | None = None,
            block: int = QUANT_BLOCK) -> dict[str, Any]:
    """Predicted run.json of (model, cluster, strategy): the same field names as the trainer writes."""
    calib = calibration or Calibration()
    e = elem_bytes or (4 if cluster.device == "cpu" else 2)
    world, mbs = cluster.world_size, s.micro_batch_size
    accum = max(1, (global_batch or world * mbs) // (world * mbs))
    sm = _summary(model, world, s.allgather_bucket_mb, s.reduce_bucket_mb)
    root, blocks, block_counts, root_group = sm.root, sm.lengths, sm.block_counts, sm.root_group
    costs = _costs(cluster, calib, e, s.quantize_above, block)
    L, P, G, O = cluster.num_levels, s.param_span, s.grad_span, s.optim_span  # noqa: E741 (the paper's names)
    size, h, ct = costs.prefix, s.secondary_span, costs.time
    wb, gbits = s.weight_bits, s.grad_bits

    # seconds of each collective, once per distinct bucket / group length (a handful per plan)
    def fwd_t(n: int) -> float:
        return ct(("all_gather", (1, P), n // size[P], wb))

    def bwd_t(n: int) -> float:
        return fwd_t(n) if h is None else ct(("all_gather", (1, h), n // size[h], 16))

    def red_t(m: int) -> float:
        return ct(("reduce_scatter", (1, P), m, gbits)) + ct(("reduce_scatter", (P + 1, G), m // size[P], gbits))

    def boundary_t(n: int) -> float:
        return (ct(("reduce_scatter", (G + 1, O), n // size[G], gbits))
                + ct(("all_reduce", (O + 1, L), n // size[O], gbits))
                + ct(("all_gather", (G + 1, O), n // size[O], 16)) + ct(("all_gather", (P + 1, G), n // size[G], 16)))

    f_of = {n: fwd_t(n) for n, _ in block_counts}
    b_of = {n: bwd_t(n) for n, _ in block_counts}
    r_of = {m: red_t(m) for m, _ in sm.group_counts}

    # compute, seconds: forward of a block is (2·params + 4·h·T) FLOPs per token; backward twice that
    rate = cluster.peak_tflops * 1e12 * calib.compute_efficiency
    tokens = mbs * model.seq_len
    per_block = (2 * block_numel(model) + 4 * model.hidden * model.seq_len) * tokens / rate
    head = 2 * root_numel(model) * tokens / rate
    bwd_factor = 3.0 if s.activation_checkpointing else 2.0  # + a forward recompute

    # one micro-step: a FIFO communication queue and a compute stream, as the engine runs them
    p = s.prefetch_buckets
    root_f, root_r = fwd_t(root), r_of[root_group] if root_group else 0.0
    r_lengths, r_units, r_groups, fwd_runs, bwd_runs = _runs(model, world, s.allgather_bucket_mb,
                                                              s.reduce_bucket_mb, p)
    # forward: gathers run ahead by `prefetch` buckets; the root is gathered before anything computes
    t, comm = _pipeline(root_f, root_f, f_of, blocks, per_block, sm.units, None, None, p, fwd_runs)
    t += 3 * head  # the head's forward and backward
    # backward, last bucket first; a group's reduction queues after its last bucket
    t, comm = _pipeline(t, comm, b_of, r_lengths, bwd_factor * per_block, r_units, r_of, r_groups, p, bwd_runs)
    comm = (comm if comm > t else t) + root_r
    compute_s = per_block * sm.total_units * (1 + bwd_factor) + 3 * head
    comm_s = (root_f + sum(k * (f_of[n] + b_of[n]) for n, k in block_counts)
              + sum(k * r_of[m] for m, k in sm.block_group_counts) + root_r)
    micro_s = calib.overlap * (t if t > comm else comm) + (1 - calib.overlap) * (compute_s + comm_s)
    boundary_s = boundary_t(root) + sum(k * boundary_t(n) for n, k in block_counts)
    optimizer_s = (root + sum(n * k for n, k in block_counts)) / size[O] / calib.optimizer_elems_per_s
    step_s = accum * micro_s + boundary_s + optimizer_s + calib.step_overhead_s

    memory = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    for n, k in block_counts:
        memory["params"] += k * (n // size[P] * e)
        memory["grads"] += k * (n // size[G] * e)
        memory["optim_states"] += k * 12 * (n // size[O])
        memory["secondary_params"] += k * (n // size[h] * e) if h is not None else 0
    memory["params"] += root // size[P] * e
    memory["grads"] += root // size[G] * e
    memory["optim_states"] += 12 * (root // size[O])
    group = max(max(sm.group_end, default=0), root_group)
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
        "bytes_per_level": _fast_volume(cluster, s, costs, accum, root, block_counts, sm.group_counts),
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
