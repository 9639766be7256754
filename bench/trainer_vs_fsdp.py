"""Our ZeRO engine vs PyTorch FSDP2 (``fully_shard``) vs DeepSpeed ZeRO-3 vs DDP: step time and peak memory
on the same GPT.

    python bench/trainer_vs_fsdp.py                          # worlds 4 and 8, all seven configs
    python bench/trainer_vs_fsdp.py --worlds 4 --configs zero3,fsdp2 --steps 10

Configs (every one trains the same ``--model`` GPT, ``trainer.gpt.build_gpt(spec, seed=0)``,
on the same data, ``--batch`` sequences per rank per step (default 1), with ``zerotune train``'s
recipe: AdamW with betas (0.9, 0.95), peak learning rate ``trainer.train.default_lr`` and linear
warm-up over half the steps, no clipping; every config's AdamW is torch's fused update on a GPU and
the unfused one on CPU, as our engine's). ``--dtype`` (default ``auto``: bf16 on GPU, fp32 on CPU)
is the compute and communication dtype of every config alike: our engine's ``dtype`` (bf16 weights
and gradients, fp32 master shards), FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` (fp32
sharded parameters, bf16 gathers and reduce-scatters), DDP under ``torch.autocast`` (fp32 weights
and gradients, bf16 matrix products). ``--set grad_bits=32`` reduces gradients in fp32 on both sides:
our engine's strategy, FSDP2's ``reduce_dtype=float32`` (torchtitan's default) and the DeepSpeed export's
``communication_data_type``; DDP's are fp32 already:

- ``zero3``: our :class:`ZeroEngine`, strategy preset ``zero3`` (everything sharded over the world);
- ``fsdp2``: ``fully_shard`` per transformer block, then on the root, over a 1-D mesh of all ranks,
  ``reshard_after_forward=True`` (FULL_SHARD) — the pair of ``zero3``;
- ``ds3``: DeepSpeed (``deepspeed.initialize`` on the same model and torch AdamW) with the config zerotune
  exports for ``zero3`` with the same ``--set`` (``tuner.exports.deepspeed_config``: stage 3, its buckets,
  ``overlap_comm``, bf16 or fp32, ``--batch`` and ``--accum`` as the micro-batch and accumulation) — what a
  user of the DeepSpeed export runs. It needs ``pip install deepspeed`` (``make install`` has it); on CPU it
  runs DeepSpeed's CPU accelerator over gloo. The export is asked for no gradient clipping, the bench's recipe
  (DeepSpeed 0.19.8 clips at 1.0 when a config leaves ``gradient_clipping`` out: on an H200 that took its
  losses 0.3-0.4 below the others' within 8 steps of gpt-1.3b, bench/data/h200-runner-peers). Its losses then
  follow ours and DDP's: to five decimals on one rank in fp32, within 0.01 nats across ranks, where it sums
  gradients in another order;
- ``ds3d``: the same DeepSpeed ZeRO-3 with DeepSpeed's own defaults for all but the batch, the dtype, the
  clipping and the stage (what a user runs without zerotune's export): beside ``ds3`` it tells what the
  export's settings (buckets, prefetch, live parameters, reuse distance, persistence threshold) change;
- ``mics``: our engine, preset ``mics`` (sharded inside a node, replicated across nodes);
- ``hsdp``: ``fully_shard`` over a 2-D mesh (replicate, shard) = (nodes, ranks per node), ranks per
  node being the product of every cluster level size but the outermost — the pair of ``mics``;
- ``ddp``: ``DistributedDataParallel``, the floor.

``--set activation_checkpointing=true`` (and ``--set checkpoint_policy=selective``) checkpoints every config's
blocks the same way: the engine's own, and the peers' blocks wrapped in torch's non-reentrant checkpoint wrapper
with the same policy (``trainer.checkpointing.wrap_blocks``, as the FSDP2 export's snippet does).

World sizes map to clusters as 4 -> local:2x2, 8 -> local:2x2x2 (2^k -> local:2x...x2); world 1
(one GPU: NCCL takes one rank per device) runs on local:1, where there is nothing to shard or
reduce and the table compares the engines' own work — bucket copies, hooks, the optimizer — on the
same device; ``mics`` and ``hsdp`` need two levels and are left out there. Every
(world, config) runs in its own ``torchrun`` launch, so each config starts from fresh processes;
rank 0 writes the config's result to a JSON file in a temporary directory and this script prints
one table per world size. Step time: the slowest rank's time of each step, median over the steps
after ``--warmup``. ``others`` is the share of the machine's CPU time that processes other than
this bench used during the launch (Linux /proc/stat): well above 0% means other work shared the
cores and that row's time is inflated — rerun on a quiet machine.

Memory. On GPU (nccl) the figure is ``torch.cuda.max_memory_allocated`` after the model is built.
On CPU there is no allocator counter, so every config (ours included, for an apples-to-apples
column) reports the increase of the process's peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``) from
just before the model is built (after the process groups / device mesh exist) to the end of the
run, maximum over ranks. That figure is coarse: it includes the CPU allocator's caching and
fragmentation, gloo's buffers, autograd's temporaries and any page the process touched once, and
it misses memory reused from pages already counted in the baseline. Every config imports the same
modules (our engine, FSDP2, ``torch._dynamo``, which the first AdamW imports) before the baseline,
so no config is charged for Python modules another one loaded earlier. For our engine the table also
gives the exact peak of its memory accountant (``engine.mem.report()["peak"]``), which counts only
the buffers the engine books (shards, gathered buckets, gradients, optimizer states, activations).
On CPU, resident memory depends on the allocator and on gloo as much as on the algorithm: glibc
keeps what a step frees in its heaps (one per thread), and gloo's own all_gather_single and
reduce_scatter_single copy the whole buffer into temporaries (+20-38 MiB peak for a 12 MiB buffer
on 2-4 ranks). Our engine runs those two collectives in place on gloo from 1 MiB on, as one
broadcast / reduce per rank (``zerotune/trainer/comm.py``); FSDP2 calls gloo's own.
``--mmap-threshold BYTES`` sets ``MALLOC_MMAP_THRESHOLD_`` for every launch alike: lower resident
memory for every config, paid in page faults (step time).

On one CPU the ranks share cores and "links" are shared memory: times show the cost of the
algorithms and of their Python overhead, not of a real fabric.

``--profile`` runs one more step after the timed ones under ``torch.profiler`` (not timed) and adds
two columns per config: on GPU the CUDA kernels (and memcpy/memset) the step launches and the sum
of their device time; on CPU the ATen operators it dispatches and their summed self CPU time. A
step whose wall time is well above its kernels' time while the kernels are many and short is bound
by the host's launching, not by the device (``kernel ms`` sums every stream: with communication
streams busy it can exceed the wall time). On GPU it also prints, per config, how long the device
waited for the host (the timed step minus the union of its kernels' intervals) and the host's
operators and CUDA runtime calls with the most self time; ``--trace-dir DIR`` keeps rank 0's
profile of that step as a Chrome trace.

Each result also holds ``to_optimizer_ms``: rank 0's wall time from a step's start to its optimizer call
(median of the timed steps). On CPU that is the forward and backward themselves; two ``--model`` files that
differ only in their layer count give each config's cost per block, and on a model too narrow to compute
much (``--worlds 1``) that cost is the runner's host work per block: its hooks, copies and dispatch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = ("zero3", "fsdp2", "ds3", "ds3d", "mics", "hsdp", "ddp")
DEEPSPEED = {"ds3", "ds3d"}
OURS = {"zero3", "mics"}
PAIRS = {"zero3": "fsdp2", "mics": "hsdp"}  # ours -> its FSDP2 counterpart
DS_PAIRS = {"zero3": "ds3"}  # ours -> DeepSpeed running the config zerotune exports for the same strategy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="4,8", help="comma-separated world sizes (1 or powers of 2)")
    p.add_argument("--batch", type=int, default=1, help="sequences per rank per micro-step")
    p.add_argument("--accum", type=int, default=1,
                   help="micro-steps per optimizer step (gradient accumulation; ours reduces beyond the grad span "
                        "in the last one only, FSDP2 and DDP reduce in every one)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                   help="compute and communication dtype of every config (auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--model", default="gpt-mini",
                   help="model preset (zerotune/costmodel/catalog.py MODELS) or a ModelSpec JSON file")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a Strategy field of our engine's configs (e.g. allgather_bucket_mb=1.6)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before one launch is killed")
    p.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                   help="glibc's MALLOC_MMAP_THRESHOLD_ for every launch (CPU): allocations this large are mapped "
                        "and returned when freed; lower resident memory, more page faults")
    p.add_argument("--profile", action="store_true",
                   help="profile one extra step: kernels (CPU: operators) launched and their summed time")
    p.add_argument("--comm-thread", choices=["auto", "thread", "inline"], default="auto",
                   help="where our engine issues its collectives: auto (inline on a GPU, a thread on CPU), "
                        "thread or inline (to compare the two on one machine)")
    p.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="with --profile on a GPU: also write rank 0's host + device profile of the extra step as a "
                        "Chrome trace, DIR/CONFIG-wWORLD-bBATCH.json (open it in Perfetto or chrome://tracing)")
    p.add_argument("--json-out", default=None, help="also write every config's result (per-step times, losses) here")
    # internal: what one torchrun launch runs
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch={args.batch}: must be >= 1")
    if args.accum < 1:
        p.error(f"--accum={args.accum}: must be >= 1")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be >= 0 and < --steps={args.steps}")
    unknown = sorted(set(_split(args.configs)) - set(CONFIGS))
    if unknown:
        p.error(f"unknown configs {unknown}; known: {list(CONFIGS)}")
    return args


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def cluster_for(world: int) -> str:
    """1 -> local:1, 4 -> local:2x2, 8 -> local:2x2x2: a binary tree of levels, outermost = nodes of the last."""
    if world < 1 or world & (world - 1):
        raise SystemExit(f"bench: world size {world} must be 1 or a power of 2")
    return "local:1" if world == 1 else "local:" + "x".join(["2"] * int(math.log2(world)))


TWO_LEVELS = {"mics", "hsdp"}
"""Configs that shard inside a node and replicate across nodes: nothing to tell them from zero3 / fsdp2 on one rank."""


# -- the launcher side -------------------------------------------------------------------------
def launch(args: argparse.Namespace) -> int:
    from zerotune.trainer.launch import run_torchrun

    worlds = [int(w) for w in _split(args.worlds)]
    model = str(Path(args.model).resolve()) if Path(args.model).is_file() else args.model  # ranks resolve it too
    configs = [c for c in CONFIGS if c in _split(args.configs)]
    results: dict[int, dict[str, dict[str, Any]]] = {}
    failed = False
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zerotune-bench-") as tmp:
        for world in worlds:
            cluster = cluster_for(world)
            results[world] = {}
            for config in configs:
                if world == 1 and config in TWO_LEVELS:
                    print(f"          {config} left out on 1 rank (it needs two levels)", file=sys.stderr)
                    continue
                if config in DEEPSPEED and importlib.util.find_spec("deepspeed") is None:
                    print(f"          {config} left out: DeepSpeed is not installed (pip install deepspeed)",
                          file=sys.stderr)
                    continue
                out = Path(tmp) / f"w{world}-{config}.json"
                target = [__file__, "--config", config, "--cluster", cluster, "--result", str(out),
                          "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", model,
                          "--timeout", str(args.timeout), "--batch", str(args.batch), "--accum", str(args.accum),
                          "--dtype", args.dtype,
                          *(["--profile"] if args.profile else []),
                          *(["--trace-dir", str(Path(args.trace_dir).resolve())] if args.trace_dir else []),
                          "--comm-thread", args.comm_thread,
                          *[a for s in args.set for a in ("--set", s)]]
                print(f"[{time.perf_counter() - t_all:6.1f}s] {config:<6} on {world} ranks ({cluster}) ...",
                      file=sys.stderr, flush=True)
                t0, busy0, ours0 = time.perf_counter(), _machine_busy_s(), _children_cpu_s()
                env = {"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)} if args.mmap_threshold else None
                res = run_torchrun(world, target, module=False, stream=False, timeout_s=args.timeout, env=env)
                why = f"timed out after {args.timeout:.0f}s" if res.timed_out else f"exit {res.returncode}"
                if out.is_file():
                    if not res.ok:
                        # rank 0 writes the result after every rank's timings and memory are gathered, before
                        # the last barrier: a launch that fails after it failed in teardown (seen: gloo with
                        # FSDP2 aborting one rank at exit, "terminate called without an active exception")
                        print(f"          warning: the launch ended with {why} after rank 0 wrote the result, "
                              f"which stands; last output:\n{res.output[-600:]}", file=sys.stderr, flush=True)
                    results[world][config] = json.loads(out.read_text())
                    r = results[world][config]
                    busy1, wall = _machine_busy_s(), time.perf_counter() - t0
                    if busy0 is not None and busy1 is not None:  # CPU that other processes used meanwhile
                        others = busy1 - busy0 - (_children_cpu_s() - ours0)
                        r["others_cpu_pct"] = max(0.0, 100.0 * others / (wall * (os.cpu_count() or 1)))
                    print(f"          done in {wall:.1f}s: {r['step_ms']:.1f} ms/step, other processes used "
                          f"{r.get('others_cpu_pct', float('nan')):.0f}% of the CPU", file=sys.stderr, flush=True)
                else:
                    failed = True
                    print(f"bench: {config} on {world} ranks failed ({why}); last output:\n"
                          f"{res.output[-3000:]}", file=sys.stderr)
    print(f"\nwall time {time.perf_counter() - t_all:.0f}s", file=sys.stderr)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({str(w): r for w, r in results.items()}, indent=2))
    for world in worlds:
        report(world, cluster_for(world), results[world], args)
    return 1 if failed else 0


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy since boot (Linux /proc/stat), None elsewhere."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (torchrun and, through it, every rank)."""
    t = os.times()
    return t.children_user + t.children_system


def report(world: int, cluster: str, rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    if not rows:
        return
    any_row = next(iter(rows.values()))
    mem_kind = any_row["mem_kind"]
    print(f"\n{args.model} on {world} {any_row['backend']} ranks ({cluster}, {any_row.get('device', '')}), "
          f"{any_row.get('dtype', 'float32')}, {args.batch} sequence(s) per rank per micro-step, "
          f"{args.accum} micro-step(s) per step, {args.steps} steps, "
          f"median of the last {args.steps - args.warmup}; memory: {mem_kind} per rank (max over ranks)")
    if any_row.get("hsdp_mesh"):
        print(f"HSDP mesh (replicate, shard) = {tuple(any_row['hsdp_mesh'])}")
    head = (f"{'config':<8}{'what':<34}{'step ms':>9}{'TFLOPS':>8}{'ours/FSDP2':>12}{'ours/DS':>9}{'vs DDP':>8}"
            f"{'mem MiB':>10}{'mem ours/FSDP2':>16}{'acct MiB':>10}{'loss first->last':>20}{'others':>8}"
            + (f"{'kernels':>9}{'kernel ms':>11}" if any_row.get("profile") else ""))
    print(head)
    print("-" * len(head))
    ddp = rows.get("ddp", {}).get("step_ms")
    for config in CONFIGS:
        r = rows.get(config)
        if r is None:
            continue
        pair = PAIRS.get(config)
        ratio = f"{r['step_ms'] / rows[pair]['step_ms']:.2f}" if pair and pair in rows else ""
        mem_ratio = f"{r['mem_bytes'] / rows[pair]['mem_bytes']:.2f}" if pair and pair in rows and \
            rows[pair]["mem_bytes"] else ""
        peer = DS_PAIRS.get(config)
        vs_ds = f"{r['step_ms'] / rows[peer]['step_ms']:.2f}" if peer and peer in rows else ""
        vs_ddp = f"{r['step_ms'] / ddp:.2f}" if ddp else ""
        acct = f"{r['accountant_peak'] / 2**20:.1f}" if r.get("accountant_peak") is not None else ""
        loss = f"{r['losses'][0]:.4f}->{r['losses'][-1]:.4f}"
        others = f"{r['others_cpu_pct']:.0f}%" if r.get("others_cpu_pct") is not None else ""
        tflops = f"{r['tflops_per_rank']:.3g}" if "tflops_per_rank" in r else ""
        prof = r.get("profile")
        launched = f"{prof['launches']:>9}{prof['busy_ms']:>11.1f}" if prof else ""
        print(f"{config:<8}{r['what']:<34}{r['step_ms']:>9.1f}{tflops:>8}{ratio:>12}{vs_ds:>9}{vs_ddp:>8}"
              f"{r['mem_bytes'] / 2**20:>10.1f}{mem_ratio:>16}{acct:>10}{loss:>20}{others:>8}{launched}")
    if any_row.get("profile"):
        unit = "CUDA kernels, memcpy and memset" if any_row["backend"] == "nccl" else "ATen operators"
        print(f"(kernels: {unit} launched by one profiled step, rank 0; kernel ms: their summed "
              f"{'device' if any_row['backend'] == 'nccl' else 'self CPU'} time)")
    for config in CONFIGS:  # where the wall time goes when the device waits (GPU profiles only)
        prof = (rows.get(config) or {}).get("profile") or {}
        if "device_busy_ms" in prof:
            top = ", ".join(f"{h['name']} {h['ms']:.1f} ms x{h['count']}" for h in prof.get("host_top", [])[:6])
            wait = rows[config]["step_ms"] - prof["device_busy_ms"]
            print(f"{config}: device busy {prof['device_busy_ms']:.1f} ms of the {rows[config]['step_ms']:.1f} ms "
                  f"step, "
                  f"so it waits {wait:.1f} ms for the host; host (profiled again with the CPU, slower) "
                  f"{prof.get('host_ms', float('nan')):.1f} ms of operator and runtime self time, most in: {top}")
        elif prof.get("timeline_error"):
            print(f"{config}: no device timeline ({prof['timeline_error']})")


# -- the rank side -----------------------------------------------------------------------------
def checkpoint_like_ours(model: Any, strategy: Any) -> str:
    """A peer's model checkpoints its blocks as the engine's strategy says; returns how (``Strategy.recompute``)."""
    from zerotune.trainer.checkpointing import wrap_blocks

    wrap_blocks(model.blocks, strategy)
    return str(strategy.checkpointing)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from zerotune.costmodel.catalog import build_strategy, parse_cluster
    from zerotune.costmodel.files import load_model, parse_overrides
    from zerotune.trainer.data import TokenSource, sequence_ids
    from zerotune.trainer.profiling import profile_step
    from zerotune.trainer.train import BETAS, default_lr, lr_at

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and cuda)
    dtype = torch.bfloat16 if bf16 else torch.float32
    info: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."),
                            "device": torch.cuda.get_device_name(device) if cuda else "cpu"}
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    spec, cluster = load_model(args.model), parse_cluster(args.cluster)
    marks: list[float] = []  # each step's wall clock when its optimizer step is called
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == cluster.world_size, (world, cluster.world_size)
    config = args.config

    # every config imports the same modules before the baseline: module imports are not training memory,
    # and the first torch.optim optimizer imports torch._dynamo (~68 MiB of Python objects), which FSDP2's
    # mesh would otherwise pull in partly before the baseline and our engine entirely after it
    import torch._dynamo  # noqa: F401
    from torch.distributed.fsdp import fully_shard

    from zerotune.trainer.engine import ZeroEngine, adamw_options

    # communication setup first (process groups / mesh), so the memory baseline excludes it
    if config in DEEPSPEED:
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")  # its own detection wants a GPU
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend)  # adopts the process group above
    if config in OURS:
        from zerotune.core.topology import build_topology

        topo = build_topology(cluster, timeout_s=args.timeout)  # once per process
    elif config in ("fsdp2", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        if config == "fsdp2":
            mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
        else:
            per_node = math.prod(cluster.sizes[:-1]) if cluster.num_levels > 1 else world
            shape = (world // per_node, per_node)
            info["hsdp_mesh"] = list(shape)
            mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    rss0 = _peak_rss_bytes()

    engine, peak = None, default_lr(spec)
    if config in OURS:
        strategy = build_strategy(config, cluster, **parse_overrides(args.set))
        inline = {"auto": None, "thread": False, "inline": True}[args.comm_thread]
        engine = ZeroEngine(spec, strategy, topo, dtype=dtype, device=device, lr=peak, seed=0, betas=BETAS,
                            inline_comm=inline)
        info["what"] = f"ours {config} ({len(engine.buckets)} buckets" + (
            f", {args.comm_thread})" if args.comm_thread != "auto" else ")")
        info["strategy"], info["recompute"] = strategy.to_dict(), strategy.checkpointing

        def train_step(micros: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> float:
            total = torch.zeros((), dtype=torch.float64, device=device)  # read once, after the step is queued
            for i, (idx, targets) in enumerate(micros):
                loss = engine.forward_backward(idx, targets, loss_scale=1.0 / (world * len(micros)),
                                               final=i == len(micros) - 1)
                total += loss.detach()
            marks.append(time.perf_counter())
            engine.step(lr=lr)
            return float(total) / len(micros)
    elif config in DEEPSPEED:
        from zerotune.trainer.gpt import build_gpt
        from zerotune.tuner.exports import deepspeed_config

        strategy = dataclasses.replace(build_strategy("zero3", cluster, **parse_overrides(args.set)),
                                       micro_batch_size=args.batch)
        ds_config = deepspeed_config(spec, cluster, strategy, global_batch=world * args.batch * args.accum,
                                     dtype="bf16" if bf16 else "fp32", gradient_clipping=0.0)  # the recipe's
        if config == "ds3d":  # DeepSpeed's own defaults: only the batch, the dtype, the clipping and the stage kept
            ds_config = {**{k: ds_config[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                      "gradient_accumulation_steps", "gradient_clipping")},
                         **({"bf16": {"enabled": True}} if bf16 else {}), "zero_optimization": {"stage": 3}}
        model = build_gpt(spec, seed=0)
        info["recompute"] = checkpoint_like_ours(model, strategy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0, betas=BETAS,
                                      **adamw_options(device))
        ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        info["what"] = f"DeepSpeed {deepspeed.__version__} ZeRO-3" + (" defaults" if config == "ds3d" else "")
        info["strategy"], info["deepspeed_config"] = strategy.to_dict(), ds_config

        def train_step(micros: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> float:
            total = torch.zeros((), dtype=torch.float64, device=device)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for i, (idx, targets) in enumerate(micros):  # DeepSpeed divides by the accumulation, steps at its end
                loss = ds_engine(idx, targets)
                ds_engine.backward(loss)
                total += loss.detach()
                if i == len(micros) - 1:
                    marks.append(time.perf_counter())
                ds_engine.step()
            return float(total) / len(micros)
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from zerotune.trainer.gpt import build_gpt

        model = build_gpt(spec, seed=0).to(device)
        info["recompute"] = checkpoint_like_ours(model, build_strategy("zero3", cluster, **parse_overrides(args.set)))
        autocast = contextlib.nullcontext()
        if config == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
            info["what"] = "DDP"
            if bf16:
                autocast = torch.autocast(device.type, dtype=torch.bfloat16)
        else:
            fp32_reduce = parse_overrides(args.set).get("grad_bits") == 32  # the same reduction as ours
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if fp32_reduce else dtype)
            info["reduce_dtype"] = str(policy.reduce_dtype).removeprefix("torch.")
            for block in model.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
            fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
            info["what"] = "FSDP2 full shard" if config == "fsdp2" else f"FSDP2 HSDP {tuple(mesh.shape)}"
        optimizer = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0, betas=BETAS,
                                      **adamw_options(device))  # the engine's rule: fused on a GPU

        def train_step(micros: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> float:
            total = torch.zeros((), dtype=torch.float64, device=device)
            for idx, targets in micros:
                with autocast:
                    loss = model(idx, targets)  # plain mean loss: DDP / FSDP2 average the gradients
                (loss / len(micros)).backward()
                total += loss.detach()
            marks.append(time.perf_counter())
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(total) / len(micros)

    data = TokenSource(spec.vocab, spec.seq_len, seed=0)

    def batch_of(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        micros = []
        for micro in range(args.accum):
            ids = sequence_ids(step, micro, rank, accum=args.accum, world=world, batch=args.batch)
            idx, targets = (t.to(device) for t in data.batch(ids))
            micros.append((idx, targets))
        return micros

    losses, times, to_optimizer = [], [], []
    for step in range(args.steps):
        micros = batch_of(step)
        t0 = time.perf_counter()
        losses.append(train_step(micros, lr_at(step, peak, args.steps // 2)))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        to_optimizer.append(marks[-1] - t0)

    if args.profile:  # one more step, untimed, under the profiler
        micros = batch_of(args.steps)
        accum = f"x{args.accum}" if args.accum > 1 else ""
        trace = (str(Path(args.trace_dir) / f"{config}-w{world}-b{args.batch}{accum}.json")
                 if args.trace_dir and rank == 0 else None)
        info["profile"] = profile_step(lambda: train_step(micros, lr_at(args.steps, peak, args.steps // 2)),
                                       cuda, trace)

    # results: the slowest rank per step, the global mean loss, memory maximum over ranks
    t = torch.tensor(times, dtype=torch.float64, device=device)  # NCCL reduces device tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    lt = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(lt)
    t, lt = t.cpu(), lt.cpu()
    mem = {"mem_bytes": int(torch.cuda.max_memory_allocated(device)) if cuda else _peak_rss_bytes() - rss0,
           "accountant_peak": engine.mem.report()["peak"] if engine is not None else None}
    mems: list[Any] = [None] * world
    dist.all_gather_object(mems, mem)
    if engine is not None:
        engine.close()
    if rank == 0:
        step_times = t.tolist()
        step_s = statistics.median(step_times[args.warmup:])
        result = {
            "config": config, "world": world, "cluster": cluster.name, "backend": backend, **info,
            "step_ms": step_s * 1e3,
            "tflops_per_rank": spec.flops_per_token() * spec.seq_len * args.batch * args.accum / step_s / 1e12,
            "step_times_ms": [x * 1e3 for x in step_times],
            "to_optimizer_ms": statistics.median(to_optimizer[args.warmup:]) * 1e3,
            "losses": (lt / world).tolist(),
            "mem_kind": "torch.cuda.max_memory_allocated" if cuda else "peak-RSS increase",
            "mem_bytes": max(m["mem_bytes"] for m in mems),
            "mem_bytes_per_rank": [m["mem_bytes"] for m in mems],
            "accountant_peak": max(m["accountant_peak"] for m in mems) if engine is not None else None,
            "batch": args.batch, "accum": args.accum, "torch_version": torch.__version__,
        }
        Path(args.result).write_text(json.dumps(result, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ns = parse_args()
    if "RANK" in os.environ:
        if ns.config is None or ns.cluster is None or ns.result is None:
            raise SystemExit("bench: under torchrun, run through the launcher (python bench/trainer_vs_fsdp.py)")
        worker(ns)
    else:
        sys.exit(launch(ns))
