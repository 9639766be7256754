"""The short-run entry: N steps of a GPT under one Strategy, metrics to ``run.json``.

On this machine (launches torchrun with W = the cluster's world size):

    zerotune train --model gpt-tiny --cluster local:2x2x2 --strategy zero3 --steps 8 --out run.json

Under an existing launcher (every rank runs this module):

    torchrun --nproc-per-node 8 -m zerotune.trainer.train --model gpt-tiny --cluster local:2x2x2 \
        --strategy zeropp --steps 8 --out run.json
    srun python -m zerotune.trainer.train ...      # RANK/WORLD_SIZE from SLURM_*; set MASTER_ADDR/PORT

Rank 0 writes run.json (fields in docs/trainer.md); a failing rank writes ``<out>.rank<r>.err`` with its
error so the launcher can say which rank failed and why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from zerotune.core.batch import SEQUENCES_PER_RANK, default_global_batch
from zerotune.core.records import Host, MemoryBytes, Quantization, RunMetrics
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.files import load_cluster, load_model, load_strategy, parse_overrides
from zerotune.errors import SpecError
from zerotune.trainer.faults import RankStatus, fault, maybe_fault
from zerotune.trainer.health import health, step_spread

BETAS = (0.9, 0.95)
"""AdamW's betas in a short run: GPT-3's (Brown et al. 2020, §2.3), which most large-model recipes keep."""
GRAD_CLIP = 1.0
"""The global gradient norm the trainer clips to by default (``--grad-clip``); the DeepSpeed and FSDP exports
carry it so that a run of theirs trains as the trials did."""


def seconds_per_level(steps: list[dict[str, dict[str, float]]], warmup: int) -> dict[str, dict[str, float]]:
    """Rank 0's seconds in collectives per step, by level and kind: the median over the timed steps."""
    timed = steps[warmup:] or steps
    keys = {(lv, kind) for step in timed for lv, kinds in step.items() for kind in kinds}
    out: dict[str, dict[str, float]] = {}
    for lv, kind in sorted(keys):
        out.setdefault(lv, {})[kind] = statistics.median(step.get(lv, {}).get(kind, 0.0) for step in timed)
    return out


def quantization_per_step(steps: list[dict[str, float]], warmup: int) -> Quantization:
    """Rank 0's block (de)quantization per step: elements (quantized + dequantized, as the cost model
    counts them) and wall seconds in those calls, each the median over the timed steps."""
    timed = steps[warmup:] or steps
    return {"elements": int(statistics.median(q["elements"] for q in timed)),
            "seconds": statistics.median(q["seconds"] for q in timed)}


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``zerotune train`` and ``python -m zerotune.trainer.train``."""
    p.add_argument("--model", default="gpt-tiny", help="model preset or JSON file")
    p.add_argument("--cluster", default="local:2x2", help="cluster preset (local:AxBxC here) or JSON file")
    p.add_argument("--strategy", default="zero3", help="strategy preset or JSON file")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a strategy field")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (a study's trials run 10)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing and the health trend")
    p.add_argument("--global-batch", type=int, default=None,
                   help=f"sequences per step, a multiple of world x micro-batch (default: {SEQUENCES_PER_RANK} per "
                        "rank in whole micro-batches, as zerotune predict and a request default to)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                   help="compute and unquantized communication dtype (auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default: scaled to the model's width, see default_lr)")
    p.add_argument("--lr-warmup", type=int, default=None,
                   help="steps of linear learning-rate warm-up (default: half the steps)")
    p.add_argument("--grad-clip", type=float, default=GRAD_CLIP, help="clip the global gradient norm to this (0: off)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-file", default=None, help="uint16 token ids (nanoGPT train.bin); default synthetic")
    p.add_argument("--quant-block", type=int, default=None, help="elements per quantization block")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    p.add_argument("--out", default="run.json", help="where rank 0 writes the metrics")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, profile one more (on a GPU two: kernels, then host and kernels); "
                        "rank 0's figures go into run.json's profile")
    p.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="with --profile on a GPU: keep rank 0's host + device trace of that step, "
                        "DIR/rank0-stepN.json.gz (Perfetto; python bench/trace_phases.py splits it)")
    p.add_argument("--force", action="store_true",
                   help="run even when the cost model says the strategy does not fit the device's memory")


def resolve(args: argparse.Namespace, *, accelerated: bool | None = None,
            host_free_bytes: int | None = None) -> tuple[ModelSpec, ClusterSpec, Strategy, int]:
    """Validate everything before any process group exists; returns the accumulation steps too.

    Memory (unless ``--force``): per rank against the cluster's device memory and, given
    ``host_free_bytes``, every rank together against it (all of them run on this host).
    ``accelerated``: whether ``--dtype auto`` means bf16 (None: whether the cluster's devices are
    accelerators)."""
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    strategy = load_strategy(args.strategy, cluster, **parse_overrides(args.set))
    if args.steps < 1:
        raise SpecError("steps", args.steps, "must be >= 1")
    if not 0 <= args.warmup < args.steps:
        raise SpecError("warmup", args.warmup, f"must be >= 0 and < steps={args.steps}")
    per_step = cluster.world_size * strategy.micro_batch_size
    global_batch = args.global_batch or default_global_batch(cluster.world_size, strategy.micro_batch_size)
    if global_batch % per_step:
        raise SpecError("global_batch", global_batch, f"must be a multiple of world x micro_batch_size = {per_step}")
    _check_out(args.out)
    fault()
    accum = global_batch // per_step
    if not args.force:
        accelerated = cluster.device != "cpu" if accelerated is None else accelerated
        check_memory(model, cluster, strategy, accum, elem_bytes(args.dtype, accelerated),
                     ranks_here=cluster.world_size if host_free_bytes is not None else None,
                     available_bytes=host_free_bytes)
    return model, cluster, strategy, accum


def elem_bytes(dtype: str, accelerated: bool) -> int:
    """Bytes per element the run will use (``auto``: bf16 on an accelerator, fp32 on CPU)."""
    return {"fp32": 4, "bf16": 2}.get(dtype, 2 if accelerated else 4)


def _check_out(out: str) -> None:
    """``--out`` must be writable before anything trains, not after."""
    path = Path(out)
    if path.is_dir():
        raise SpecError("out", out, "is a directory; give the path of the run.json to write")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SpecError("out", out, f"its directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise SpecError("out", out, f"its directory {str(parent)!r} is not writable")


def check_memory(model: ModelSpec, cluster: ClusterSpec, strategy: Strategy, accum: int, elem_bytes: int,
                 ranks_here: int | None = None, available_bytes: int | None = None,
                 hint: str = "; --force runs it anyway") -> MemoryBytes:
    """Refuse (SpecError) a run the cost model says cannot fit: per rank against the cluster's device
    memory, and, with ``ranks_here`` and ``available_bytes``, all ranks on this host against its free
    memory. Returns the prediction's memory per rank; ``hint`` ends the refusal."""
    from zerotune.costmodel import GIB, predict

    per_step = cluster.world_size * strategy.micro_batch_size
    pred = predict(model, cluster, strategy, elem_bytes=elem_bytes, global_batch=per_step * accum)
    memory = pred["memory_bytes"]
    if not pred["feasible"]:
        over = pred["overflow"]
        raise SpecError("strategy", strategy.name or "custom",
                        f"{model.name} does not fit {cluster.device} memory with it: {over['reason']} "
                        f"(over by {over['over_by_bytes'] / GIB:.1f} GiB per rank){hint}")
    if ranks_here and available_bytes is not None and ranks_here * memory["peak"] > available_bytes:
        raise SpecError("cluster", cluster.name,
                        f"its {ranks_here} ranks on this host need {ranks_here * memory['peak'] / GIB:.1f} GiB "
                        f"({memory['peak'] / GIB:.2f} GiB each) and {available_bytes / GIB:.1f} GiB is available{hint}")
    return memory


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_lr(model: ModelSpec) -> float:
    """The peak learning rate for a short run: 6e-4 at width 768 and below, scaled as 1/width above.

    6e-4 at d_model 768 is GPT-3's 125M setting (Brown et al. 2020, Table 2.1), whose larger models
    take lower rates (1.2e-4 at 4096, 1.0e-4 at 5120: close to 1/width, as muP prescribes, Yang et
    al. 2022). Narrower models are not given more: at 1e-3 gpt-mini's loss jumps by 0.5 nats with a
    gradient norm of 10 once the warm-up ends (measured on 16 sequences per step), at 6e-4 it does not."""
    return 6e-4 * min(1.0, 768 / model.hidden)


def lr_at(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps`` (step 0 at peak/warmup_steps), then constant."""
    return peak * min(1.0, (step + 1) / max(1, warmup_steps))


def _env_from_slurm() -> None:
    """Under ``srun`` without torchrun, take the rank layout from Slurm's variables."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        per_node = os.environ.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]  # "4(x2),3" -> 4
        if per_node.isdigit():
            os.environ.setdefault("LOCAL_WORLD_SIZE", per_node)


def run(args: argparse.Namespace) -> RunMetrics | None:
    """Train on this rank; rank 0 returns the metrics."""
    import torch
    import torch.distributed as dist

    from zerotune.core.topology import build_topology
    from zerotune.core.volume import QUANT_BLOCK
    from zerotune.costmodel.catalog import device_matches
    from zerotune.trainer.data import TokenSource, sequence_ids
    from zerotune.trainer.engine import ZeroEngine
    from zerotune.trainer.profiling import profile_step

    model_spec, cluster, strategy, accum = resolve(args)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cluster.world_size))
    dtype = torch.bfloat16 if elem_bytes(args.dtype, cuda) == 2 else torch.float32
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    topo = build_topology(cluster, timeout_s=args.timeout)
    device_name = torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()})"
    emulated = not device_matches(cluster.device, device_name)
    if emulated and topo.rank == 0:
        print(f"zerotune: {cluster.name} has {cluster.device} devices and this run has {device_name}: it is an "
              f"emulation on {platform.node()} (bytes, memory and learning carry over; times do not)",
              file=sys.stderr, flush=True)
    status = RankStatus(args.out, topo.rank)
    status.update("while building the model")
    lr = args.lr or default_lr(model_spec)
    lr_warmup = args.steps // 2 if args.lr_warmup is None else args.lr_warmup
    engine = ZeroEngine(model_spec, strategy, topo, dtype=dtype, device=device, lr=lr, betas=BETAS,
                        grad_clip=args.grad_clip or None, weight_decay=args.weight_decay, seed=args.seed,
                        quant_block=args.quant_block or QUANT_BLOCK)
    data = TokenSource(model_spec.vocab, model_spec.seq_len, seed=args.seed, token_file=args.token_file)
    world, mbs = topo.world_size, strategy.micro_batch_size
    losses, grad_norms, step_times = [], [], []
    step_bytes: dict[str, dict[str, int]] = {}
    step_seconds: list[dict[str, dict[str, float]]] = []
    step_quant: list[dict[str, float]] = []

    def host_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's micro-batches in host memory (pinned on a GPU, so that their copies do not wait)."""
        out = [data.batch(sequence_ids(step, micro, topo.rank, accum=accum, world=world, batch=mbs))
               for micro in range(accum)]
        return [(idx.pin_memory(), targets.pin_memory()) for idx, targets in out] if cuda else out

    upcoming = host_batches(0)

    def train_step(step: int) -> tuple[torch.Tensor, float]:
        """One optimizer step on the batches drawn for it; draws the next step's while the device runs this
        one (after the last micro-step is queued), as a loader's prefetch does. Returns the summed loss (on
        the device) and the gradient norm."""
        nonlocal upcoming
        total = torch.zeros((), dtype=torch.float64, device=device)  # NCCL reduces device tensors only
        batches = [tuple(t.to(device, non_blocking=True) for t in micro) for micro in upcoming]
        for micro, (idx, targets) in enumerate(batches):
            total += engine.forward_backward(idx, targets, loss_scale=1.0 / (world * accum), final=micro == accum - 1)
        upcoming = host_batches(step + 1)
        return total, engine.step(lr=lr_at(step, lr, lr_warmup))

    for step in range(args.steps):
        poisoned = maybe_fault(topo.rank, step)
        engine.counter.reset()
        t0 = time.perf_counter()
        total, grad_norm = train_step(step)
        status.update(f"at step {step + 1}/{args.steps}")
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        step_bytes = engine.counter.as_dict()
        step_seconds.append(engine.counter.seconds_dict())
        step_quant.append(engine.counter.quant_dict())
        if poisoned:
            total.fill_(math.nan)
        dist.all_reduce(total)  # logging only; not part of the strategy's bytes
        losses.append(float(total) / (world * accum))
        grad_norms.append(grad_norm)
        if topo.rank == 0:
            print(f"step {step + 1}/{args.steps}  loss {losses[-1]:.4f}  grad_norm {grad_norm:.4f}  "
                  f"{step_times[-1]:.3f} s", file=sys.stderr, flush=True)
    profiled = None
    if args.profile:  # one more step (two on a GPU), untimed, under the profiler; its loss is not reported
        status.update("profiling one more step")
        trace = str(Path(args.trace_dir) / f"rank0-step{args.steps + 1}.json.gz") if args.trace_dir else None
        profiled = profile_step(lambda: train_step(args.steps), cuda, trace if topo.rank == 0 else None)
    memory = engine.mem.report()
    if cuda:
        memory["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(device))
        # over max_allocated: the caching allocator's fragmentation (costmodel.memory.FRAGMENTATION)
        memory["cuda_max_reserved"] = int(torch.cuda.max_memory_reserved(device))
    memories: list[Any] = [None] * world
    dist.all_gather_object(memories, memory)
    engine.close()
    dist.destroy_process_group()
    status.remove()
    if topo.rank != 0:
        return None
    spread = step_spread(step_times, args.warmup)
    step_time = spread["median"]
    tokens = world * mbs * accum * model_spec.seq_len
    out: RunMetrics = {
        "status": "ok",
        "world_size": world,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "step_time_s": step_time,
        "step_times_s": step_times,
        "step_time_spread": spread,
        "tokens_per_s": tokens / step_time,
        "tflops_per_rank": model_spec.flops_per_token() * tokens / world / step_time / 1e12,
        "bytes_per_level": step_bytes,
        "seconds_per_level": seconds_per_level(step_seconds, args.warmup),
        "quantization": quantization_per_step(step_quant, args.warmup),
        "memory_bytes": cast(MemoryBytes, {k: max(m[k] for m in memories) for k in memory}),
        "loss": losses,
        "grad_norm": grad_norms,
        "health": health(losses, grad_norms, args.warmup),
        "grad_accum_steps": accum,
        "global_batch": world * mbs * accum,
        "dtype": str(dtype).removeprefix("torch."),
        "device": device_name,
        "emulated": emulated,
        "backend": "nccl" if cuda else "gloo",
        "model": model_spec.to_dict(),
        "cluster": cluster.to_dict(),
        "strategy": strategy.to_dict(),
        "data": data.describe(),
        "config": {"lr": lr, "lr_warmup_steps": lr_warmup, "grad_clip": args.grad_clip or None, "betas": list(BETAS),
                   "weight_decay": args.weight_decay, "seed": args.seed,
                   "token_file": args.token_file, "quant_block": args.quant_block or QUANT_BLOCK},
        "torch_version": torch.__version__,
        "host": host_facts(world),
    }
    if profiled is not None:
        out["profile"] = profiled
    return out


def host_facts(world: int) -> Host:
    """Rank 0's host, the CPUs it may run on and the ranks on it: where ranks outnumber CPUs, nothing overlaps."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"name": platform.node(), "cpus": cpus, "local_ranks": int(os.environ.get("LOCAL_WORLD_SIZE", world))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.trainer.train", description=__doc__.splitlines()[0])
    add_run_args(parser)
    args = parser.parse_args(argv)
    _env_from_slurm()
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun: it dies with its launcher, never orphaned
        from zerotune.trainer.launch import set_parent_death_signal

        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() == 1:  # the launcher died before the signal was armed
            return 1
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = run(args)
    except BaseException as exc:
        err = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()}
        try:
            Path(f"{args.out}.rank{rank}.err").write_text(json.dumps(err, indent=2))
        except OSError:
            pass  # --out's directory is unusable: the refusal itself says so
        raise
    if result is not None:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}: {result['step_time_s']:.3f} s/step, health {result['health']['verdict']}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
