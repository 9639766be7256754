"""The device's matrix-product rate at a transformer layer's shapes, as a fraction of its peak.

    python bench/gemm_efficiency.py                                   # GPU: bf16, the default sweep
    python bench/gemm_efficiency.py --tokens 2048,8192 --hidden 2048 --peak-tflops 989

A GPT layer's GEMMs for ``T`` tokens (micro-batch x sequence) and width ``h``: QKV (T x h x 3h), the
attention output (T x h x h), the two MLP products (T x h x 4h, T x 4h x h), each in the forward layout
(activation @ weight^T) and the two backward layouts (the input gradient, grad @ weight, and the weight
gradient, grad^T @ activation). Each (T, h) row gives the layer's GEMM FLOPs over the summed median
time of its products (CUDA events around ``--repeats`` products after ``--warmup``), and that rate over
``--peak-tflops`` (default: the device's datasheet dense 16-bit peak from the cost model's profiles,
matched by name; 989 for an H100/H200). Attention's score products and every element-wise kernel are
left out: this is the GEMM ceiling a training step's compute efficiency sits under.

On CPU it runs fp32 at small sizes (a check that the script works, not a figure of any device).
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

from zerotune.costmodel.hardware import peak_tflops_of  # noqa: E402


def layer_gemms(tokens: int, hidden: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of one layer's forward and backward products: C[m, n] = A[m, k] @ B[k, n]."""
    out = []
    for name, k, n in (("qkv", hidden, 3 * hidden), ("proj", hidden, hidden), ("fc1", hidden, 4 * hidden),
                       ("fc2", 4 * hidden, hidden)):
        out += [(f"{name}.fwd", tokens, k, n), (f"{name}.dgrad", tokens, n, k), (f"{name}.wgrad", k, tokens, n)]
    return out


def time_gemm(m: int, k: int, n: int, dtype, device, warmup: int, repeats: int) -> float:
    import torch

    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    return time_kernel(lambda: torch.matmul(a, b), device, warmup, repeats)


def time_kernel(fn: Any, device: Any, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after ``warmup``: CUDA events on a GPU, the wall
    clock on CPU."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    p.add_argument("--tokens", default="512,1024,2048,4096,8192,16384" if cuda else "64,128",
                   help="tokens per micro-batch (micro-batch x sequence length), comma-separated")
    p.add_argument("--hidden", default="1024,2048,4096,6144,8192" if cuda else "64,128", help="layer widths")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak (default: by name)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = args.peak_tflops or peak_tflops_of(name)
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    print(f"{name}, {str(dtype).removeprefix('torch.')}, peak {peak} TFLOPS; one layer's 12 GEMMs (fwd, dgrad, wgrad)")
    print(f"{'tokens':>8}{'hidden':>8}{'TFLOPS':>9}{'of peak':>9}{'slowest product':>26}")
    for hidden in (int(h) for h in args.hidden.split(",")):
        for tokens in (int(t) for t in args.tokens.split(",")):
            flops = seconds = 0.0
            worst = ("", 1e30)
            for gname, m, k, n in layer_gemms(tokens, hidden):
                s = time_gemm(m, k, n, dtype, device, args.warmup, args.repeats)
                f = 2.0 * m * k * n
                flops, seconds = flops + f, seconds + s
                if f / s < worst[1]:
                    worst = (gname, f / s)
            tflops = flops / seconds / 1e12
            frac = tflops / peak if peak else None
            rows.append({"tokens": tokens, "hidden": hidden, "tflops": tflops, "of_peak": frac,
                         "slowest": worst[0], "slowest_tflops": worst[1] / 1e12})
            share = f"{frac:.3f}" if frac is not None else "-"
            print(f"{tokens:>8}{hidden:>8}{tflops:>9.1f}{share:>9}{worst[0]:>16} {worst[1] / 1e12:7.1f}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": name, "dtype": str(dtype), "peak_tflops": peak,
                                                   "torch": torch.__version__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
