"""``zerotune train | upload | emulate``: a short run of the built-in trainer, run.json files sent to the service,
and the emulated clusters short runs can run on."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from zerotune.api.cli import ExitStatus


def add_parsers(sub: Any, env: Mapping[str, str]) -> None:
    """Add this group's commands to ``sub``."""
    from zerotune.trainer.train import add_run_args

    p = sub.add_parser("train", help="a short run of the built-in ZeRO trainer under torchrun; writes run.json")
    add_run_args(p)
    p.add_argument("--run-timeout", type=float, default=1800.0, help="wall-clock limit for the whole run, seconds")
    p.add_argument("--quiet", action="store_true", help="do not stream the ranks' progress")
    p.add_argument("--emulate", nargs="?", const="on", default="off", choices=["on", "auto", "off"],
                   help="run on an emulated cluster: a network namespace per innermost group, links shaped per "
                        "level (Linux, CAP_NET_ADMIN; docs/trainer.md); auto: on loopback with a warning "
                        "where that is missing")
    p.add_argument("--emulate-scale", type=float, default=None,
                   help="with --emulate: the factor every link is slowed by (default: this machine's FLOPS per rank "
                        "over the target's achievable FLOPS per rank, measured)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("upload", help="send run.json files measured elsewhere to the service as trials")
    p.add_argument("runs", nargs="+", help="run.json files (zerotune train --out)")
    p.add_argument("--url", default=env.get("ZEROTUNE_URL", "http://127.0.0.1:8000"),
                   help="the service (ZEROTUNE_URL, default http://127.0.0.1:8000)")
    p.add_argument("--token", default=env.get("ZEROTUNE_TOKEN"), help="bearer token (ZEROTUNE_TOKEN)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("emulate", help="emulated clusters on this machine: check, plan, or clean up",
                       description="Network namespaces joined by shaped links, one per group of the innermost "
                                   "level, so local runs feel a cluster's bandwidth hierarchy (Linux, CAP_NET_ADMIN).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="exit 0 when this machine can emulate, else 2 and why")
    what.add_argument("--plan", action="store_true", help="print the namespaces, links and scale for --cluster")
    what.add_argument("--clean", action="store_true",
                      help="remove emulations left by dead processes (with --all: every zerotune emulation)")
    p.add_argument("--all", action="store_true", help="with --clean: also the sets of live processes")
    p.add_argument("--cluster", help="with --plan: the cluster to emulate (a preset, e.g. frontier:2 or local:2x2)")
    p.add_argument("--local-tflops", type=float, default=None,
                   help="with --plan: this machine's TFLOPS per rank (default: measured with a matmul loop)")
    p.set_defaults(func=cmd_emulate)


def cmd_train(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Validate, launch torchrun with one rank per cluster rank, report where run.json is."""
    from pathlib import Path

    import torch

    from zerotune.trainer.faults import failure_reason
    from zerotune.trainer.launch import run_torchrun
    from zerotune.trainer.train import available_memory_bytes, resolve

    # refuse bad input before any process starts; every rank runs on this host, so on CPU they must fit
    # in its free memory together
    cuda = torch.cuda.is_available()
    model, cluster, strategy, accum = resolve(args, accelerated=cuda,
                                              host_free_bytes=None if cuda else available_memory_bytes())
    out = Path(args.out)
    for stale in [out, *out.parent.glob(out.name + ".rank*")]:
        stale.unlink(missing_ok=True)
    print(f"zerotune: training {model.name} with {strategy.name or 'custom strategy'} on {cluster.name} "
          f"({cluster.world_size} ranks, {args.steps} steps, {accum} micro-batch(es) per step)", file=sys.stderr)
    # the ranks get the arguments, minus the launcher's
    ranks = _strip(args.argv, ("--run-timeout", "--emulate-scale"), ("--quiet",))
    target = ["zerotune.trainer.train", *ranks]
    with _emulated(args.emulate, cluster, args.emulate_scale) as plan:
        if plan is not None:
            from zerotune.tuner.executors import emulate

            for line in plan.describe():
                print(f"zerotune: {line}", file=sys.stderr)
        result = run_torchrun(cluster.world_size, target, timeout_s=args.run_timeout, stream=not args.quiet,
                              agents=None if plan is None else emulate.agent_commands(plan, target),
                              env=None if plan is None else emulate.agent_env())
    if result.ok and out.is_file():
        run = json.loads(out.read_text())
        if plan is not None:
            run["emulation"] = plan.summary()
            out.write_text(json.dumps(run, indent=2))
        print(json.dumps({k: run[k] for k in ("status", "step_time_s", "tokens_per_s", "tflops_per_rank",
                                              "health")}, indent=2))
        return ExitStatus.SUCCESS
    reason = failure_reason(out, result.output, result.timed_out, args.run_timeout)
    out.write_text(json.dumps({"status": "failed", "error": reason, "world_size": cluster.world_size,
                               "log_tail": result.output.splitlines()[-40:]}, indent=2))
    print(f"zerotune: error: training failed: {reason}", file=sys.stderr)
    return ExitStatus.ERROR

def _emulated(mode: str, cluster: Any, scale: float | None) -> Any:
    """A context holding the emulation ``mode`` asks for (its Plan), or None: off, or auto where it cannot run."""
    import contextlib

    from zerotune.tuner.executors import emulate, netns

    if mode == "off":
        return contextlib.nullcontext(None)
    lack = netns.missing()
    if lack is not None and mode == "auto":
        print(f"zerotune: warning: running on loopback, not emulated: this machine lacks {lack}", file=sys.stderr)
        return contextlib.nullcontext(None)
    netns.require()
    if cluster.num_levels < 2:
        print("zerotune: warning: a one-level cluster has nothing to emulate: running on loopback", file=sys.stderr)
        return contextlib.nullcontext(None)
    how = f"links slowed by {scale:.3g} (--emulate-scale)" if scale is not None else ""
    if scale is None:
        scale, how = emulate.measured_scale(cluster, cluster.world_size)
    print(f"zerotune: emulating {cluster.name}: {how}", file=sys.stderr)
    return emulate.emulation(cluster, scale)


def _strip(argv: list[str], with_value: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a == "--emulate":  # a launcher option whose value may be left out
            skip = i + 1 < len(argv) and argv[i + 1] in ("on", "auto", "off")
        elif a.startswith("--emulate="):
            continue
        elif a in with_value:
            skip = True
        elif a in flags or a.split("=", 1)[0] in with_value:
            continue
        else:
            out.append(a)
    return out

def cmd_upload(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """POST run.json files to /v1/trials: trials measured elsewhere become measured evidence."""
    from zerotune.api.prologue.client import Client, ServiceError
    from zerotune.errors import SpecError

    client = Client(args.url, token=args.token, timeout=args.timeout)
    for path in args.runs:
        try:
            run = json.loads(open(path).read())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError("run", path, f"cannot read a run.json: {exc}") from None
        try:
            status, _, trial = client.request("POST", "/v1/trials", run)
        except ServiceError as exc:
            print(f"zerotune: error: {path}: {exc}", file=sys.stderr)
            return ExitStatus.USAGE_ERROR if exc.status == 422 else ExitStatus.ERROR
        verb = "stored" if status == 201 else "already stored as"
        print(f"zerotune: {path}: {verb} trial {trial['id']} ({trial['status']}, study {trial['study_id']})",
              file=sys.stderr)
    return ExitStatus.SUCCESS


def cmd_emulate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Check, plan or clean emulated clusters (``zerotune/tuner/executors/emulate.py``)."""
    from zerotune.costmodel import calibration_for
    from zerotune.costmodel.files import load_cluster
    from zerotune.tuner.executors import emulate, netns

    if args.check:
        netns.require()
        print(f"emulation available (latency shaping: {'yes' if netns.has_netem() else 'no, no sch_netem'})")
        return ExitStatus.SUCCESS
    if args.clean:
        netns.require()
        removed = netns.clean(stale_only=not args.all)
        print(f"removed {len(removed)} namespaces" + (": " + " ".join(removed) if removed else ""))
        return ExitStatus.SUCCESS
    if not args.cluster:
        from zerotune.errors import UsageError

        raise UsageError("--cluster", None, "--plan needs the cluster to emulate")
    cluster = load_cluster(args.cluster)
    if args.local_tflops is None:
        scale, how = emulate.measured_scale(cluster, cluster.world_size)
    else:
        efficiency = calibration_for(cluster).compute_efficiency
        scale = emulate.scale_for(cluster, efficiency, args.local_tflops)
        how = (f"links slowed by {scale:.3g} = {args.local_tflops:.3g} TFLOPS per rank here / "
               f"{cluster.peak_tflops:g} x {efficiency:.3g} achievable per rank there")
    plan = emulate.plan(cluster, scale, netem=netns.missing() is None and netns.has_netem())
    print("\n".join(plan.describe()))
    print(f"scale {scale:.3g}: {how}")
    return ExitStatus.SUCCESS
