"""What the collective libraries charge a ring step and what each class of link carries: NCCL's and RCCL's own
tuning models (protocols, base and hop latencies, the tree), the host designs that change them, and the links of
the presets with the share of their rate collectives reach, every constant with its source.

``timing`` times collectives with these tables; ``hardware`` builds the presets' calibrations from ``LINKS`` and
``HOSTS``. No constant here was fitted to the strategy comparisons that ``bench/published.py`` reports: they come
from the libraries' own source code and collective benchmarks (nccl-tests and rccl-tests bus bandwidths).

Sources (cited by key below; the node designs, [olcf-frontier], [nersc-perlmutter], [dgx-a100] and [h200], are
``hardware``'s):
- [nccl-tuning] NVIDIA/nccl ``src/graph/tuning.cc`` at 5067397c: ring base latency 8.4 µs (Simple
  protocol); per-step hardware latency NVLink 3.4 µs, network 14 µs (Simple).
- [rccl-tuning] ROCm/rccl ``src/graph/tuning.cc`` at 0cbce2a7: ``baseLat`` (lines 55-60) ring LL 12.0
  µs, Simple 17.0 µs; ``tuning_model_3`` (lines 164-192) ring ``hwLat`` LL xGMI 0.8 / network 9.5 µs,
  Simple 3.6 / 19.8 µs, ``bwRatio`` LL 0.20, LL128 0 (off), Simple 1.0. ``src/graph/rome_models.cc``
  line 523, ``rome_model_74`` (8 GCDs, 4 NUMA nodes, 4 NICs, the MI250X 4/2/1-link xGMI matrix:
  Frontier's node, matched by layout, as no model there names a system) selects ``tuning=3``; RCCL has
  no per-architecture latency table, and LL128 is off unless a model or ``RCCL_LL128_FORCE_ENABLE``
  turns it on. Not modelled: the per-message-size ``ringCorrectionFactor``.
- [nccl-tree] NVIDIA/nccl ``src/graph/tuning.cc`` (v2.2x, with Blackwell rows): Tree ``baseLat`` LL /
  LL128 / Simple 6.8 / 14.0 / 8.4 µs, Tree ``hwLat`` NVLink .6 / 1.25 / 4.0 and network 5.0 / 8.5 / 14 µs,
  the tree all-reduce's busBw refinements and latency formula, ``treeCorrectionFactor``, and in
  ``ncclTopoGetAlgoTime`` the ring's "plateau effect": a multi-node Simple ring all-reduce pays its
  latency 1.9 times before compute capability 8.0 (Volta) and 1.4 times from it on.
- [nccl-netoverhead] NVIDIA/nccl ``src/graph/tuning.cc`` (v2.19-2.27; ROCm/rccl carries the same
  code): "Inter-node rings still have to launch nsteps * net overhead": in a ring that spans 2+
  nodes every step, intra-node ones included, costs at least ``getNetOverhead`` (1 µs on Intel or
  unknown hosts, 2 µs on AMD hosts), three times that under Simple; LL's bus bandwidth is
  ``min(llMaxBw, busBw * .5)``, with ``llMaxBws`` by GPU (one node: Volta 39, Ampere 87.7, Hopper 141
  GB/s) or by host CPU (2 nodes / more: Intel 39 / 20.4, AMD 22.5 / 19.0 GB/s); LL128 is enabled by
  default only where the ring's NIC sits on the GPU's PCIe switch (``typeInter <= PATH_PXB``).
- [nccl-tests#212] NVIDIA, on 8×H100: "450GB/s is the line rate. With the protocol overhead (~20%)
  NCCL can get an effective NVLink bandwidth of 370GB/s" (busbw of all-gather/reduce-scatter).
- [nccl-tests#290] NVIDIA: "For NDR @ 400Gbps you should see 46-48GB/s per NIC".
- [nccl-tests#100, #119] 2-3 HGX-A100 nodes, 4×HDR 200 Gb/s: all-reduce busbw 91-96 GB/s of 100.
- [nccl-tests#29] DGX-1 with 4×EDR: "about 40 GB/s" of 50 (NVIDIA GTC 2017 S7155, second-hand).
- [mi250x-ifabric] C. Pearson, "Interconnect Bandwidth Heterogeneity on AMD MI250x and Infinity
  Fabric" (arXiv 2302.14827), as the reference values of the LUMI-G (same node as Frontier) ReFrame
  suite, Lumi-supercomputer/lumi-reframe-tests ``checks/microbenchmarks/gpu/comm_scope.py`` at
  a6d79840: GCD to GCD at 1 GiB over 4 / 2 / 1 Infinity Fabric links 148 / 76 / 38 GB/s one way, of
  200 / 100 / 50: 0.74-0.76 of the link rate.
- [lumi-rccl] the same suite's ``checks/microbenchmarks/gpu/rccl_test.py``: rccl-tests all_reduce on
  2 nodes x 8 GCDs (aws-ofi-rccl plugin), 128 MiB, busbw 85 GB/s of the node's 4 x 25 GB/s
  Slingshot-11 injection: 0.85.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotune.core.spec import Level

NCCL_RING_BASE_US = 8.4
"""Fixed cost of one ring collective, Simple protocol [nccl-tuning]."""
NVLINK_HOP_US = 3.4
"""Per ring step over NVLink / NVSwitch, Simple [nccl-tuning]."""
NET_HOP_US = 14.0
"""Per ring step over the network, Simple [nccl-tuning]."""
NCCL_RING_PROTOCOLS: dict[str, tuple[float, float, float, float]] = {
    "Simple": (NCCL_RING_BASE_US, NVLINK_HOP_US, NET_HOP_US, 1.0),
    "LL128": (14.0, 1.9, 4.0, 0.92),
    "LL": (6.6, 0.6, 2.7, 0.5),
}
"""NCCL's ring protocols as its tuner models them [nccl-tuning]: (base latency µs, hop latency over
NVLink µs, hop latency over the network µs, fraction of the Simple protocol's bus bandwidth): the
``baseLat`` and ring ``hwLat`` tables, and the ring refinements ``busBw * 0.92`` (LL128: 120 of every
128 bytes are data) and ``busBw * .5`` (LL: a flag beside every 4-byte word; NCCL also caps it at
``llMaxBw``, not modelled). NCCL runs each collective with the protocol its model predicts fastest:
LL for small messages, LL128 in between, Simple for large ones (``Calibration.protocols``)."""
RCCL_RING_BASE_US = 17.0
"""Fixed cost of one RCCL ring collective, Simple protocol [rccl-tuning]."""
XGMI_HOP_US = 3.6
"""Per RCCL ring step over xGMI (Infinity Fabric), Simple [rccl-tuning]."""
SLINGSHOT_HOP_US = 19.8
"""Per RCCL ring step over the network of a Frontier-like node, Simple [rccl-tuning]."""
RCCL_RING_PROTOCOLS: dict[str, tuple[float, float, float, float]] = {
    "Simple": (RCCL_RING_BASE_US, XGMI_HOP_US, SLINGSHOT_HOP_US, 1.0),
    "LL": (12.0, 0.8, 9.5, 0.20),
}
"""RCCL's ring protocols on a Frontier-like node as its tuner models them [rccl-tuning], in the layout of
``NCCL_RING_PROTOCOLS``: LL at a fifth of Simple's bus bandwidth, LL128 off."""
RING_PROTOCOLS = {"nccl": NCCL_RING_PROTOCOLS, "rccl": RCCL_RING_PROTOCOLS}
"""Each collective library's protocol table (``Calibration.protocols``), each with its Simple row."""
NCCL_TREE_PROTOCOLS: dict[str, tuple[float, float, float, float]] = {
    "Simple": (8.4, 4.0, 14.0, 0.92),
    "LL128": (14.0, 1.25, 8.5, 0.92 * 120 / 128),
    "LL": (6.8, 0.6, 5.0, 0.92 / 3.8),
}
"""NCCL's tree all-reduce [nccl-tree], in the layout of ``NCCL_RING_PROTOCOLS``: (``baseLat`` µs, tree
``hwLat`` over NVLink µs, over the network µs, bus bandwidth as a fraction of the ring's Simple busbw:
``busBw * .92``, then LL128 ``* 120/128`` and LL ``/ 3.8`` capped at ``llMaxBw``). Its latency is
``base + 2 · ((ranks per node − 1) · NVLink + log2(nodes) · network)`` and its algorithm bandwidth half
the bus bandwidth, so it beats the ring on small all-reduces across many nodes and loses on large ones."""
NCCL_TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
"""NCCL's ``treeCorrectionFactor`` [nccl-tree]: the tree's bandwidth multiplier by message size, powers
of two from 64 B (index ``log2(bytes / 64)``) to 256 MB; 1 beyond."""


@dataclass(frozen=True)
class Host:
    """What a node's host side adds to its library's multi-node rings [nccl-netoverhead]."""

    net_overhead_us: float
    """Per-step network post overhead (``getNetOverhead``): 1 µs Intel or unknown, 2 µs AMD."""
    ll_max_busbw_gbps: tuple[float, float]
    """LL's bus-bandwidth cap on 2 nodes and on more (``llMaxBws`` by CPU vendor), GB/s."""
    nic_beside_gpu: bool
    """The NICs sit on the GPUs' PCIe switches (NCCL's LL128 condition); False where they hang off the CPU."""
    source: str


HOSTS: dict[str, Host] = {
    "intel": Host(1.0, (39.0, 20.4), True, "Intel Xeon host, NICs on the GPUs' PCIe switches (DGX-1/2, DGX H100, "
                  "AWS p3dn/p4d, Azure NDv2/NDv4 node designs)"),
    "amd": Host(2.0, (22.5, 19.0), True, "AMD EPYC host, NICs on the GPUs' PCIe switches (DGX A100)"),
    "amd-cpu-nic": Host(2.0, (22.5, 19.0), False, "AMD EPYC host whose NICs share no PCIe switch with the GPUs: "
                        "Perlmutter's GPU node (1 EPYC 7763, 4 A100, 4 Slingshot-11 NICs; docs.nersc.gov/systems/"
                        "perlmutter/architecture). The PCIe path is not printed there: an inference from the "
                        "switchless HPE Cray EX blade design, stated as such"),
    "unknown": Host(1.0, (39.0, 20.4), True, "NCCL's defaults for a host it does not recognise"),
}
"""Host designs by key (``profile_calibration``'s ``host``)."""


@dataclass(frozen=True)
class Link:
    """A class of link: per-rank bandwidth with every rank sending, what collectives achieve of it, hop latency."""

    bandwidth_gbps: float
    efficiency: float
    latency_us: float
    source: str

    def level(self, name: str, size: int) -> Level:
        return Level(name, size, self.bandwidth_gbps, self.latency_us)


NVLINK_EFFICIENCY = 370 / 450
"""NCCL's Simple-protocol overhead on NVLink (~20%) [nccl-tests#212]; also used for NVLink2/3, where no
busbw table of all-gather / reduce-scatter was found."""
XGMI_EFFICIENCY = 0.75
"""What a GCD-to-GCD copy achieves of its Infinity Fabric links' rate, 0.74-0.76 for 4, 2 or 1 links
[mi250x-ifabric] (a point-to-point figure: no RCCL busbw table inside a Frontier node was found)."""
SLINGSHOT_EFFICIENCY = 0.85
"""RCCL's busbw across Slingshot-11 nodes over their injection bandwidth [lumi-rccl]."""

LINKS: dict[str, Link] = {
    "nvlink2-nvswitch": Link(150.0, NVLINK_EFFICIENCY, NVLINK_HOP_US,
                             "DGX-2 V100: 6 NVLink2 × 25 GB/s per direction into the NVSwitches [nccl-tests#212]"),
    "nvlink3-nvswitch": Link(300.0, NVLINK_EFFICIENCY, NVLINK_HOP_US,
                             "A100: 12 NVLink3 × 25 GB/s per direction [nccl-tests#212]"),
    "nvlink4-nvswitch": Link(450.0, NVLINK_EFFICIENCY, NVLINK_HOP_US,
                             "H100: 18 NVLink4, 450 GB/s per direction; busbw 370 [nccl-tests#212]"),
    "nvlink3-4gpu": Link(100.0, NVLINK_EFFICIENCY, NVLINK_HOP_US,
                         "4 A100 joined pairwise by 4 NVLink3 links, 100 GB/s per direction to each peer (the "
                         "ring's hop) [nersc-perlmutter]"),
    "ib-edr-100": Link(12.5, 0.8, NET_HOP_US,
                       "one 100 Gb/s EDR/HDR100 link; ~40 of 50 GB/s on 4×EDR [nccl-tests#29]"),
    "ib-hdr-200": Link(25.0, 0.93, NET_HOP_US,
                       "one 200 Gb/s HDR NIC; busbw 91-96 of 100 GB/s on 4×HDR [nccl-tests#100]"),
    "ib-ndr-400": Link(50.0, 0.94, NET_HOP_US,
                       "one 400 Gb/s NDR NIC per GPU; 46-48 GB/s per NIC [nccl-tests#290]"),
    "xgmi-gcd-pair": Link(200.0, XGMI_EFFICIENCY, XGMI_HOP_US,
                          "the two GCDs of one MI250X, 200 GB/s [olcf-frontier]; 0.75 achieved [mi250x-ifabric]"),
    "xgmi-node": Link(50.0, XGMI_EFFICIENCY, XGMI_HOP_US,
                      "GCDs of different MI250X in a node, 50-100 GB/s: the ring's slowest hop, 50 [olcf-frontier]; "
                      "0.75 achieved [mi250x-ifabric]"),
    "slingshot-11-gpu-nic": Link(25.0, SLINGSHOT_EFFICIENCY, NET_HOP_US,
                                 "one 200 Gb/s Slingshot-11 NIC per GPU [nersc-perlmutter]; the Slingshot busbw share "
                                 "measured with RCCL on LUMI-G [lumi-rccl] (no NCCL figure on Slingshot was found); "
                                 "NCCL's network hop [nccl-tuning]"),
    "slingshot-11": Link(12.5, SLINGSHOT_EFFICIENCY, SLINGSHOT_HOP_US,
                         "4 × 25 GB/s Slingshot-11 NICs per 8 GCDs [olcf-frontier]; RCCL busbw 85 of 100 GB/s "
                         "per node on LUMI-G, Frontier's node design [lumi-rccl]"),
}
