"""What a collective library's rings cost across nodes on one fabric, as collective benchmarks at scale measured it.

``timing`` charges a ring that spans nodes by the α-β model of ``links`` and ``protocols``: the library's own
tuning tables (a Simple network step of 14 µs under NCCL, 19.8 µs under RCCL) and a link's collective efficiency
measured on 2-3 nodes. At hundreds of nodes vendor collectives run far slower than that: RCCL on Frontier ran a
256 MB all-gather on 2,048 GCDs in 156 ms where the α-β ring charges 21 ms [pccl]. This module holds, per
collective library and fabric (``FABRICS``, the key ``Calibration.fabric`` names), the collectives measured at
scale and the law read off them:

    T = launch + k · (R − 1) · λ(N) + sent / (η(N) · line)

for a ring of R ranks spanning N nodes (k = 1 for an all-gather or a reduce-scatter, 2 for an all-reduce), each
rank sending ``sent`` bytes; λ(N) is the per-step latency and η(N) the fraction of its line rate ``line`` the ring
leaves a node with: a flat ring over every rank leaves each node through all its NICs (line = the node's NIC
rate), zerotune's one ring per level through its rank's share of them (the ranks under the level run their rings
side by side). The law charges rings on nodes of the design it was measured on (``applies``); another node design
on the same fabric keeps the α-β ring.
Each fabric's law is read off its reference cluster's measurements (``Fabric.measured``); the fabric's other
sources are rows of ``bench/collectives_at_scale.py``, predicted by the law and held to it by its test.

**Solving λ and B.** The measurements of one fabric at one node count (``Measured``) are the rings the library ran
over every GPU (a flat ring of R = N × ranks-per-node) at two or more message sizes. λ(N) and 1/B(N) are the least
squares of the relative error over those rows (``solve``), with B held at most at the nodes' line rate (η ≤ 1: a
two-size solve that returns more, or a negative bandwidth, says the time did not grow with the size, the library was
latency-bound there) and λ at least 0 (both bounds tightened by the order in nodes below). **Between measured node
counts** λ·N is interpolated linearly in log N and η log-log; **below the smallest** the smallest's values are held,
**beyond the largest** the largest's (flat: λ from 32 to 256 Frontier nodes is 63-75 µs, flat from 64 on;
stated, not extrapolated further). **Message sizes**: the sources measured 256 and 512 MB buffers, chunks of 0.13-16
MB per ring step (the *bulk* rows, ``Fabric.measured``). Below the smallest bulk chunk a fabric with no more
measurements is charged the more of the law and the α-β ring of the library's own tuning model: there the bulk rows
say nothing of the library's latency protocols (LL, LL128), and λ at a few nodes was not identified (those rows were
bandwidth-bound) (NCCL's small all-gathers on 16 Kestrel nodes took 0.56 ms at 1-16 KiB, five times that ring's
latency: neither is too slow).
**The latency regime** (``Fabric.latency``, RCCL on Frontier only): rows of chunks below the smallest bulk chunk,
two or more sizes per node count, solved the same way into λ_s(N), η_s(N) (``latency``; η_s capped by the bulk η).
RCCL's reduce-scatters of 2-64 MiB on 64-1,024 GCDs [pccl-dev] give λ_s = 24.6, 12.3, 6.2, 4.3, 2.6 µs a step at 8,
16, 32, 64, 128 nodes (λ_s·N held from 8 to 32 by the order below) and η_s = 0.91 (latency-bound, at the cap), 0.11,
0.056, 0.024, 0.024: a step of a few KiB costs 3-25 µs, not the bulk's 63-75 µs, and moves its bytes slower (LL).
``ring_seconds`` charges each law on the chunks it was read from, each floored by the other so that a ring's time
never falls as its nodes or its buffer grow: a bulk chunk no less than the latency law at the smallest bulk chunk on
the same ring (at 2-16 nodes, where the bulk λ was not identified, that floor is what [pccl-dev] measured: 1.9-2.2
ms for 8-128 MiB on 64 GCDs, floor 1.65, bulk law 0.15-1.5), a smaller chunk no less than the bulk law on the ring
over which the same buffer's chunk is the smallest bulk one (from 2 nodes). η_s is read as a ring's rate (the
latency protocols' own, 2-11 GB/s from 16 nodes on, far below the NICs'), so rings side by side each keep it up to
their share of the NICs: the same reading as λ's below, unchecked likewise. No α-β floor on the rings measured
(flat, 8 GCDs a node): chunks down to 2 KiB were, a smaller one is charged λ_s. A ring of fewer ranks a node
(zerotune's per-level rings) keeps it: λ_s averages a flat ring's network and xGMI steps (2.6 µs at 128 nodes, below
RCCL's own LL network hop of 9.5 µs), so it is no network step's cost. Named uncertainty: [pccl-dev] ran seven
months before [pccl]'s figures, another RCCL build with the same libfabric settings, whose bulk rows ran 2.3-2.9x
faster than [pccl]'s at 256-1,024 GCDs (within 25% at 32-128): were its latency protocols faster by as much, λ_s
from 32 nodes on is low by up to that factor. NCCL's latency protocols on Slingshot were measured at one node count
only (Kestrel, another node design): ``nccl-slingshot`` keeps the α-β floor.
**Monotone in nodes**: the points (bulk and latency alike) are solved fewest nodes first, each with η at most the
previous point's and λ·N at least the previous point's (a ring on more nodes never gets more bandwidth, nor less
latency per node it spans), and λ·N is interpolated linearly in log N, so at fixed ranks per node a ring's time
never falls as the nodes grow (across the two regimes too, by their floors, and as the buffer grows). The two-size
solve is ill-conditioned where the time barely grows with the size (NCCL at 1,024 vs 2,048 GPUs trades λ for B); the
constraints pick, among the readings that fit, the one that keeps that order.

**Which measurements apply to which ring** (``timing``). The measured rings are flat: R − 1 steps with ranks per
node 8 (Frontier) or 4 (Perlmutter). The time beyond 16 Frontier nodes is linear in the ranks and independent of
the size ("Beyond 128 GCDs, RCCL's execution time scales almost linearly with the number of processes" [pccl]
VI-B): a cost paid per ring *step*. A ring step is a send and a receive on every rank, each waiting for the chunk
the previous step brought, so at each step the ranks at a node's edge post one network message; a per-message cost
of the library's network path (its proxy thread posting to the plugin, the provider's handshake) is then paid once
per step, R − 1 times, however many ranks the ring holds per node — not once per node boundary on the chunk's
critical path, as the libraries' own tuners charge latency (NCCL ``src/graph/tuning.cc``: nInterSteps = N − 1 of
the network latency), which at 2,048 GCDs would need 0.6 ms per network hop, where PCCL's own hierarchical
all-gather over the same 256 nodes took 6.4 ms for 256 MB in all [pccl] Fig. 11, nearly all of it bandwidth. So:

- a flat ring (DeepSpeed, FSDP: ``Calibration.rings == "flat"``) of R ranks over N nodes pays (R − 1) · λ(N) and
  its bytes at B(N) — exactly what was measured;
- zerotune's inter-node ring (one rank per node, the ranks under it side by side, each with its own proxy and
  connections) pays (N − 1) · λ(N): the same per-step cost at the same node count, over N − 1 steps, and its
  bytes at B(N) / (ranks per node). One ring per level therefore takes ranks-per-node times fewer slow steps; that
  is the hierarchy's advantage at scale, and it comes from the per-step law, not from a constant. Unchecked: no
  source measured the library's one-rank-per-node rings at these scales (PCCL's hierarchical curves run PCCL's own
  point-to-point exchange, not RCCL's rings). Should the per-message cost be a node's (its NICs or a shared proxy)
  rather than a ring's, side-by-side rings would pay it ranks-per-node times and the advantage would vanish;
  the sources here cannot tell the two apart (``docs/costmodel.md`` says so beside the law).

An all-reduce under the law is charged as the ring's reduce-scatter plus all-gather (k = 2): no source measured
these libraries' tree across Slingshot at scale. A fabric with no measurement (``FABRICS``' entries with no rows)
keeps the α-β ring of ``links`` and ``protocols`` with its sourced constants, unchanged.

**NCCL on InfiniBand, with and without SHARP: no law; what the sources at scale say.** Two sweeps measured NCCL on
8-GPU H100 nodes with 8 NDR NICs (400 GB/s a node) at scale, both all-reduces only: NVIDIA's NVLSTree sweep on 32 to
8,192 GPUs [gtc24-nvlstree] and Fernandez et al.'s on 32 to 4,096 [fernandez] (fabric unconfirmed by the stored
copies, NCCL's own choice of algorithm). NCCL ran them as a tree: NVLSTree by name, and a flat ring at 2,048 GPUs
would pay 2 × 255 network steps (7 ms at NCCL's tuned 14 µs Simple step), which the 0.42 ms measured at 1 MiB leaves
no room for. Two things can be read off a tree about a ring. (1) The bandwidth a node keeps at N nodes, for large
messages: a ring all-reduce sends 2(R − 1)/R of the buffer out of each node (one NIC per channel, the channels over
every NIC), a double binary tree ~2× it (up one tree and down the other, each over half the buffer), NVLSTree the
same through each GPU's own NIC — the same bytes per node link, which nccl-tests' busbw reports as (bytes out of a
node)/time. At each GPU count's largest size read (4-16 GiB) busbw was 357-380 GB/s from 128 to 8,192 GPUs
[gtc24-nvlstree] and 331-355 at 8-16 GiB from 64 to 2,048 [fernandez]: it does not fall with the nodes (unlike
Slingshot's and EFA's above), within the two sources' own 8% disagreement. The α-β ring's constant (``links``
ib-ndr-400: 0.94 of the NIC, [nccl-tests#290] on 2-3 nodes; with NCCL's tree where faster, ``protocols``) charges
338-363 GB/s there, and meets every row of 1 GiB and more (the bytes at least 85% of the time) within −12%..+10%
(``tests/costmodel/test_collectives_at_scale.py``); a law η(N) read off them would be that same constant, so none is
added. (2) The per-step latency of a ring: not at all — a tree's latency grows with log N, a ring's with N − 1
steps, and below 1 GiB these rows measure the tree's latency and pipeline fill (0.13 ms at 1 MiB on 32 GPUs, 0.42 on
2,048, 0.70 on 8,192, where the model charges 0.08, 0.18, 0.21): a ring of ZeRO's all-gathers and reduce-scatters
keeps the per-step latency of NCCL's tuning model, and NCCL's own all-reduce at these scales and sizes runs up to
3.6× slower than the model charges (a gap the test of ``bench/collectives_at_scale.py`` names, not closed here).
SHARP: one printed plateau, 480 GB/s on 32 H100 [gtc-busbw] against 370 without; the model has no in-network
reduction, and no preset turns SHARP on (``profiles.PRESET_FABRICS``), so ``nccl-ib-sharp`` keeps the α-β ring too.

Sources:
- [pccl] Singh, Pradeep, Singh, Wei, Bhatele, "The Big Send-off: Scalable and Performant Collectives for Deep
  Learning", IPDPS 2026, arXiv 2504.18658v2, Fig. 1, 8 and 10 (times read from the figures' vector paths; their
  ratios to PCCL's curves reproduce the printed cells of Fig. 9 and 11 within about 2%): RCCL 2.20.5 with
  aws-ofi-rccl 1.4 on Frontier (8 MI250X GCDs and 4 Slingshot-11 NICs of 25 GB/s per node) and NCCL 2.24.3 on
  Perlmutter (4 A100 and 4 Slingshot-11 NICs per node), all-gather and reduce-scatter of 256 and 512 MB per GPU
  (output of the gather, input of the reduction), mean of 10 trials, 32 to 2,048 GPUs. Transcribed with the same
  figures in ``bench/published/collectives/pccl.toml``, which ``bench/collectives_at_scale.py`` compares with this
  law row by row.
- [pccl-dev] The same authors' run logs of February 2025, github.com/axonn-ai/sc2025-pccl-reproducer at 5a6353f,
  data/reduce_scatter_3/slurm-2990833..2990839.out: RCCL's reduce-scatter (torch.distributed, bf16, the mean of 10
  timed iterations) of 1 MiB to 1 GiB on 16-1,024 GCDs of Frontier with aws-ofi-rccl and libfabric's eager protocol
  off (FI_CXI_RDZV_THRESHOLD=0, as in [pccl]'s final script). Transcribed in
  ``bench/published/collectives/pccl_dev_frontier.toml``, which says what is left out and why (the 1 MiB row, the
  eager-enabled runs, the all-gathers); the law reads its rows of chunks below 128 KiB at 8-128 nodes.
- [playbook] Tazi et al., "The Ultra-Scale Playbook: Training LLMs on GPU Clusters" (Hugging Face, 2025), figure
  "Communication Bandwidth by Number of Nodes (size=256MB)", its Plotly data (``fragments/pp_comm_bandwidth.html``
  of the mirror github.com/vinjn/nanotron-ultrascale-playbook at 924e4d0b): NCCL over EFA, 1-64 nodes of 8 H100;
  transcribed in ``bench/published/collectives/ultrascale_playbook.toml``.
- [gtc24-nvlstree] NVIDIA GTC 2024 session S62129 (the NCCL team's talk), slide 35 'NCCL Allreduce BusBW,
  ALGO=NVLSTree, 32 to 8K GPUs' (https://www.nvidia.com/en-us/on-demand/session/gtc24-s62129/), read by pixel in
  ``bench/published/collectives/nvidia_gtc24_nvlstree.toml``.
- [fernandez] Fernandez et al., "Hardware Scaling Trends and Diminishing Returns in Large-Scale Distributed
  Training", arXiv 2411.13055, figure 'NCCL Tests Scaling Performance' (4-512 nodes of 8 H100), read by pixel in
  ``fernandez2024_nccl_scan.toml``.
- [gtc-busbw] NVIDIA GTC 2024 S62129 and GTC 2025 S72583, slide 12 'Collective Communication Bandwidth': DGX H100
  with 8 × 400 Gb/s, 370-380 GB/s all-reduce busbw without SHARP, 480 with (``nvidia_gtc_busbw.toml``).
- [nccl-tests#290] github.com/NVIDIA/nccl-tests issue 290: 46-48 GB/s per NDR NIC (``links`` ib-ndr-400).
- Rows of other clusters on the same fabrics, compared in ``bench/collectives_at_scale.py`` and not read into the
  laws: NCCL over Slingshot-11 on NREL Kestrel (``kestrel_nccl.toml``: another node design, so the α-β ring) and on
  CSCS Alps with and without the CXI provider (``cscs_alps_nccl.toml``: GH200, no device profile), NCCL
  all-reduces over EFA on 2 nodes of p4de (the α-β ring) and p5 (the law's design) (``aws_efa_nccl.toml``), on 2-8
  p3dn nodes in 2019 (``kahn2019_p3dn_efa.toml``) and on 4 P6-B200 nodes (``bekman_p6b200_efa.toml``: no device
  profile), RCCL with aws-ofi-rccl on 2 LUMI-G nodes (``lumi_reframe_rccl.toml``).
The rows read into the laws are in ``fabric_rows``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from zerotune.costmodel.fabric_rows import (
    MIB,
    NCCL_EFA,
    NCCL_PERLMUTTER,
    RCCL_FRONTIER,
    RCCL_FRONTIER_LATENCY,
    STEPS,
    Measured,
)


def sent_bytes(collective: str, mb: float, ranks: int) -> float:
    """Bytes each rank sends in a ring collective on a buffer of ``mb`` MiB (the gather's output, the reduction's
    input): (R − 1)/R of it, twice for an all-reduce."""
    return STEPS[collective] * (ranks - 1) / ranks * mb * MIB


@dataclass(frozen=True)
class Point:
    """The law at one measured node count: per-step latency and the bytes per second a ring leaves a node with."""

    nodes: int
    per_node: int
    step_s: float
    efficiency: float
    """η: the bytes per second a flat ring left a node with, over the node's NIC line rate."""


@dataclass(frozen=True)
class Fabric:
    """A collective library on a fabric: its measured collectives at scale (none: the α-β ring of ``links``)."""

    library: str
    """``nccl`` or ``rccl`` (``Calibration.protocols``)."""
    description: str
    measured: tuple[Measured, ...] = ()
    """The bulk rows the law is read from."""
    latency: tuple[Measured, ...] = ()
    """Rows of chunks below the bulk rows' smallest, two or more sizes at each node count: the latency regime
    (module docstring)."""


FABRICS: dict[str, Fabric] = {
    "nccl-ib": Fabric("nccl", "NCCL on InfiniBand, SHARP off: all-reduce trees measured at scale, no ring; the α-β "
                      "ring's bandwidth holds there (module docstring) [gtc24-nvlstree] [fernandez]"),
    "nccl-ib-sharp": Fabric("nccl", "NCCL on InfiniBand with SHARP in-network reduction: one plateau on 32 GPUs "
                            "[gtc-busbw], not modelled"),
    "nccl-slingshot": Fabric("nccl", "NCCL on HPE Slingshot-11 (Perlmutter) [pccl]", NCCL_PERLMUTTER),
    "nccl-slingshot-noplugin": Fabric("nccl", "NCCL on Slingshot-11 with no libfabric CXI provider (TCP over the "
                                      "Slingshot NICs): no preset runs it; measured on 2 GH200 nodes only "
                                      "(cscs_alps_nccl.toml)"),
    "rccl-slingshot": Fabric("rccl", "RCCL on Slingshot-11 without the aws-ofi-rccl plugin (RCCL's own sockets "
                             "transport): none measured here yet"),
    "rccl-slingshot-ofi": Fabric("rccl", "RCCL on Slingshot-11 through the aws-ofi-rccl libfabric plugin "
                                 "(Frontier) [pccl] [pccl-dev]", RCCL_FRONTIER, RCCL_FRONTIER_LATENCY),
    "nccl-efa": Fabric("nccl", "NCCL on AWS EFA through aws-ofi-nccl (8 H100 per node) [playbook]", NCCL_EFA),
}
"""Each collective library and fabric the presets and published clusters run on (``Calibration.fabric``)."""


def solve(rows: tuple[Measured, ...], launch_s: float, cap: float, lam_min: float = 0.0) -> tuple[float, float]:
    """(λ seconds per step, B bytes/s per node) of flat rings measured at one node count: the least squares of the
    relative error of T = launch + k(R − 1)λ + sent/B over ``rows``, with B at most ``cap`` (the nodes' line rate,
    or less: ``points``) and λ at least ``lam_min`` (module docstring). One message size cannot tell λ from B: its
    time is charged to bandwidth (λ = ``lam_min``), so a smaller message is charged less and a ring of fewer steps
    gains nothing from it (the conservative reading for the hierarchy)."""
    a = [STEPS[r.collective] * (r.gpus - 1) / (r.ms * 1e-3) for r in rows]  # coefficient of λ, relative
    b = [sent_bytes(r.collective, r.mb, r.gpus) / (r.ms * 1e-3) for r in rows]  # coefficient of 1/B
    y = [1 - launch_s / (r.ms * 1e-3) for r in rows]
    saa, sbb, sab = sum(x * x for x in a), sum(x * x for x in b), sum(p * q for p, q in zip(a, b, strict=True))
    say, sby = sum(p * q for p, q in zip(a, y, strict=True)), sum(p * q for p, q in zip(b, y, strict=True))

    def inv_given(lam: float) -> float:
        return max((sby - lam * sab) / sbb, 1 / cap)

    det = saa * sbb - sab * sab
    if det <= 1e-9 * saa * sbb:  # one message size: λ and B cannot be told apart; charged as bandwidth
        return lam_min, 1 / inv_given(lam_min)
    lam, inv = (say * sbb - sby * sab) / det, (sby * saa - say * sab) / det
    if inv < 1 / cap:  # faster than the NICs allow: latency-bound, B at the cap
        inv = 1 / cap
        lam = (say - inv * sab) / saa
    if lam < lam_min:
        lam = lam_min
        inv = inv_given(lam)
    return lam, 1 / inv


def _solved(rows: tuple[Measured, ...], launch_s: float, ceiling: tuple[Point, ...] = ()) -> tuple[Point, ...]:
    """One point per node count of ``rows``, fewest nodes first, each with η at most the previous point's (and the
    ``ceiling`` law's at its nodes) and λ·N at least the previous point's (module docstring)."""
    by_nodes: dict[int, list[Measured]] = {}
    for r in rows:
        by_nodes.setdefault(r.gpus // r.per_node, []).append(r)
    out: list[Point] = []
    for nodes in sorted(by_nodes):
        group = tuple(by_nodes[nodes])
        line = group[0].node_gbps * 1e9
        eta_max = min(out[-1].efficiency if out else 1.0, at_nodes(ceiling, nodes)[1] if ceiling else 1.0)
        lam_min = out[-1].step_s * out[-1].nodes / nodes if out else 0.0  # λ·N never less on more nodes
        lam, bw = solve(group, launch_s, eta_max * line, lam_min)
        out.append(Point(nodes, group[0].per_node, lam, bw / line))
    return tuple(out)


@functools.cache
def points(fabric: str, launch_s: float) -> tuple[Point, ...]:
    """The law's points of ``FABRICS[fabric]``, one per measured node count, fewest nodes first (empty where
    nothing was measured)."""
    return _solved(FABRICS[fabric].measured if fabric in FABRICS else (), launch_s)


@functools.cache
def latency(fabric: str, launch_s: float) -> tuple[Point, ...]:
    """The latency regime's points (λ_s, η_s) of ``FABRICS[fabric]`` (empty where none was measured), η_s capped by
    the bulk law's η at the same nodes."""
    rows = FABRICS[fabric].latency if fabric in FABRICS else ()
    return _solved(rows, launch_s, points(fabric, launch_s)) if rows else ()


def at_nodes(pts: tuple[Point, ...], nodes: float) -> tuple[float, float]:
    """(λ, η) at ``nodes``: λ·N linear in log N and η log-log between measured points, each held beyond them (λ
    itself beyond the largest)."""
    if nodes <= pts[0].nodes:
        return pts[0].step_s, pts[0].efficiency
    if nodes >= pts[-1].nodes:
        return pts[-1].step_s, pts[-1].efficiency
    hi = next(i for i, p in enumerate(pts) if p.nodes >= nodes)
    p, q = pts[hi - 1], pts[hi]
    w = math.log(nodes / p.nodes) / math.log(q.nodes / p.nodes)
    per_node_step = p.step_s * p.nodes + w * (q.step_s * q.nodes - p.step_s * p.nodes)
    return per_node_step / nodes, math.exp(math.log(p.efficiency) + w * math.log(q.efficiency / p.efficiency))


def measured(fabric: str) -> bool:
    """Whether the law covers ``fabric``: some of its collectives were measured across nodes."""
    return fabric in FABRICS and bool(FABRICS[fabric].measured)


@functools.cache
def smallest_chunk(fabric: str) -> float:
    """The fewest bytes a rank sent in one ring step among ``fabric``'s bulk rows: below it the bulk law was not
    measured (``ring_seconds`` then charges the latency regime where one was measured, else the more of the law and
    the α-β ring of the library's protocols)."""
    return min(sent_bytes(r.collective, r.mb, r.gpus) / (STEPS[r.collective] * (r.gpus - 1))
               for r in FABRICS[fabric].measured)


def step_seconds(fabric: str, nodes: int, per_node: int, node_line: float, launch_s: float) -> float | None:
    """λ(N): the law's per-step latency of a ring over ``nodes`` nodes on ``fabric`` (None where it does not apply)."""
    if not applies(fabric, nodes, per_node, node_line):
        return None
    return at_nodes(points(fabric, launch_s), nodes)[0]


def design(fabric: str) -> tuple[int, float]:
    """The node its law was measured on: (ranks per node, the node's NIC line rate in bytes/s)."""
    first = FABRICS[fabric].measured[0]
    return first.per_node, first.node_gbps * 1e9


def applies(fabric: str, nodes: int, per_node: int, node_line: float) -> bool:
    """Whether the law of ``fabric`` charges a ring over ``nodes`` nodes of ``per_node`` ranks whose NICs carry
    ``node_line`` bytes/s: something measured on the fabric, 2+ nodes, and the node of the measurements (the same
    ranks per node and line rate). A node of another design on the same fabric keeps the α-β ring with its link's
    own measured efficiency: what a fabric's rings reach at scale did not carry over between node designs (NCCL on
    Slingshot-11 reached 0.91 of Kestrel's 2 NICs per 4 H100 on 16 nodes, ``kestrel_nccl.toml``, and 0.68 of
    Perlmutter's 4 per 4 A100 [pccl])."""
    if nodes < 2 or not measured(fabric):
        return False
    ranks, line = design(fabric)
    return per_node == ranks and abs(node_line / line - 1) < 0.01


def ring_seconds(fabric: str, collective: str, ranks: int, nodes: int, sent: float, node_line: float,
                 per_node: int, share: int, launch_s: float, alpha_beta: float = 0.0) -> float | None:
    """Seconds of one ring of ``ranks`` over ``nodes`` nodes on ``fabric``, each rank sending ``sent`` bytes, on
    nodes of ``per_node`` ranks whose NICs carry ``node_line`` bytes/s, ``share`` such rings leaving each node side
    by side, launch included (module docstring): the law at ``nodes``; where a step carries less than the smallest
    bulk chunk (``smallest_chunk``), the latency regime's law where one was measured (``latency``; each law floored
    by the other), else the more of the law and ``alpha_beta`` (the α-β ring's seconds under the library's own
    tuning model); None where the law does not apply (``applies``)."""
    if not applies(fabric, nodes, per_node, node_line):
        return None
    line = node_line / share
    pts = points(fabric, launch_s)
    steps = STEPS[collective]

    smallest, small = smallest_chunk(fabric), latency(fabric, launch_s)

    def bulk(n: float, r: float, nbytes: float) -> float:  # the law read off the bulk rows, on n nodes
        lam, efficiency = at_nodes(pts, n)
        return launch_s + steps * (r - 1) * lam + nbytes / (efficiency * line)

    chunk = sent / (steps * (ranks - 1))
    if not small:
        return bulk(nodes, ranks, sent) if chunk >= smallest else max(bulk(nodes, ranks, sent), alpha_beta)
    lam_s, eta_s = at_nodes(small, nodes)
    rate_s = min(eta_s * node_line, at_nodes(pts, nodes)[1] * line)  # a ring's own, up to its share of the NICs

    def latency_law(nbytes: float) -> float:  # the latency regime on this ring
        return launch_s + steps * (ranks - 1) * lam_s + nbytes / rate_s

    if chunk >= smallest:
        return max(bulk(nodes, ranks, sent), latency_law(steps * (ranks - 1) * smallest))
    floor_nodes, floor_ranks = nodes * chunk / smallest, ranks * chunk / smallest  # this buffer at the bulk's chunk
    t = latency_law(sent)
    if floor_nodes >= 2:
        t = max(t, bulk(floor_nodes, floor_ranks, steps * (floor_ranks - 1) * smallest))
    return t if share == 1 else max(t, alpha_beta)  # fewer ranks a node than the rings measured: α-β floor too
