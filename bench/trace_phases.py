"""Where a profiled GPU step's time goes, read off the Chrome trace ``trainer_vs_fsdp.py --trace-dir`` or
``zerotune train --profile --trace-dir`` keeps.

    python bench/trace_phases.py bench/data/h100-1gpu-fused/trace/*.json.gz

For each trace (one step of one config, rank 0, profiled on the host and the device): the device's span,
busy time and gaps, the host's lead before the first kernel, the forward / backward / optimizer split
and the forward's host time and Python (``zerotune.trainer.profiling.trace_phases`` says what each
figure is). The trace was taken with the CPU profiler on, which slows the host: read the gaps and host
times as shares and comparisons between configs profiled alike, not as the unprofiled step's absolutes
(``trainer_vs_fsdp.py`` prints those: the timed step minus the device's busy time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zerotune.trainer.profiling import load_trace, trace_phases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path, help="Chrome traces (.json or .json.gz)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    try:
        results = {str(t): trace_phases(load_trace(t)) for t in args.traces}
    except ValueError as exc:
        raise SystemExit(f"trace_phases: {exc}") from None
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'trace':<28}{'span ms':>9}{'busy ms':>9}{'gaps>50us':>10}{'lead ms':>9}  "
          f"{'forward busy/gaps':>18}{'backward busy/gaps':>20}{'optimizer busy/gaps':>21}{'fwd host/Python':>17}")
    for name, r in results.items():
        ph = {k: f"{v['busy_ms']:.1f}/{v['gaps_ms']:.1f}" for k, v in r["phases"].items()}
        fwd = f"{r['forward_host_ms']:.1f}/{r['forward_python_ms']:.1f}" if "forward_host_ms" in r else "-"
        lead = f"{r['lead_ms']:.1f}" if "lead_ms" in r else "-"
        print(f"{Path(name).name.split('.')[0]:<28}{r['span_ms']:>9.1f}{r['busy_ms']:>9.1f}{r['gaps_over_50us']:>10}"
              f"{lead:>9}  {ph.get('forward', '-'):>18}{ph.get('backward', '-'):>20}{ph.get('optimizer', '-'):>21}"
              f"{fwd:>17}")
    print("(ms, one profiled step with the CPU profiler on: the host is slowed, so compare configs, not absolutes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
