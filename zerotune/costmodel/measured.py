"""A measured run, as the cost model's fit reads it, and the rates read off its own clocks.

``Measurement`` is one run (``Measurement.from_run``: a trainer ``run.json``): what ran, how long a step took,
and, where the run recorded them, the bytes and seconds of each level's collectives and of its (de)quantization.
Where those seconds are the collectives' own durations (gloo blocks until a collective is done), a level's
bandwidth efficiency (``measured_level_efficiencies``), the all-to-all's share of it
(``measured_all_to_all_efficiency``) and the quantization rate (``measured_quant_rate``) are read off them
rather than fitted to step times (``bandwidths_from_clocks`` says when; ``calibration.fit`` does the fitting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zerotune.core.records import RunMetrics
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.rates import Calibration
from zerotune.costmodel.schedule import accumulation_steps
from zerotune.costmodel.tally import step_latency
from zerotune.errors import SpecError


@dataclass(frozen=True)
class Measurement:
    """One measured run: what ran and how long a step took."""

    model: ModelSpec
    cluster: ClusterSpec
    strategy: Strategy
    step_time_s: float
    elem_bytes: int = 4
    global_batch: int | None = None
    quant_block: int = 2048
    oversubscribed: bool = False
    """CPU ranks outnumbered the CPUs of their host (run.json's ``host``): no communication overlapped."""
    one_host: bool = False
    """Every rank ran on one host (run.json's ``host``; before it was recorded, a ``local:`` cluster):
    whatever the levels are called, their collectives crossed the same transport."""
    level_traffic: tuple[tuple[str, int, float], ...] = ()
    """(level, bytes sent per rank per step, seconds per step in those collectives) for the
    all-gathers, reduce-scatters and all-reduces of each level (run.json's ``bytes_per_level`` and
    ``seconds_per_level``; empty for runs that did not record seconds)."""
    all_to_all_traffic: tuple[tuple[str, int, float], ...] = ()
    """The same for each level's all-to-alls (ZeRO++'s quantized gradient exchange)."""
    timed_collectives: bool = False
    """The per-level seconds are the collectives' own durations: gloo blocks until a collective is
    done; NCCL returns once it is queued on a stream, so its seconds are the host's issue time only."""
    quant_traffic: tuple[int, float] = (0, 0.0)
    """(elements quantized + dequantized, seconds in those calls) per step (run.json's ``quantization``)."""

    @classmethod
    def from_run(cls, run: RunMetrics, source: str = "run.json") -> Measurement:
        """From a trainer ``run.json`` (status ok)."""
        if run.get("status") != "ok":
            raise SpecError(source, run.get("status"), "only completed runs (status ok) can calibrate")
        host = run.get("host")
        one_host = (host["local_ranks"] >= run["world_size"] if host and "world_size" in run
                    else str(run["cluster"].get("name", "")).startswith("local:"))
        gloo = run.get("backend") == "gloo"
        quant = run.get("quantization") or {}
        return cls(model=ModelSpec.from_dict(run["model"]), cluster=ClusterSpec.from_dict(run["cluster"]),
                   strategy=Strategy.from_dict(run["strategy"]), step_time_s=float(run["step_time_s"]),
                   elem_bytes=2 if run.get("dtype") in ("bfloat16", "float16") else 4,
                   global_batch=run.get("global_batch"), quant_block=run.get("config", {}).get("quant_block", 2048),
                   oversubscribed=gloo and "host" in run
                   and run["host"]["local_ranks"] > run["host"]["cpus"], one_host=one_host,
                   level_traffic=_level_traffic(run, RATE_KINDS),
                   all_to_all_traffic=_level_traffic(run, ("all_to_all",)),
                   timed_collectives=gloo,
                   quant_traffic=(int(quant.get("elements", 0)), float(quant.get("seconds", 0.0))))


def bandwidths_from_clocks(measurements: Sequence[Measurement]) -> bool:
    """Whether a refit should read the bandwidths off the runs' clocks (``fit(bandwidths="measured")``)
    rather than fit them to step times: every run timed its collectives (gloo) per level and spread
    its ranks over hosts or network namespaces (an emulated cluster), so each level's seconds are its
    own links'. On emulated clusters the clocks' bandwidths predicted held-out runs better than fitted
    ones in each of five analyses (two-level: Spearman 0.972 vs 0.953; frontier-like, four campaigns:
    0.871 vs 0.760, 0.939 vs 0.859, 0.938 vs 0.879 and, with the quantization rate read off the clocks
    too, 0.913 vs 0.866; bench/data/emulated-2core/report.txt), and they
    leave the runs' degrees of freedom to the scalars. Ranks all on one host keep the fitted, shared
    bandwidth: their "levels" crossed one transport."""
    return bool(measurements) and all(m.timed_collectives and m.level_traffic and not m.one_host
                                      for m in measurements)


def measured_quant_rate(measurements: Sequence[Measurement]) -> float | None:
    """Elements block-(de)quantized per second, read off the runs' own clocks: the elements over the
    seconds spent quantizing, summed over the gloo runs that quantized (on CPU the calls return when
    done; NCCL runs time only the launch). None where no such run recorded any (then the rate is
    fitted to step times, or held)."""
    timed = [m.quant_traffic for m in measurements if m.timed_collectives and m.quant_traffic[0] > 0
             and m.quant_traffic[1] > 0]
    if not timed:
        return None
    return sum(n for n, _ in timed) / sum(s for _, s in timed)


RATE_KINDS = ("all_gather", "reduce_scatter", "all_reduce")
"""The collective kinds whose seconds measure a level's bandwidth (ring algorithms, bytes over the link);
all-to-all is left out: gloo runs it as pairwise sends whose time is not the model's ring."""


def _level_traffic(run: RunMetrics, kinds_of: Sequence[str]) -> tuple[tuple[str, int, float], ...]:
    seconds, volume = run.get("seconds_per_level") or {}, run.get("bytes_per_level") or {}
    out = []
    for level, kinds in seconds.items():
        sent = sum(int(volume.get(level, {}).get(k, 0)) for k in kinds_of)
        spent = sum(float(kinds.get(k, 0.0)) for k in kinds_of)
        if sent > 0 and spent > 0:
            out.append((level, sent, spent))
    return tuple(out)


WIRE_FLOOR = 0.1
"""A level's measured seconds less the model's latency for them keep at least this share as wire time, so a
level whose seconds are nearly all latency cannot read as an unbounded rate."""


def _rates(measurements: Sequence[Measurement], ring: bool,
           latency: Calibration | None = None) -> dict[str, tuple[int, float]]:
    """Bytes and seconds per level summed over the runs, of their ring collectives or their all-to-alls;
    with ``latency``, a level's seconds less what that calibration charges those collectives for launch
    and hops (``costmodel.step_latency``), at least ``WIRE_FLOOR`` of them."""
    out: dict[str, tuple[int, float]] = {}
    for m in measurements:
        lat: dict[str, float] = {}
        if latency is not None:
            accum = accumulation_steps(m.cluster, m.strategy, m.global_batch)
            lat = step_latency(m.model, m.cluster, m.strategy, latency, elem_bytes=m.elem_bytes, accum=accum,
                               block=m.quant_block, all_to_all=not ring)
        for level, nbytes, secs in m.level_traffic if ring else m.all_to_all_traffic:
            sent, spent = out.get(level, (0, 0.0))
            out[level] = (sent + nbytes, spent + max(secs - lat.get(level, 0.0), WIRE_FLOOR * secs))
    return out


def measured_all_to_all_efficiency(measurements: Sequence[Measurement], latency: Calibration | None = None) -> float:
    """An all-to-all's rate over its level's ring rate, both read off the runs' clocks (with ``latency``, less
    what that calibration charges them for launch and hops): the bytes-weighted mean over the levels where
    both ran (1.0 where no run exchanged all-to-all)."""
    ring, a2a = _rates(measurements, True, latency), _rates(measurements, False, latency)
    both = [lv for lv in a2a if lv in ring and a2a[lv][1] > 0 and ring[lv][1] > 0]
    weight = sum(a2a[lv][0] for lv in both)
    if not weight:
        return 1.0
    return sum(a2a[lv][0] * (a2a[lv][0] / a2a[lv][1]) / (ring[lv][0] / ring[lv][1]) for lv in both) / weight


def measured_level_efficiencies(measurements: Sequence[Measurement],
                                latency: Calibration | None = None) -> tuple[float, ...]:
    """Each level's bandwidth efficiency read off the runs' own clocks: the bytes its ring collectives
    sent per rank over the seconds spent in them, summed over the runs, divided by the level's
    ``bandwidth_gbps``. The seconds include each collective's launch and hops, which the model charges
    apart from the bytes: with ``latency``, what that calibration charges for them is taken off first
    (``_rates``), so the latency is not paid twice; without, on small messages this is a lower bound of
    the link's efficiency. A level with no traffic keeps the nominal 0.8.

    Raises ``SpecError`` when a run recorded no seconds in ring collectives (a run.json from before
    ``seconds_per_level``)."""
    if not all(m.level_traffic for m in measurements):
        raise SpecError("measurements", "no seconds_per_level",
                        "every run needs run.json's seconds_per_level to read bandwidths off its clocks "
                        "(train it again with this version)")
    rates = _rates(measurements, True, latency)
    return tuple(rates[lv.name][0] / rates[lv.name][1] / (lv.bandwidth_gbps * 1e9) if lv.name in rates else 0.8
                 for lv in measurements[0].cluster.levels)
