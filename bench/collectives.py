"""Hierarchical vs flat all-gather and reduce-scatter, 16-bit vs int8 vs int4, on local gloo ranks.

    python bench/collectives.py --cluster local:2x2x2 --size-mb 64      # launches torchrun itself

Each configuration runs ``--repeats`` times after one warm-up; rank 0 prints the median time, the
bytes this rank sent per level (from the byte counter) and ratios against the flat 16-bit run of
the same collective. Sizes are of the full 16-bit (bf16) buffer. On one CPU the "links" are shared
memory, so times show the cost of the algorithm and of quantization, not of a real fabric;
the per-level bytes are what a real fabric would carry.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", default="local:2x2x2", help="local:AxBxC (innermost first)")
    p.add_argument("--size-mb", type=float, default=64.0, help="full buffer size, MB of bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before every rank is killed")
    return p.parse_args(argv)


def launch(args: argparse.Namespace) -> int:
    from zerotune.costmodel.catalog import parse_cluster
    from zerotune.trainer.launch import run_torchrun

    cluster = parse_cluster(args.cluster)
    print(f"launching {cluster.world_size} ranks for {cluster.name} ...", file=sys.stderr)
    result = run_torchrun(cluster.world_size, [__file__, *sys.argv[1:]], module=False, stream=True,
                          timeout_s=args.timeout)
    if result.timed_out:
        print(f"bench: timed out after {args.timeout:.0f}s; all ranks killed", file=sys.stderr)
    return 0 if result.ok else 1


def worker(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from zerotune.core.topology import build_topology
    from zerotune.costmodel.catalog import parse_cluster
    from zerotune.trainer.comm import Communicator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    cluster = parse_cluster(args.cluster)
    topo = build_topology(cluster, timeout_s=args.timeout)
    comm = Communicator(topo)
    world, everything = topo.world_size, (1, cluster.num_levels)
    numel = int(args.size_mb * 1e6) // 2 // world * world
    full = torch.randn(numel, generator=torch.Generator().manual_seed(topo.rank)).to(torch.bfloat16)
    shard = comm.shard(full, everything)
    rows = []
    for op in ("all_gather", "reduce_scatter"):
        for flat in (True, False):
            for bits in (16, 8, 4):
                def call(op: str = op, bits: int = bits, flat: bool = flat) -> None:
                    if op == "all_gather":
                        comm.all_gather(shard, everything, bits=bits, flat=flat)
                    else:
                        comm.reduce_scatter(full, everything, bits=bits, flat=flat)
                call()  # warm-up
                times = []
                for _ in range(args.repeats):
                    dist.barrier()
                    comm.counter.reset()
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                dist.barrier()
                rows.append((op, "flat" if flat else "hier", bits, statistics.median(times), comm.counter.as_dict()))
    if topo.rank == 0:
        report(cluster, rows, args)
    dist.destroy_process_group()


def report(cluster, rows, args) -> None:  # noqa: ANN001
    names = [lv.name for lv in cluster.levels]
    outer = names[-1]
    print(f"\n{args.size_mb:g} MB bf16 buffer, {cluster.name} ({cluster.world_size} gloo ranks), "
          f"median of {args.repeats}; MB sent by one rank per level")
    head = f"{'collective':<15}{'algo':<6}{'bits':>5}{'time ms':>10}" + "".join(f"{n:>12}" for n in names)
    print(head + f"{'time/flat16':>13}{outer + '/flat16':>18}")
    base = {}
    for op, algo, bits, t, vol in rows:
        per_level = {n: sum(vol.get(n, {}).values()) for n in names}
        if algo == "flat" and bits == 16:
            base[op] = (t, per_level[outer])
        t0, b0 = base[op]
        cells = "".join(f"{per_level[n] / 1e6:>12.2f}" for n in names)
        print(f"{op:<15}{algo:<6}{bits:>5}{t * 1e3:>10.1f}{cells}{t / t0:>13.2f}{per_level[outer] / b0:>18.3f}")


if __name__ == "__main__":
    ns = parse_args()
    if "RANK" in os.environ:
        worker(ns)
    else:
        sys.exit(launch(ns))
