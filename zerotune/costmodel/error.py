"""How far to trust a prediction: the model's measured error, as a band.

For a cluster predicted with a device profile (every preset), the error is the one the profiles
reach on published measurements: ``bench/published.py --write-error`` scores every transcribed row
and strategy comparison and writes ``model_error.json`` beside this module (a test checks that the
file is what the bench computes from today's model and tables, so it cannot go stale). Two bands are served:

- ``rows``: |predicted / published - 1| of absolute figures (TFLOPS or tokens/s per GPU);
- ``comparisons``: the same for ratios of two strategies measured side by side — the error of a
  *decision* between strategies, which is what a recommendation's margin is held to. Ratios of one
  strategy at two scales (weak scaling) are stored apart as ``scaling`` and never enter it: they are
  easier ratios (the same schedule twice), and ten of them at 16-128 A100s once narrowed the decision
  band there from 7.8% to 2.5% median.

Each band gives the median and the 90th percentile, **at the prediction's scale**: the published
figures disagree with the model far more at 1,024 GPUs than at 16 (collectives degrade at scale in
ways an α-β model does not see), so one band for every scale would understate the error of a large
cluster and overstate that of a small one. The file keeps every scored item with the number of GPUs
it was measured on (a ratio of two scales counts at the larger); a prediction for W ranks reads
the items measured within a factor ``SCALE_WINDOW`` of W, widening the window by that factor until
it holds ``MIN_ITEMS`` (or every item). The band names the range it read.

**And at the prediction's device**: items carry the device they ran on, and where a device has
``DEVICE_MIN_ITEMS`` or more scored items in the GPU range the scale band read, the band is the wider
of the two (``device`` says what that device's own items show). A Frontier prediction at 384 GCDs
reads the V100 ZeRO++ comparisons that dominate that scale (about 10% median) and the seed paper's
three Frontier strategy comparisons (about 37% median, up to 45% off): a decision between strategies there is
held to the second, because the model's error on one device is no smaller for being small on another.

**Leave one table out.** A band is applied to a user's prediction, which has no table; what it must not read is a
table's errors measured with a constant that table set. The items' errors are out of sample already — every
prediction uses the device and link profiles as they are, fitted to none of the scored tables — except where a
profile constant was set from a table: those are the ``role = "calibration"`` tables (``rebase.py`` re-bases the
eager PyTorch efficiencies on ``hardware.SOURCE_RUNS``, the runs ``bench/published/ibm_fsdp.toml`` prints; the
A100's FlashAttention-2 figure is ``flash_attention2.toml``'s), each of whose rows is predicted with the constant it
set. ``model_error.json`` keeps every item with its table and names those tables under ``held_out``; every band is
read from the items of the other tables only (``band_items``), and says how many items near its scale it held out
(``held_out_near``).

A preset's profile keeps its band whichever runner's collectives it is charged (``rates.run_by``):
most published rows were run by DeepSpeed or FSDP, and each table names how its engine ran them.
Where a preset's prediction runs flat rings (``--runner deepspeed`` or ``fsdp``) at a scale where its
vendor library's collectives were measured more than 15% off the model's ring
(``bench/collectives_at_scale.py``, stored as ``collectives`` by the same ``--write-error``), the band
also says so (``collectives``: the library, the GPU count, the measured ratio): RCCL's flat rings past
16 Frontier nodes ran 3-7x the model's time, which no band of strategy figures shows.
Every preset band also states the model's lean on checkpointed runs (``checkpointing``): in the published tables
that measured runs with and without activation checkpointing, the median of each table's
``(1 + checkpointed rows' median error) / (1 + uncheckpointed rows' median error) - 1`` (about -10%: the model
charges a recomputed forward more than those runs paid). A decision between the two kinds is held to it
(``tuner.choice``); no prediction is corrected by it.
A prediction with another calibration (the nominal one of a ``local:`` or custom cluster) has no
published band; a calibration refitted from measured trials (``costmodel.calibration.refit``)
carries the error those trials show under cross-validation.
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any

from zerotune.core.records import Band, Collectives, DeviceBand, ErrorBand, Lean
from zerotune.costmodel.profiles import PRESET_CALIBRATIONS
from zerotune.costmodel.rates import Calibration, run_by

ERROR_FILE = Path(__file__).with_name("model_error.json")
SCALE_WINDOW = 2
"""Items measured on W/2 .. 2W GPUs (one doubling either way) speak for a prediction on W."""
MIN_ITEMS = 8
"""Fewer items than this at the prediction's scale: the window widens (a median of three is no band)."""
DEVICE_MIN_ITEMS = 3
"""Fewer scored items of the prediction's device in its range: no device band (too few to speak for it)."""
COLLECTIVES_WITHIN = 0.15
"""A library's measured collectives within this of the model's ring add nothing to a band (the published goal)."""


def band_of(errors: list[float]) -> Band:
    """Median and 90th percentile (nearest rank) of absolute relative errors."""
    errors = sorted(abs(e) for e in errors)
    if not errors:
        return {"count": 0, "median": None, "p90": None}
    return {"count": len(errors), "median": round(statistics.median(errors), 4),
            "p90": round(errors[min(len(errors) - 1, round(0.9 * (len(errors) - 1)))], 4)}


def at_scale(items: list[list], world: int | None) -> tuple[Band, tuple[int, int] | None]:
    """The band of the ``[gpus, error, device, table]`` items measured near ``world`` GPUs, and the GPU range it
    read (None: every item, as for a prediction without a scale)."""
    if world is None or not items:
        return band_of([it[1] for it in items]), None
    lo = hi = float(world)
    while True:
        lo, hi = lo / SCALE_WINDOW, hi * SCALE_WINDOW
        near = [it for it in items if lo <= it[0] <= hi]
        if len(near) >= MIN_ITEMS or len(near) == len(items):
            return band_of([it[1] for it in near]), (int(min(it[0] for it in near)), int(max(it[0] for it in near)))


def on_device(items: list[list], device: str | None, span: tuple[int, int] | None) -> Band | None:
    """The band of the items measured on ``device`` within ``span`` GPUs (all GPU counts for None): None for
    fewer than ``DEVICE_MIN_ITEMS``."""
    mine = [it[1] for it in items if len(it) > 2 and it[2] == device
            and (span is None or span[0] <= it[0] <= span[1])]
    return band_of(mine) if device and len(mine) >= DEVICE_MIN_ITEMS else None


def band_items(err: dict[str, Any], kind: str) -> list[list]:
    """The ``kind`` items (``rows``, ``comparisons``, ``scaling``) a band may read: those of tables that set no
    constant they are scored with (not under ``held_out``)."""
    held = err.get("held_out", {})
    return [it for it in err["items"][kind] if len(it) < 4 or it[3] not in held]


def held_out_near(err: dict[str, Any], kind: str, span: tuple[int, int] | None) -> int:
    """How many ``kind`` items measured within ``span`` GPUs (all for None) the leave-one-table-out rule held out."""
    held = err.get("held_out", {})
    return sum(1 for it in err["items"][kind] if len(it) > 3 and it[3] in held
               and (span is None or span[0] <= it[0] <= span[1]))


@functools.lru_cache(maxsize=1)
def published_error() -> dict[str, Any] | None:
    """The stored error of the profile-based model on published measurements (``model_error.json``; None
    while the bench that writes it has never run, as when it scores the model to write it)."""
    return json.loads(ERROR_FILE.read_text()) if ERROR_FILE.exists() else None


_BY_ID: dict[tuple[int, int | None, str | None], tuple[Calibration, ErrorBand | None]] = {}
"""``_band`` by the calibration's identity (held, so that no id is reused): a study predicts with one calibration
object call after call, and hashing it (every rate) costs more than the band's lookup."""


def error_band(calibration: Calibration, world: int | None = None, device: str | None = None) -> ErrorBand | None:
    """The band a prediction made with ``calibration`` for ``world`` ranks of ``device`` (a
    ``ClusterSpec.device``) carries: its measured error for a fitted one, the published one near that
    scale and on that device for a preset's own profile, None otherwise (nothing measured its error).
    A fresh dict per call."""
    known = _BY_ID.get((id(calibration), world, device))
    if known is None or known[0] is not calibration:
        if len(_BY_ID) > 256:
            _BY_ID.clear()
        known = _BY_ID[id(calibration), world, device] = (calibration, _band(calibration, world, device))
    band = known[1]
    return band.copy() if band is not None else None


@functools.lru_cache(maxsize=256)
def _band(calibration: Calibration, world: int | None, device: str | None) -> ErrorBand | None:
    measured = calibration.measured_error
    if measured is not None:
        return {"row_median": measured.row_median, "row_p90": measured.row_p90,
                "comparison_median": measured.comparison_median, "comparison_p90": measured.comparison_p90,
                "source": measured.source}
    # a preset's profile under any runner's collectives: the published rows were run by all three
    err = published_error() if run_by(calibration, "zerotune") in PRESET_CALIBRATIONS.values() else None
    if err is None or "items" not in err:  # not written yet by this version of the bench
        return None
    row_items, pair_items = band_items(err, "rows"), band_items(err, "comparisons")
    rows, row_range = at_scale(row_items, world)
    pairs, pair_range = at_scale(pair_items, world)

    def where(span: tuple[int, int] | None) -> str:
        return "" if span is None else f" on {span[0]}-{span[1]} GPUs"

    def tables(kind: str, span: tuple[int, int] | None) -> set[str]:
        """The tables the items a band read came from."""
        return {it[3] for it in band_items(err, kind) if span is None or span[0] <= it[0] <= span[1]}
    read = sorted(tables("rows", row_range) | tables("comparisons", pair_range))
    held = held_out_near(err, "rows", row_range) + held_out_near(err, "comparisons", pair_range)
    band: ErrorBand = {
        "row_median": rows["median"], "row_p90": rows["p90"],
        "comparison_median": pairs["median"], "comparison_p90": pairs["p90"],
        "source": f"bench/published.py: {rows['count']} published figures{where(row_range)} and "
                  f"{pairs['count']} comparisons{where(pair_range)} ({', '.join(read)})"
                  + (f"; {held} held out (their tables set a constant they are scored with: "
                     f"{', '.join(sorted(err['held_out']))})" if held else "")}
    own_rows = on_device(row_items, device, row_range)
    own_pairs = on_device(pair_items, device, pair_range)
    said = [f"{mine['count']} {label} {mine['median']:.0%} median, {mine['p90']:.0%} p90"
            for mine, label in ((own_rows, "figures"), (own_pairs, "comparisons")) if mine is not None]
    if own_rows is not None:  # the wider of the scale's and the device's
        band["row_median"], band["row_p90"] = _wider(band["row_median"], own_rows["median"]), \
            _wider(band["row_p90"], own_rows["p90"])
    if own_pairs is not None:
        band["comparison_median"], band["comparison_p90"] = _wider(band["comparison_median"], own_pairs["median"]), \
            _wider(band["comparison_p90"], own_pairs["p90"])
    if said:
        mine: DeviceBand = {"device": device}
        if own_rows is not None:
            mine["rows"] = own_rows
        if own_pairs is not None:
            mine["comparisons"] = own_pairs
        band["device"] = mine
        band["source"] += f"; on {device}: {' and '.join(said)}, the wider band kept"
    slower = _collectives(err, calibration, world)
    if slower is not None:
        band["collectives"] = slower
    lean = err.get("checkpointing") or {}
    if lean.get("lean") is not None:
        band["checkpointing"] = {"lean": lean["lean"], "source": "bench/published.py: the median of "
                                 f"{len(lean['tables'])} tables' checkpointed over uncheckpointed rows ("
                                 + ", ".join(t["table"] for t in lean["tables"]) + ")"}
    return band


def _wider(band: float | None, mine: float | None) -> float | None:
    """The wider of a scale's band and its device's."""
    return mine if band is None or (mine is not None and mine > band) else band


def lean_sentence(lean: Lean) -> str:
    """The clause every client says of a band's ``checkpointing`` lean (``zerotune predict``, a decision's ``why``)."""
    return (f"the model's figures for checkpointed runs sat {lean['lean']:+.1%} from its figures for uncheckpointed "
            f"ones in the published tables that measured both ({lean['source']})")


def _collectives(err: dict[str, Any], calibration: Calibration, world: int | None) -> Collectives | None:
    """Where a prediction runs its library's flat rings (DeepSpeed's and FSDP's) at a scale whose vendor
    collectives were measured more than ``COLLECTIVES_WITHIN`` off the model's ring: the measured ratio
    at the largest measured GPU count not above ``world`` (``model_error.json``'s ``collectives``)."""
    measured = err.get("collectives", {})
    scales = measured.get("measured_over_predicted", {}).get(calibration.protocols)
    if calibration.rings != "flat" or not scales or world is None:
        return None
    below = [(g, r) for g, r in scales if g <= world]
    if not below:
        return None
    gpus, ratio = max(below)
    if abs(ratio - 1) <= COLLECTIVES_WITHIN:
        return None
    return {"library": calibration.protocols.upper(), "gpus": gpus, "measured_over_predicted": ratio,
            "source": measured["source"]}
