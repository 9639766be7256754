"""Where one training step's time goes: a step under ``torch.profiler``, and its Chrome trace split into phases.

``profile_step`` runs a step under the profiler (``zerotune train --profile`` and
``bench/trainer_vs_fsdp.py --profile`` call it on an extra, untimed step); ``trace_phases`` splits
the Chrome trace of a step profiled on the host and the device (``bench/trace_phases.py`` prints it
for kept traces):

- the device's span (first kernel's start to last kernel's end), the union of its kernels' intervals
  (copies and memsets included; overlapping streams count once) and the gaps between them, with how
  many gaps last over 50 µs: many short gaps are a device waiting for a host that launches slower
  than it runs;
- ``lead_ms``: from the step's first host event to its first device event, the host's work before the
  device has anything to run (a training loop's data, copies to the device, the forward's first
  launches) — a step that starts on an idle device pays it in full;
- the same split by phase: *forward* up to the first kernel launched by the autograd engine, *backward*
  from there up to the first multi-tensor optimizer kernel (torch's fused AdamW, ``multi_tensor_apply``),
  *optimizer* from there to the end;
- the forward on the host's main thread (the thread of the first ATen operator): its window, and the
  part of it inside no PyTorch operator or CUDA runtime call, i.e. Python (the modules' code, an
  engine's hooks; a ``record_function`` range such as DDP's ``DistributedDataParallel.forward`` counts
  as Python too).

A trace is taken with the CPU profiler on, which slows the host: read its gaps and host times as
shares and comparisons between steps profiled alike, not as the unprofiled step's absolutes.
Pure Python but for ``profile_step``, which imports torch when called.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CALLS = ("cpu_op", "cuda_runtime", "cuda_driver")
GAP_US = 50.0


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


def load_trace(path: Path | str) -> list[dict[str, Any]]:
    """A Chrome trace's complete events (``ph == "X"``), from ``.json`` or ``.json.gz``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def trace_phases(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The split of one profiled step's trace (module docstring); ValueError if it holds no device events."""
    dev = sorted((e for e in events if e.get("cat") in DEVICE), key=lambda e: e["ts"])
    if not dev:
        raise ValueError("no device events in this trace (was it profiled on a GPU?)")
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
    if host:
        out["lead_ms"] = max(0.0, dev[0]["ts"] - min(e["ts"] for e in host)) / 1e3
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


def profile_step(step: Callable[[], Any], cuda: bool, trace: str | None = None) -> dict[str, Any]:
    """Run ``step`` once under ``torch.profiler``: on GPU the kernels, copies and memsets it put on the
    device and their summed device time; on CPU the ATen operators it dispatched (every call, nested
    ones included) and their summed self CPU time.

    On GPU it then answers where a step's wall time goes when the device is not busy:
    ``device_busy_ms`` is the union of the kernels' intervals on every stream (overlapping streams count
    once), so a timed step's wall time minus it is what the device waited for the host (the profiled
    step's own wall time would not do: the profiler slows the host, 150 ms for an 83 ms step of
    gpt-1.3b on an H100). A second step is profiled on the host as well
    (``ProfilerActivity.CPU``, which slows the host, so read its times as shares, not absolutes):
    ``host_top`` lists the operators and CUDA runtime calls with the most self CPU time, ``host_ms``
    sums them and ``phases`` is that step's ``trace_phases``; ``trace`` names a file for its Chrome
    trace (``.gz``: compressed)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    rows: list[tuple[str, int, float]] = []
    for e in prof.key_averages():
        if cuda:  # torch renamed the CUDA field; older ones have only self_cuda_time_total
            t = getattr(e, "self_device_time_total", None)
            t = float(getattr(e, "self_cuda_time_total", 0.0) if t is None else t)
            if t > 0:
                rows.append((e.key, e.count, t))
        elif e.key.startswith("aten::"):
            rows.append((e.key, e.count, float(e.self_cpu_time_total)))
    rows.sort(key=lambda r: -r[2])
    out: dict[str, Any] = {
        "launches": sum(r[1] for r in rows), "busy_ms": sum(r[2] for r in rows) / 1e3,
        "unit": "device kernels" if cuda else "aten operators",
        "top": [{"name": k[:160], "count": n, "ms": t / 1e3} for k, n, t in rows[:25]]}
    if not cuda:
        return out
    try:  # the device's timeline: a profiler that changes its event API loses these figures, not the run
        spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
                 if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.end > e.time_range.start]
        out["device_busy_ms"] = union_us(spans) / 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as host_prof:
            step()
            torch.cuda.synchronize()
        host = sorted(((e.key, e.count, e.self_cpu_time_total) for e in host_prof.key_averages()
                       if e.self_cpu_time_total > 0), key=lambda r: -r[2])
        out["host_ms"] = sum(r[2] for r in host) / 1e3
        out["host_top"] = [{"name": k[:160], "count": n, "ms": t / 1e3} for k, n, t in host[:20]]
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "step.json")
            host_prof.export_chrome_trace(raw)
            out["phases"] = trace_phases(load_trace(raw))
            if trace:
                save_trace(raw, trace)
    except Exception as exc:  # noqa: BLE001 - keep the kernels' figures, say why the rest is missing
        out["timeline_error"] = f"{type(exc).__name__}: {exc}"
    return out


def save_trace(raw: str, dest: str) -> None:
    """Copy the exported Chrome trace ``raw`` to ``dest``, gzip-compressed if ``dest`` ends in ``.gz``."""
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    if dest.endswith(".gz"):
        with open(raw, "rb") as src, gzip.open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(raw, dest)
