"""A device's causal attention rate, as its kernel benchmarks count it and as the time model charges it.

    python bench/attention_rate.py                                  # GPU: bf16, SDPA's own backend choice
    python bench/attention_rate.py --backend flash --head-dims 64,128 --tokens 2048,4096,8192
    python bench/attention_rate.py --json-out attention.json        # on CPU: fp32, small (a check that it runs)

For each (tokens, head size) it times ``torch.nn.functional.scaled_dot_product_attention`` with a causal mask:
the forward alone, and the backward of that forward (CUDA events, medians over ``--repeats`` after
``--warmup``), over ``--batch`` sequences of ``--width // head size`` heads. Each pass's rate is printed as
a fraction of ``--peak-tflops`` (default: the device's datasheet dense 16-bit peak from the cost model's profiles,
matched by name) counted as FlashAttention's and Triton's benchmarks count it (the unmasked half of the square:
2·T²·d FLOPs per head forward, the backward 2.5 times that, its recomputation included), and the two together in
the time model's terms (``attention.causal_kernel_efficiency``: the whole square, the backward twice the forward),
the figure ``attention.ATTENTION_KERNELS`` holds per device, with the forward's share of the two passes' time
(``attention.kernel_forward_share``: what a recomputed forward pays again). ``--backend`` pins SDPA's backend
(``flash``, ``cudnn``, ``efficient``, ``math``); the default lets PyTorch pick, as zerotune's engine does.
On a device FlashAttention-2's published benchmark swept ([fa2-bench]: A100, H100, and the H200 by its SMs), each
row also prints that benchmark at the same point in the model's terms (``attention.ATTENTION_KERNELS['flash2']``'s
curve, what the time model charges a FlashAttention-2 run) and the measured rate over it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_efficiency import time_kernel  # noqa: E402  - a sibling bench script: this file's folder is on sys.path

from zerotune.costmodel.attention import ATTENTION_KERNELS, causal_kernel_efficiency  # noqa: E402
from zerotune.costmodel.hardware import device_key_of, peak_tflops_of  # noqa: E402
from zerotune.costmodel.rates import curve_rate  # noqa: E402

BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")


def causal_flops(batch: int, heads: int, tokens: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention as kernel benchmarks count them: QK^T and PV over the unmasked half."""
    return 4.0 * batch * heads * tokens * tokens * head_dim / 2


def published_curve(name: str) -> tuple[tuple[int, int, float], ...] | None:
    """FlashAttention-2's published benchmark on the device ``name`` names ([fa2-bench], the curve the time model
    charges FlashAttention-2 at), or None where it swept no such part."""
    flash2 = ATTENTION_KERNELS["flash2"]
    return flash2.curves.get(device_key_of(name) or "") if flash2 else None


def measure(batch: int, heads: int, tokens: int, head_dim: int, dtype: Any, device: Any, backend: str,
            warmup: int, repeats: int) -> tuple[float, float]:
    """Median seconds of the causal SDPA forward and of its backward (the backward alone: the forward's
    graph kept, ``retain_graph``)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    if backend == "auto":
        pinned = contextlib.nullcontext()
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        pinned = sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend])
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))
    with pinned:
        forward = time_kernel(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, warmup, repeats)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.randn_like(out)
        backward = time_kernel(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), device,
                               warmup, repeats)
    return forward, backward


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    p.add_argument("--tokens", default="1024,2048,4096,8192" if cuda else "64,128", help="sequence lengths")
    p.add_argument("--head-dims", default="64,128" if cuda else "16,32", help="head sizes, comma-separated")
    p.add_argument("--width", type=int, default=4096 if cuda else 64, help="heads x head size (the model's width)")
    p.add_argument("--batch", type=int, default=4 if cuda else 1, help="sequences per call")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="pin SDPA's backend (default: PyTorch's pick)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak (default: by name)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    head_dims = [int(d) for d in args.head_dims.split(",")]
    for head_dim in head_dims:
        if head_dim < 1 or args.width % head_dim:
            p.error(f"--width={args.width}: must be a multiple of every head size (--head-dims has {head_dim})")
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = args.peak_tflops or peak_tflops_of(name)
    dtype = torch.bfloat16 if cuda else torch.float32
    stated = f"peak {peak} TFLOPS" if peak else "peak unknown (give --peak-tflops)"
    bench = published_curve(name) if cuda else None
    print(f"{name}, {str(dtype).removeprefix('torch.')}, {stated}; causal SDPA, backend {args.backend}, "
          f"{args.batch} sequences of width {args.width}")
    print(f"{'tokens':>8}{'head':>6}{'fwd ms':>9}{'bwd ms':>9}{'fwd share':>10}{'fwd TF':>8}{'bwd TF':>8}"
          f"{'fwd of pk':>10}{'bwd of pk':>10}{'model terms':>12}{'fa2 bench':>10}{'vs bench':>9}")
    rows = []
    for head_dim in head_dims:
        heads = args.width // head_dim
        for tokens in (int(t) for t in args.tokens.split(",")):
            fwd_s, bwd_s = measure(args.batch, heads, tokens, head_dim, dtype, device, args.backend,
                                   args.warmup, args.repeats)
            flops = causal_flops(args.batch, heads, tokens, head_dim)
            fwd_tf, bwd_tf = flops / fwd_s / 1e12, 2.5 * flops / bwd_s / 1e12
            row: dict[str, Any] = {"tokens": tokens, "head_dim": head_dim, "heads": heads, "forward_s": fwd_s,
                                   "backward_s": bwd_s, "forward_tflops": fwd_tf, "backward_tflops": bwd_tf,
                                   "forward_share": fwd_s / (fwd_s + bwd_s)}
            fractions = "-".rjust(10) * 3
            if peak:
                row["forward_of_peak"], row["backward_of_peak"] = fwd_tf / peak, bwd_tf / peak
                row["model_terms"] = causal_kernel_efficiency(row["forward_of_peak"], row["backward_of_peak"])
                fractions = (f"{row['forward_of_peak']:>10.3f}{row['backward_of_peak']:>10.3f}"
                             f"{row['model_terms']:>12.3f}")
                if bench:  # the published benchmark at this point, as the model charges FlashAttention-2
                    row["fa2_bench_model_terms"] = curve_rate(bench, tokens, head_dim)
                    fractions += (f"{row['fa2_bench_model_terms']:>10.3f}"
                                  f"{row['model_terms'] / row['fa2_bench_model_terms']:>9.2f}")
            rows.append(row)
            print(f"{tokens:>8}{head_dim:>6}{fwd_s * 1e3:>9.3f}{bwd_s * 1e3:>9.3f}{row['forward_share']:>10.3f}"
                  f"{fwd_tf:>8.1f}{bwd_tf:>8.1f}{fractions}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
    if peak and rows:
        print(f"median in the model's terms: {statistics.median(r['model_terms'] for r in rows):.3f} of peak, "
              f"the forward {statistics.median(r['forward_share'] for r in rows):.3f} of the kernel's time "
              "(attention.ATTENTION_KERNELS holds both per device and kernel)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": name, "dtype": str(dtype), "peak_tflops": peak,
                                                   "backend": args.backend, "batch": args.batch,
                                                   "torch": torch.__version__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
