"""Where a forward and backward spends its device time, beside what the time model charges for it.

    python bench/kernel_split.py                                  # GPU: gpt-1.3b in bf16, micro-batches 1, 2, 4, 8
    python bench/kernel_split.py --model gpt-125m --batches 4,16 --json-out split.json
    python bench/kernel_split.py --device cpu --model gpt-tiny    # a check that the script runs (no device figures)

The time model (``zerotune/costmodel/traffic.py``) splits a step's compute in two: the matmuls and
the attention at a fraction of the device's peak, every other kernel (LayerNorms, GELU, residual adds,
bias gradients, the qkv split's backward, embedding gathers, the loss over the vocabulary) at its
bytes over a fraction of the datasheet HBM bandwidth (``STREAM_FRACTION`` where nothing better was
measured). This script measures both parts on the device in hand, for the engine's own model
(``trainer.gpt``) run eagerly; the Hopper figures of ``zerotune/costmodel/hardware.py``
(``H200_ENGINE_EFFICIENCY``, ``H200_EAGER_MEMORY_FRACTION``, and the H100's) and of ``attention.py``
(``H200_ENGINE_ATTENTION`` and its forward share, and the H100's) are its
medians on one H200 (``bench/data/h200-kernels``) and one H100 (``bench/data/h100-kernels``):

1. **Kernel classes.** One forward and backward per iteration under ``torch.profiler`` (host and
   device); each kernel's time goes to the ATen operator that launched it, and the operators are
   split as the model splits them: ``mm``/``addmm``/``bmm``/``baddbmm`` (matmuls), the
   scaled-dot-product attention's forward and backward (attention), everything else (memory-bound).
   Printed per micro-batch: the measured milliseconds of each class, the model's charge for the
   memory-bound class (``traffic`` bytes at ``STREAM_FRACTION`` × HBM) and the bandwidth those kernels
   reached, the rates the matmuls and the attention reached as fractions of peak, and the attention forward's
   share of the attention's time (``Calibration.attention_forward_share``); and the forward alone timed (``fwd``,
   its graph recorded as training records it), what a recomputed forward pays again: its share of the step's
   wall time is the measure of activation checkpointing's cost on the device in hand.
2. **Streaming rate.** Three memory-bound kernels on large tensors, each's bytes over its time as a
   fraction of the datasheet bandwidth: an element-wise add (reads two, writes one), a LayerNorm
   forward, and torch's fused AdamW step (``ADAMW_BYTES_PER_ELEM`` bytes per fp32 element) — the
   hardware-level figures ``STREAM_FRACTION`` and the optimizer's charge stand for.

On CPU it runs a small model in fp32 and reports operator CPU time instead of device time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_efficiency import time_kernel  # noqa: E402  - a sibling bench script: this file's folder is on sys.path

from zerotune.core.plan import block_numel, root_numel  # noqa: E402
from zerotune.core.spec import ModelSpec  # noqa: E402
from zerotune.costmodel.catalog import parse_model  # noqa: E402
from zerotune.costmodel.hardware import (  # noqa: E402
    ADAMW_BYTES_PER_ELEM,
    STREAM_FRACTION,
    device_of,
    peak_tflops_of,
)
from zerotune.costmodel.traffic import block_flops, head_flops, traffic  # noqa: E402

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
"""Operators whose kernels are matmuls (the innermost of them gets a kernel's time)."""
ATTENTION_MARKS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")

def op_class(key: str) -> str:
    if key in MATMUL_OPS:
        return "matmul"
    if any(m in key for m in ATTENTION_MARKS):
        return "attention"
    return "memory"


def hbm_gbps_of(name: str) -> float | None:
    """The datasheet HBM bandwidth of the device ``name`` names (``hardware.device_of``), else None."""
    d = device_of(name)
    return d.hbm_gbps if d else None


def charged(spec: ModelSpec, tokens: int, elem_bytes: int) -> dict[str, float]:
    """What the time model counts for one forward and backward of ``tokens`` tokens: memory-bound
    bytes (``traffic``), matmul FLOPs (2 per weight element, forward; twice that backward) and the
    attention's FLOPs (4·h·T per token forward, full square as the model charges it)."""
    t = traffic(spec, elem_bytes)
    attention = 4 * spec.hidden * spec.seq_len
    matmul = spec.layers * (block_flops(spec) - attention) + head_flops(spec)
    assert matmul == 2 * (spec.layers * block_numel(spec) + root_numel(spec)), "the model's FLOPs moved"
    return {"memory_bytes": tokens * (spec.layers * (t.block_fwd + t.block_bwd) + t.root_fwd + t.root_bwd),
            "matmul_flops": 3 * tokens * matmul, "attention_flops": 3 * tokens * spec.layers * attention}


def split_step(model: Any, spec: ModelSpec, batch: int, iters: int, warmup: int, device: Any) -> dict[str, Any]:
    """Time ``iters`` forward-and-backward passes of ``model`` on a micro-batch of ``batch`` sequences,
    then profile as many more; the kernels' time by class, per pass."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, spec.vocab, (batch, spec.seq_len), generator=gen).to(device) for _ in range(2))

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        model(idx, targets).backward()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    def median_s(run: Any) -> float:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    wall_s = median_s(step)
    # the forward alone, its graph recorded as training records it (and dropped): what a recompute pays again
    forward_s = median_s(lambda: model(idx, targets))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            step()
        sync()
    by_class = {"matmul": 0.0, "attention": 0.0, "memory": 0.0}
    by_op: dict[str, float] = {}
    for e in prof.key_averages():
        if not e.key.startswith("aten::"):
            continue
        us = (getattr(e, "self_device_time_total", 0.0) or 0.0) if cuda else e.self_cpu_time_total
        if us > 0:
            by_class[op_class(e.key)] += us
            by_op[e.key] = by_op.get(e.key, 0.0) + us
    kernels_us = 0.0
    if cuda:  # every kernel's time, attributed or not: what the classes above should add up to
        kernels_us = sum(e.self_device_time_total for e in prof.key_averages()
                         if str(getattr(e, "device_type", "")).endswith("CUDA"))
    for p in model.parameters():
        p.grad = None
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:12]
    attention_forward_us = sum(v for k, v in by_op.items() if op_class(k) == "attention" and "backward" not in k)
    return {"batch": batch, "tokens": batch * spec.seq_len, "wall_ms": 1e3 * wall_s, "forward_ms": 1e3 * forward_s,
            **{f"{k}_ms": v / 1e3 / iters for k, v in by_class.items()},
            "attention_forward_ms": attention_forward_us / 1e3 / iters,
            "kernels_ms": kernels_us / 1e3 / iters,
            "top_ops": [{"op": k, "class": op_class(k), "ms": v / 1e3 / iters} for k, v in top]}


def streaming(device: Any, elems: int, hidden: int) -> list[dict[str, Any]]:
    """Bytes per second of three memory-bound kernels on ``elems``-element tensors."""
    import torch
    import torch.nn.functional as F

    out = []
    a, b = (torch.randn(elems, dtype=torch.bfloat16, device=device) for _ in range(2))
    c = torch.empty_like(a)
    s = time_kernel(lambda: torch.add(a, b, out=c), device)
    out.append({"kernel": "add bf16 (read 2, write 1)", "bytes": 3 * 2 * elems, "s": s})
    x = a[: elems - elems % hidden].view(-1, hidden)
    w, bias = torch.ones(hidden, dtype=a.dtype, device=device), torch.zeros(hidden, dtype=a.dtype, device=device)
    s = time_kernel(lambda: F.layer_norm(x, (hidden,), w, bias), device)
    out.append({"kernel": f"LayerNorm forward bf16 (h={hidden}: read, write)", "bytes": 2 * 2 * x.numel(), "s": s})
    n = elems // 4  # fp32 master, gradient, two moments: 16 B per element
    p = torch.zeros(n, dtype=torch.float32, device=device, requires_grad=True)
    p.grad = torch.randn(n, dtype=torch.float32, device=device)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW([p], lr=1e-4, fused=fused, foreach=None if fused else False)
    s = time_kernel(opt.step, device)
    out.append({"kernel": f"AdamW step fp32 ({'fused' if fused else 'for-loop'})",
                "bytes": int(ADAMW_BYTES_PER_ELEM * n), "s": s})
    for row in out:
        row["gbps"] = row["bytes"] / row["s"] / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-1.3b", help="a model preset (default: gpt-1.3b)")
    p.add_argument("--batches", default="1,2,4,8", help="sequences per micro-batch, comma-separated")
    p.add_argument("--iters", type=int, default=5, help="timed and profiled passes per micro-batch")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, help="dense 16-bit peak (default: the device's profile)")
    p.add_argument("--hbm-gbps", type=float, help="datasheet HBM bandwidth, GB/s (default: the device's profile)")
    p.add_argument("--stream-elems", type=int, default=1 << 30, help="elements of the streaming kernels' tensors")
    p.add_argument("--json-out", help="write the figures here")
    args = p.parse_args(argv)
    try:
        spec, batches = parse_model(args.model), [int(b) for b in args.batches.split(",")]
    except (ValueError, KeyError) as exc:
        print(f"kernel_split: {exc}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype, elem_bytes = (torch.bfloat16, 2) if cuda else (torch.float32, 4)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = args.peak_tflops or (peak_tflops_of(name) if cuda else None)
    hbm = args.hbm_gbps or (hbm_gbps_of(name) if cuda else None)
    print(f"{spec.name} on {name}, {dtype}, sequence {spec.seq_len}; torch {torch.__version__}; "
          f"peak {peak or '?'} TFLOPS, HBM {hbm or '?'} GB/s, STREAM_FRACTION {STREAM_FRACTION}", flush=True)
    from zerotune.trainer.gpt import build_gpt

    model, rows = build_gpt(spec, dtype=dtype).to(device), []
    for batch in batches:
        r = split_step(model, spec, batch, args.iters, args.warmup, device)
        r.update(charged(spec, r["tokens"], elem_bytes))
        if hbm:
            r["memory_charged_ms"] = 1e3 * r["memory_bytes"] / (STREAM_FRACTION * hbm * 1e9)
            r["memory_reached"] = r["memory_bytes"] / (r["memory_ms"] / 1e3) / (hbm * 1e9) if r["memory_ms"] else None
        if peak:
            r["matmul_reached"] = r["matmul_flops"] / (r["matmul_ms"] / 1e3) / (peak * 1e12) if r["matmul_ms"] else None
            r["attention_reached"] = (r["attention_flops"] / (r["attention_ms"] / 1e3) / (peak * 1e12)
                                      if r["attention_ms"] else None)
        rows.append(r)
    del model
    if cuda:
        torch.cuda.empty_cache()
    unit = "device" if cuda else "operator CPU"
    print(f"\nper forward + backward ({unit} ms; memory charged: traffic bytes at STREAM's {STREAM_FRACTION} x HBM)")
    print(f"{'batch':>5} {'tokens':>7} {'wall':>8} {'fwd':>7} {'kernels':>8} {'matmul':>8} {'attn':>7} {'memory':>8} "
          f"{'charged':>8} {'meas/chg':>8} {'mem GB':>7} {'HBM frac':>8} {'mm frac':>7} {'attn frac':>9} "
          f"{'attn fwd':>8}")
    for r in rows:
        chg = r.get("memory_charged_ms")
        fmt = (lambda v, w, p=3: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}")  # noqa: E731
        print(f"{r['batch']:>5} {r['tokens']:>7} {r['wall_ms']:>8.2f} {r['forward_ms']:>7.2f} {r['kernels_ms']:>8.2f} "
              f"{r['matmul_ms']:>8.2f} "
              f"{r['attention_ms']:>7.2f} {r['memory_ms']:>8.2f} {fmt(chg, 8, 2)} "
              f"{fmt(r['memory_ms'] / chg if chg else None, 8, 2)} {r['memory_bytes'] / 1e9:>7.2f} "
              f"{fmt(r.get('memory_reached'), 8)} {fmt(r.get('matmul_reached'), 7)} "
              f"{fmt(r.get('attention_reached'), 9)} "
              f"{fmt(r['attention_forward_ms'] / r['attention_ms'] if r['attention_ms'] else None, 8)}")
    shares = ", ".join(f"{r['forward_ms'] / r['wall_ms']:.3f}" for r in rows)
    print(f"\nthe forward alone over the whole step, by micro-batch: {shares} (a checkpointed step pays it again)")
    last = rows[-1]
    print(f"\nlargest operators at micro-batch {last['batch']} (ms per pass):")
    for o in last["top_ops"]:
        print(f"  {o['ms']:>8.2f}  {o['class']:<9} {o['op']}")
    stream = streaming(device, args.stream_elems if cuda else 1 << 22, spec.hidden)
    print(f"\nstreaming kernels on {args.stream_elems if cuda else 1 << 22:,}-element tensors "
          f"(fraction of the datasheet {hbm or '?'} GB/s; STREAM's figure is {STREAM_FRACTION}):")
    for s in stream:
        s["fraction"] = s["gbps"] / hbm if hbm else None
        frac = f"{s['fraction']:.3f}" if s["fraction"] is not None else "-"
        print(f"  {s['kernel']:<48} {s['s'] * 1e3:>8.3f} ms {s['gbps']:>8.0f} GB/s  {frac}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"model": spec.name, "device": name, "torch": torch.__version__, "dtype": str(dtype),
             "peak_tflops": peak, "hbm_gbps": hbm, "stream_fraction": STREAM_FRACTION,
             "passes": rows, "streaming": stream}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
