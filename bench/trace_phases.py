"""Where a profiled GPU step's time goes, read off the Chrome trace ``trainer_vs_fsdp.py --trace-dir`` keeps.

    python bench/trace_phases.py bench/data/h100-1gpu-fused/trace/*.json.gz

For each trace (one step of one config, rank 0, profiled on the host and the device):

- the device's span (first kernel's start to last kernel's end), the union of its kernels' intervals
  (copies and memsets included; overlapping streams count once) and the gaps between them, with how
  many gaps last over 50 µs: many short gaps are a device waiting for a host that launches slower
  than it runs;
- the same split by phase: *forward* up to the first kernel launched by the autograd engine, *backward*
  from there up to the first multi-tensor optimizer kernel (torch's fused AdamW, ``multi_tensor_apply``),
  *optimizer* from there to the end;
- the forward on the host's main thread (the thread of the first ATen operator): its window, and the
  part of it inside no PyTorch operator or CUDA runtime call, i.e. Python (the modules' code, an
  engine's hooks; a ``record_function`` range such as DDP's ``DistributedDataParallel.forward`` counts
  as Python too).

The trace was taken with the CPU profiler on, which slows the host: read the gaps and host times as
shares and comparisons between configs profiled alike, not as the unprofiled step's absolutes
(``trainer_vs_fsdp.py`` prints those: the timed step minus the device's busy time).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CALLS = ("cpu_op", "cuda_runtime", "cuda_driver")
GAP_US = 50.0


def load(path: Path) -> list[dict[str, Any]]:
    """The trace's complete events (``ph == "X"``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def union_us(spans: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, end) intervals."""
    total, cur_s, cur_e = 0.0, 0.0, 0.0
    for i, (s, e) in enumerate(sorted(spans)):
        if i == 0 or s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + cur_e - cur_s


def phases(events: list[dict[str, Any]]) -> dict[str, Any]:
    dev = sorted((e for e in events if e.get("cat") in DEVICE), key=lambda e: e["ts"])
    if not dev:
        raise SystemExit("trace_phases: no device events in this trace (was it profiled on a GPU?)")
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    host = [e for e in events if e.get("cat") in HOST_CALLS]
    first_bwd = min((e["ts"] for e in host if e["name"].startswith("autograd::engine")), default=None)
    bwd_dev = next((e["ts"] for e in dev if first_bwd is not None
                    and launches.get(e.get("args", {}).get("correlation"), -1.0) >= first_bwd), None)
    opt_dev = next((e["ts"] for e in dev if "multi_tensor_apply" in e["name"]), None)
    end = max(e["ts"] + e["dur"] for e in dev)
    bounds = [("forward", dev[0]["ts"]), ("backward", bwd_dev), ("optimizer", opt_dev)]
    known = [(name, ts) for name, ts in bounds if ts is not None] + [("end", end)]
    out: dict[str, Any] = {"span_ms": (end - dev[0]["ts"]) / 1e3, "phases": {}}
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in dev]
    out["busy_ms"] = union_us(spans) / 1e3
    gaps, reach = [], spans[0][1]
    for s, e in spans[1:]:
        if s > reach:
            gaps.append(s - reach)
        reach = max(reach, e)
    out["gaps_over_50us"] = sum(g > GAP_US for g in gaps)
    for (name, lo), (_, hi) in zip(known, known[1:], strict=False):
        inside = [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]
        busy = union_us(inside) / 1e3
        out["phases"][name] = {"busy_ms": busy, "gaps_ms": (hi - lo) / 1e3 - busy}
    first_aten = min((e for e in host if e["name"].startswith("aten::")), key=lambda e: e["ts"], default=None)
    if first_aten is not None and first_bwd is not None:
        main = [e for e in host if e.get("tid") == first_aten.get("tid") and e["ts"] < first_bwd]
        start = min(e["ts"] for e in main)
        covered = union_us([(e["ts"], min(e["ts"] + e["dur"], first_bwd)) for e in main])
        out["forward_host_ms"] = (first_bwd - start) / 1e3
        out["forward_python_ms"] = (first_bwd - start - covered) / 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path, help="Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    results = {str(t): phases(load(t)) for t in args.traces}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'trace':<28}{'span ms':>9}{'busy ms':>9}{'gaps>50us':>10}  "
          f"{'forward busy/gaps':>18}{'backward busy/gaps':>20}{'optimizer busy/gaps':>21}{'fwd host/Python':>17}")
    for name, r in results.items():
        ph = {k: f"{v['busy_ms']:.1f}/{v['gaps_ms']:.1f}" for k, v in r["phases"].items()}
        fwd = f"{r['forward_host_ms']:.1f}/{r['forward_python_ms']:.1f}" if "forward_host_ms" in r else "-"
        print(f"{Path(name).name.split('.')[0]:<28}{r['span_ms']:>9.1f}{r['busy_ms']:>9.1f}{r['gaps_over_50us']:>10}  "
              f"{ph.get('forward', '-'):>18}{ph.get('backward', '-'):>20}{ph.get('optimizer', '-'):>21}{fwd:>17}")
    print("(ms, one profiled step with the CPU profiler on: the host is slowed, so compare configs, not absolutes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
