"""The cluster presets as plain data (standard library only): each preset's device and levels, and its ranks per node.

The one table of them: the cost model builds the preset clusters and their calibrations from it
(``costmodel.profiles.PROFILES``, ``costmodel.catalog.CLUSTERS``), and the Slurm prologue client, which imports
only the standard library, reads the preset names and their ranks per node from it
(``zerotune/api/prologue/body.py``). A preset is ``(device, levels)``: ``device`` a key of
``costmodel.hardware.DEVICES``, ``levels`` ``(level name, size, link)`` innermost first, ``link`` a key of
``costmodel.links.LINKS``; the outermost level's size is the number of nodes, set by ``NAME:N``.
"""

from __future__ import annotations

import math

CLUSTER_PRESETS: dict[str, tuple[str, tuple[tuple[str, int, str], ...]]] = {
    "frontier": ("MI250X", (("gcd-pair", 2, "xgmi-gcd-pair"), ("node", 4, "xgmi-node"),
                            ("inter-node", 1, "slingshot-11"))),
    "dgx-h100": ("H100", (("node", 8, "nvlink4-nvswitch"), ("inter-node", 1, "ib-ndr-400"))),
    "dgx-h200": ("H200", (("node", 8, "nvlink4-nvswitch"), ("inter-node", 1, "ib-ndr-400"))),
    "dgx-a100": ("A100", (("node", 8, "nvlink3-nvswitch"), ("inter-node", 1, "ib-hdr-200"))),
    "perlmutter": ("A100-40GB", (("node", 4, "nvlink3-4gpu"), ("inter-node", 1, "slingshot-11-gpu-nic"))),
}
"""The cluster presets: device and (level, size, link) innermost first; the outermost size is set by ``NAME:N``."""

PRESET_DEVICES_PER_NODE: dict[str, int] = {name: math.prod(size for _, size, _ in levels[:-1])
                                           for name, (_, levels) in CLUSTER_PRESETS.items()}
"""Ranks per node of each preset: every level but the outermost, whose size counts the nodes (``frontier``: a pair
of GCDs times 4 per node, 8), so the prologue can size a job from ``SLURM_JOB_NUM_NODES``."""
