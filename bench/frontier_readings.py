"""The seed paper's Frontier comparison under both readings of its 3-level method, with and without RCCL's
measured rings at scale: what each assumption does to the four published ratios.

    python bench/frontier_readings.py            # the table
    python bench/frontier_readings.py --json

``bench/published/frontier_3level.toml`` scores the paper's ratios (3-level over ZeRO++ 1.71 and over ZeRO-3
2.40 at 384 GCDs, ZeRO++ over ZeRO-3 1.405, the 3-level method's 0.94 scaling from 16 to 384 GCDs) with the
3-level method read as ``3level-b`` (ZeRO++ with hpZ on the GCD pair) and RCCL's rings across nodes charged by the
law of its fabric (``zerotune/costmodel/fabrics.py``: the per-step latency and bus bandwidth RCCL 2.20.5 with
aws-ofi-rccl 1.4 reached on Frontier in the PCCL study, ``bench/published/collectives/pccl.toml``). The paper's full
text, which says how it splits the three levels and which RCCL it ran, is not available, so neither choice is
known. This script predicts the same ratios, with the table's own clusters and calibration, under the two readings
of DESIGN.md §1 (``3level-a``: parameters over the GCD pair, gradients over the node, optimizer states over every
GCD, as AMSP plans; ``3level-b``) and with the law or without it (``fabric`` "": RCCL's own tuning model, the α-β
ring the model charged before the law).

Nothing here changes the model or ``bench/published.py``'s scores: it is a what-if, printed so the assumptions
behind the table's misses can be weighed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from published import Table  # noqa: E402  - a sibling bench script: this file's folder is on sys.path

from zerotune.costmodel import clear_caches, timing  # noqa: E402

TABLE = ROOT / "bench" / "published" / "frontier_3level.toml"
READINGS = ("3level-b", "3level-a")
"""The table's reading first."""


@contextmanager
def without_law() -> Iterator[None]:
    """While open, every calibration's fabric law is off (``fabrics``): rings across nodes are the α-β ring of the
    library's own tuning model, as before the law."""
    ring, step = timing.fabric_ring, timing.step_seconds
    clear_caches()  # collectives already timed with the law are memoized per cluster
    timing.fabric_ring = lambda *args, **kwargs: None
    timing.step_seconds = lambda *args, **kwargs: None
    try:
        yield
    finally:
        timing.fabric_ring, timing.step_seconds = ring, step
        clear_caches()


def _table() -> Table:
    table = Table(TABLE)
    table.strategies.setdefault("3level-a", {"preset": "3level-a"})
    return table


def _read(row_id: str, reading: str) -> str:
    return row_id.replace("/3level-b", f"/{reading}")


def variant(reading: str, law: bool) -> dict[str, Any]:
    """The table's comparisons and the TFLOPS per GCD behind them, with the 3-level method read as ``reading``,
    RCCL's rings across nodes charged by its fabric's law (the model as it is) or not (``without_law``)."""
    table = _table()  # a fresh one: predictions are cached per table
    ids = sorted({_read(c[k], reading) for c in table.compares for k in ("of", "over")})
    with nullcontext() if law else without_law():
        tflops = {i: table.predict(i)["value"] for i in ids}
    ratios = [{"caption": c["caption"], "published": c["value"],
               "predicted": tflops[_read(c["of"], reading)] / tflops[_read(c["over"], reading)]}
              for c in table.compares]
    return {"reading": reading, "law": law, "tflops_per_gcd": tflops, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    variants = [variant(r, law) for r in READINGS for law in (True, False)]
    if args.json:
        print(json.dumps({"variants": variants}, indent=2))
        return 0
    heads = [f"{v['reading']}{'' if v['law'] else ' α-β'}" for v in variants]
    print(f"{'ratio':60s} {'published':>9s} " + " ".join(f"{h:>15s}" for h in heads))
    for i, c in enumerate(variants[0]["ratios"]):
        cells = " ".join(f"{v['ratios'][i]['predicted']:9.3f} {v['ratios'][i]['predicted'] / c['published'] - 1:+4.0%}"
                         for v in variants)
        print(f"{c['caption'][:60]:60s} {c['published']:9.3f} {cells}")
    print("\nTFLOPS per GCD behind them:")
    for v, head in zip(variants, heads, strict=True):
        print(f"  {head:16s} " + ", ".join(f"{k.replace('/gpt-neox-20b/1/', ' ')} {t:.1f}"
                                            for k, t in v["tflops_per_gcd"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
