"""The cost model's collectives against vendor collectives measured at scale (32 to 2,048 GPUs).

    python bench/collectives_at_scale.py            # the table, then where the model holds and where not
    python bench/collectives_at_scale.py --json

``bench/published/collectives/*.toml`` holds measured times of one all-gather or reduce-scatter per
library, cluster, message size and GPU count (RCCL on Frontier, NCCL on Perlmutter: the PCCL paper).
Each is predicted as DeepSpeed and FSDP issue it — one ring over every GPU (``Calibration.rings =
"flat"``), the library's protocol choice — with the link and device profiles as they are: nothing
here is fitted to these figures, and no profile constant comes from them. The error is
(predicted - measured) / measured. Where the vendor library falls off a cliff that an α-β ring does
not have (RCCL beyond 16 Frontier nodes), the table says so rather than hiding it in an average.
"""

from __future__ import annotations

import argparse
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
from zerotune.costmodel.rates import Calibration, run_by  # noqa: E402
from zerotune.costmodel.timing import costs_for  # noqa: E402

TABLES = ROOT / "bench" / "published" / "collectives"
MIB = 2**20
ELEM_BYTES = 2
WITHIN = 0.15


def perlmutter(gpus: int) -> tuple[ClusterSpec, Calibration]:
    """The ``perlmutter`` preset: 4 A100 joined pairwise by NVLink3, one Slingshot-11 NIC per GPU, an AMD host
    whose NICs share no PCIe switch with the GPUs (``profiles.PROFILES`` and ``PRESET_HOSTS``, with sources)."""
    cluster = parse_cluster(f"perlmutter:{gpus // 4}")
    return cluster, run_by(calibration_for(cluster), "deepspeed")


def frontier(gpus: int) -> tuple[ClusterSpec, Calibration]:
    cluster = parse_cluster(f"frontier:{gpus // 8}")
    return cluster, run_by(calibration_for(cluster), "deepspeed")


CLUSTERS = {"frontier": frontier, "perlmutter": perlmutter}


def predicted_ms(cluster_name: str, collective: str, mb: float, gpus: int) -> float:
    """One flat ring over every GPU: an all-gather whose output, or a reduce-scatter whose input, is ``mb``."""
    cluster, calib = CLUSTERS[cluster_name](gpus)
    numel = int(mb * MIB) // ELEM_BYTES
    if collective == "all_gather":
        numel //= gpus  # the shard each GPU contributes
    costs = costs_for(cluster, calib, ELEM_BYTES, 1, 2048)
    return 1e3 * costs.time((collective, (1, cluster.num_levels), numel, 16))


def rows(tables: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in tables:
        table = tomllib.loads(path.read_text())
        for series in table["series"]:
            for gpus, ms in zip(table["gpus"], series["ms"], strict=True):
                pred = predicted_ms(series["cluster"], series["collective"], series["mb"], gpus)
                out.append({"table": path.stem, "library": series["library"], "cluster": series["cluster"],
                            "collective": series["collective"], "mb": series["mb"], "gpus": gpus,
                            "measured_ms": ms, "predicted_ms": round(pred, 3), "error": round(pred / ms - 1, 4)})
    return out


def summary(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per library, the error at each scale: where the α-β ring holds and where the library departs from it."""
    out = []
    for library in sorted({r["library"] for r in items}):
        mine = [r for r in items if r["library"] == library]
        for gpus in sorted({r["gpus"] for r in mine}):
            errors = [abs(r["error"]) for r in mine if r["gpus"] == gpus]
            slow = [r["measured_ms"] / r["predicted_ms"] for r in mine if r["gpus"] == gpus]
            out.append({"library": library, "gpus": gpus, "median_abs_error": round(statistics.median(errors), 4),
                        "within": sum(e <= WITHIN for e in errors), "count": len(errors),
                        "measured_over_predicted": round(statistics.median(slow), 2)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args(argv)
    items = rows(sorted(TABLES.glob("*.toml")))
    result = {"rows": items, "summary": summary(items)}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    head = ("library", "collective", "MB", "GPUs", "measured ms", "predicted ms", "error")
    print("{:8} {:15} {:>5} {:>5} {:>12} {:>13} {:>7}".format(*head))
    for r in items:
        flag = "" if abs(r["error"]) <= WITHIN else "  *"
        print(f"{r['library']:8} {r['collective']:15} {r['mb']:>5} {r['gpus']:>5} {r['measured_ms']:>12.2f} "
              f"{r['predicted_ms']:>13.2f} {r['error']:>+7.0%}{flag}")
    print("\nby scale (median |error|, rows within ±15%, median measured / predicted):")
    for s in result["summary"]:
        print(f"  {s['library']:5} {s['gpus']:>5} GPUs: {s['median_abs_error']:6.1%}  {s['within']}/{s['count']}  "
              f"x{s['measured_over_predicted']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
