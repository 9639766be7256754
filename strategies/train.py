"""The short-run entry: N steps of a GPT under one Strategy, metrics to ``run.json``.

On this machine (launches torchrun with W = the cluster's world size):

    zerotune train --model gpt-tiny --cluster local:2x2x2 --strategy zero3 --steps 8 --out run.json

Under an existing launcher (every rank runs this module):

    torchrun --nproc-per-node 8 -m strategies.train --model gpt-tiny --cluster local:2x2x2 \
        --strategy zeropp --steps 8 --out run.json
    srun python -m strategies.train ...      # RANK/WORLD_SIZE from SLURM_*; set MASTER_ADDR/PORT

Rank 0 writes run.json (fields in the README); a failing rank writes ``<out>.rank<r>.err`` with its
error so the launcher can say which rank failed and why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from strategies.catalog import build_strategy, parse_cluster, parse_model, parse_overrides
from strategies.errors import SpecError
from strategies.spec import ClusterSpec, ModelSpec, Strategy


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``zerotune train`` and ``python -m strategies.train``."""
    p.add_argument("--model", default="gpt-tiny", help="model preset or JSON file")
    p.add_argument("--cluster", default="local:2x2", help="cluster preset (local:AxBxC here) or JSON file")
    p.add_argument("--strategy", default="zero3", help="strategy preset or JSON file")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a strategy field")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step (default: world x micro_batch_size, i.e. no accumulation)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                   help="compute and unquantized communication dtype (auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-file", default=None, help="uint16 token ids (nanoGPT train.bin); default synthetic")
    p.add_argument("--quant-block", type=int, default=None, help="elements per quantization block")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    p.add_argument("--out", default="run.json", help="where rank 0 writes the metrics")


def resolve(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, Strategy, int]:
    """Validate everything before any process group exists; returns the accumulation steps too."""
    model, cluster = parse_model(args.model), parse_cluster(args.cluster)
    strategy = build_strategy(args.strategy, cluster, **parse_overrides(args.set))
    if args.steps < 1:
        raise SpecError("steps", args.steps, "must be >= 1")
    if not 0 <= args.warmup < args.steps:
        raise SpecError("warmup", args.warmup, f"must be >= 0 and < steps={args.steps}")
    per_step = cluster.world_size * strategy.micro_batch_size
    global_batch = args.global_batch or per_step
    if global_batch % per_step:
        raise SpecError("global_batch", global_batch, f"must be a multiple of world x micro_batch_size = {per_step}")
    return model, cluster, strategy, global_batch // per_step


def health(losses: list[float], grad_norms: list[float]) -> dict[str, str]:
    """``ok``, or ``nan`` / ``diverged`` / ``flat`` with the evidence.

    nan: a non-finite loss or grad norm. diverged: the mean of the last quarter of the losses is
    above 1.2x the first loss, or any loss above 2x the first. flat: 8+ steps (shorter runs cannot
    tell slow learning from none) and the last quarter fell by less than 1% from the first loss.
    """
    for i, (loss, gn) in enumerate(zip(losses, grad_norms, strict=True)):
        if not (math.isfinite(loss) and math.isfinite(gn)):
            return {"verdict": "nan", "evidence": f"step {i}: loss={loss}, grad_norm={gn}"}
    first, tail = losses[0], statistics.fmean(losses[-max(1, len(losses) // 4):])
    if tail > 1.2 * first or max(losses) > 2 * first:
        return {"verdict": "diverged",
                "evidence": f"loss went from {first:.4f} to {tail:.4f} (max {max(losses):.4f})"}
    if len(losses) >= 8 and first - tail < 0.01 * first:
        return {"verdict": "flat", "evidence": f"loss {first:.4f} -> {tail:.4f}: less than 1% lower"}
    return {"verdict": "ok", "evidence": f"loss {first:.4f} -> {tail:.4f}"}


def failure_reason(out: Path, output: str, timed_out: bool, limit: float) -> str:
    """Which rank failed and why: the first error file written (its peers fail after it, inside
    collectives), else the launcher's last words."""
    if timed_out:
        return f"timed out after {limit:g} s; every rank was killed"
    errors = []
    for path in out.parent.glob(out.name + ".rank*.err"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if errors:
        first = min(errors, key=lambda e: (e.get("time", 0.0), e.get("rank", 0)))
        return f"rank {first['rank']} failed: {first['error']}"
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1] if lines else "torchrun exited without output"


def _maybe_fault(rank: int, step: int) -> bool:
    """Fault injection for failure-path tests: ZEROTUNE_FAULT="crash@RANK:STEP", "hang@RANK:STEP" or
    "nan@RANK:STEP" (that rank's loss is NaN from that step on: the run ends and the health gate fails it).
    Returns whether this rank's loss is poisoned at this step."""
    spec = os.environ.get("ZEROTUNE_FAULT")
    if not spec:
        return False
    kind, _, where = spec.partition("@")
    fault_rank, _, fault_step = where.partition(":")
    if rank == int(fault_rank) and step == int(fault_step or 0):
        if kind == "crash":
            raise RuntimeError(f"injected crash on rank {rank} at step {step} (ZEROTUNE_FAULT={spec})")
        if kind == "hang":
            time.sleep(10**6)
    return kind == "nan" and rank == int(fault_rank) and step >= int(fault_step or 0)


def _env_from_slurm() -> None:
    """Under ``srun`` without torchrun, take the rank layout from Slurm's variables."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        per_node = os.environ.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]  # "4(x2),3" -> 4
        if per_node.isdigit():
            os.environ.setdefault("LOCAL_WORLD_SIZE", per_node)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Train on this rank; rank 0 returns the metrics."""
    import torch
    import torch.distributed as dist

    from strategies.data import TokenSource, sequence_ids
    from strategies.engine import ZeroEngine
    from strategies.topology import build_topology
    from strategies.volume import QUANT_BLOCK

    model_spec, cluster, strategy, accum = resolve(args)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cluster.world_size))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(args.dtype, torch.bfloat16 if cuda else torch.float32)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    topo = build_topology(cluster, timeout_s=args.timeout)
    engine = ZeroEngine(model_spec, strategy, topo, dtype=dtype, device=device, lr=args.lr,
                        weight_decay=args.weight_decay, seed=args.seed, quant_block=args.quant_block or QUANT_BLOCK)
    data = TokenSource(model_spec.vocab, model_spec.seq_len, seed=args.seed, token_file=args.token_file)
    world, mbs = topo.world_size, strategy.micro_batch_size
    losses, grad_norms, step_times = [], [], []
    step_bytes: dict[str, dict[str, int]] = {}
    for step in range(args.steps):
        poisoned = _maybe_fault(topo.rank, step)
        engine.counter.reset()
        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64)
        for micro in range(accum):
            ids = sequence_ids(step, micro, topo.rank, accum=accum, world=world, batch=mbs)
            idx, targets = (t.to(device) for t in data.batch(ids))
            total += engine.forward_backward(idx, targets, loss_scale=1.0 / (world * accum))
        grad_norm = engine.step()
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        step_bytes = engine.counter.as_dict()
        if poisoned:
            total.fill_(math.nan)
        dist.all_reduce(total)  # logging only; not part of the strategy's bytes
        losses.append(float(total) / (world * accum))
        grad_norms.append(grad_norm)
        if topo.rank == 0:
            print(f"step {step + 1}/{args.steps}  loss {losses[-1]:.4f}  grad_norm {grad_norm:.4f}  "
                  f"{step_times[-1]:.3f} s", file=sys.stderr, flush=True)
    memory = engine.mem.report()
    if cuda:
        memory["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(device))
    memories: list[Any] = [None] * world
    dist.all_gather_object(memories, memory)
    engine.close()
    dist.destroy_process_group()
    if topo.rank != 0:
        return None
    step_time = statistics.median(step_times[args.warmup:])
    tokens = world * mbs * accum * model_spec.seq_len
    return {
        "status": "ok",
        "world_size": world,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "step_time_s": step_time,
        "step_times_s": step_times,
        "tokens_per_s": tokens / step_time,
        "tflops_per_rank": model_spec.flops_per_token() * tokens / world / step_time / 1e12,
        "bytes_per_level": step_bytes,
        "memory_bytes": {k: max(m[k] for m in memories) for k in memory},
        "loss": losses,
        "grad_norm": grad_norms,
        "health": health(losses, grad_norms),
        "grad_accum_steps": accum,
        "global_batch": world * mbs * accum,
        "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()})",
        "backend": "nccl" if cuda else "gloo",
        "model": model_spec.to_dict(),
        "cluster": cluster.to_dict(),
        "strategy": strategy.to_dict(),
        "config": {"lr": args.lr, "weight_decay": args.weight_decay, "seed": args.seed,
                   "token_file": args.token_file, "quant_block": args.quant_block or QUANT_BLOCK},
        "torch_version": torch.__version__,
        "host": host_facts(world),
    }


def host_facts(world: int) -> dict[str, int]:
    """CPUs rank 0 may run on and ranks on its host: where ranks outnumber CPUs, nothing overlaps."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"cpus": cpus, "local_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", world))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strategies.train", description=__doc__.splitlines()[0])
    add_run_args(parser)
    args = parser.parse_args(argv)
    _env_from_slurm()
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = run(args)
    except BaseException as exc:
        err = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()}
        Path(f"{args.out}.rank{rank}.err").write_text(json.dumps(err, indent=2))
        raise
    if result is not None:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}: {result['step_time_s']:.3f} s/step, health {result['health']['verdict']}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
