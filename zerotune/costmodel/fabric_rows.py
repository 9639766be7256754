"""The collectives measured at scale that ``fabrics``' laws are read from, as transcribed from their sources (cited
in ``fabrics``' docstring by the tags each row's ``source`` names; the files of ``bench/published/collectives``
hold the same numbers with their provenance)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
"""The sources' MB (``pccl.toml``: MB taken as 2^20 bytes)."""


@dataclass(frozen=True)
class Measured:
    """One collective measured on one fabric: a flat ring over ``gpus`` ranks, ``per_node`` to a node."""

    collective: str
    mb: float
    """Each GPU's buffer: the gather's output, the reduction's input (the all-reduce's buffer), MiB."""
    gpus: int
    per_node: int
    ms: float
    node_gbps: float
    """The line rate of a node's NICs, GB/s: what no solved B may exceed."""
    source: str


STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}
"""Ring steps per rank, in units of R − 1 (``protocols.STEPS``)."""


def _pccl(collective: str, per_node: int, ms: dict[int, tuple[float, float]]) -> tuple[Measured, ...]:
    """[pccl] rows of one library and collective: {GPUs: (ms at 256 MB, ms at 512 MB)}, 4 × 25 GB/s per node."""
    return tuple(Measured(collective, mb, gpus, per_node, t, 100.0, "pccl")
                 for gpus, pair in ms.items() for mb, t in zip((256, 512), pair, strict=True))


RCCL_FRONTIER = (
    _pccl("all_gather", 8, {32: (2.91, 5.77), 64: (2.94, 5.78), 128: (4.61, 5.85), 256: (21.2, 22.9),
                                    512: (42.4, 42.2), 1024: (79.6, 83.0), 2048: (156.0, 158.0)})
    + _pccl("reduce_scatter", 8, {32: (2.89, 5.72), 64: (2.94, 5.78), 128: (4.54, 5.86), 256: (18.4, 20.2),
                                          512: (41.8, 41.6), 1024: (79.8, 82.9), 2048: (154.0, 158.0)}))
"""RCCL 2.20.5 with aws-ofi-rccl 1.4 on Frontier, 8 GCDs and 4 Slingshot-11 NICs per node [pccl] Fig. 1, 8, 10."""

NCCL_PERLMUTTER = (
    _pccl("all_gather", 4, {32: (3.92, 7.42), 64: (3.94, 7.82), 128: (4.32, 8.01), 256: (5.30, 8.92),
                                    512: (9.34, 10.8), 1024: (15.4, 18.0), 2048: (19.8, 32.0)})
    + _pccl("reduce_scatter", 4, {32: (3.90, 7.44), 64: (3.90, 7.80), 128: (4.26, 7.90), 256: (5.35, 9.09),
                                          512: (9.23, 10.4), 1024: (15.3, 17.5), 2048: (19.8, 31.6)}))
"""NCCL 2.24.3 on Perlmutter, 4 A100 and 4 Slingshot-11 NICs per node [pccl] Fig. 1, 8, 10."""

RCCL_FRONTIER_LATENCY = tuple(
    Measured("reduce_scatter", mb, gpus, 8, ms, 100.0, "pccl-dev")
    for gpus, by_mb in {64: {2: 1.623, 4: 1.568}, 128: {2: 1.348, 4: 2.383, 8: 2.448},
                        256: {2: 1.631, 4: 2.231, 8: 4.034, 16: 4.382},
                        512: {2: 3.043, 4: 4.049, 8: 5.365, 16: 10.614, 32: 15.041},
                        1024: {2: 3.290, 4: 4.824, 8: 6.864, 16: 9.708, 32: 16.148, 64: 27.202}}.items()
    for mb, ms in by_mb.items())
"""RCCL's reduce-scatters on Frontier whose chunk (MiB / GCDs) is below 128 KiB, at the node counts with two or more
such sizes [pccl-dev] (the 2 MiB row on 32 GCDs, alone at its count, is compared, not read)."""

def _busbw(collective: str, mb: float, per_node: int, node_gbps: float, source: str,
           busbw: dict[int, float]) -> tuple[Measured, ...]:
    """Rows given as nccl-tests' bus bandwidth (GB/s) by GPU count: the time is the bytes each rank sent over it."""
    # each rank sends STEPS (R − 1)/R of the buffer: fabrics.sent_bytes, written out here because fabrics imports
    # this module (and calling back into it at predict time adds a hop to the predict walk, tests/costmodel)
    return tuple(Measured(collective, mb, gpus, per_node,
                          1e3 * STEPS[collective] * (gpus - 1) / gpus * mb * MIB / (gbps * 1e9), node_gbps, source)
                 for gpus, gbps in busbw.items())


NCCL_EFA = (
    _busbw("all_gather", 256, 8, 400.0, "playbook", {16: 184.6, 32: 119.0, 64: 69.0, 128: 55.0, 256: 28.0,
                                                     512: 11.0})
    + _busbw("reduce_scatter", 256, 8, 400.0, "playbook", {16: 181.6, 32: 115.8, 64: 68.6, 128: 54.5, 256: 27.9,
                                                           512: 11.1}))
"""NCCL over AWS EFA, 8 H100 per node, 2-64 nodes [playbook]: all-gather and reduce-scatter of 256 MB, the medians
of the figure's data; the node's line rate 400 GB/s (3,200 Gb/s of EFA per p5.48xlarge, the instance the source's
'8xH100s' with EFA implies, as ``ultrascale_playbook.toml`` states). One size: charged as bandwidth (``solve``).
The source's 'Bandwidth' may be bus or algorithm bandwidth; for these collectives the two differ by (R − 1)/R,
at most 6% from 16 GPUs on. Its all-reduce is left out: above one node NCCL ran a tree there, not a ring (its
2-node figure, 362 GB/s, is more than a ring can push through the NICs)."""
