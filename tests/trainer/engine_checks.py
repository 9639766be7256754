"""Multi-rank training runs for test_engine.py, under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 8 tests/trainer/engine_checks.py local:2x2x2 CASES OUT_DIR

CASES is a JSON list of {"name", "strategy", "set": {...}, "steps", "accum", "dtype", "lr", "by_roots",
"inline", "outer_at_step", "guard"} ("inline": collectives on the main thread, as the engine runs them on a GPU;
"outer_at_step": no micro-step is final, so the step reduces beyond the grad span; "guard": after training, try
a micro-step after a final one). For each, every rank trains gpt-tiny (or the case's "model": a preset name
or a ModelSpec dict) and rank 0 saves losses, grad norms, counted bytes, the memory report and the final
full parameters to OUT_DIR/<name>.pt; each rank writes rank<r>.json when done.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerotune.core.topology import build_topology
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.trainer import comm as comm_module
from zerotune.trainer.data import TokenSource, sequence_ids
from zerotune.trainer.engine import ZeroEngine

DEFAULT_BY_ROOTS = comm_module.BY_ROOTS_MIN_BYTES
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    cluster, cases, out_dir = parse_cluster(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    topo = build_topology(cluster, timeout_s=120)
    world = topo.world_size
    for case in cases:
        spec = parse_model(case.get("model", "gpt-tiny"))
        strategy = build_strategy(case["strategy"], cluster, **case.get("set", {}))
        dtype, accum, steps = DTYPES[case.get("dtype", "fp32")], case.get("accum", 1), case["steps"]
        # gloo's broadcast / reduce collectives serve buffers from 1 MiB on; gpt-tiny's are smaller
        comm_module.BY_ROOTS_MIN_BYTES = 0 if case.get("by_roots") else DEFAULT_BY_ROOTS
        engine = ZeroEngine(spec, strategy, topo, dtype=dtype, lr=case.get("lr", 3e-3), seed=0,
                            quant_block=case.get("quant_block", 2048), inline_comm=case.get("inline"))
        data = TokenSource(spec.vocab, spec.seq_len, seed=0)
        losses, norms, step_bytes, step_quant, step_calls = [], [], {}, 0, {}
        for step in range(steps):
            engine.counter.reset()
            total = torch.zeros((), dtype=torch.float64)
            for micro in range(accum):
                ids = sequence_ids(step, micro, topo.rank, accum=accum, world=world, batch=strategy.micro_batch_size)
                total += engine.forward_backward(*data.batch(ids), loss_scale=1.0 / (world * accum),
                                                 final=micro == accum - 1 and not case.get("outer_at_step"))
            norms.append(engine.step())
            step_bytes, step_quant = engine.counter.as_dict(), engine.counter.quant_elements
            step_calls = {lv: dict(kinds) for lv, kinds in engine.counter.calls.items() if any(kinds.values())}
            dist.all_reduce(total)
            losses.append(float(total) / (world * accum))
        memory = engine.mem.report()
        params = engine.full_parameters()
        guard = None
        if case.get("guard"):  # a micro-step after the final one is refused before it issues a collective
            batch = data.batch(sequence_ids(steps, 0, topo.rank, accum=1, world=world, batch=strategy.micro_batch_size))
            engine.forward_backward(*batch, loss_scale=1.0 / world)
            try:
                engine.forward_backward(*batch, loss_scale=1.0 / world)
            except RuntimeError as exc:
                guard = str(exc)
            engine.step()
        engine.close()
        if topo.rank == 0:
            torch.save({"losses": losses, "grad_norms": norms, "bytes": step_bytes, "calls": step_calls,
                        "quant_elements": step_quant, "memory": memory, "params": params, "guard": guard,
                        "strategy": strategy.to_dict()}, out_dir / f"{case['name']}.pt")
    (out_dir / f"rank{topo.rank}.json").write_text(json.dumps({"rank": topo.rank}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
