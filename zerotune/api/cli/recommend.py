"""``zerotune recommend``: the Slurm prologue client. Standard library only (with the ``zerotune/api/prologue``
package): a prologue pays for what it uses, and never for torch or the service."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from zerotune.api.cli import ExitStatus
from zerotune.errors import UsageError


def add_parsers(sub: Any, env: Mapping[str, str]) -> None:
    """The ``recommend`` subcommand (the Slurm prologue client): standard library only, see zerotune/api/prologue/."""
    from zerotune.api import prologue as pl

    p = sub.add_parser(
        "recommend", help="the Slurm prologue client: this job's config from the service (or a safe fallback)",
        description="Ask the zerotune service for the config of this job's model on this job's allocation "
                    "(SLURM_JOB_NUM_NODES / SLURM_NNODES, SLURM_GPUS_ON_NODE, SLURM_CLUSTER_NAME, SLURM_JOB_ID). "
                    "When the service is slow or down: the last answer cached for the same request, else plain "
                    "ZeRO-3 with DeepSpeed's default buckets, a warning, and exit 0 (see --strict, --no-fallback). "
                    "Exit statuses: 0 ok, 1 error, 2 usage error, 3 fallback used (--strict), 4 refused by the "
                    "service (4xx), 5 server error and 6 timeout (--no-fallback), 130 interrupted.")
    p.add_argument("--model", help="model preset (gpt-neox-20b) or ModelSpec JSON file (ZEROTUNE_MODEL)")
    p.add_argument("--cluster", help="frontier, dgx-h100, local:AxB, NAME:N or a ClusterSpec JSON file "
                   "(ZEROTUNE_CLUSTER, else SLURM_CLUSTER_NAME); inside Slurm the node count comes from Slurm")
    p.add_argument("--server", "--url", dest="server", help="the service (ZEROTUNE_URL, default http://127.0.0.1:8000)")
    p.add_argument("--token", help="bearer token for a service that requires one (ZEROTUNE_TOKEN)")
    p.add_argument("--format", choices=[*pl.FORMATS, *pl.FORMAT_ALIASES], default="env",
                   help="env: write every config into a directory and print export lines (default); deepspeed, "
                        "fsdp, zerotune (the trainer's config; 'json' is its older name), torchtitan (TOML), "
                        "accelerate (accelerate launch YAML, FSDP2 plugin; with -o also the DeepSpeed plugin's), "
                        "hf-trainer (the HF Trainer's --deepspeed config, \"auto\" where TrainingArguments set it): "
                        "one config, to -o or stdout")
    p.add_argument("-o", "--output", help="the file to write (deepspeed/fsdp/zerotune; default stdout) or, with "
                   "--format env, the directory (default .zerotune/job-$SLURM_JOB_ID)")
    p.add_argument("--base", help="your DeepSpeed config: the recommended zero_optimization is merged into it, "
                   "every other key stays yours (deepspeed and env formats); a batch key that differs from the "
                   "recommended one is refused")
    p.add_argument("--baseline", metavar="FILE", help="your config today (a DeepSpeed ds_config.json, FSDP settings "
                   "JSON/YAML or a torchtitan TOML): the answer states the recommendation's gain over it")
    p.add_argument("--keep-base-batch", action="store_true",
                   help="with --base: keep its batch keys (DeepSpeed's batch rule still checked) instead of refusing "
                        "a batch other than the one every trial measured")
    p.add_argument("--quiet", action="store_true",
                   help="no warning lines for the config's notes (they are still written: notes.txt, *.notes.txt)")
    p.add_argument("--executor", choices=pl.EXECUTORS, default="model", help="how the service tunes")
    p.add_argument("--trials", type=int, default=40, help="the study's trial budget (default 40)")
    p.add_argument("--runner", choices=pl.RUNNERS,
                   help="who trains with the answer (ZEROTUNE_RUNNER, default zerotune): deepspeed or fsdp searches "
                        "only what that runner runs exactly, timed as it runs it (model executor)")
    p.add_argument("--grad-reduce-in-fp32", action="store_true",
                   help="the training reduces gradients in fp32 (ZEROTUNE_GRAD_REDUCE_IN_FP32=1; torchtitan's default, "
                        "FSDP2 reduce_dtype=float32): every strategy searched reduces them in fp32")
    p.add_argument("--objective", choices=["throughput", "pareto"], default="throughput")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    p.add_argument("--time-budget", type=float, help="the study's time budget, seconds")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds for the whole exchange, retries included (default 10), on top of --wait")
    p.add_argument("--connect-timeout", type=float, default=2.0, help="seconds per connection attempt (default 2)")
    p.add_argument("--read-timeout", type=float, default=5.0, help="seconds to wait for an answer (default 5)")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for a pending job (a request never answered before) to finish")
    p.add_argument("--strict", action="store_true", help="exit 3 when a fallback was written")
    p.add_argument("--no-fallback", action="store_true",
                   help="write nothing without the service's answer: exit 5 (server error) or 6 (timeout)")
    p.add_argument("--no-slurm", action="store_true", help="ignore the SLURM_* variables")
    p.add_argument("--dry-run", action="store_true", help="print the request it would send, send nothing")
    p.add_argument("--measure", type=float, metavar="SECONDS",
                   help="inside a Slurm job: measure the answer's shortlist on this job's nodes with this job's model "
                        "within SECONDS (the runs, and sending them to the service, which stores them as trials and "
                        "refits the cluster's calibration), and write the measured winner; an answer measured by a "
                        "job of the same request and shape is reused; any failure keeps the predicted answer, with "
                        "one warning")
    p.add_argument("--measure-steps", type=int, default=10,
                   help="optimizer steps per measured candidate, the first 2 of them warm-up (default 10, as a "
                        "service's measured trial)")
    p.set_defaults(func=cmd_recommend)


def cmd_recommend(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The prologue client: resolve the request, ask the service, fall back, write the outputs."""
    import signal
    import time

    from zerotune.api import prologue as pl
    from zerotune.api.prologue.client import Client, Retry, ServiceError, describe

    start = time.monotonic()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started with SIGINT ignored (a background job of a script)
    for name, value, rule in (("--timeout", args.timeout, args.timeout > 0),
                              ("--connect-timeout", args.connect_timeout, args.connect_timeout > 0),
                              ("--read-timeout", args.read_timeout, args.read_timeout > 0),
                              ("--wait", args.wait, args.wait >= 0), ("--trials", args.trials, args.trials >= 1),
                              ("--measure", args.measure, args.measure is None or args.measure > 0),
                              ("--measure-steps", args.measure_steps, args.measure_steps >= 1)):
        if not rule or (value is not None and (value != value or value == float("inf"))):
            raise UsageError(name, value, "must be a finite number > 0" if name != "--wait" else
                                "must be a finite number >= 0")
    if args.base and args.format not in ("deepspeed", "env", "accelerate"):
        raise UsageError("--base", args.base, "merges into a DeepSpeed config: use it with --format deepspeed, "
                                                 "accelerate or env")
    use_slurm = not args.no_slurm
    job = pl.job_id(env) if use_slurm else None
    model = pl.resolve_model(args.model or env.get("ZEROTUNE_MODEL"))
    cluster = pl.resolve_cluster(args.cluster or env.get("ZEROTUNE_CLUSTER"), env, use_slurm)
    base = None
    if args.base:
        base = pl.read_json_file("--base", args.base)
        if not isinstance(base, dict):
            raise UsageError("--base", args.base, "a DeepSpeed config is a JSON object")
    baseline = _read_baseline(args.baseline) if args.baseline else None
    body = pl.build_request(model, cluster, objective=args.objective, executor=args.executor, trials=args.trials,
                            time_budget_s=args.time_budget, global_batch=args.global_batch,
                            runner=args.runner or env.get("ZEROTUNE_RUNNER"), baseline=baseline,
                            grad_reduce_in_fp32=args.grad_reduce_in_fp32 or pl.env_flag(
                                "ZEROTUNE_GRAD_REDUCE_IN_FP32", env.get("ZEROTUNE_GRAD_REDUCE_IN_FP32")))
    server = (args.server or env.get("ZEROTUNE_URL") or "http://127.0.0.1:8000").rstrip("/")
    token = args.token or env.get("ZEROTUNE_TOKEN")
    if args.dry_run:
        print(json.dumps({"method": "POST", "url": f"{server}/v1/recommendations?wait={args.wait:g}",
                          "headers": {"Content-Type": "application/json",
                                      **({"Authorization": "Bearer ***"} if token else {})},
                          "body": body, "cache_key": pl.request_key(body)}, indent=2))
        return ExitStatus.SUCCESS
    try:
        client = Client(server, token, timeout=args.read_timeout, connect_timeout=args.connect_timeout,
                        deadline=start + args.timeout + args.wait, retry=Retry())
    except ValueError as exc:
        raise UsageError("--server", server, str(exc).split(": ", 1)[-1]) from None
    default_dir = os.path.join(".zerotune", f"job-{job}" if job else "recommend")
    fallback = False
    try:
        rec, source = pl.fetch(client, body, args.wait), "service"
        pl.save_answer(body, rec, env, server)
    except ServiceError as exc:  # 4xx: the request itself is wrong; a fallback would hide it
        print(f"zerotune: error: the service refused the request: {describe(exc.status, exc.detail)}",
              file=sys.stderr)
        return ExitStatus.SERVER_REFUSED
    except pl.Unanswered as exc:
        if args.no_fallback:
            print(f"zerotune: error: {exc} ({server})", file=sys.stderr)
            return ExitStatus.TIMEOUT if exc.cause == "timeout" else ExitStatus.SERVER_ERROR
        fallback, spent = True, time.monotonic() - start
        cached = pl.saved_answer(body, env)
        if cached is not None:
            rec, source = cached, "cache"
            what = f"the cached recommendation {cached.get('id')} of {cached.get('saved_at')}"
        else:
            rec, source = pl.default_recommendation(body), "default"
            what = "the built-in default (ZeRO-3, DeepSpeed's default buckets)"
        pl.warn(f"{exc} ({server}, after {spent:.1f} s); using {what}")
    if args.measure is not None and source == "service":
        rec = _measured(rec, args, server, token, job, os.path.join(args.output or default_dir, "measure")
                        if args.format == "env" else os.path.join(default_dir, "measure"))
        pl.save_answer(body, rec, env, server)  # the measured answer is the one a later fallback reuses
    try:
        text, notes = pl.write_outputs(rec, args.format, args.output, base, source, default_dir,
                                       keep_base_batch=args.keep_base_batch)
    except OSError as exc:
        print(f"zerotune: error: cannot write the {args.format} output: {exc}", file=sys.stderr)
        return ExitStatus.ERROR
    if not args.quiet:  # one line per real difference between the config and what was measured
        for note in notes:
            pl.warn(note)
    sys.stdout.write(text)
    sys.stdout.flush()
    return ExitStatus.FALLBACK_USED if fallback and args.strict else ExitStatus.SUCCESS


def _measured(rec: dict[str, Any], args: argparse.Namespace, server: str, token: str | None, job: str | None,
              workdir: str) -> dict[str, Any]:
    """``--measure``: the answer measured on this allocation (``api/prologue/measuring.py``), or ``rec`` with one
    warning when anything goes wrong: measuring never fails the job."""
    from pathlib import Path

    from zerotune.api import prologue as pl
    from zerotune.api.prologue.client import Client, Retry
    from zerotune.api.prologue.measuring import Unmeasured, measure_answer

    def say(line: str) -> None:
        if not args.quiet:
            print(f"zerotune: measure: {line}", file=sys.stderr)

    try:
        client = Client(server, token, timeout=max(args.read_timeout, 60.0), connect_timeout=args.connect_timeout,
                        retry=Retry())
        measured = measure_answer(client, rec, job=job, budget_s=args.measure, workdir=Path(workdir),
                                  steps=args.measure_steps,
                                  warmup=min(2, args.measure_steps - 1), log=say)
    except KeyboardInterrupt:
        raise
    except Unmeasured as exc:
        pl.warn(f"--measure: {exc}; using the predicted answer")
        return rec
    except Exception as exc:  # whatever broke, the job keeps its predicted config
        pl.warn(f"--measure failed ({type(exc).__name__}: {exc}); using the predicted answer")
        return rec
    return {**measured, "job": job}


def _read_baseline(path: str) -> dict[str, Any]:
    """``--baseline FILE``: its object, sent as the request's ``baseline`` (the service reads no files). JSON, a
    torchtitan TOML (the standard library's tomllib) or YAML (where pyyaml is installed)."""
    import json
    import tomllib
    from pathlib import Path

    try:
        text = Path(path).read_text()
        if path.endswith(".toml"):
            data: Any = tomllib.loads(text)
        elif path.endswith((".yaml", ".yml")):
            import yaml
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ImportError:
        raise UsageError("--baseline", path, "a YAML file needs pyyaml (pip install pyyaml), or write it as JSON") \
            from None
    except (OSError, ValueError) as exc:
        raise UsageError("--baseline", path, f"cannot be read ({exc})") from None
    except Exception as exc:  # yaml.YAMLError
        raise UsageError("--baseline", path, f"is not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError("--baseline", path, "must hold an object (a DeepSpeed config, FSDP settings or a TOML)")
    return data
