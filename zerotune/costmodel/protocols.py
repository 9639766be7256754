"""Seconds of one ring, tree or chain as the collective libraries run it: the fastest of their protocols.

``timing.Costs`` says which rings a collective runs (one per level, or one flat ring over the whole group) and
how many hops of which latency each takes; this module charges them as NCCL or RCCL would (pure functions of
a ``Calibration``).

**The protocol** (``Calibration.protocols``): NCCL times each collective under its Simple, LL128 and LL protocols
and runs the fastest (``links.NCCL_RING_PROTOCOLS``: smaller base and hop latencies for less bandwidth), so a
latency-bound ring over a large group runs LL or LL128. A ring over 2+ nodes pays the host's network post
overhead on every node-link step (``Calibration.net_overhead_us``, three times it under Simple), LL's bus
bandwidth is capped (``Calibration.ll_max_busbw_gbps``) and LL128 runs only where ``Calibration.ll128``, as
both libraries' tuners have it (``links`` [nccl-netoverhead]). An all-reduce under NCCL's protocols runs as a
ring or as NCCL's tree, whichever its model says is faster (``tree``: log2(nodes) network hops where the ring
pays nodes − 1, at half the bus bandwidth; ``links`` [nccl-tree]), and a multi-node Simple ring all-reduce pays
its latency ``Calibration.ring_plateau`` times. The profiles of NVIDIA devices choose so (both kinds of ring);
fitted calibrations, gloo runs and RCCL (whose tables were not sourced) are charged Simple's latencies
throughout.

**A chain** (``chain``): a broadcast's buffer pipelined in segments down NCCL's ring (``timing.Costs.broadcast``),
at the segment count that takes least.
"""

from __future__ import annotations

import math

from zerotune.costmodel.links import NCCL_TREE_CORRECTION, NCCL_TREE_PROTOCOLS, RING_PROTOCOLS
from zerotune.costmodel.rates import Calibration

STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}
"""Ring steps per rank of a level, in units of (s − 1)."""

Row = tuple[str, float, float, float, float, float, float]
"""A protocol as ``protocol_rows`` gives it: (name, launch scale, node-hop scale, network-hop scale, bandwidth
fraction, per-step floor in seconds, LL's bus-bandwidth cap in bytes/s or inf)."""


def protocol_rows(calib: Calibration, nodes: int) -> list[Row]:
    """The protocols a collective over ``nodes`` nodes may run under (``Calibration.protocols``), each scaled to
    the library's Simple row; ``simple``: Simple's latencies alone."""
    if calib.protocols == "simple":
        return [("Simple", 1.0, 1.0, 1.0, 1.0, 0.0, math.inf)]
    table = RING_PROTOCOLS[calib.protocols]
    base_ref, node_ref, net_ref, _ = table["Simple"]
    return [(name, base / base_ref, node / node_ref, net / net_ref, bw,
             calib.net_overhead_us * (3 if name == "Simple" else 1) * 1e-6 if nodes > 1 else 0.0,
             ll_cap(calib, nodes) if name == "LL" else math.inf)
            for name, (base, node, net, bw) in table.items() if name != "LL128" or calib.ll128]


def hop_s(calib: Calibration, hop_us: float, node_scale: float, net_scale: float, floor: float) -> float:
    """Seconds one ring step waits on a hop of ``hop_us`` (Simple): the network's scale where the hop is the
    library's Simple network latency or more (``network``), else the node link's, and never less than ``floor``."""
    alpha = calib.latency_scale * 1e-6
    if network(calib, hop_us):
        return hop_us * alpha * net_scale
    step = hop_us * alpha * node_scale
    return step if step > floor else floor


def ll_cap(calib: Calibration, nodes: int) -> float:
    """LL's bus-bandwidth cap (bytes/s) for a collective on ``nodes`` (1, 2, more); inf where none is set."""
    caps = calib.ll_max_busbw_gbps
    return caps[min(nodes, 3) - 1] * 1e9 if caps else math.inf


def network(calib: Calibration, hop_us: float) -> bool:
    """Whether a level whose hop latency is ``hop_us`` joins nodes: its hop is at least the network
    hop of the library's Simple row (only asked under ``protocols`` nccl or rccl)."""
    table = RING_PROTOCOLS.get(calib.protocols)
    return table is not None and hop_us >= table["Simple"][2]


def fastest(calib: Calibration, hops: list[tuple[int, float]], wire_s: float, sent: float = 0.0, nodes: int = 1,
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
    launch = calib.collective_launch_us * 1e-6
    exposed = one_per_node and calib.protocols == "nccl"
    net_ref = RING_PROTOCOLS[calib.protocols]["Simple"][2] if calib.protocols != "simple" else 1.0
    best = math.inf
    for name, base, node, net, bw, floor, cap in protocol_rows(calib, nodes):
        if exposed:
            net = NCCL_TREE_PROTOCOLS[name][2] / net_ref
        wire = wire_s / bw
        if name == "LL" and sent:
            wire = max(wire, sent / cap)
        lat = launch * base + sum(steps * hop_s(calib, hop, node, net, floor) for steps, hop in hops)
        if all_reduce and nodes > 1 and name == "Simple":
            lat *= calib.ring_plateau
        t = lat + wire
        best = t if t < best else best
    return best


def tree(calib: Calibration, ranks: int, nodes: int, nbytes: float, busbw: float, node_hop: float,
         net_hop: float) -> float:
    """Seconds of an ``nbytes`` all-reduce over ``ranks`` on ``nodes`` as NCCL's tree runs it, under the
    fastest of its protocols (``links.NCCL_TREE_PROTOCOLS``, ``NCCL_TREE_CORRECTION``): base +
    2 · ((ranks per node − 1) · NVLink hop + log2(nodes) · network hop), and the buffer at half the
    tree's bus bandwidth (a fraction of the ring's Simple ``busbw``, bytes/s). The levels' own hop
    latencies (``node_hop``, ``net_hop``) scale the table's as the ring's do."""
    alpha, launch = calib.latency_scale * 1e-6, calib.collective_launch_us * 1e-6
    base_ref, node_ref, net_ref, _ = RING_PROTOCOLS["nccl"]["Simple"]
    per_node, depth = ranks // nodes, nodes.bit_length() - 1
    size_index = (int(nbytes) >> 6).bit_length() - 1
    best = math.inf
    for name, (base, node, net, fraction) in NCCL_TREE_PROTOCOLS.items():
        if name == "LL128" and not calib.ll128:
            continue
        bw = busbw * fraction if name != "LL" else min(busbw * fraction, ll_cap(calib, nodes))
        if 0 <= size_index < len(NCCL_TREE_CORRECTION[name]):
            bw *= NCCL_TREE_CORRECTION[name][size_index]
        hops = (per_node - 1) * node_hop * node / node_ref + depth * net_hop * net / net_ref
        t = launch * base / base_ref + 2 * hops * alpha + nbytes / (0.5 * bw)
        best = t if t < best else best
    return best


def chain(stages: list[tuple[int, float, float]], nbytes: float) -> float:
    """Seconds of ``nbytes`` pipelined down a chain of (hops, seconds a segment waits on a hop, seconds a byte
    takes on it) stages, at the number of segments k that takes least (``timing.Costs.broadcast``): k at each
    stage's stationary point as the slowest hop (√(S · (Σ hops·β − β_m) / α_m)), and where two stages' segment
    times cross, rounded both ways, and 1."""
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
