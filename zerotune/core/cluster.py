"""The hardware: a ClusterSpec, its levels innermost first, each a Level of the interconnect.

Vocabulary follows DESIGN.md §2: a *level* is a tier of the cluster (innermost first), a *span k* is the subtree of
levels 1..k (span 0 = the rank alone, span L = the world). Each field says what it means and may hold
(``core.fields.about``): the values check themselves and the API's body models are built from them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from zerotune.core.fields import about, check_fields, check_int, from_dict
from zerotune.errors import SpecError

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives a level's bus bandwidth may be measured for apart (``Level.collective_busbw``)."""
BUSBW_FIELDS = ("busbw_gbps", *(f"{op}_busbw_gbps" for op in COLLECTIVES))
"""A level's measured bus bandwidths: one for every collective, and each collective's own."""
MAX_LEVELS = 8
"""The most levels a cluster has (explicit specs, local:AxB… presets and the API alike)."""
MAX_LEVEL_SIZE = 65536
"""The largest fan-out of one level."""
BANDWIDTH_MAX = 1e9
"""The API's bound on a bandwidth, a memory or a peak (GB/s, GiB, TFLOPS): finite, far past any machine."""


def _busbw(doc: str) -> dict[str, Any]:
    return about(doc, above=0, api_max=BANDWIDTH_MAX)


@dataclass(frozen=True)
class Level:
    """One tier of a cluster's interconnect."""

    name: str = field(metadata=about('Label used everywhere bytes are reported ("gcd-pair", "node", "inter-node").',
                                     min_length=1, max_length=64))
    size: int = field(metadata=about("Fan-out: how many children of the level below form one group of this level.",
                                     minimum=1, api_max=MAX_LEVEL_SIZE))
    bandwidth_gbps: float = field(metadata=about(
        "Per-rank bandwidth of this level's links, GB/s, when all ranks send at once.", above=0,
        api_max=BANDWIDTH_MAX))
    latency_us: float = field(default=5.0, metadata=about(
        "Per-message latency of this level's links, microseconds.", minimum=0, api_max=1e7))
    busbw_gbps: float | None = field(default=None, metadata=_busbw(
        "A measured bus bandwidth, GB/s, of one collective whose ranks span this level and every level under it at "
        "this size (nccl-tests' or rccl-tests' busbw at a large message, e.g. all_reduce_perf -b 256M across the "
        "nodes): the level's collectives then reach it instead of the nominal share of bandwidth_gbps "
        "(costmodel.profiles.calibration_for). At most what the level's links carry: bandwidth_gbps times the ranks "
        "under it (a ring leaves a group through that many links)."))
    all_gather_busbw_gbps: float | None = field(default=None, metadata=_busbw(
        "busbw_gbps of the all-gather alone (all_gather_perf), where it was measured apart: a cluster's collectives "
        "need not reach one rate (an EFA cluster's all-gather reached 28 GB/s on 32 nodes where its all-reduce "
        "reached 65, bench/published/hf_playbook.toml). The level's all-gathers reach it; busbw_gbps where not "
        "given."))
    reduce_scatter_busbw_gbps: float | None = field(default=None, metadata=_busbw(
        "busbw_gbps of the reduce-scatter alone (reduce_scatter_perf), as all_gather_busbw_gbps."))
    all_reduce_busbw_gbps: float | None = field(default=None, metadata=_busbw(
        "busbw_gbps of the all-reduce alone (all_reduce_perf), as all_gather_busbw_gbps."))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("level.name", self.name, "must be a non-empty string")
        check_fields(self, f"level[{self.name}]")

    def measured_busbw(self) -> tuple[tuple[str, float], ...]:
        """The bus bandwidths measured on this level, as (field name, GB/s): ``busbw_gbps`` and each collective's."""
        return tuple((f, v) for f in BUSBW_FIELDS if (v := getattr(self, f)) is not None)

    def collective_busbw(self) -> tuple[tuple[str, float], ...]:
        """The collectives measured apart on this level, as (collective, GB/s); the others reach ``busbw_gbps``
        where it was measured (``Calibration.level_efficiency`` holds that rule, ``profiles.with_measured_links``
        fills it)."""
        return tuple((op, v) for op, f in zip(COLLECTIVES, BUSBW_FIELDS[1:], strict=True)
                     if (v := getattr(self, f)) is not None)


@dataclass(frozen=True)
class ClusterSpec:
    """The hardware: levels innermost first; the product of their sizes is the world size."""

    name: str = field(metadata=about("The cluster's name (a preset's is family:nodes, e.g. frontier:48).",
                                     min_length=1, max_length=64))
    levels: tuple[Level, ...] = field(metadata=about("The tiers of the interconnect, innermost first.",
                                                     min_length=1, max_length=MAX_LEVELS))
    device: str = field(default="cpu", metadata=about("The accelerator of every rank.", min_length=1,
                                                      max_length=64))
    device_memory_gib: float = field(default=16.0, metadata=about("Memory per rank (one GPU / GCD), GiB.", above=0,
                                                                  api_max=BANDWIDTH_MAX))
    peak_tflops: float = field(default=1.0, metadata=about("Peak dense 16-bit TFLOPS per rank.", above=0,
                                                           api_max=BANDWIDTH_MAX))

    def __post_init__(self) -> None:
        levels = tuple(lv if isinstance(lv, Level) else from_dict(Level, lv, "cluster.levels[]")
                       for lv in self.levels)
        object.__setattr__(self, "levels", levels)
        if not levels:
            raise SpecError("cluster.levels", [], "needs at least one level")
        if len(levels) > MAX_LEVELS:
            raise SpecError("cluster.levels", f"{len(levels)} levels", f"at most {MAX_LEVELS} levels")
        for lv in levels:
            if lv.size > MAX_LEVEL_SIZE:
                raise SpecError(f"level[{lv.name}].size", lv.size, f"must be <= {MAX_LEVEL_SIZE}")
        names = [lv.name for lv in levels]
        if len(set(names)) != len(names):
            raise SpecError("cluster.levels", names, "level names must be unique")
        check_fields(self, "cluster")
        below = 1
        for lv in levels:
            for name, value in lv.measured_busbw():
                if value > below * lv.bandwidth_gbps:
                    raise SpecError(f"level[{lv.name}].{name}", value,
                                    f"must be at most what the level's links carry: {below} rank(s) under it x "
                                    f"bandwidth_gbps {lv.bandwidth_gbps:g} = {below * lv.bandwidth_gbps:g} GB/s")
            below *= lv.size

    @property
    def num_levels(self) -> int:
        """L, the number of levels; spans run 0..L."""
        return len(self.levels)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:  # read on every prediction: computed once (levels are immutable)
        return tuple(lv.size for lv in self.levels)

    @functools.cached_property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    @property
    def node_span(self) -> int:
        """The span of one node: every level but the outermost (all of them on a 1-level cluster)."""
        return max(self.num_levels - 1, 1)

    def span_size(self, span: int) -> int:
        """Ranks in a span-``span`` group: the product of the sizes of levels 1..span."""
        if not 0 <= span <= self.num_levels:
            raise SpecError("span", span, f"must be within 0..{self.num_levels} (the cluster's levels)")
        return math.prod(self.sizes[:span])

    def spans_rule(self) -> str:
        """What each span means on this cluster, for errors: ``"must be within 0..3 on frontier:48
        (0 = unsharded, 1 = gcd-pair (2 ranks), 2 = node (8 ranks), 3 = inter-node (384 ranks))"``."""
        levels = ", ".join(f"{k} = {lv.name} ({self.span_size(k)} ranks)" for k, lv in enumerate(self.levels, 1))
        return f"must be within 0..{self.num_levels} on {self.name} (0 = unsharded, {levels})"

    def with_outer_size(self, size: int) -> ClusterSpec:
        """The same cluster with ``size`` groups of the outermost level (e.g. nodes). A bus bandwidth measured on
        the outermost level holds at the size it was measured at only, so another size drops it."""
        check_int(f"cluster {self.name}: outermost level size", size, 1)
        outer = self.levels[-1]
        if size != outer.size:  # every bus bandwidth measured there
            cleared: dict[str, Any] = dict.fromkeys(BUSBW_FIELDS)
            outer = dataclasses.replace(outer, **cleared)
        levels = self.levels[:-1] + (dataclasses.replace(outer, size=size),)
        return dataclasses.replace(self, levels=levels)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON; a level leaves out each bus bandwidth it has not measured (``BUSBW_FIELDS``: so a
        cluster written before those fields existed keeps its form, and a request its key)."""
        out = dataclasses.asdict(self)
        for lv in out["levels"]:
            for name in BUSBW_FIELDS:
                if lv[name] is None:
                    del lv[name]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ClusterSpec:
        return from_dict(cls, data, "cluster")
