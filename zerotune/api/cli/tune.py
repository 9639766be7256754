"""``zerotune tune``: a study without a server, progress on stderr, the recommendation on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from zerotune.api.cli import ExitStatus
from zerotune.core.fields import OPTIONS
from zerotune.core.spec import Strategy


def add_parsers(sub: Any, env: Mapping[str, str]) -> None:
    """Add this group's commands to ``sub``."""
    p = sub.add_parser("tune", help="run a study without a server and print the recommendation")
    p.add_argument("--model", required=True, help="model preset or JSON file")
    p.add_argument("--cluster", required=True, help="cluster preset or JSON file")
    add_request_flags(p)
    p.add_argument("--steps", type=int, default=10, help="steps per measured trial")
    p.add_argument("--trial-timeout", type=float, default=600.0, help="seconds before a measured trial is killed")
    p.add_argument("--calibration", help="a stored calibration to predict with (default: the newest stored for the "
                                         "cluster in --db, else the cluster's profile), or a zerotune calibrate file")
    p.add_argument("--partition", help="Slurm partition (slurm executor)")
    p.add_argument("--slurm-mode", choices=("steps", "jobs"), default=env.get("ZEROTUNE_SLURM_MODE") or "steps",
                   help="slurm executor: 'steps' runs each trial as a job step of the allocation zerotune runs in, "
                        "or of one allocation held for the whole study (one queue wait); 'jobs' submits each trial "
                        "as a batch job of its own (clusters that forbid steps) (default: $ZEROTUNE_SLURM_MODE, "
                        "else steps)")
    p.add_argument("--db", help="SQLAlchemy URL (ZEROTUNE_DB or ZEROTUNE_DB_FILE, as the service reads them; "
                                "default: SQLite under the user's data directory)")
    p.add_argument("--workdir", help="where trials write their files (default .zerotune/<request>)")
    p.add_argument("--baseline", metavar="FILE", help="your config today (a DeepSpeed ds_config.json, FSDP settings "
                   "JSON/YAML or a torchtitan TOML): the answer states the recommendation's gain over it")
    p.add_argument("--full", action="store_true", help="print the whole recommendation record")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)


OWN_FLAGS = ("calibration",)
"""Request fields whose flag says more than the field (``--calibration`` also takes a file): written out above."""


def add_request_flags(p: argparse.ArgumentParser) -> None:
    """A flag for each field of a request (``core.fields.Options``; ``About.flag`` names it) but ``OWN_FLAGS``: the
    field's type, choices, default and meaning."""
    for d in OPTIONS:
        if d.about.flag is None or d.name in OWN_FLAGS:
            continue
        flag = "--" + (d.about.flag or d.label.split(".")[-1]).replace("_", "-")
        if d.kind is bool:
            p.add_argument(flag, dest=d.name, action=argparse.BooleanOptionalAction if d.default else "store_true",
                           help=d.about.doc)
        else:
            p.add_argument(flag, dest=d.name, type=d.kind, choices=d.about.choices or None, default=d.default,
                           metavar=None if d.about.choices else flag[2:].upper().replace("-", "_"), help=d.about.doc)


def request_options(args: argparse.Namespace) -> dict[str, Any]:
    """The request's fields that ``add_request_flags`` read."""
    return {d.name: getattr(args, d.name) for d in OPTIONS if d.about.flag is not None and d.name not in OWN_FLAGS}


def cmd_tune(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """A study without a server: progress on stderr, the recommendation on stdout."""
    import dataclasses

    from zerotune.api.cli.serving import service_settings
    from zerotune.costmodel.files import load_cluster, load_model
    from zerotune.db.migrate import upgrade
    from zerotune.db.session import make_engine, make_session_factory, session_scope
    from zerotune.tuner import calibrating
    from zerotune.tuner.baseline import read_baseline_file
    from zerotune.tuner.request import TuneRequest
    from zerotune.tuner.study_options import TunerOptions

    baseline = read_baseline_file(args.baseline) if args.baseline else None
    request = TuneRequest(model=load_model(args.model), cluster=load_cluster(args.cluster), baseline=baseline,
                          **request_options(args))
    options = TunerOptions(steps=args.steps, trial_timeout_s=args.trial_timeout)
    if request.emulate:
        from zerotune.tuner.executors import netns

        netns.require()  # before any study: exit 2 with what is missing
    url = service_settings(db=args.db).url()  # --db, else ZEROTUNE_DB / ZEROTUNE_DB_FILE, else the default SQLite file
    upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    try:  # the calibration named, else the newest stored for the cluster (as the service does)
        with session_scope(sessions) as s:
            request = dataclasses.replace(request, calibration=calibrating.resolve_name(s, request.cluster,
                                                                                         args.calibration))
            calibration = calibrating.for_request(s, request)
        return _tune(args, request, options, url, sessions, calibration)
    finally:
        engine.dispose()

def _tune(args: argparse.Namespace, request: Any, options: Any, url: str, sessions: Any, calibration: Any) -> int:
    """``cmd_tune`` once the request and its calibration are resolved: the study, its shortlist, the summary."""
    from pathlib import Path

    from zerotune.db.session import session_scope
    from zerotune.tuner import shortlist
    from zerotune.tuner.executors import make_executor
    from zerotune.tuner.request import TuneRequest
    from zerotune.tuner.study import Tuner

    def study(what: TuneRequest | shortlist.Plan, trials: int) -> dict[str, Any]:
        """Run the study of a request, or of a shortlist (exactly its candidates), with a progress bar."""
        of = what.request if isinstance(what, shortlist.Plan) else what
        bar = _progress_bar(trials, args.quiet)
        workdir = Path(args.workdir or Path(".zerotune")) / of.key()[:12]
        executor = make_executor(of.executor, calibration=calibration, partition=args.partition, emulate=of.emulate,
                                 slurm_mode=args.slurm_mode, slurm_hold_s=(trials + 3) * (args.trial_timeout + 60))
        tuner: Tuner
        if isinstance(what, shortlist.Plan):
            tuner = shortlist.ShortlistTuner(what, sessions=sessions, executor=executor, workdir=workdir,
                                             options=options, calibration=calibration, progress=bar)
        else:
            tuner = Tuner(what, sessions=sessions, executor=executor, workdir=workdir, options=options,
                          calibration=calibration, progress=bar)
        try:
            return tuner.run()
        finally:
            if hasattr(bar, "close"):
                bar.close()

    rec = study(request, args.trials)
    if request.measure:
        with session_scope(sessions) as s:
            todo = shortlist.plan(s, request, rec)
        if todo is None:
            print("zerotune: the predicted winner is beyond the model's error: nothing to measure", file=sys.stderr)
        else:
            print(f"zerotune: measuring the shortlist ({todo.note['measured_shortlist']['why']}) with "
                  f"{todo.request.executor}", file=sys.stderr)
            rec = study(todo, len(todo.candidates))
    s = rec["strategy"]
    d = rec.get("decision") or {}
    band = f" (model error {d['band']:.1%}: {d['margin_vs_band']})" if d.get("band") is not None and \
        d.get("margin_vs_band") else ""
    print(f"zerotune: recommended {_describe(s)} — {rec['value']:.4g} TFLOPS/rank ({rec['evidence']}), "
          f"margin {rec['margin'] or 0:.1%} over the runner-up{band}, every trial at {request.global_batch} "
          f"sequences ({request.tokens_per_step:,} tokens) per step; study {rec['study_id']} in {url}", file=sys.stderr)
    if rec.get("memory"):  # how much of a rank's memory the pick uses, and what it kept for the runtime
        print(f"zerotune: memory: {rec['memory']['reason']}", file=sys.stderr)
    if rec.get("baseline"):
        print(f"zerotune: {rec['baseline']['sentence']}", file=sys.stderr)
    again = set(rec.get("remeasured") or [])
    measured = [f"trial {lead['trial_id']} {lead['value']:.4g} [{lead['interval'][0]:.4g}, {lead['interval'][1]:.4g}]"
                f"{' re-measured' if lead['trial_id'] in again else ''}"
                for lead in rec.get("leaders") or [] if lead.get("interval")]
    if measured:  # a model study's leaders are predictions: no interval to print
        print("zerotune: measured leaders (TFLOPS/rank, median [interquartile]): " + "; ".join(measured),
              file=sys.stderr)
    if (rec.get("trials") or {}).get("short"):  # fewer trials completed than the budget: said, with why
        print(f"zerotune: the answer was {rec['trials']['short']}", file=sys.stderr)
    if d.get("lossy") and d["lossy"]["kept"] == "unquantized":
        print(f"zerotune: {d['lossy']['why']}", file=sys.stderr)
    if d.get("checkpointing"):
        print(f"zerotune: {d['checkpointing']['why']}", file=sys.stderr)
    if d.get("collectives"):
        from zerotune.api.prologue import collectives_caveat

        print(f"zerotune: {collectives_caveat(d['collectives'])}", file=sys.stderr)
    if rec.get("refit") and "error" not in rec["refit"]:
        r = rec["refit"]
        print(f"zerotune: the measured runs refitted calibration {r['name']}: median error "
              f"{r['before']['rows']['median']:.1%} before, {r['after']['rows']['median']:.1%} after"
              + (f", {r['cross_validated']['rows']['median']:.1%} cross-validated" if r["cross_validated"] else "")
              + f" ({r['runs']} runs); the next study on {r['cluster']} starts from it", file=sys.stderr)
    if d.get("shortlist") and not rec.get("measured_shortlist"):
        print(f"zerotune: {len(d['shortlist'])} partitions lie within the model's error of the winner; worth "
              f"measuring (--executor local or slurm): " + "; ".join(
                  f"trial {c['trial_id']} {_describe(c['strategy'])}" for c in d["shortlist"]), file=sys.stderr)
    print(json.dumps(rec if args.full else {k: rec[k] for k in ("strategy", "value", "evidence", "margin", "exports")
                                            } | ({"memory": rec["memory"]} if rec.get("memory") else {}),
                     indent=2, default=str))
    return ExitStatus.SUCCESS

def _describe(s: dict[str, Any]) -> str:
    hpz = f" hpZ {s['secondary_span']}" if s.get("secondary_span") is not None else ""
    bits = f"w{s['weight_bits']} g{s['grad_bits']}"
    bits += f" (quantized from level {s['quantize_above']})" if min(s["weight_bits"], s["grad_bits"]) < 16 else ""
    return (f"P/G/OS spans {s['param_span']}/{s['grad_span']}/{s['optim_span']}{hpz}, {bits}, "
            f"buckets {s['allgather_bucket_mb']:g}/{s['reduce_bucket_mb']:g} MB, prefetch {s['prefetch_buckets']}, "
            f"micro-batch {s['micro_batch_size']}"
            f"{_checkpointing(s)}")


def _checkpointing(s: dict[str, Any]) -> str:
    """How a stored strategy checkpoints, after a comma (``Strategy.checkpointing``; a strategy stored before the
    policy and ``checkpoint_every`` existed is full, on every block); nothing without."""
    strategy = Strategy.from_dict(s)
    return {"none": "", "full": ", checkpointing", "selective": ", selective checkpointing"}.get(
        strategy.checkpointing, f", checkpointing 1 block in {strategy.checkpoint_every}")

def _progress_bar(total: int, quiet: bool) -> Any:
    """Progress on stderr: a bar on a terminal, one plain line per event in a log (no carriage returns).

    Each finished trial shows its status, and a failed one its reason; a new phase (measuring,
    re-measuring k/n, verifying) is announced."""
    if quiet:
        return None

    def line(progress: Any) -> str:
        last = progress.last
        if not last:
            return f"{progress.phase}"
        outcome = f"{last['value']:.4g} TFLOPS/rank" if last.get("value") is not None else \
            f"{last.get('status')}: {last.get('reason') or 'no reason recorded'}"
        best = f"{progress.best_value:.4g}" if progress.best_value is not None else "-"
        return f"{progress.phase} trial {progress.done + 1}/{progress.total} (#{last.get('number')}): {outcome}; " \
               f"best {best}"

    if not sys.stderr.isatty():
        def plain(progress: Any) -> None:
            print(f"zerotune: {line(progress)}", file=sys.stderr, flush=True)
        return plain

    from tqdm import tqdm

    bar = tqdm(total=total, desc="trials", unit="trial", file=sys.stderr)

    def update(progress: Any) -> None:
        bar.set_description_str(progress.phase or "trials")
        bar.n = progress.done + 1 if progress.last else progress.done
        last = progress.last
        if last.get("value") is None and last.get("status"):
            bar.write(f"zerotune: {line(progress)}", file=sys.stderr)  # a failed trial's reason stays on screen
        best = f"{progress.best_value:.4g}" if progress.best_value is not None else "-"
        bar.set_postfix_str(f"best {best} TFLOPS/rank; last #{last.get('number')} {last.get('status')}" if last
                            else f"best {best} TFLOPS/rank")
        bar.refresh()
    update.close = bar.close  # type: ignore[attr-defined]
    return update
