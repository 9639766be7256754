"""Fit the cost model's efficiencies to measured runs, and store them as named calibrations.

``fit`` solves a nonlinear least-squares problem (``scipy.optimize.least_squares``, trust-region
reflective with bounds) over log step times: residual_i = log(predicted_i / measured_i), so every
run weighs the same whatever its length. The unknowns are the ``Calibration`` fields: compute
efficiency, one bandwidth efficiency per level that carries traffic in the data (or one effective
bandwidth for all of them where every run had its ranks on one host: there the levels name
subgroups that all talk over the same shared-memory or loopback transport), the latency scale,
the quantization and optimizer throughputs, the overlap and a fixed per-step overhead. The
predictor is the same ``costmodel.predict`` the tuner uses, so a fit is a fit of the model itself.
What the runs measured, and the rates read off their own clocks instead of fitted, are ``measured``'s.

Calibrations are JSON files ``<data dir>/calibrations/<name>.json`` (data dir: ``$ZEROTUNE_DATA_DIR``
or ``~/.local/share/zerotune``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zerotune.costmodel import Calibration, MeasuredError, predict, state_memory
from zerotune.costmodel.measured import (
    Measurement,
    bandwidths_from_clocks,
    measured_all_to_all_efficiency,
    measured_level_efficiencies,
    measured_quant_rate,
)
from zerotune.errors import SpecError

# (field, lower, upper) in the fitted space; rates are fitted as log10
_SCALARS = [("compute_efficiency", 1e-4, 2.0), ("latency_scale", 1e-3, 1e4), ("quant_elems_per_s", 1e5, 1e13),
            ("optimizer_elems_per_s", 1e5, 1e13), ("overlap", 0.0, 1.0), ("step_overhead_s", 0.0, 100.0)]
_LOG = {"compute_efficiency", "latency_scale", "quant_elems_per_s", "optimizer_elems_per_s"}
FITTABLE = tuple(f for f, _, _ in _SCALARS)
"""The scalar fields ``fit`` can fit (bandwidths are always fitted: per level, or one shared by all levels)."""


def fit_options(fields_text: str | None, fixes: Sequence[str]) -> tuple[list[str] | None, Calibration]:
    """``--fit a,b`` and ``--fix field=value`` as ``fit``'s ``fields`` and ``start``.

    With few runs, fit few unknowns: latency trades off against bandwidth, overhead against compute,
    and overlap cannot be seen at all where ranks outnumber cores (``--fix overlap=0`` there)."""
    fields = None
    if fields_text:
        fields = [f.strip() for f in fields_text.split(",") if f.strip()]
        for f in fields:
            if f not in FITTABLE:
                raise SpecError("fit", f, f"not a fitted field; choose from {', '.join(FITTABLE)}")
    values: dict[str, float] = {}
    for text in fixes:
        field, sep, raw = text.partition("=")
        if not sep or field not in FITTABLE:
            raise SpecError("fix", text, f"expected FIELD=VALUE with FIELD one of {', '.join(FITTABLE)}")
        if fields is None or field in fields:
            raise SpecError("fix", text, f"{field} is fitted; leave it out of --fit to hold it at a value")
        low, high = next((lo, hi) for f, lo, hi in _SCALARS if f == field)
        try:
            value = float(raw)
        except ValueError:
            raise SpecError("fix", text, "the value must be a number") from None
        if not low <= value <= high:
            raise SpecError("fix", text, f"{field} must lie in [{low:g}, {high:g}]")
        values[field] = value
    return fields, Calibration.from_dict(values)


def identifiable_fields(measurements: Sequence[Measurement]) -> tuple[list[str], dict[str, str]]:
    """``fit``'s default unknowns: the scalars these runs can tell apart, and why each other one is held.

    Quantization throughput needs a run that quantizes; optimizer throughput needs runs whose
    optimizer shards differ in size (else it is one more constant, like the step overhead); overlap
    cannot be seen where every run had more ranks than CPUs (held at 0: nothing overlapped)."""
    fields, held = [], {}
    for field in FITTABLE:
        if field == "quant_elems_per_s" and not any(m.strategy.quantized for m in measurements):
            held[field] = "no run quantizes"
        elif field == "quant_elems_per_s" and measured_quant_rate(measurements) is not None:
            held[field] = "read off the runs' own seconds in (de)quantization, not fitted"
        elif field == "optimizer_elems_per_s" and len(
                {state_memory(m.model, m.cluster, m.strategy, elem_bytes=m.elem_bytes)["optim_states"]
                 for m in measurements}) < 2:
            held[field] = "every run's optimizer shard has the same size"
        elif field == "overlap" and all(m.oversubscribed for m in measurements):
            held[field] = "ranks outnumbered CPUs in every run: held at 0"
        else:
            fields.append(field)
    return fields, held


def predicted_step_time(m: Measurement, calib: Calibration) -> float:
    """The model's step time for what ``m`` ran, under ``calib``."""
    return predict(m.model, m.cluster, m.strategy, elem_bytes=m.elem_bytes, global_batch=m.global_batch,
                   calibration=calib, block=m.quant_block)["step_time_s"]


def fit(measurements: Sequence[Measurement], *, name: str = "fitted", start: Calibration | None = None,
        fields: Sequence[str] | None = None, tie_levels: bool | None = None,
        bandwidths: bool | str = True) -> tuple[Calibration, dict[str, Any]]:
    """Least-squares calibration from measurements; returns it and fit statistics.

    Args:
        measurements: runs on one cluster family (level layout); at least as many as unknowns.
        name: the calibration's name.
        start: initial values (nominal by default).
        fields: the scalar fields to fit (default: ``identifiable_fields``, the ones the runs can
            tell apart; the others stay at ``start``, overlap at 0 where ranks outnumbered CPUs, the
            quantization rate at what gloo runs' clocks read, ``measured_quant_rate``); bandwidth
            efficiencies of every level that carries traffic in the data are always fitted.
        tie_levels: fit one effective bandwidth (bytes/s) shared by every level instead of one per
            level (default: where every run had all its ranks on one host, as ``local:`` runs do:
            their "levels" are names for subgroups, and every collective crossed the same shared
            memory or loopback transport, so per-level bandwidths would only fit noise).
        bandwidths: False holds every level's bandwidth at ``start`` (too few runs to fit them too);
            ``"measured"`` sets them, and the all-to-all's share of them, from the runs' own per-level
            seconds (``measured_level_efficiencies``, ``measured_all_to_all_efficiency``) and holds them
            there, so only the scalars are fitted to step times (the quantization rate too is then read
            off the runs' clocks, ``measured_quant_rate``, where they quantized). The clocks' seconds hold each
            collective's launch and hops too, which the model charges apart: the first pass takes off what
            ``start`` charges for them, a second what the first pass fitted (latency_scale among its
            scalars), so the latency is not paid twice.
    """
    if bandwidths != "measured":
        return _fit(measurements, name=name, start=start, fields=fields, tie_levels=tie_levels,
                    bandwidths=bandwidths)
    first, _ = _fit(measurements, name=name, start=start, fields=fields, tie_levels=tie_levels,
                    bandwidths=bandwidths, latency=start or Calibration(name=name))
    return _fit(measurements, name=name, start=first, fields=fields, tie_levels=tie_levels, bandwidths=bandwidths,
                latency=first)


def _fit(measurements: Sequence[Measurement], *, name: str, start: Calibration | None, fields: Sequence[str] | None,
         tie_levels: bool | None, bandwidths: bool | str,
         latency: Calibration | None = None) -> tuple[Calibration, dict[str, Any]]:
    """``fit``, one pass; ``latency``: the calibration whose launch and hop charges come off the clocks'
    seconds where bandwidths are ``"measured"``."""
    from scipy.optimize import least_squares

    if not measurements:
        raise SpecError("measurements", 0, "need at least one measured run to calibrate")
    levels = measurements[0].cluster.num_levels
    if any(m.cluster.num_levels != levels for m in measurements):
        raise SpecError("measurements", "mixed clusters", "all runs of one calibration must share the level layout")
    base = start or Calibration(name=name)
    held: dict[str, str] = {}
    if fields is None:
        fields, held = identifiable_fields(measurements)
        if "overlap" in held:
            base = dataclasses.replace(base, overlap=0.0)
    quant_rate = measured_quant_rate(measurements)
    if quant_rate is not None and (bandwidths == "measured" or "quant_elems_per_s" in held):
        base = dataclasses.replace(base, quant_elems_per_s=quant_rate)
        fields = [f for f in fields if f != "quant_elems_per_s"]
    if bandwidths == "measured":
        base = dataclasses.replace(base, bandwidth_efficiency=measured_level_efficiencies(measurements, latency),
                                   all_to_all_efficiency=measured_all_to_all_efficiency(measurements, latency))
    elif len(base.bandwidth_efficiency) != levels:
        base = dataclasses.replace(base, bandwidth_efficiency=(0.8,) * levels)
    scalars = [s for s in _SCALARS if s[0] in fields]
    busy = sorted({lv for m in measurements for lv in range(1, levels + 1) if m.cluster.levels[lv - 1].size > 1})
    tied = all(m.one_host for m in measurements) if tie_levels is None else tie_levels
    gbps = [lv.bandwidth_gbps for lv in measurements[0].cluster.levels]
    # tied: the first busy level's; others share
    fitted_bw = (busy[:1] if tied else busy) if bandwidths is True else []
    if bandwidths == "measured" or fitted_bw:  # the runs' own rates replace any one collective's measured apart
        # and the fabric's law at scale too, as a cluster's own measured bus bandwidth does (``profiles``)
        base = dataclasses.replace(base, collective_efficiency=(), fabric="")
    n_unknowns = len(scalars) + len(fitted_bw)
    if len(measurements) < n_unknowns:
        raise SpecError("measurements", len(measurements), f"need at least {n_unknowns} runs for {n_unknowns} unknowns")

    def unpack(x: Sequence[float]) -> Calibration:
        values: dict[str, Any] = {}
        for (field, _, _), v in zip(scalars, x, strict=False):
            values[field] = float(10 ** v if field in _LOG else v)
        bw = list(base.bandwidth_efficiency)
        for lv, v in zip(fitted_bw, x[len(scalars):], strict=True):
            bw[lv - 1] = float(10 ** v)
        if tied and fitted_bw:
            for lv in busy[1:]:
                bw[lv - 1] = bw[busy[0] - 1] * gbps[busy[0] - 1] / gbps[lv - 1]
        return dataclasses.replace(base, name=name, bandwidth_efficiency=tuple(bw), **values)

    def residuals(x: Sequence[float]) -> list[float]:
        calib = unpack(x)
        return [math.log(predicted_step_time(m, calib) / m.step_time_s) for m in measurements]

    x0 = [math.log10(getattr(base, f)) if f in _LOG else getattr(base, f) for f, _, _ in scalars]
    x0 += [math.log10(base.bandwidth_efficiency[lv - 1]) for lv in fitted_bw]
    lower = [math.log10(lo) if f in _LOG else lo for f, lo, _ in scalars] + [-4.0] * len(fitted_bw)
    upper = [math.log10(hi) if f in _LOG else hi for f, _, hi in scalars] + [1.0] * len(fitted_bw)
    x0 = [min(max(v, lo + 1e-9), hi - 1e-9) for v, lo, hi in zip(x0, lower, upper, strict=True)]
    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", max_nfev=400 * n_unknowns)
    calib = unpack(result.x)
    errors = [abs(math.exp(r) - 1) for r in residuals(result.x)]
    return calib, {"runs": len(measurements), "median_rel_error": sorted(errors)[len(errors) // 2],
                   "max_rel_error": max(errors), "cost": float(result.cost), "converged": bool(result.success),
                   "fitted": [f for f, _, _ in scalars], "held": held,
                   "bandwidths": "from the runs' seconds per level" if bandwidths == "measured"
                   else "one for all levels" if tied else "one per level"}


REFIT_ORDER = ("compute_efficiency", "step_overhead_s", "latency_scale", "overlap", "optimizer_elems_per_s",
               "quant_elems_per_s")
"""With fewer runs than unknowns, ``refit`` fits the first of these the runs can tell apart (compute and
the fixed per-step cost explain most of a short run; the rates of small kernels least)."""


def _spread(errors: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(errors)
    if not ordered:
        return {"median": None, "p90": None, "count": 0}
    return {"median": ordered[len(ordered) // 2], "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "count": len(ordered)}


def assess(measurements: Sequence[Measurement], predicted: Sequence[float]) -> dict[str, Any]:
    """How far ``predicted`` step times are from the measured ones.

    ``rows``: |predicted / measured - 1| per run. ``comparisons``: |predicted ratio / measured ratio - 1|
    over every pair of runs of the same model, cluster and batch — the error of choosing between them."""
    rows = [abs(p / m.step_time_s - 1) for m, p in zip(measurements, predicted, strict=True)]
    pairs = []
    for i, (a, pa) in enumerate(zip(measurements, predicted, strict=True)):
        for b, pb in zip(measurements[i + 1:], predicted[i + 1:], strict=True):
            if (a.model, a.cluster, a.global_batch) == (b.model, b.cluster, b.global_batch):
                pairs.append(abs((pa / pb) / (a.step_time_s / b.step_time_s) - 1))
    return {"rows": _spread(rows), "comparisons": _spread(pairs)}


def before_after(measurements: Sequence[Measurement], start: Calibration, fitted: Calibration) -> dict[str, Any]:
    """The error on ``measurements`` of the calibration they started from and of the one fitted to them."""
    return {"before": assess(measurements, [predicted_step_time(m, start) for m in measurements]),
            "after": assess(measurements, [predicted_step_time(m, fitted) for m in measurements])}


def refit(measurements: Sequence[Measurement], *, name: str, start: Calibration | None = None) -> tuple[
        Calibration, dict[str, Any]]:
    """Refit ``start`` (the calibration the cluster had) to measured runs, and say what it gained.

    Fits at most one unknown per two runs, and never more than a fold without one run can fit:
    compute efficiency first, then the bandwidths (one shared by all levels where the runs ran on one
    host or are too few for one per level; none where ``bandwidths_from_clocks``: they are read off the
    runs' per-level seconds), then the other factors ``identifiable_fields`` names, in
    ``REFIT_ORDER``. The error is then measured three
    ways on the same runs: ``before`` (``start``), ``after`` (the refit, in-sample) and
    ``cross_validated`` (each run predicted by a fit that never saw it: leave-one-out up to 10 runs,
    5 folds beyond), which becomes the refit's ``measured_error`` — the band its predictions carry.
    """
    n = len(measurements)
    if n == 0:
        raise SpecError("measurements", 0, "need at least one measured run to calibrate")
    start = start or Calibration()
    folds = n if n <= 10 else 5
    budget = max(1, min(n - math.ceil(n / folds), n // 2))  # at most one unknown per two runs
    fields, held = identifiable_fields(measurements)
    if "overlap" in held:
        start = dataclasses.replace(start, overlap=0.0)
    quant_rate = measured_quant_rate(measurements)
    if quant_rate is not None:
        start = dataclasses.replace(start, quant_elems_per_s=quant_rate)
    levels = measurements[0].cluster.num_levels
    busy = {lv for m in measurements for lv in range(1, levels + 1) if m.cluster.levels[lv - 1].size > 1}
    order = [f for f in REFIT_ORDER if f in fields]
    keep, slots = order[:1], budget - len(order[:1])  # compute first: what a short run mostly measures
    tie = all(m.one_host for m in measurements) or len(busy) + 1 > budget
    clocks = bandwidths_from_clocks(measurements)  # then no bandwidth is fitted: none takes a slot
    n_bw = 0 if clocks or not busy else 1 if tie else len(busy)
    with_bw: bool | str = "measured" if clocks else slots >= n_bw
    slots -= n_bw if with_bw else 0
    keep += order[1:1 + max(0, slots)]
    for f in fields:
        if f not in keep:
            held[f] = f"{n} runs: fitted only the {len(keep) + (n_bw if with_bw else 0)} most telling factors"
    if clocks:
        held["bandwidth_efficiency"] = ("read off the runs' own per-level seconds (gloo collectives, ranks over "
                                        "hosts or namespaces), not fitted")
    elif not with_bw:
        held["bandwidth_efficiency"] = f"{n} runs: too few to fit the bandwidths too"
    start = dataclasses.replace(start, measured_error=None)

    def fitted(runs: Sequence[Measurement]) -> Calibration:
        return fit(runs, name=name, start=start, fields=keep, tie_levels=tie, bandwidths=with_bw)[0]

    calib, stats = fit(measurements, name=name, start=start, fields=keep, tie_levels=tie, bandwidths=with_bw)
    stats["held"] = held
    report: dict[str, Any] = {
        "runs": n, "cluster": measurements[0].cluster.name, "start": start.name, "fit": stats,
        **before_after(measurements, start, calib), "cross_validated": None}
    if n > 1:
        predicted = [0.0] * n
        for fold in range(folds):
            held_out = set(range(fold, n, folds))
            model = fitted([m for i, m in enumerate(measurements) if i not in held_out])
            for i in held_out:
                predicted[i] = predicted_step_time(measurements[i], model)
        cv = report["cross_validated"] = assess(measurements, predicted)
        pairs = cv["comparisons"] if cv["comparisons"]["count"] else cv["rows"]
        calib = dataclasses.replace(calib, measured_error=MeasuredError(
            row_median=cv["rows"]["median"], row_p90=cv["rows"]["p90"], comparison_median=pairs["median"],
            comparison_p90=pairs["p90"], runs=n,
            source=f"{n} measured runs on {measurements[0].cluster.name}, cross-validated ({folds} folds)"))
    return calib, report


def data_dir() -> Path:
    return Path(os.environ.get("ZEROTUNE_DATA_DIR") or Path.home() / ".local" / "share" / "zerotune")


def save_calibration(calib: Calibration, cluster: str, stats: dict[str, Any] | None = None) -> Path:
    path = data_dir() / "calibrations" / f"{calib.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cluster": cluster, "calibration": calib.to_dict(), "fit": stats or {}}, indent=2))
    return path


def load_calibration(name: str) -> Calibration:
    """A stored calibration by name (or a path to its JSON file)."""
    path = Path(name) if name.endswith(".json") else data_dir() / "calibrations" / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (data_dir() / "calibrations").glob("*.json"))
        raise SpecError("calibration", name, f"no such calibration; stored: {known or 'none'}")
    return Calibration.from_dict(json.loads(path.read_text())["calibration"])
