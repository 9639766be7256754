"""Seconds of one collective on one cluster: which rings it runs, their hops and their bytes (pure Python).

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
- quantization: elements quantized + dequantized / ``quant_elems_per_s`` (``volume.quant_elements``);
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

**At scale** (``fabrics``): where the calibration's collective library and fabric (``Calibration.fabric``) were
measured across nodes, a ring that spans 2+ nodes is charged the law read off those measurements instead —
launch + k·(ranks − 1)·λ(N) + bytes / (η(N) · line), λ and η by the N nodes it spans: a flat ring all of it, its
line the node's NICs (what was measured), zerotune's inter-node ring of one rank per node its N − 1 steps, its line
the rank's share of the NICs (the ranks under the level run their rings side by side); a ring whose steps carry less
than the smallest chunk measured, the more of the law and the α-β ring. Intra-node levels, and nodes of another
design than the one measured (``fabrics.applies``), keep the α-β ring.

**The protocol** each ring runs under (Simple, LL128 or LL), and for an all-reduce whether NCCL's tree beats
the ring, is what the library's own model says is fastest: ``protocols``.

**A broadcast** (``Costs.broadcast``: a runner that syncs weights from their owners, ``Calibration.weight_sync``)
is a chain along the flat ring, charged its pipeline's fill hop by hop at the best segment count
(``protocols.chain``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from zerotune.core.spec import ClusterSpec, Level
from zerotune.core.volume import (
    Volume,
    all_gather_volume,
    all_reduce_volume,
    pairs,
    quant_elements,
    quantized_nbytes,
    reduce_scatter_volume,
    wire_elem_bytes,
)
from zerotune.costmodel.fabrics import ring_seconds as fabric_ring
from zerotune.costmodel.fabrics import step_seconds
from zerotune.costmodel.protocols import STEPS, chain, fastest, hop_s, network, protocol_rows, tree
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.schedule import Coll, Group

_VOLUME = {"all_gather": all_gather_volume, "reduce_scatter": reduce_scatter_volume, "all_reduce": all_reduce_volume}


class Seconds(NamedTuple):
    """The seconds of a schedule's collectives as one runner (``Costs.calib``) issues them; the same for every
    strategy that shares the schedule, whatever its micro-batch, prefetch or checkpointing."""

    fwd: dict[int, float]
    """Forward gather by bucket length (the root's included)."""
    bwd: dict[int, float]
    """Backward gather by bucket length."""
    reduce: dict[Group, float]
    """A reduce group's reduction within ``grad_span``."""
    final: dict[Group, float]
    """The same in the step's final micro-step: with the reduction beyond ``grad_span`` where the runner
    queues it in backward (``Calibration.outer_reduce``); ``reduce`` itself where nothing more is queued."""
    boundary: float
    """The step boundary's collectives."""
    passes: dict[tuple, tuple[float, float, float]]
    """``pipeline``'s passes over these collectives, by what else they read (``pipeline.time_step``): strategies
    that share the schedule and their compute per block share them too."""


class Costs:
    """Memoized bytes and seconds of collectives on one cluster with one calibration (hot path)."""

    def __init__(self, cluster: ClusterSpec, calib: Calibration, elem_bytes: int, quantize_above: int,
                 block: int) -> None:
        self.cluster, self.calib, self.e, self.qa, self.block = cluster, calib, elem_bytes, quantize_above, block
        self.prefix = [math.prod(cluster.sizes[:k]) for k in range(len(cluster.sizes) + 1)]
        """Ranks in each span, 0..L (``ClusterSpec.span_size``)."""
        self._vol: dict[Coll, Volume] = {}
        self._flat: dict[Coll, tuple[tuple[tuple[str, str], int], ...]] = {}
        self._time: dict[Coll, float] = {}
        self.step_volumes: dict[tuple[int, int], tuple[Volume, int]] = {}
        """Step volumes by (schedule, accumulation): strategies that differ only in what moves no bytes
        (prefetch, micro-batch at a fixed accumulation, checkpointing) share one."""
        self.copies: dict[tuple[int, int], tuple[float, float]] = {}
        """A micro-step's copies by (schedule, reduction bytes) (``runners.copy_seconds``), for runners that copy."""
        self.seconds: dict[int, Seconds] = {}
        """A schedule's collectives timed as this runner issues them, by schedule (``runners.schedule_seconds``)."""

    def volume(self, c: Coll) -> Volume:
        vol = self._vol.get(c)
        if vol is None:
            op, levels, numel, bits = c
            vol = self._vol[c] = _VOLUME[op](self.cluster, levels, numel, self.e, bits, self.qa, self.block)
        return vol

    def flat_volume(self, c: Coll) -> tuple[tuple[tuple[str, str], int], ...]:
        """``volume(c)`` as ((level, kind), bytes) pairs with bytes > 0 (``volume.pairs``: cheap to accumulate)."""
        flat = self._flat.get(c)
        if flat is None:
            flat = self._flat[c] = pairs(self.volume(c))
        return flat

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

    def _nics(self, lo: int, hi: int) -> tuple[float, int, int]:
        """What one flat ring over levels lo..hi leaves its nodes through: (the node's NIC line rate in bytes/s,
        ranks per node, rings side by side on each node), at its outermost network level: every rank of the node
        under that level sends through its NICs, the ring through its span's share (ranks per node / the span's
        ranks under the level)."""
        below, out = 1, (math.inf, 1, 1)
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size > 1 and network(self.calib, lv.latency_us):
                per_node = self.prefix[level - 1]
                out = (per_node * lv.bandwidth_gbps * 1e9, per_node, max(per_node // below, 1))
            below *= lv.size
        return out

    def _flat_ring(self, op: str, lo: int, hi: int, numel: int, bits: int) -> float:
        """Seconds on the wire of one collective run as one ring over all its ranks (module docstring)."""
        calib = self.calib
        ranks = self.prefix[hi] // self.prefix[lo - 1]
        e = wire_elem_bytes(self.e, bits)
        if op == "all_gather":
            sent = (ranks - 1) * (quantized_nbytes(numel, bits, self.block) if bits < 16 else numel * e)
        else:
            sent = STEPS[op] * (ranks - 1) * (numel // ranks) * e
        slowest, nodes = 0.0, 1
        node_hop = net_hop = 0.0
        hops: list[tuple[int, float]] = []  # (ring steps at the level, its Simple hop latency)
        for lv, steps, rate in self._ring_levels(lo, hi, op):
            hops.append((STEPS[op] * steps, lv.latency_us))
            slowest = max(slowest, sent / rate)
            if network(calib, lv.latency_us):
                nodes *= lv.size
                net_hop = max(net_hop, lv.latency_us)
            else:
                node_hop = max(node_hop, lv.latency_us)
        ring = fastest(calib, hops, slowest, sent, nodes, op == "all_reduce", nodes > 1 and ranks == nodes)
        node_line, per_node, share = self._nics(lo, hi)
        law = fabric_ring(calib.fabric, op, ranks, nodes, sent, node_line, per_node, share,
                          calib.collective_launch_us * 1e-6, ring)
        if law is not None:  # measured on this fabric at scale (``fabrics``): the law, not the α-β ring
            return law
        if op != "all_reduce" or calib.protocols != "nccl" or not slowest:
            return ring
        return min(ring, tree(calib, ranks, nodes, numel * e, sent / slowest, node_hop, net_hop))

    def _level_rings(self, c: Coll) -> float:
        """Seconds on the wire of one collective run as one ring per level, one level after the other (a
        16-bit all-reduce as NCCL's tree where that is faster; a quantized one is the engine's own exchange)."""
        op, (lo, hi), _, bits = c
        vol, calib = self.volume(c), self.calib
        as_tree = op == "all_reduce" and bits >= 16 and calib.protocols == "nccl"
        t = 0.0
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size == 1:
                continue
            kinds = vol.get(lv.name, {})
            sent = sum(kinds.values()) + (1 / calib.all_to_all_efficiency - 1) * kinds.get("all_to_all", 0)
            rate = lv.bandwidth_gbps * 1e9 * calib.level_efficiency(level, op)
            joins = network(calib, lv.latency_us)
            nodes = lv.size if joins else 1
            ring = fastest(calib, [(STEPS[op] * (lv.size - 1), lv.latency_us)], sent / rate, sent, nodes,
                           op == "all_reduce", joins)
            per_node = self.prefix[level - 1]
            law = fabric_ring(calib.fabric, op, lv.size, nodes, sent, per_node * lv.bandwidth_gbps * 1e9, per_node,
                              per_node, calib.collective_launch_us * 1e-6, ring)
            if law is not None:  # one rank per node, the ranks under the level side by side (``fabrics``)
                t += law
                continue
            if as_tree and sent:
                buffer = sent * lv.size / (2 * (lv.size - 1))  # a ring all-reduce sends 2(s - 1)/s of it
                ring = min(ring, tree(calib, lv.size, nodes, buffer, rate, 0.0 if joins else lv.latency_us,
                                      lv.latency_us if joins else 0.0))
            t += ring
        return t

    def ring_latency(self, c: Coll, all_to_all: bool = False) -> tuple[tuple[str, float], ...]:
        """(level, seconds) of one collective that do not depend on its bytes — each level ring's launch and
        hops under Simple (a measured fabric's per-step latency, ``fabrics``), as ``_level_rings`` charges them —
        for the levels whose bytes are booked as ring collectives (or, with ``all_to_all``, for those booked as a
        quantized reduction's all-to-all). What a measured level's seconds in the engine's collectives hold beside
        their wire time (``measured.measured_level_efficiencies``)."""
        op, (lo, hi), _, _ = c
        vol, calib = self.volume(c), self.calib
        alpha, launch = calib.latency_scale * 1e-6, calib.collective_launch_us * 1e-6
        out = []
        for level in range(lo, hi + 1):
            lv = self.cluster.levels[level - 1]
            if lv.size > 1 and bool(vol.get(lv.name, {}).get("all_to_all")) == all_to_all:
                per_node = self.prefix[level - 1]
                law = step_seconds(calib.fabric, lv.size, per_node, per_node * lv.bandwidth_gbps * 1e9, launch) \
                    if network(calib, lv.latency_us) else None
                hop = lv.latency_us * alpha if law is None else law
                out.append((lv.name, launch + STEPS[op] * (lv.size - 1) * hop))
        return tuple(out)

    def broadcast(self, lo: int, hi: int, numel: int) -> float:
        """Seconds of one broadcast of ``numel`` 16-bit elements from one rank to every rank of levels lo..hi (one
        NCCL call on the group, however ``Calibration.rings`` runs the rest), under the fastest protocol
        (``Calibration.protocols``; launch and hop latencies scaled as ``protocols.fastest`` scales them).

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
            calib, levels = self.calib, self._ring_levels(lo, hi)
            nodes = math.prod(lv.size for lv, _, _ in levels if network(calib, lv.latency_us))
            launch = calib.collective_launch_us * 1e-6
            t = math.inf
            for _, base, node, net, bw, floor, cap in protocol_rows(calib, nodes):
                # per level: (hops, seconds a segment waits on a hop, seconds a byte takes on it)
                stages = [(hops, hop_s(calib, lv.latency_us, node, net, floor), max(1 / rate / bw, 1 / cap))
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
                t += quant_elements(self.cluster, self.qa, op, lo, hi, numel) / self.calib.quant_elems_per_s
        self._time[c] = t
        return t


_COSTS: dict[tuple, Costs] = {}
_BY_ID: dict[tuple[int, int, int, int, int], tuple[ClusterSpec, Calibration, Costs]] = {}
"""``_COSTS`` by the identities of the cluster and calibration (held, so that no id is reused): a study predicts with
the same two objects call after call, and hashing them (every level, every rate) costs more than the rest of a
memoized prediction's lookups."""


def costs_for(cluster: ClusterSpec, calib: Calibration, e: int, qa: int, block: int) -> Costs:
    """The shared ``Costs`` of one (cluster, calibration, dtype, quantize_above, block)."""
    known = _BY_ID.get((id(cluster), id(calib), e, qa, block))
    if known is not None and known[0] is cluster and known[1] is calib:
        return known[2]
    key = (cluster, calib, e, qa, block)
    costs = _COSTS.get(key)
    if costs is None:
        if len(_COSTS) > 256:
            _COSTS.clear()
        costs = _COSTS[key] = Costs(cluster, calib, e, qa, block)
    if len(_BY_ID) > 256:
        _BY_ID.clear()
    _BY_ID[id(cluster), id(calib), e, qa, block] = (cluster, calib, costs)
    return costs


def clear() -> None:
    _COSTS.clear()
    _BY_ID.clear()
