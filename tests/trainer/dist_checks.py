"""Multi-rank measurements for test_collectives.py, run under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 8 tests/trainer/dist_checks.py local:2x2x2 OUT_DIR

Every rank runs the same collectives and writes OUT_DIR/rank{r}.json with raw measurements
(results compared against references, errors, counted bytes); the pytest side computes the
closed-form expectations and asserts, so nothing here decides pass or fail.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerotune.core.topology import build_topology, range_ranks
from zerotune.costmodel.catalog import parse_cluster
from zerotune.trainer import comm as comm_module
from zerotune.trainer import quant
from zerotune.trainer.comm import Communicator

SIZES = (1001, 37)  # not divisible by any world size used
DEFAULT_BY_ROOTS = comm_module.BY_ROOTS_MIN_BYTES
BLOCK = 64  # small quantization blocks so tiny buffers hold several


def level_ranges(num_levels: int) -> list[tuple[int, int]]:
    return [(lo, hi) for lo in range(1, num_levels + 1) for hi in range(lo, num_levels + 1)]


def exact_values(n: int, seed: int) -> torch.Tensor:
    """Random dyadic values: fp32 sums of up to 8 of them are exact in any order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1024, 1024, (n,), generator=g).float() / 256


QUANT_COUNT = [0]
"""Elements quantized plus elements dequantized since the last reset (what the cost model charges)."""


def _counting(fn: Callable[..., torch.Tensor], elems: Callable[[torch.Tensor, torch.Tensor], int]
              ) -> Callable[..., torch.Tensor]:
    def wrapped(*args: object, **kwargs: object) -> torch.Tensor:
        out = fn(*args, **kwargs)
        QUANT_COUNT[0] += elems(args[0], out)  # type: ignore[arg-type]
        return out
    return wrapped


quant.quantize = _counting(quant.quantize, lambda x, _: x.numel())  # comm.py calls them through the module
quant.dequantize = _counting(quant.dequantize, lambda _, out: out.numel())


def main() -> None:
    cluster, out_dir = parse_cluster(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    topo = build_topology(cluster, timeout_s=60)
    comm = Communicator(topo, block=BLOCK)
    rank, world = topo.rank, topo.world_size
    records = []

    def measure(op: str, levels: tuple[int, int], n: int, meta: dict, fn: Callable[..., torch.Tensor],
                *args: object, **kwargs: object) -> torch.Tensor:
        comm.counter.reset()
        QUANT_COUNT[0] = 0
        out = fn(*args, **kwargs)
        records.append({"op": op, "levels": list(levels), "n": n, "bytes": comm.counter.as_dict(),
                        "quant_elems": QUANT_COUNT[0], **meta})
        return out

    for levels in level_ranges(cluster.num_levels):
        for n in SIZES:
            # every rank can build every rank's input from the seed, so references are local
            inputs = [exact_values(n, 1000 * r + n) for r in range(world)]
            full = exact_values(n, 7 + n)
            mine = inputs[rank]
            group_ranks = range_ranks(cluster, rank, levels)
            exact_sum = torch.stack([inputs[r] for r in group_ranks]).sum(0)
            shard = comm.shard(full, levels)
            for flat in (False, True):
                meta = {"flat": flat, "bits": 16, "qa": 1}
                got = measure("all_gather", levels, shard.numel(), meta, comm.all_gather, shard, levels,
                              numel=n, flat=flat)
                records[-1]["equal"] = bool(torch.equal(got, full))
                got = measure("reduce_scatter", levels, n, meta, comm.reduce_scatter, mine, levels, flat=flat)
                records[-1]["equal"] = bool(torch.equal(got, comm.shard(exact_sum, levels)))
                got = measure("all_reduce", levels, n, meta, comm.all_reduce, mine, levels, flat=flat)
                records[-1]["equal"] = bool(torch.equal(got, exact_sum))
                for bits in (8, 4):
                    for qa in range(1, levels[1] + 1):
                        meta = {"flat": flat, "bits": bits, "qa": qa}
                        q = {"bits": bits, "quantize_above": qa, "flat": flat}
                        # weights: every chunk is quantized exactly once, whatever the algorithm
                        padded = torch.cat([full, full.new_zeros(shard.numel() * topo.size(levels) - n)])
                        chunks = padded.view(-1, shard.numel())
                        expect = quant.dequantize(quant.quantize(chunks, bits, BLOCK), shard.numel(), bits,
                                                  block=BLOCK).reshape(-1)
                        if not any(cluster.sizes[lv - 1] > 1 for lv in range(max(levels[0], qa), levels[1] + 1)):
                            expect = padded if topo.size(levels) > 1 else shard  # no quantized link crossed
                        got = measure("all_gather", levels, shard.numel(), meta, comm.all_gather, shard, levels, **q)
                        records[-1]["equal"] = bool(torch.equal(got, expect))
                        got = measure("reduce_scatter", levels, n, meta, comm.reduce_scatter, mine, levels, **q)
                        ref = comm.shard(exact_sum, levels)
                        records[-1]["max_err"] = float((got - ref).abs().max())
                        records[-1]["rel_rms"] = float((got - ref).norm() / ref.norm())
                        records[-1]["max_abs_input"] = float(max(inputs[r].abs().max() for r in group_ranks))
            # in place: the gather lands in the caller's buffer, the reductions overwrite their input;
            # then the same on gloo's broadcasts / reduces (used from 1 MiB on; here at every size)
            for by_roots in (False, True):
                comm_module.BY_ROOTS_MIN_BYTES = 0 if by_roots else DEFAULT_BY_ROOTS
                meta = {"flat": False, "bits": 16, "qa": 1, "in_place": True, "by_roots": by_roots}
                out = torch.full((shard.numel() * topo.size(levels),), float("nan"))
                got = measure("all_gather", levels, shard.numel(), meta, comm.all_gather, shard, levels, out=out)
                records[-1]["equal"] = bool(torch.equal(got[:n], full) and got.data_ptr() == out.data_ptr())
                padded_mine = torch.cat([mine, mine.new_zeros(out.numel() - n)])
                buf = padded_mine.clone()
                got = measure("reduce_scatter", levels, n, meta, comm.reduce_scatter, buf, levels, in_place=True)
                records[-1]["equal"] = bool(torch.equal(got, comm.shard(exact_sum, levels)) and (
                    topo.size(levels) == 1 or buf.data_ptr() <= got.data_ptr() < buf.data_ptr() + 4 * buf.numel()))
                buf = padded_mine.clone()
                got = measure("all_reduce", levels, n, meta, comm.all_reduce, buf, levels, in_place=True)
                records[-1]["equal"] = bool(torch.equal(got[:n], exact_sum) and got.data_ptr() == buf.data_ptr())
            comm_module.BY_ROOTS_MIN_BYTES = DEFAULT_BY_ROOTS
    (out_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "coords": topo.coords,
                                                          "records": records}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
