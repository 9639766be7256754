"""The cost model's collectives against vendor collectives measured at scale (8 to 8,192 GPUs).

    python bench/collectives_at_scale.py            # rows per source, a summary per library and fabric, the goal
    python bench/collectives_at_scale.py --json

``bench/published/collectives/*.toml`` holds measured times (``ms``, nccl-tests' ``us``) or bus bandwidths
(``busbw_gbps``) of one collective per library, fabric, cluster, message size and GPU count: ``[[series]]`` over GPU
counts at one size (``mb``), ``[[sweep]]`` over sizes (``bytes``) at one GPU count, ``[[point]]`` a single value.
Sizes are nccl-tests' size column: the buffer each rank all-reduces or reduce-scatters, each rank's output of an
all-gather. A bandwidth becomes a time as nccl-tests defines busbw: time = size × (R − 1)/R / busbw, twice that
for an all-reduce; where a sweep prints both ``us`` and busbw, the time column is used (the busbw is derived from
it). ``bw_gbps`` (the source does not say bus or algorithm bandwidth) is read as bus bandwidth: nccl-tests and
rccl-tests print both and the sources that say which quote busbw; for an all-gather or a reduce-scatter the two
differ by (R − 1)/R, and an all-reduce figure read as algorithm bandwidth would put a node past its NICs' line rate.
A ``[[point]]`` that prints the large-message plateau without its size is compared at ``PLATEAU_BYTES``; one with
no GPU count is shown, not scored. ``fabric_confirmed = false`` (the source does not confirm its network) and
``algorithm`` (NCCL_ALGO forced, e.g. NVLSTree) are shown beside the row, which is scored like the others (it counts
in the goal; no law is read off an unconfirmed fabric). The fabric label ``nvlink-only`` is one node, no network.
A row marked ``superseded`` (a reference its own source later replaced) or ``excluded`` (its source file says why the
row does not measure what its columns say) is shown, not scored.

A cluster is a preset name or a ``[clusters.NAME]`` table (device, per_node, intra and inter ``LINKS`` keys or
``inter_gbps_per_gpu``, host). A table's device with no profile in ``hardware.DEVICES`` (B200, GH200) leaves its rows
shown and unscored ("no device profile"): a profile holds more than a datasheet's peak, memory and HBM — NCCL's
protocol ceilings on the device (``ll_max_busbw_gbps``, ``ring_plateau``) and the intra-node link (NVLink 5, GH200's
NVLink 4 without NVSwitch: no ``LINKS`` key) — and those would be guesses. Each scored row is predicted as DeepSpeed
and FSDP issue it — one ring over every GPU (``Calibration.rings = "flat"``), an NCCL all-reduce as the faster of
that ring and NCCL's tree — on the cluster's calibration with the row's fabric (``Calibration.fabric``): where the
fabric's collectives were measured at scale, the law of ``zerotune/costmodel/fabrics.py``, read off some of these
very rows (its reference sources, named there); elsewhere the α-β ring with its sourced constants (NCCL on
InfiniBand: ``fabrics``' paragraph on it). The error is (predicted − measured) / measured.
Goal: every NCCL and RCCL row within ±25% at every scale from 32 to 2,048 GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zerotune.core.spec import ClusterSpec  # noqa: E402
from zerotune.costmodel import calibration_for  # noqa: E402
from zerotune.costmodel.catalog import parse_cluster  # noqa: E402
from zerotune.costmodel.fabrics import FABRICS, applies  # noqa: E402
from zerotune.costmodel.hardware import DEVICES  # noqa: E402
from zerotune.costmodel.profiles import (  # noqa: E402
    PRESET_FABRICS,
    PROFILES,
    profile_calibration,
    profile_cluster,
)
from zerotune.costmodel.rates import Calibration, run_by  # noqa: E402
from zerotune.costmodel.timing import costs_for  # noqa: E402

TABLES = ROOT / "bench" / "published" / "collectives"
MIB = 2**20
ELEM_BYTES = 2
GOAL = 0.25
"""The goal: every NCCL and RCCL row within this at every scale from ``GOAL_GPUS[0]`` to ``GOAL_GPUS[1]``."""
GOAL_GPUS = (32, 2048)
PLATEAU_BYTES = 16 * 2**30
"""Where a ``[[point]]`` gives nccl-tests' large-message busbw plateau without its size (NVIDIA's GTC slide 12), it
is compared with the model at 16 GiB: the largest size NVIDIA's own NVLSTree sweep (``nvidia_gtc24_nvlstree.toml``)
and Fernandez et al.'s (``fernandez2024_nccl_scan.toml``) print, where their curves are flat (within 3% from 4 GiB)."""
NO_NETWORK = "nvlink-only"
"""The fabric label of a one-node row (no network between nodes)."""
WITHIN = 0.15
"""The published benches' ±15%, printed beside the goal."""
OTHER_FABRICS = {("dgx-h100", "nccl-ib-sharp")}
"""Presets a source measured on another fabric than the preset's own (``PRESET_FABRICS``): the DGX H100 with IB
SHARP on (NVIDIA's GTC slide 12), which the preset leaves off."""
INTRA_STAND_IN = "nvlink4-nvswitch"
"""The intra-node link of a ``[clusters.NAME]`` table that names none (Kestrel's 4-GPU NVLink4 board has no key in
``LINKS``): a flat ring across nodes is charged by its fabric's law, which does not read it."""
INTER_STAND_IN = "ib-ndr-400"
"""The inter-node link of a table that gives only ``inter_gbps_per_gpu``: its bandwidth replaced by that figure,
its hop the network's (which the fabric's law does not read either)."""


def fabric_of(library: str, fabric: str | None, cluster: str) -> str:
    """The ``FABRICS`` key of a row: ``<library>-<fabric>`` where the source names its fabric, a preset's own
    (``PRESET_FABRICS``) where it names only the cluster, "" for ``nvlink-only`` (one node: no network)."""
    if fabric is None:
        return PRESET_FABRICS[cluster]
    if fabric == NO_NETWORK:
        return ""
    key = f"{library.lower()}-{fabric}"
    if key not in FABRICS:
        raise ValueError(f"fabric {fabric!r} of {library}: no {key!r} in FABRICS")
    return key


def cluster_for(name: str, tables: dict[str, Any], gpus: int, fabric: str) -> tuple[ClusterSpec, Calibration]:
    """The cluster of ``gpus`` GPUs a row ran on and its calibration with the row's fabric, run as DeepSpeed runs
    collectives (one flat ring)."""
    if name in PROFILES:
        per_node = {"frontier": 8}.get(name, PROFILES[name][1][0][1])
        cluster = parse_cluster(f"{name}:{max(gpus // per_node, 1)}")
        calib = calibration_for(cluster)
        if calib.fabric != fabric and (name, fabric) not in OTHER_FABRICS:
            raise ValueError(f"{name}: the row's fabric {fabric} is not the preset's {calib.fabric}")
        return cluster, run_by(dataclasses.replace(calib, fabric=fabric), "deepspeed")
    spec = tables[name]
    per_node, intra = int(spec["per_node"]), spec.get("intra", INTRA_STAND_IN)
    inter = spec.get("inter", INTER_STAND_IN)
    inter_gbps = spec.get("inter_gbps_per_gpu")
    cluster = profile_cluster(f"{name}:{gpus // per_node}", spec["device"],
                              (("node", per_node, intra), ("inter-node", gpus // per_node, inter)),
                              bandwidths=(None, inter_gbps))
    calib = profile_calibration(name, spec["device"], (intra, inter), host=spec.get("host", "unknown"),
                                fabric=fabric)
    return cluster, run_by(calib, "deepspeed")


def predicted_ms(cluster: ClusterSpec, calib: Calibration, collective: str, nbytes: float, gpus: int) -> float:
    """One flat ring over every GPU: an all-gather whose output, or a reduce-scatter or all-reduce whose input, is
    ``nbytes`` per GPU."""
    numel = int(nbytes) // ELEM_BYTES
    if collective == "all_gather":
        numel //= gpus  # the shard each GPU contributes
    costs = costs_for(cluster, calib, ELEM_BYTES, 1, 2048)
    return 1e3 * costs.time((collective, (1, cluster.num_levels), numel, 16))


def by_law(cluster: ClusterSpec, calib: Calibration) -> bool:
    """Whether the row's ring across nodes is charged by its fabric's law (``fabrics.applies``: its node is the design
    the law was measured on), not by the α-β ring."""
    per_node = cluster.world_size // cluster.levels[-1].size
    return applies(calib.fabric, cluster.levels[-1].size, per_node, per_node * cluster.levels[-1].bandwidth_gbps * 1e9)


def _ms_from_busbw(collective: str, nbytes: float, gpus: int, gbps: float) -> float:
    """nccl-tests' bus bandwidth back to a time: busbw = size / time × (R − 1)/R, twice that for an all-reduce."""
    factor = (2 if collective == "all_reduce" else 1) * (gpus - 1) / gpus
    return 1e3 * nbytes * factor / (gbps * 1e9)


def measured(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured row of one source: library, fabric, cluster, collective, bytes per GPU (None: the size was not
    printed), GPUs (None: not printed), ms, and how the row was given (``fabric_confirmed``, ``algorithm``)."""
    out = []
    for series in table.get("series", []):
        gpus = series.get("gpus", table.get("gpus"))
        gpus = gpus if isinstance(gpus, list) else [gpus]
        nbytes = series["mb"] * MIB
        if "ms" in series:
            times = series["ms"]
        else:
            times = [_ms_from_busbw(series["collective"], nbytes, g, b)
                     for g, b in zip(gpus, _bandwidths(series), strict=True)]
        for g, ms in zip(gpus, times, strict=True):
            out.append({**_keys(series), "bytes": nbytes, "gpus": g, "measured_ms": ms})
    for sweep in table.get("sweep", []):
        if "us" in sweep:  # nccl-tests' time column, where printed: the busbw beside it is derived from it
            times = [us / 1e3 for us in sweep["us"]]
        else:
            times = [_ms_from_busbw(sweep["collective"], b, sweep["gpus"], bw)
                     for b, bw in zip(sweep["bytes"], _bandwidths(sweep), strict=True)]
        for nbytes, ms in zip(sweep["bytes"], times, strict=True):
            out.append({**_keys(sweep), "bytes": nbytes, "gpus": sweep["gpus"], "measured_ms": ms})
    for point in table.get("point", []):
        gpus = point.get("gpus")
        nbytes = point["bytes"] if "bytes" in point else point["mb"] * MIB if "mb" in point else None
        gbps = _bandwidths(point)
        out.append({**_keys(point), "bytes": nbytes, "gpus": gpus, "measured_gbps": gbps,
                    "measured_ms": None if gpus is None or nbytes is None
                    else _ms_from_busbw(point["collective"], nbytes, gpus, gbps)})
    return out


def _bandwidths(row: dict[str, Any]) -> Any:
    """A row's ``busbw_gbps``, or its ``bw_gbps`` (bus or algorithm bandwidth unstated) read as bus bandwidth (module
    docstring: why)."""
    return row.get("busbw_gbps", row.get("bw_gbps"))


def _keys(series: dict[str, Any]) -> dict[str, Any]:
    fabric = fabric_of(series["library"], series.get("fabric"), series["cluster"])
    return {"library": series["library"], "fabric": fabric, "cluster": series["cluster"],
            "collective": series["collective"], "fabric_confirmed": series.get("fabric_confirmed", True),
            "algorithm": series.get("algorithm"), "superseded": series.get("superseded"),
            "excluded": series.get("excluded")}


def unscored(r: dict[str, Any], clusters: dict[str, Any]) -> str | None:
    """Why a measured row is printed but not compared with the model (None: compared)."""
    device = clusters[r["cluster"]]["device"] if r["cluster"] in clusters else None
    if device is not None and device not in DEVICES:
        return f"no device profile ({device})"
    if r["gpus"] is None:
        return "GPU count not printed"
    if r["superseded"]:
        return f"superseded in its own source: {r['superseded']}"
    if r["excluded"]:
        return f"excluded: {r['excluded']}"
    return None


def plateau(r: dict[str, Any]) -> dict[str, Any]:
    """A ``[[point]]`` that gives the large-message plateau without its size: compared at ``PLATEAU_BYTES``."""
    if r["bytes"] is not None or r["gpus"] is None:
        return r
    return {**r, "bytes": float(PLATEAU_BYTES),
            "measured_ms": _ms_from_busbw(r["collective"], PLATEAU_BYTES, r["gpus"], r["measured_gbps"])}


def rows(tables: list[Path]) -> list[dict[str, Any]]:
    """Every row of every source, compared with the model where it can be (``unscored``: why not; ``error`` None)."""
    out = []
    for path in tables:
        table = tomllib.loads(path.read_text())
        clusters = table.get("clusters", {})
        for r in measured(table):
            r = plateau(r)
            why = unscored(r, clusters)
            row = {"table": path.stem, **r, "mb": None if r["bytes"] is None else round(r["bytes"] / MIB, 6),
                   "unscored": why, "law": False, "predicted_ms": None, "error": None}
            if why is None:
                cluster, calib = cluster_for(r["cluster"], clusters, r["gpus"], r["fabric"])
                pred = predicted_ms(cluster, calib, r["collective"], r["bytes"], r["gpus"])
                row.update(law=by_law(cluster, calib), measured_ms=round(r["measured_ms"], 4),
                           predicted_ms=round(pred, 4), error=round(pred / r["measured_ms"] - 1, 4))
            out.append(row)
    return out


def scored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows compared with the model."""
    return [r for r in items if r["error"] is not None]


def summary(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per library and fabric, the error at each scale: of the rows its law charges (``law``), and of those on other
    node designs, which the α-β ring charges."""
    out = []
    items = scored(items)
    for library, fabric, law in sorted({(r["library"], r["fabric"], r["law"]) for r in items}):
        mine = [r for r in items if (r["library"], r["fabric"], r["law"]) == (library, fabric, law)]
        for gpus in sorted({r["gpus"] for r in mine}):
            errors = [abs(r["error"]) for r in mine if r["gpus"] == gpus]
            slow = [r["measured_ms"] / r["predicted_ms"] for r in mine if r["gpus"] == gpus]
            out.append({"library": library, "fabric": fabric, "law": law, "gpus": gpus,
                        "median_abs_error": round(statistics.median(errors), 4),
                        "within": sum(e <= WITHIN for e in errors), "within_goal": sum(e <= GOAL for e in errors),
                        "count": len(errors), "measured_over_predicted": round(statistics.median(slow), 2)})
    return out


def goal(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal's rows (NCCL and RCCL, ``GOAL_GPUS``) and those outside ±``GOAL``."""
    mine = [r for r in scored(items)
            if r["library"] in ("NCCL", "RCCL") and GOAL_GPUS[0] <= r["gpus"] <= GOAL_GPUS[1]]
    misses = [r for r in mine if abs(r["error"]) > GOAL]
    return {"rows": len(mine), "within": len(mine) - len(misses), "misses": misses, "scored": mine}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows, the summary and the goal as JSON")
    args = parser.parse_args(argv)
    items = rows(sorted(TABLES.glob("*.toml")))
    result: dict[str, Any] = {"rows": items, "summary": summary(items), "goal": goal(items)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for table in sorted({r["table"] for r in items}):
        print(f"\n== {table}")
        head = ("library", "fabric", "collective", "MiB", "GPUs", "measured ms", "predicted ms", "error")
        print("{:6} {:19} {:15} {:>10} {:>5} {:>12} {:>13} {:>7}".format(*head))
        for r in (r for r in items if r["table"] == table):
            mb = "-" if r["mb"] is None else f"{r['mb']:.4g}"
            lead = f"{r['library']:6} {r['fabric'] or '(none)':19} {r['collective']:15} {mb:>10} {r['gpus'] or '-':>5} "
            notes = ([f"{r['algorithm']}"] if r["algorithm"] else []) + ([] if r["fabric_confirmed"] else
                                                                          ["fabric unconfirmed"])
            note = f"  ({', '.join(notes)})" if notes else ""
            if r["error"] is None:
                shown = "-" if r["measured_ms"] is None else f"{r['measured_ms']:.4g}"
                print(f"{lead}{shown:>12} {'-':>13} {'':>7}  not scored: {r['unscored']}{note}")
                continue
            flag = "" if abs(r["error"]) <= GOAL else "  *"
            print(f"{lead}{r['measured_ms']:>12.4g} {r['predicted_ms']:>13.4g} {r['error']:>+7.0%}{flag}{note}")
    print("\nby library, fabric (its law, or the α-β ring on another node design) and scale (median |error|, rows "
          "within ±15%, within ±25%, median measured / predicted):")
    for s in result["summary"]:
        how = "law" if s["law"] else "α-β"
        print(f"  {s['library']:5} {s['fabric']:19} {how:3} {s['gpus']:>5} GPUs: {s['median_abs_error']:6.1%}  "
              f"{s['within']}/{s['count']}  {s['within_goal']}/{s['count']}  x{s['measured_over_predicted']}")
    g = result["goal"]
    print(f"\ngoal (every NCCL and RCCL row within ±{GOAL:.0%} at {GOAL_GPUS[0]}-{GOAL_GPUS[1]:,} GPUs): "
          f"{g['within']} of {g['rows']} rows" + ("" if g["misses"] else " — met"))
    by_table = {t: [sum(r["table"] == t for r in g["misses"]), sum(r["table"] == t for r in g["scored"])]
                for t in sorted({r["table"] for r in g["scored"]})}
    print("  misses by source: " + ", ".join(f"{t} {m}/{n}" for t, (m, n) in by_table.items()))
    for r in g["misses"]:
        print(f"  miss: {r['table']} {r['library']} {r['collective']} {r['mb']:.4g} MiB on {r['gpus']} GPUs "
              f"{r['error']:+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
