"""The seed paper's Frontier comparison under both readings of its 3-level method, with and without RCCL's
measured slow-down at scale: what each assumption does to the four published ratios.

    python bench/frontier_readings.py            # the table
    python bench/frontier_readings.py --json

``bench/published/frontier_3level.toml`` scores the paper's ratios (3-level over ZeRO++ 1.71 and over ZeRO-3
2.40 at 384 GCDs, ZeRO++ over ZeRO-3 1.405, the 3-level method's 0.94 scaling from 16 to 384 GCDs) with the
3-level method read as ``3level-b`` (ZeRO++ with hpZ on the GCD pair) and RCCL's rings timed by its own tuning
model. The paper's full text, which says how it splits the three levels and which RCCL it ran, is not
available, so neither choice is known. This script predicts the same ratios, with the table's own clusters and
calibration, under the two readings of DESIGN.md §1 (``3level-a``: parameters over the GCD pair, gradients over
the node, optimizer states over every GCD, as AMSP plans; ``3level-b``) and under a second timing of RCCL's flat
rings: the per-step cost RCCL paid beyond 128 GCDs in the PCCL study (``bench/published/collectives/pccl.toml``,
RCCL 2.20.5 on Frontier: all-gathers and reduce-scatters of 256 and 512 MB took 72-90 µs per ring step from 256
GCDs on, whatever their size; ``python bench/collectives_at_scale.py`` prints the model against it). The floor
is read off that file here (the median of its RCCL times over ring steps at 256 GCDs and more), and charged to
every flat ring of more than 128 ranks (the largest count at which every RCCL series stays within twice its
32-GCD time), never less than the ring model's own time.

Nothing here changes the model or ``bench/published.py``'s scores: it is a what-if, printed so the assumptions
behind the table's two misses can be weighed (the paper's sub-module gathers of a 20B model are 75-300 MB, the
sizes PCCL measured, so its floor applies to them as measured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from published import Table  # noqa: E402  - a sibling bench script: this file's folder is on sys.path

from zerotune.costmodel import clear_caches, timing  # noqa: E402
from zerotune.costmodel.protocols import STEPS  # noqa: E402

TABLE = ROOT / "bench" / "published" / "frontier_3level.toml"
PCCL = ROOT / "bench" / "published" / "collectives" / "pccl.toml"
READINGS = ("3level-b", "3level-a")
"""The table's reading first."""


def rccl_floor(path: Path = PCCL) -> tuple[float, int]:
    """(seconds per ring step, ranks above which it applies) from the PCCL study's RCCL series: the median of
    ms / (GPUs - 1) over its counts of 256 GCDs and more, and the largest count at which every RCCL series stays
    within twice its time at the smallest count."""
    table = tomllib.loads(path.read_text())
    gpus, series = table["gpus"], [s for s in table["series"] if s["library"] == "RCCL"]
    per_step = [ms * 1e-3 / (n - 1) for s in series for n, ms in zip(gpus, s["ms"], strict=True) if n >= 256]
    onset = max(n for i, n in enumerate(gpus) if all(s["ms"][i] < 2 * s["ms"][0] for s in series))
    return statistics.median(per_step), onset


@contextmanager
def rccl_cliff(floor_s: float, above: int) -> Iterator[None]:
    """While open, a flat ring under RCCL's protocols over more than ``above`` ranks takes at least ``floor_s`` per
    ring step (the ring model's own time where that is longer)."""
    plain = timing.Costs._flat_ring

    def floored(self: timing.Costs, op: str, lo: int, hi: int, numel: int, bits: int) -> float:
        t = plain(self, op, lo, hi, numel, bits)
        ranks = self.prefix[hi] // self.prefix[lo - 1]
        if self.calib.protocols == "rccl" and ranks > above:
            t = max(t, STEPS[op] * (ranks - 1) * floor_s)
        return t

    clear_caches()  # collectives already timed without the floor are memoized per cluster
    timing.Costs._flat_ring = floored  # type: ignore[method-assign]
    try:
        yield
    finally:
        timing.Costs._flat_ring = plain  # type: ignore[method-assign]
        clear_caches()


def _table() -> Table:
    table = Table(TABLE)
    table.strategies.setdefault("3level-a", {"preset": "3level-a"})
    return table


def _read(row_id: str, reading: str) -> str:
    return row_id.replace("/3level-b", f"/{reading}")


def variant(reading: str, cliff: tuple[float, int] | None) -> dict[str, Any]:
    """The table's comparisons and the TFLOPS per GCD behind them, with the 3-level method read as ``reading``
    and RCCL's rings floored by ``cliff`` (None: the model as it is)."""
    table = _table()  # a fresh one: predictions are cached per table
    ids = sorted({_read(c[k], reading) for c in table.compares for k in ("of", "over")})
    with rccl_cliff(*cliff) if cliff else nullcontext():
        tflops = {i: table.predict(i)["value"] for i in ids}
    ratios = [{"caption": c["caption"], "published": c["value"],
               "predicted": tflops[_read(c["of"], reading)] / tflops[_read(c["over"], reading)]}
              for c in table.compares]
    return {"reading": reading, "rccl_cliff": cliff is not None, "tflops_per_gcd": tflops, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cliff = rccl_floor()
    variants = [variant(r, c) for r in READINGS for c in (None, cliff)]
    if args.json:
        print(json.dumps({"rccl_floor_s": cliff[0], "rccl_floor_above_ranks": cliff[1], "variants": variants},
                         indent=2))
        return 0
    print(f"RCCL's per-step floor from the PCCL study: {cliff[0] * 1e6:.0f} µs a ring step above {cliff[1]} ranks")
    heads = [f"{v['reading']}{' +cliff' if v['rccl_cliff'] else ''}" for v in variants]
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
