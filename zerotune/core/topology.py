"""Rank coordinates, level groups, spans and replica groups, built once from a ClusterSpec.

Rank r has one coordinate per level, the innermost varying fastest (r = c1 + s1·c2 + s1·s2·c3 …),
so every span-k group is a contiguous block of ranks, as DeepSpeed's hpZ groups are. A *level
group* holds the ranks that differ only in one level's coordinate; a *level range* (lo..hi) holds
the ranks that differ only in levels lo..hi: span k is the range 1..k, the replica group of span k
is the range k+1..L. Ranges are 1-based and inclusive; an empty range (lo > hi) is one rank.

The coordinate math is plain Python (usable anywhere); ``build_topology`` creates the process
groups and must be called by every rank in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from zerotune.core.spec import ClusterSpec

LevelRange = tuple[int, int]  # (lo, hi), 1-based inclusive; lo > hi is empty


def rank_coords(cluster: ClusterSpec, rank: int) -> tuple[int, ...]:
    """Coordinates of ``rank``, innermost level first."""
    coords, rest = [], rank
    for size in cluster.sizes:
        coords.append(rest % size)
        rest //= size
    return tuple(coords)


def coords_rank(cluster: ClusterSpec, coords: tuple[int, ...] | list[int]) -> int:
    """Inverse of :func:`rank_coords`."""
    rank, stride = 0, 1
    for c, size in zip(coords, cluster.sizes, strict=True):
        rank += c * stride
        stride *= size
    return rank


def range_ranks(cluster: ClusterSpec, rank: int, levels: LevelRange) -> list[int]:
    """Global ranks of ``rank``'s group over a level range, in group-rank order (ascending)."""
    lo, hi = levels
    base = list(rank_coords(cluster, rank))
    out = []
    for idx in range(range_size(cluster, levels)):
        coords = list(base)
        for level in range(lo, hi + 1):
            size = cluster.sizes[level - 1]
            coords[level - 1] = idx % size
            idx //= size
        out.append(coords_rank(cluster, coords))
    return sorted(out)


def range_size(cluster: ClusterSpec, levels: LevelRange) -> int:
    lo, hi = levels
    return math.prod(cluster.sizes[lo - 1:hi]) if lo <= hi else 1


def range_index(cluster: ClusterSpec, rank: int, levels: LevelRange) -> int:
    """``rank``'s index inside its level-range group (innermost level fastest)."""
    lo, hi = levels
    coords = rank_coords(cluster, rank)
    idx, stride = 0, 1
    for level in range(lo, hi + 1):
        idx += coords[level - 1] * stride
        stride *= cluster.sizes[level - 1]
    return idx


def span(k: int) -> LevelRange:
    """Span k as a level range: levels 1..k (span 0 is empty: the rank alone)."""
    return (1, k)


def replica(cluster: ClusterSpec, k: int) -> LevelRange:
    """The replica group of span k: ranks holding the same span-k shard (levels k+1..L)."""
    return (k + 1, cluster.num_levels)


@dataclass
class Topology:
    """One rank's view of the cluster: its coordinates and a process group per level and range."""

    cluster: ClusterSpec
    rank: int
    coords: tuple[int, ...]
    groups: dict[LevelRange, Any] = field(default_factory=dict)
    """Process group of this rank for every non-trivial level range (single levels included)."""

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def num_levels(self) -> int:
        return self.cluster.num_levels

    def size(self, levels: LevelRange) -> int:
        return range_size(self.cluster, levels)

    def index(self, levels: LevelRange) -> int:
        return range_index(self.cluster, self.rank, levels)

    def group(self, levels: LevelRange) -> Any:
        """The process group of a level range (a single level is (i, i)); None for one rank."""
        if self.size(levels) == 1:
            return None
        return self.groups[levels]

    def level_name(self, level: int) -> str:
        return self.cluster.levels[level - 1].name

    def level_size(self, level: int) -> int:
        return self.cluster.sizes[level - 1]


def build_topology(cluster: ClusterSpec, timeout_s: float = 120.0) -> Topology:
    """Create the process groups of every level range; a collective call on every rank.

    Requires ``torch.distributed`` to be initialized with ``world_size == cluster.world_size``.
    """
    import torch.distributed as dist

    if dist.get_world_size() != cluster.world_size:
        raise ValueError(
            f"world size {dist.get_world_size()} != cluster {cluster.name!r} world size {cluster.world_size}; "
            f"launch with --nproc-per-node {cluster.world_size} or pick a matching cluster")
    rank = dist.get_rank()
    topo = Topology(cluster=cluster, rank=rank, coords=rank_coords(cluster, rank))
    levels = cluster.num_levels
    for lo in range(1, levels + 1):
        for hi in range(lo, levels + 1):
            if range_size(cluster, (lo, hi)) == 1:
                continue
            seen: set[tuple[int, ...]] = set()
            for r in range(cluster.world_size):  # every rank creates every group, in one order
                members = tuple(range_ranks(cluster, r, (lo, hi)))
                if members in seen:
                    continue
                seen.add(members)
                group = dist.new_group(list(members), timeout=timedelta(seconds=timeout_s))
                if rank in members:
                    topo.groups[(lo, hi)] = group
    return topo
