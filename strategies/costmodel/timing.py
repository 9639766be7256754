"""Seconds: of one collective on one cluster, and of the engine's bucket pipeline (pure Python).

**A collective** over levels lo..hi runs as the engine runs it (``comm.py``): one primitive per
level with 2+ ranks, outermost first for gathers, innermost first for reductions, one after the
other. A primitive over s ranks of level l moving b bytes per rank costs (α-β model, Hockney 1994)

    launch + steps · α_l + b / (β_l · η_l)

- launch: ``Calibration.collective_launch_us``, the fixed cost of issuing one collective (kernel
  launch and the library's base latency: NCCL models it as ``baseLat``, ~7-8 µs for ring/Simple);
- steps: ring algorithms (what NCCL and RCCL run for all-gather and reduce-scatter; Thakur et al.
  2005) take s − 1 steps; pairwise all-to-all s − 1; all-reduce is reduce-scatter + all-gather,
  2(s − 1). Each step waits one hop latency α_l (``Level.latency_us`` · ``latency_scale``), so a
  collective of small messages is latency-bound and its cost grows with the group size;
- b / (β_l · η_l): bytes sent per rank (``volume.py``, exactly what the engine's counter books)
  over the level's per-rank bandwidth times the achievable fraction η_l
  (``Calibration.level_efficiency``, from collective benchmarks' bus bandwidth: each collective's own where it
  was measured apart, ``Level.all_gather_busbw_gbps`` and its kin);
- quantization: elements quantized + dequantized / ``quant_elems_per_s`` (``quant_elems``);
- an all-to-all's bytes (ZeRO++'s quantized reduce-scatter) go at ``all_to_all_efficiency`` of the
  level's ring rate.

**A flat ring** (``Calibration.rings = "flat"``: DeepSpeed and FSDP run one NCCL collective on their
whole data-parallel group, not one per level) over the R ranks of levels lo..hi costs, as NCCL's own
model has it (``src/graph/tuning.cc``: ring latency = base + (nsteps − nInterSteps)·intraLat +
nInterSteps·interLat, and ``busBw`` the minimum over the ring's links)

    launch + k · Σ_l hops_l · α_l + max_l  bytes / (below_l · β_l · η_l)

- hops_l = R/below_l − R/(below_l · s_l): of the ring's R − 1 steps, those whose two ranks first
  differ at level l (below_l = ranks of the span under level l, Π_{lo ≤ m < l} s_m); k = 1 for
  all-gather and reduce-scatter, 2 for all-reduce. The latency grows with the *whole* group, not
  with each level's fan-out: 1,024 GPUs on 128 nodes pay 1,023 hops where zerotune's hierarchy
  pays 127 + 7;
- bytes = what each rank sends on the ring: (R − 1) shards for an all-gather, (R − 1)/R of the
  buffer for a reduce-scatter (twice for an all-reduce); the ring is pipelined, so the slowest
  link class sets the rate, and a subtree of below_l ranks leaves through below_l links of level l.
Gradient collectives at bits < 16 stay hierarchical (ZeRO++'s qgZ is a hierarchical all-to-all by
design). The bytes booked per level (``volume.py``) are the engine's; only the seconds differ.
**The protocol** (``Calibration.protocols``): NCCL times each collective under its Simple, LL128
and LL protocols and runs the fastest (``links.NCCL_RING_PROTOCOLS``: smaller base and hop
latencies for less bandwidth), so a latency-bound ring over a large group runs LL or LL128. A ring
over 2+ nodes pays the host's network post overhead on every node-link step (``Calibration.
net_overhead_us``, three times it under Simple), LL's bus bandwidth is capped
(``Calibration.ll_max_busbw_gbps``) and LL128 runs only where ``Calibration.ll128``, as both libraries'
tuners have it (``links`` [nccl-netoverhead]). An all-reduce under NCCL's protocols runs as a ring
or as NCCL's tree, whichever its model says is faster (``Costs._tree``: log2(nodes) network hops where
the ring pays nodes − 1, at half the bus bandwidth; ``links`` [nccl-tree]), and a multi-node Simple
ring all-reduce pays its latency ``Calibration.ring_plateau`` times. The
profiles of NVIDIA devices choose so (both kinds of ring); fitted calibrations, gloo runs and RCCL
(whose tables were not sourced) are charged Simple's latencies throughout.

**A broadcast** (``Costs.broadcast``: a runner that syncs weights from their owners, ``Calibration.weight_sync``)
is a chain along the flat ring, charged its pipeline's fill hop by hop at the best segment count (``chain``).

**The pipeline** (``pipeline``) is the engine's own dependency structure: one FIFO communication thread and one
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
"""

from __future__ import annotations

import math

from zerotune.strategies.costmodel.links import NCCL_TREE_CORRECTION, NCCL_TREE_PROTOCOLS, RING_PROTOCOLS
from zerotune.strategies.costmodel.rates import Calibration
from zerotune.strategies.costmodel.schedule import Coll, Group
from zerotune.strategies.spec import ClusterSpec, Level
from zerotune.strategies.volume import (
    Volume,
    all_gather_volume,
    all_reduce_volume,
    quantized_nbytes,
    reduce_scatter_volume,
    wire_elem_bytes,
)

_VOLUME = {"all_gather": all_gather_volume, "reduce_scatter": reduce_scatter_volume, "all_reduce": all_reduce_volume}
_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}
"""Ring steps per rank of a level, in units of (s − 1)."""


class Costs:
    """Memoized bytes and seconds of collectives on one cluster with one calibration (hot path)."""

    def __init__(self, cluster: ClusterSpec, calib: Calibration, elem_bytes: int, quantize_above: int,
                 block: int) -> None:
        self.cluster, self.calib, self.e, self.qa, self.block = cluster, calib, elem_bytes, quantize_above, block
        self.prefix = [math.prod(cluster.sizes[:k]) for k in range(cluster.num_levels + 1)]
        self._vol: dict[Coll, Volume] = {}
        self._flat: dict[Coll, tuple[tuple[tuple[str, str], int], ...]] = {}
        self._time: dict[Coll, float] = {}
        self.step_volumes: dict[tuple, tuple[Volume, int]] = {}
        """Step volumes by (schedule, accumulation): strategies that differ only in what moves no bytes
        (prefetch, micro-batch at a fixed accumulation, checkpointing) share one."""
        self.copies: dict[tuple, tuple[float, float]] = {}
        """A micro-step's copies by (schedule, reduction bytes) (``predict._copy_seconds``), for runners that copy."""

    def volume(self, c: Coll) -> Volume:
        vol = self._vol.get(c)
        if vol is None:
            op, levels, numel, bits = c
            vol = self._vol[c] = _VOLUME[op](self.cluster, levels, numel, self.e, bits, self.qa, self.block)
        return vol

    def flat_volume(self, c: Coll) -> tuple[tuple[tuple[str, str], int], ...]:
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

    def _ring_levels(self, lo: int, hi: int, op: str | None = None) -> list[tuple[Level, int, float]]:
        """The levels lo..hi of 2+ ranks as one ring over all their R ranks runs them: (level, hops_l, rate_l), of
        the ring's R − 1 hops those whose two ranks first differ at level l (R/below_l − R/(below_l · s_l)), and
        the bytes per second a subtree of below_l ranks leaves through (below_l · bandwidth_l · η_l, η_l what
        collective ``op`` achieves there: ``Calibration.level_efficiency``)."""
        ranks = self.prefix[hi] // self.prefix[lo - 1]
        out, below = [], 1
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size > 1:
                out.append((lv, ranks // below - ranks // (below * lv.size),
                            below * lv.bandwidth_gbps * 1e9 * self.calib.level_efficiency(level, op)))
            below *= lv.size
        return out

    def _protocol_rows(self, nodes: int) -> list[tuple[str, float, float, float, float, float, float]]:
        """The protocols a collective over ``nodes`` nodes may run under (``Calibration.protocols``) as (name, launch
        scale, node-hop scale, network-hop scale, bandwidth fraction, per-step floor in seconds, LL's bus-bandwidth
        cap in bytes/s or inf), each scaled to the library's Simple row; ``simple``: Simple's latencies alone."""
        calib = self.calib
        if calib.protocols == "simple":
            return [("Simple", 1.0, 1.0, 1.0, 1.0, 0.0, math.inf)]
        table = RING_PROTOCOLS[calib.protocols]
        base_ref, node_ref, net_ref, _ = table["Simple"]
        return [(name, base / base_ref, node / node_ref, net / net_ref, bw,
                 calib.net_overhead_us * (3 if name == "Simple" else 1) * 1e-6 if nodes > 1 else 0.0,
                 self._ll_cap(nodes) if name == "LL" else math.inf)
                for name, (base, node, net, bw) in table.items() if name != "LL128" or calib.ll128]

    def _hop_s(self, hop_us: float, node_scale: float, net_scale: float, floor: float) -> float:
        """Seconds one ring step waits on a hop of ``hop_us`` (Simple): the network's scale where the hop is the
        library's Simple network latency or more, else the node link's, and never less than ``floor``."""
        table = RING_PROTOCOLS.get(self.calib.protocols)
        alpha = self.calib.latency_scale * 1e-6
        if table is not None and hop_us >= table["Simple"][2]:
            return hop_us * alpha * net_scale
        step = hop_us * alpha * node_scale
        return step if step > floor else floor

    def _flat_ring(self, op: str, lo: int, hi: int, numel: int, bits: int) -> float:
        """Seconds on the wire of one collective run as one ring over all its ranks (module docstring)."""
        calib = self.calib
        ranks = self.prefix[hi] // self.prefix[lo - 1]
        e = wire_elem_bytes(self.e, bits)
        if op == "all_gather":
            sent = (ranks - 1) * (quantized_nbytes(numel, bits, self.block) if bits < 16 else numel * e)
        else:
            sent = _STEPS[op] * (ranks - 1) * (numel // ranks) * e
        slowest, nodes = 0.0, 1
        node_hop = net_hop = 0.0
        hops: list[tuple[int, float]] = []  # (ring steps at the level, its Simple hop latency)
        for lv, steps, rate in self._ring_levels(lo, hi, op):
            hops.append((_STEPS[op] * steps, lv.latency_us))
            slowest = max(slowest, sent / rate)
            if self._network(lv.latency_us):
                nodes *= lv.size
                net_hop = max(net_hop, lv.latency_us)
            else:
                node_hop = max(node_hop, lv.latency_us)
        ring = self._fastest(hops, slowest, sent, nodes, op == "all_reduce", nodes > 1 and ranks == nodes)
        if op != "all_reduce" or calib.protocols != "nccl" or not slowest:
            return ring
        return min(ring, self._tree(ranks, nodes, numel * e, sent / slowest, node_hop, net_hop))

    def _level_rings(self, c: Coll) -> float:
        """Seconds on the wire of one collective run as one ring per level, one level after the other (a
        16-bit all-reduce as NCCL's tree where that is faster; a quantized one is the engine's own exchange)."""
        op, (lo, hi), _, bits = c
        vol, calib = self.volume(c), self.calib
        tree = op == "all_reduce" and bits >= 16 and calib.protocols == "nccl"
        t = 0.0
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size == 1:
                continue
            kinds = vol.get(lv.name, {})
            sent = sum(kinds.values()) + (1 / calib.all_to_all_efficiency - 1) * kinds.get("all_to_all", 0)
            rate = lv.bandwidth_gbps * 1e9 * calib.level_efficiency(level, op)
            network = self._network(lv.latency_us)
            nodes = lv.size if network else 1
            ring = self._fastest([(_STEPS[op] * (lv.size - 1), lv.latency_us)], sent / rate, sent, nodes,
                                 op == "all_reduce", network)
            if tree and sent:
                buffer = sent * lv.size / (2 * (lv.size - 1))  # a ring all-reduce sends 2(s - 1)/s of it
                ring = min(ring, self._tree(lv.size, nodes, buffer, rate, 0.0 if network else lv.latency_us,
                                            lv.latency_us if network else 0.0))
            t += ring
        return t

    def _tree(self, ranks: int, nodes: int, nbytes: float, busbw: float, node_hop: float, net_hop: float) -> float:
        """Seconds of an ``nbytes`` all-reduce over ``ranks`` on ``nodes`` as NCCL's tree runs it, under the
        fastest of its protocols (``links.NCCL_TREE_PROTOCOLS``, ``NCCL_TREE_CORRECTION``): base +
        2 · ((ranks per node − 1) · NVLink hop + log2(nodes) · network hop), and the buffer at half the
        tree's bus bandwidth (a fraction of the ring's Simple ``busbw``, bytes/s). The levels' own hop
        latencies (``node_hop``, ``net_hop``) scale the table's as the ring's do."""
        calib = self.calib
        alpha, launch = calib.latency_scale * 1e-6, calib.collective_launch_us * 1e-6
        base_ref, node_ref, net_ref, _ = RING_PROTOCOLS["nccl"]["Simple"]
        per_node, depth = ranks // nodes, nodes.bit_length() - 1
        size_index = (int(nbytes) >> 6).bit_length() - 1
        best = math.inf
        for name, (base, node, net, fraction) in NCCL_TREE_PROTOCOLS.items():
            if name == "LL128" and not calib.ll128:
                continue
            bw = busbw * fraction if name != "LL" else min(busbw * fraction, self._ll_cap(nodes))
            if 0 <= size_index < len(NCCL_TREE_CORRECTION[name]):
                bw *= NCCL_TREE_CORRECTION[name][size_index]
            hops = (per_node - 1) * node_hop * node / node_ref + depth * net_hop * net / net_ref
            t = launch * base / base_ref + 2 * hops * alpha + nbytes / (0.5 * bw)
            best = t if t < best else best
        return best

    def _ll_cap(self, nodes: int) -> float:
        """LL's bus-bandwidth cap (bytes/s) for a collective on ``nodes`` (1, 2, more); inf where none is set."""
        caps = self.calib.ll_max_busbw_gbps
        return caps[min(nodes, 3) - 1] * 1e9 if caps else math.inf

    def _network(self, hop_us: float) -> bool:
        """Whether a level whose hop latency is ``hop_us`` joins nodes: its hop is at least the network
        hop of the library's Simple row (only asked under ``protocols`` nccl or rccl)."""
        table = RING_PROTOCOLS.get(self.calib.protocols)
        return table is not None and hop_us >= table["Simple"][2]

    def ring_latency(self, c: Coll, all_to_all: bool = False) -> tuple[tuple[str, float], ...]:
        """(level, seconds) of one collective that do not depend on its bytes — each level ring's launch and
        hops under Simple, as ``_level_rings`` charges them — for the levels whose bytes are booked as ring
        collectives (or, with ``all_to_all``, for those booked as a quantized reduction's all-to-all). What a
        measured level's seconds in the engine's collectives hold beside their wire time
        (``calibration.measured_level_efficiencies``)."""
        op, (lo, hi), _, _ = c
        vol, calib = self.volume(c), self.calib
        alpha, launch = calib.latency_scale * 1e-6, calib.collective_launch_us * 1e-6
        out = []
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size > 1 and bool(vol.get(lv.name, {}).get("all_to_all")) == all_to_all:
                out.append((lv.name, launch + _STEPS[op] * (lv.size - 1) * lv.latency_us * alpha))
        return tuple(out)

    def _fastest(self, hops: list[tuple[int, float]], wire_s: float, sent: float = 0.0, nodes: int = 1,
                 all_reduce: bool = False, one_per_node: bool = False) -> float:
        """One ring's seconds: launch + Σ steps · hop latency + ``wire_s`` (its ``sent`` bytes per rank at the
        Simple rate), under the Simple protocol, or the fastest of NCCL's or RCCL's
        (``Calibration.protocols``). The launch and a level's own hop latency are scaled to a protocol by
        their ratio to the Simple row of the library's table: the network's where the hop is that row's
        network latency or more, the node link's below. As the library's tuner has it
        [``links`` nccl-netoverhead], a ring over 2+ ``nodes`` pays at least the host's network post
        overhead on every node-link step (three times it under Simple), LL's bus bandwidth is capped
        (``Calibration.ll_max_busbw_gbps``), LL128 runs only where ``Calibration.ll128``, and an
        ``all_reduce`` ring across nodes pays its Simple latency ``Calibration.ring_plateau`` times. A ring
        with ``one_per_node`` rank pays NCCL's tree network latency on each hop ("with ppn=1 latencies are
        fully exposed": ``NCCL_TREE_PROTOCOLS``' network column); RCCL's has no sourced tree table."""
        calib = self.calib
        launch = calib.collective_launch_us * 1e-6
        exposed = one_per_node and calib.protocols == "nccl"
        net_ref = RING_PROTOCOLS[calib.protocols]["Simple"][2] if calib.protocols != "simple" else 1.0
        best = math.inf
        for name, base, node, net, bw, floor, cap in self._protocol_rows(nodes):
            if exposed:
                net = NCCL_TREE_PROTOCOLS[name][2] / net_ref
            wire = wire_s / bw
            if name == "LL" and sent:
                wire = max(wire, sent / cap)
            lat = launch * base + sum(steps * self._hop_s(hop, node, net, floor) for steps, hop in hops)
            if all_reduce and nodes > 1 and name == "Simple":
                lat *= calib.ring_plateau
            t = lat + wire
            best = t if t < best else best
        return best

    def broadcast(self, lo: int, hi: int, numel: int) -> float:
        """Seconds of one broadcast of ``numel`` 16-bit elements from one rank to every rank of levels lo..hi (one
        NCCL call on the group, however ``Calibration.rings`` runs the rest), under the fastest protocol
        (``Calibration.protocols``; launch and hop latencies scaled as ``_fastest`` scales them).

        NCCL runs a broadcast along its ring as a chain (``src/device/broadcast.h``, ``runRing``: each rank
        receives a chunk, and forwards it to the next as it copies it out), so the buffer crosses every one of the
        ring's R - 1 hops in segments, and the hops are the flat ring's (``_flat_ring``: hops_l at level l, of
        hop latency α_l and β_l = 1 / (below_l · bandwidth_l · η_l) seconds a byte). A segment of s bytes takes
        α_l + s·β_l on a hop of level l; k segments of a buffer of S bytes take (the segmented chain of
        Pješivac-Grbović et al., "Performance analysis of MPI collective operations", Cluster Computing 10:127,
        2007, with hops of several kinds)

            T(k) = Σ_l hops_l · (α_l + s·β_l) + (k − 1) · max_l (α_l + s·β_l),   s = S / k:

        the first segment's fill of the whole chain, then one segment per slowest-hop time. Charged at the best
        k (the optimum of Johnsson and Ho, "Optimum broadcasting and personalized communication in hypercubes",
        IEEE Trans. Computers 38(9), 1989: (√((p − 2)·α) + √(S·β))² on p ranks of one kind), which NCCL's fixed
        chunks can only reach, not beat: the least a broadcast costs. Unlike an all-gather's ring, where every
        rank sends its own shard at each step, a broadcast's fill grows with the group, so at a thousand ranks
        a broadcast of tens of MB costs twice or more what its bytes and latency add up to."""
        key = ("broadcast", (lo, hi), numel, 16)
        cached = self._time.get(key)
        if cached is not None:
            return cached
        t = 0.0
        if self.moves(key):
            levels = self._ring_levels(lo, hi)
            nodes = math.prod(lv.size for lv, _, _ in levels if self._network(lv.latency_us))
            launch = self.calib.collective_launch_us * 1e-6
            t = math.inf
            for _, base, node, net, bw, floor, cap in self._protocol_rows(nodes):
                # per level: (hops, seconds a segment waits on a hop, seconds a byte takes on it)
                stages = [(hops, self._hop_s(lv.latency_us, node, net, floor), max(1 / rate / bw, 1 / cap))
                          for lv, hops, rate in levels]
                t = min(t, launch * base + chain(stages, numel * self.e))
        self._time[key] = t
        return t

    def moves(self, c: Coll) -> bool:
        """Whether the collective runs at all: a non-empty range of levels holding more than one rank."""
        lo, hi = c[1]
        return lo <= hi and self.prefix[hi] != self.prefix[lo - 1]

    def time(self, c: Coll) -> float:
        """Seconds of one collective (see the module docstring)."""
        cached = self._time.get(c)
        if cached is not None:
            return cached
        op, (lo, hi), numel, bits = c
        t = 0.0
        if self.moves(c):
            flat = self.calib.rings == "flat" and (op == "all_gather" or bits >= 16)  # qgZ stays hierarchical
            t = self._flat_ring(op, lo, hi, numel, bits) if flat else self._level_rings(c)
            if bits < 16:
                t += self.quant_elems(op, lo, hi, numel) / self.calib.quant_elems_per_s
        self._time[c] = t
        return t


def chain(stages: list[tuple[int, float, float]], nbytes: float) -> float:
    """Seconds of ``nbytes`` pipelined down a chain of (hops, seconds a segment waits on a hop, seconds a byte
    takes on it) stages, at the number of segments k that takes least (``Costs.broadcast``): k at each stage's
    stationary point as the slowest hop (√(S · (Σ hops·β − β_m) / α_m)), and where two stages' segment times
    cross, rounded both ways, and 1."""
    def total(k: int) -> float:
        seg = nbytes / k
        return sum(n * (a + seg * b) for n, a, b in stages) + (k - 1) * max(a + seg * b for _, a, b in stages)

    fill = sum(n * b for n, _, b in stages)
    marks = [nbytes * (fill - b) / a for _, a, b in stages if a > 0]
    marks = [math.sqrt(m) for m in marks if m > 0]
    marks += [nbytes * (bj - bi) / (ai - aj) for _, ai, bi in stages for _, aj, bj in stages if ai > aj and bj > bi]
    if any(a <= 0 for _, a, _ in stages):
        marks.append(nbytes)
    ks = {1} | {max(1, min(int(nbytes), f(m))) for m in marks for f in (math.floor, math.ceil)}
    return min(total(k) for k in ks)


_COSTS: dict[tuple, Costs] = {}


def costs_for(cluster: ClusterSpec, calib: Calibration, e: int, qa: int, block: int) -> Costs:
    """The shared ``Costs`` of one (cluster, calibration, dtype, quantize_above, block)."""
    key = (cluster, calib, e, qa, block)
    costs = _COSTS.get(key)
    if costs is None:
        if len(_COSTS) > 256:
            _COSTS.clear()
        costs = _COSTS[key] = Costs(cluster, calib, e, qa, block)
    return costs


def clear() -> None:
    _COSTS.clear()


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
    translation invariant in time — so the rest of the run is skipped in one jump. Exact up to
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
            d = t - pt
            tol = 1e-12 * t
            if abs(comm - pc - d) <= tol and all(abs(ends[m + 1] - ends[m] - d) <= tol for m in range(i, issued - 1)):
                k = last - i
                shift = k * d
                ends[i + 1 + k:issued + k] = [x + shift for x in ends[i + 1:issued]]
                lost += k * (lost - pl)  # the slow-down depends on (queue - compute) only: the same each time
                t, comm, issued, i = t + shift, comm + shift, issued + k, last
        pt, pc, pl = t, comm, lost
        i += 1
    return t, comm, lost
