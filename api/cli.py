"""The ``zerotune`` command line.

Each subcommand imports what it needs when it runs, so ``zerotune --help`` and the light commands
stay fast and never load torch. ``main(argv, env)`` returns an :class:`ExitStatus`; tests call it
directly with injected arguments. Expected failures print one line on stderr (the traceback only
with ``--debug``).
"""

from __future__ import annotations

import argparse
import enum
import errno
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any


class ExitStatus(enum.IntEnum):
    """Exit codes of every ``zerotune`` command (3-6: ``zerotune recommend``, README "Slurm job prologue")."""

    SUCCESS = 0
    """Done. For ``recommend``: the service's answer, or (without ``--strict``) a fallback, with a warning."""
    ERROR = 1
    """An unexpected failure (a bug, a failed run, an output file that cannot be written); details on stderr."""
    USAGE_ERROR = 2
    """Bad arguments, an invalid spec or a malformed SLURM_*/ZEROTUNE_* value: one line naming field, value, rule."""
    FALLBACK_USED = 3
    """``recommend --strict``: no answer from the service; the cached or built-in fallback was written anyway."""
    SERVER_REFUSED = 4
    """``recommend``: the service refused the request (4xx, e.g. an unknown model); its message is on stderr."""
    SERVER_ERROR = 5
    """``recommend --no-fallback``: the service was unreachable, kept answering 5xx, or the job failed."""
    TIMEOUT = 6
    """``recommend --no-fallback``: no answer within ``--timeout`` (+ ``--wait``): a slow service or a pending job."""
    INTERRUPTED = 130
    """Ctrl-C (and, for ``recommend``, SIGTERM)."""


def cmd_catalog(args: argparse.Namespace) -> int:
    from zerotune.strategies.catalog import catalog
    from zerotune.strategies.spec import count_label

    data = catalog()
    if args.json:
        print(json.dumps(data, indent=2))
        return ExitStatus.SUCCESS
    print("clusters (NAME:N sets the outermost level size; local:AxBxC for this machine):")
    for name, c in data["clusters"].items():
        levels = ", ".join(f"{lv['name']} x{lv['size']} @{lv['bandwidth_gbps']:g} GB/s" for lv in c["levels"])
        print(f"  {name:<12} {c['device']}, {c['device_memory_gib']:g} GiB, {c['peak_tflops']:g} TFLOPS; {levels}")
    print("models:")
    for name, m in data["models"].items():
        print(f"  {name:<14} {count_label(m['num_params']):>8} params  layers={m['layers']} hidden={m['hidden']} "
              f"heads={m['heads']} seq={m['seq_len']}")
    print("strategies:")
    for name, doc in data["strategies"].items():
        print(f"  {name:<10} {doc}")
    return ExitStatus.SUCCESS


def cmd_validate(args: argparse.Namespace) -> int:
    from zerotune.strategies.catalog import build_strategy, parse_cluster, parse_model, parse_overrides

    cluster = parse_cluster(args.cluster)
    strategy = build_strategy(args.strategy, cluster, **parse_overrides(args.set))
    out: dict[str, Any] = {"cluster": cluster.to_dict(), "world_size": cluster.world_size,
                           "strategy": strategy.to_dict()}
    fits = ""
    if args.model:
        from zerotune.strategies.costmodel import GIB
        from zerotune.strategies.train import check_memory, default_accumulation, elem_bytes

        model = parse_model(args.model)
        out["model"] = {**model.to_dict(), "num_params": model.num_params(),
                        "flops_per_token": model.flops_per_token()}
        # a strategy that does not fit is not valid for this model: the cost model's peak per rank at the
        # default batch, bf16 on accelerators and fp32 on CPU, as train runs it
        memory = check_memory(model, cluster, strategy, default_accumulation(strategy),
                              elem_bytes("auto", cluster.device != "cpu"),
                              hint=f"; try a wider span, zero3, or --set micro_batch_size=1 (zerotune predict "
                                   f"--model {model.name} --cluster {cluster.name} shows every preset)")
        out["memory_bytes"] = memory
        fits = (f"; {model.name} needs {memory['peak'] / GIB:.1f} GiB of {cluster.device_memory_gib:g} GiB "
                f"per rank")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        spans = f"P/G/OS spans {strategy.param_span}/{strategy.grad_span}/{strategy.optim_span}"
        hpz = f", hpZ span {strategy.secondary_span}" if strategy.secondary_span is not None else ""
        bits = f", weights {strategy.weight_bits}-bit, grads {strategy.grad_bits}-bit"
        print(f"ok: {strategy.name or 'strategy'} on {cluster.name} ({cluster.world_size} ranks): {spans}{hpz}{bits}"
              f"{fits}")
    return ExitStatus.SUCCESS


def cmd_train(args: argparse.Namespace) -> int:
    """Validate, launch torchrun with one rank per cluster rank, report where run.json is."""
    from pathlib import Path

    import torch

    from zerotune.strategies.launch import run_torchrun
    from zerotune.strategies.train import available_memory_bytes, failure_reason, resolve

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
    result = run_torchrun(cluster.world_size, ["zerotune.strategies.train", *args.argv], timeout_s=args.run_timeout,
                          stream=not args.quiet)
    if result.ok and out.is_file():
        run = json.loads(out.read_text())
        print(json.dumps({k: run[k] for k in ("status", "step_time_s", "tokens_per_s", "tflops_per_rank",
                                              "health")}, indent=2))
        return ExitStatus.SUCCESS
    reason = failure_reason(out, result.output, result.timed_out, args.run_timeout)
    out.write_text(json.dumps({"status": "failed", "error": reason, "world_size": cluster.world_size,
                               "log_tail": result.output.splitlines()[-40:]}, indent=2))
    print(f"zerotune: error: training failed: {reason}", file=sys.stderr)
    return ExitStatus.ERROR


def _sweep(text: str) -> list[str]:
    """``frontier:1,2,4`` → ``["frontier:1", "frontier:2", "frontier:4"]``."""
    name, sep, counts = text.partition(":")
    if sep and "," in counts:
        return [f"{name}:{c.strip()}" for c in counts.split(",") if c.strip()]
    return [text]


def cmd_predict(args: argparse.Namespace) -> int:
    from zerotune.strategies.calibration import load_calibration
    from zerotune.strategies.catalog import build_strategy, parse_cluster, parse_model, parse_overrides
    from zerotune.strategies.costmodel import GIB, cross_node_bytes, predict
    from zerotune.strategies.spec import count_label

    model = parse_model(args.model)
    calib = load_calibration(args.calibration) if args.calibration else None
    elem = {"bf16": 2, "fp32": 4}.get(args.dtype)
    rows = []
    for strategy_name in args.strategy or ["zero3"]:
        base = None
        for text in _sweep(args.cluster):
            cluster = parse_cluster(text)
            s = build_strategy(strategy_name, cluster, **parse_overrides(args.set))
            p = predict(model, cluster, s, elem_bytes=elem, global_batch=args.global_batch, calibration=calib)
            base = base or p
            p.update(cluster=cluster.name, strategy=s.name or strategy_name,
                     scaling_efficiency=p["tflops_per_rank"] / base["tflops_per_rank"],
                     cross_node_bytes=cross_node_bytes(p, cluster))
            rows.append(p)
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))
        return ExitStatus.SUCCESS
    print(f"{model.name} ({count_label(model.num_params())} params), calibration {rows[0]['calibration']}")
    print(f"{'cluster':<14}{'strategy':<10}{'ranks':>6}{'TFLOPS/rank':>12}{'scaling':>9}{'step s':>9}"
          f"{'tokens/s':>11}{'mem GiB':>9}  {'fits':<5}{'x-node GB':>10}")
    for p in rows:
        fits = "yes" if p["feasible"] else f"no ({p['overflow']['category']})"
        print(f"{p['cluster']:<14}{p['strategy']:<10}{p['world_size']:>6}{p['tflops_per_rank']:>12.1f}"
              f"{p['scaling_efficiency']:>9.2f}{p['step_time_s']:>9.3f}{p['tokens_per_s']:>11.0f}"
              f"{p['memory_bytes']['peak'] / GIB:>9.1f}  {fits:<5}{p['cross_node_bytes'] / 1e9:>10.2f}")
    return ExitStatus.SUCCESS


def cmd_calibrate(args: argparse.Namespace) -> int:
    from zerotune.strategies.calibration import Measurement, fit, fit_options, save_calibration

    fields, start = fit_options(args.fit, args.fix)  # refuse bad options before reading any run
    runs = []
    for path in args.runs:
        try:
            runs.append(Measurement.from_run(json.loads(open(path).read()), path))
        except (OSError, json.JSONDecodeError) as exc:
            from zerotune.strategies.errors import SpecError

            raise SpecError("run", path, f"cannot read a run.json: {exc}") from None
    tie = {"auto": None, "shared": True, "per-level": False}[args.bandwidths]
    calib, stats = fit(runs, name=args.name, fields=fields, start=start, tie_levels=tie)
    # --db first (it refuses a name stored there already): where studies look for it, the newest stored
    # for a cluster being what its next study predicts with
    stored = _store_calibration(args.db, calib, runs, stats) if args.db else None
    path = save_calibration(calib, runs[0].cluster.name, stats)
    out: dict[str, Any] = {"calibration": calib.to_dict(), "fit": stats, "saved": str(path)}
    if stored:
        out["stored"] = stored
    print(json.dumps(out, indent=2))
    return ExitStatus.SUCCESS


def _store_calibration(url: str, calib: Any, runs: list[Any], stats: dict[str, Any]) -> str:
    """Store a ``calibrate`` fit in the database (``zt_calibrations``) with its error before and after."""
    from zerotune.db import repository as repo
    from zerotune.db.migrate import upgrade
    from zerotune.db.session import make_engine, make_session_factory, session_scope
    from zerotune.strategies.calibration import before_after
    from zerotune.strategies.costmodel import calibration_for

    start = calibration_for(runs[0].cluster)
    report = {"runs": len(runs), "cluster": runs[0].cluster.name, "start": start.name, "fit": stats,
              **before_after(runs, start, calib), "cross_validated": None, "source": "zerotune calibrate"}
    upgrade(url)
    engine = make_engine(url)
    try:
        with session_scope(make_session_factory(engine)) as s:
            if repo.get_calibration(session=s, name=calib.name) is not None:
                from zerotune.strategies.errors import SpecError

                raise SpecError("name", calib.name, "a calibration of that name is stored in --db already")
            repo.save_calibration(session=s, name=calib.name, cluster=runs[0].cluster.name,
                                  num_levels=runs[0].cluster.num_levels, calibration=calib.to_dict(), report=report)
    finally:
        engine.dispose()
    return f"{calib.name} for {runs[0].cluster.name}"


def cmd_tune(args: argparse.Namespace) -> int:
    """A study without a server: progress on stderr, the recommendation on stdout."""
    import dataclasses

    from zerotune.db.migrate import upgrade
    from zerotune.db.session import default_url, make_engine, make_session_factory, session_scope
    from zerotune.strategies.catalog import parse_cluster, parse_model
    from zerotune.tuner import calibrations
    from zerotune.tuner.study import TuneRequest

    request = TuneRequest(model=parse_model(args.model), cluster=parse_cluster(args.cluster), executor=args.executor,
                          trials=args.trials, objective=args.objective, global_batch=args.global_batch,
                          tokens_per_step=args.tokens_per_step, measure=args.measure_shortlist,
                          sampler=args.sampler, seed=args.seed, time_budget_s=args.time_budget)
    url = args.db or default_url()
    upgrade(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    try:  # the calibration named, else the newest stored for the cluster (as the service does)
        with session_scope(sessions) as s:
            name = calibrations.resolve_name(s, request.cluster, args.calibration)
            calibration = calibrations.load(s, name)
        return _tune(args, dataclasses.replace(request, calibration=name), url, sessions, calibration)
    finally:
        engine.dispose()


def _tune(args: argparse.Namespace, request: Any, url: str, sessions: Any, calibration: Any) -> int:
    """``cmd_tune`` once the request and its calibration are resolved: the study, its shortlist, the summary."""
    from pathlib import Path

    from zerotune.db.session import session_scope
    from zerotune.tuner import shortlist
    from zerotune.tuner.executors import make_executor
    from zerotune.tuner.study import Tuner, TuneRequest

    def study(request: TuneRequest, trials: int, **options: Any) -> dict[str, Any]:
        bar = _progress_bar(trials, args.quiet)
        workdir = Path(args.workdir or Path(".zerotune")) / request.key()[:12]
        executor = make_executor(request.executor, calibration=calibration, partition=args.partition)
        tuner = Tuner(request, db_url=url, executor=executor, workdir=workdir, steps=args.steps,
                      trial_timeout_s=args.trial_timeout, calibration=calibration, progress=bar, **options)
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
            rec = study(todo.request, len(todo.candidates), candidates=todo.candidates, answer_key=todo.answer_key,
                        answer_note=todo.note)
    s = rec["strategy"]
    d = rec.get("decision") or {}
    band = f" (model error {d['band']:.1%}: {d['margin_vs_band']})" if d.get("band") is not None and \
        d.get("margin_vs_band") else ""
    print(f"zerotune: recommended {_describe(s)} — {rec['value']:.4g} TFLOPS/rank ({rec['evidence']}), "
          f"margin {rec['margin'] or 0:.1%} over the runner-up{band}, every trial at {request.global_batch} "
          f"sequences ({request.tokens_per_step:,} tokens) per step; study {rec['study_id']} in {url}", file=sys.stderr)
    if rec.get("leaders"):
        again = set(rec.get("remeasured") or [])
        print("zerotune: measured leaders (TFLOPS/rank, median [interquartile]): " + "; ".join(
            f"trial {lead['trial_id']} {lead['value']:.4g} [{lead['interval'][0]:.4g}, {lead['interval'][1]:.4g}]"
            f"{' re-measured' if lead['trial_id'] in again else ''}"
            for lead in rec["leaders"] if lead.get("interval")), file=sys.stderr)
    if d.get("lossy") and d["lossy"]["kept"] == "unquantized":
        print(f"zerotune: {d['lossy']['why']}", file=sys.stderr)
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
    print(json.dumps(rec if args.full else {k: rec[k] for k in ("strategy", "value", "evidence", "margin", "exports")},
                     indent=2, default=str))
    return ExitStatus.SUCCESS


def _describe(s: dict[str, Any]) -> str:
    hpz = f" hpZ {s['secondary_span']}" if s.get("secondary_span") is not None else ""
    bits = f"w{s['weight_bits']} g{s['grad_bits']}"
    bits += f" (quantized from level {s['quantize_above']})" if min(s["weight_bits"], s["grad_bits"]) < 16 else ""
    return (f"P/G/OS spans {s['param_span']}/{s['grad_span']}/{s['optim_span']}{hpz}, {bits}, "
            f"buckets {s['allgather_bucket_mb']:g}/{s['reduce_bucket_mb']:g} MB, prefetch {s['prefetch_buckets']}, "
            f"micro-batch {s['micro_batch_size']}"
            f"{', checkpointing' if s['activation_checkpointing'] else ''}")


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


def cmd_db(args: argparse.Namespace) -> int:
    from zerotune.db.migrate import current, prepare_optuna_storage, upgrade
    from zerotune.db.session import default_url

    url = args.db or default_url()
    upgrade(url, args.revision)
    if args.revision == "head":
        prepare_optuna_storage(url)  # Optuna's own tables too, so optuna-dashboard can open the database at once
    print(f"zerotune: database {url} at revision {current(url)}", file=sys.stderr)
    return ExitStatus.SUCCESS


def _settings(**overrides: Any) -> Any:
    """Service settings from ZEROTUNE_* variables, with command-line flags on top."""
    from pydantic import ValidationError

    from zerotune.api.settings import Settings
    from zerotune.strategies.errors import SpecError

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error.get("loc", ())) or "settings"
        raise SpecError(f"ZEROTUNE_{field.upper()}" if field != "settings" else field, error.get("input"),
                        error.get("msg", "invalid")) from None


def _log_to_stderr(debug: bool) -> None:
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP service with its embedded workers, until Ctrl-C or SIGTERM."""
    import uvicorn

    from zerotune.api.app import create_app

    settings = _settings(db=args.db, host=args.host, port=args.port, workers=args.workers)
    sock = _listen(settings.host, settings.port)
    _log_to_stderr(args.debug)
    print(f"zerotune: serving on http://{settings.host}:{settings.port} (database {_safe_url(settings.url())}, "
          f"{settings.workers} embedded worker(s){', token required for writes' if settings.token else ''})",
          file=sys.stderr)
    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="info",
                            access_log=args.access_log, timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
    return ExitStatus.SUCCESS


def _listen(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound before anything starts: a busy port or an address this
    host does not have is one line and exit 2, not "serving on ..." followed by a traceback."""
    from zerotune.strategies.errors import SpecError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise SpecError("host", host, f"cannot listen there: {exc.strerror or exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SpecError("port", port, f"{host}:{port} is already in use (another service?); choose another "
                            "with --port or ZEROTUNE_PORT") from None
        raise SpecError("host", host, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def cmd_worker(args: argparse.Namespace) -> int:
    """Claim jobs from the database and run their studies until Ctrl-C or SIGTERM."""
    from zerotune.tuner.worker import serve_worker

    settings = _settings(db=args.db)
    _log_to_stderr(args.debug)
    serve_worker(settings, settings.url(), parent_pid=args.parent_pid, max_jobs=args.max_jobs)
    return ExitStatus.SUCCESS


def cmd_upload(args: argparse.Namespace) -> int:
    """POST run.json files to /v1/trials: trials measured elsewhere become measured evidence."""
    from zerotune.api.client import Client, ServiceError
    from zerotune.strategies.errors import SpecError

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


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the service answers /healthz (or /readyz with --ready): the container health check."""
    from zerotune.api.client import Client, ServiceError

    url = args.url or f"http://127.0.0.1:{os.environ.get('ZEROTUNE_PORT', '8000')}"
    try:
        _, _, body = Client(url, timeout=args.timeout).request("GET", "/readyz" if args.ready else "/healthz")
    except ServiceError as exc:
        print(f"zerotune: error: {url}: {exc}", file=sys.stderr)
        return ExitStatus.ERROR
    print(json.dumps(body))
    return ExitStatus.SUCCESS


def add_recommend_parser(sub: Any) -> None:
    """The ``recommend`` subcommand (the Slurm prologue client): standard library only, see api/prologue.py."""
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
                        "fsdp, zerotune (the trainer's config; 'json' is its older name): one config, to -o or "
                        "stdout")
    p.add_argument("-o", "--output", help="the file to write (deepspeed/fsdp/zerotune; default stdout) or, with "
                   "--format env, the directory (default .zerotune/job-$SLURM_JOB_ID)")
    p.add_argument("--base", help="your DeepSpeed config: the recommended zero_optimization is merged into it, "
                   "every other key stays yours (deepspeed and env formats); a batch key that differs from the "
                   "recommended one is refused")
    p.add_argument("--keep-base-batch", action="store_true",
                   help="with --base: keep its batch keys (DeepSpeed's batch rule still checked) instead of refusing "
                        "a batch other than the one every trial measured")
    p.add_argument("--quiet", action="store_true",
                   help="no warning lines for the config's notes (they are still written: notes.txt, *.notes.txt)")
    p.add_argument("--executor", choices=["model", "local", "slurm"], default="model", help="how the service tunes")
    p.add_argument("--trials", type=int, default=40, help="the study's trial budget (default 40)")
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
    p.set_defaults(func=lambda args: cmd_recommend(args, os.environ))


def cmd_recommend(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The prologue client: resolve the request, ask the service, fall back, write the outputs."""
    import signal
    import time

    from zerotune.api import prologue as pl
    from zerotune.api.client import Client, Retry, ServiceError, describe

    start = time.monotonic()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started with SIGINT ignored (a background job of a script)
    for name, value, rule in (("--timeout", args.timeout, args.timeout > 0),
                              ("--connect-timeout", args.connect_timeout, args.connect_timeout > 0),
                              ("--read-timeout", args.read_timeout, args.read_timeout > 0),
                              ("--wait", args.wait, args.wait >= 0), ("--trials", args.trials, args.trials >= 1)):
        if not rule or value != value or value == float("inf"):
            raise pl.UsageError(name, value, "must be a finite number > 0" if name != "--wait" else
                                "must be a finite number >= 0")
    if args.base and args.format not in ("deepspeed", "env"):
        raise pl.UsageError("--base", args.base, "merges into a DeepSpeed config: use it with --format deepspeed or "
                                                 "env")
    use_slurm = not args.no_slurm
    job = pl.job_id(env) if use_slurm else None
    model = pl.resolve_model(args.model or env.get("ZEROTUNE_MODEL"))
    cluster = pl.resolve_cluster(args.cluster or env.get("ZEROTUNE_CLUSTER"), env, use_slurm)
    base = None
    if args.base:
        base = pl.read_json_file("--base", args.base)
        if not isinstance(base, dict):
            raise pl.UsageError("--base", args.base, "a DeepSpeed config is a JSON object")
    body = pl.build_request(model, cluster, objective=args.objective, executor=args.executor, trials=args.trials,
                            time_s=args.time_budget, global_batch=args.global_batch)
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
        raise pl.UsageError("--server", server, str(exc).split(": ", 1)[-1]) from None
    default_dir = os.path.join(".zerotune", f"job-{job}" if job else "recommend")
    fallback = False
    try:
        rec, source = pl.fetch(client, body, args.wait), "service"
        pl.cache_store(body, rec, env, server)
    except ServiceError as exc:  # 4xx: the request itself is wrong; a fallback would hide it
        print(f"zerotune: error: the service refused the request: {describe(exc.status, exc.detail)}",
              file=sys.stderr)
        return ExitStatus.SERVER_REFUSED
    except pl.Unanswered as exc:
        if args.no_fallback:
            print(f"zerotune: error: {exc} ({server})", file=sys.stderr)
            return ExitStatus.TIMEOUT if exc.cause == "timeout" else ExitStatus.SERVER_ERROR
        fallback, spent = True, time.monotonic() - start
        cached = pl.cache_load(body, env)
        if cached is not None:
            rec, source = cached, "cache"
            what = f"the cached recommendation {cached.get('id')} of {cached.get('saved_at')}"
        else:
            rec, source = pl.default_recommendation(body), "default"
            what = "the built-in default (ZeRO-3, DeepSpeed's default buckets)"
        pl.warn(f"{exc} ({server}, after {spent:.1f} s); using {what}")
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


def _main_recommend(argv: list[str], env: Mapping[str, str]) -> int:
    """``zerotune recommend``: its own small parser and error handling, so that nothing but the standard
    library (and api.client / api.prologue) is imported."""
    from zerotune.api.prologue import UsageError

    parser = argparse.ArgumentParser(prog="zerotune", description="Pick the partition strategy for sharded LLM "
                                                                   "training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_recommend_parser(parser.add_subparsers(dest="command", metavar="COMMAND"))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return ExitStatus.SUCCESS if exc.code == 0 else ExitStatus.USAGE_ERROR
    try:
        return int(cmd_recommend(args, env))
    except KeyboardInterrupt:
        print("zerotune: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except UsageError as exc:
        print(f"zerotune: error: {exc}", file=sys.stderr)
        return ExitStatus.USAGE_ERROR
    except Exception as exc:
        if args.debug or env.get("ZEROTUNE_DEBUG"):
            raise
        print(f"zerotune: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return ExitStatus.ERROR


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (after the global ``--debug``), or None."""
    for arg in argv:
        if arg != "--debug":
            return None if arg.startswith("-") else arg
    return None


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerotune", description="Pick the partition strategy for sharded LLM training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("catalog", help="list the cluster, model and strategy presets")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("validate", help="resolve a strategy against a cluster and check every rule")
    p.add_argument("--cluster", required=True, help="preset (frontier:48, dgx-h100:4, local:2x2x2) or JSON file")
    p.add_argument("--strategy", required=True, help="preset (zero3, zeropp, 3level-a, ...) or JSON file")
    p.add_argument("--model", help="model preset or JSON file: its size, and whether the strategy fits it in "
                                   "device memory (exit 2 when it does not)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a strategy field, e.g. --set weight_bits=16 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the resolved values as JSON")
    p.set_defaults(func=cmd_validate)

    from zerotune.strategies.train import add_run_args

    p = sub.add_parser("train", help="a short run of the built-in ZeRO trainer under torchrun; writes run.json")
    add_run_args(p)
    p.add_argument("--run-timeout", type=float, default=1800.0, help="wall-clock limit for the whole run, seconds")
    p.add_argument("--quiet", action="store_true", help="do not stream the ranks' progress")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("predict", help="predict step time, TFLOPS, memory and bytes with the cost model")
    p.add_argument("--model", required=True, help="model preset or JSON file")
    p.add_argument("--cluster", required=True, help="cluster preset; frontier:1,2,4,8 sweeps sizes")
    p.add_argument("--strategy", action="append", help="strategy preset or JSON file (repeatable; default zero3)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a strategy field")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per step, a multiple of world x micro-batch (default: one micro-batch per rank)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="run dtype (auto: fp32 on CPU clusters, bf16 otherwise)")
    p.add_argument("--calibration", help="a stored calibration name (zerotune calibrate) or its JSON file")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON (run.json field names)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("calibrate", help="fit the cost model to measured run.json files and store it by name")
    p.add_argument("runs", nargs="+", help="run.json files from zerotune train (one cluster layout)")
    p.add_argument("--name", required=True, help="name to store the calibration under")
    p.add_argument("--fit", default=None, metavar="FIELD,...",
                   help="the scalar efficiencies to fit (default: those the runs can tell apart; a wrong name "
                        "lists them); per-level bandwidths are always fitted")
    p.add_argument("--fix", action="append", default=[], metavar="FIELD=VALUE",
                   help="hold a field left out of --fit at VALUE (else nominal), e.g. overlap=0 where ranks "
                        "outnumber cores")
    p.add_argument("--db", help="also store it in this database (SQLAlchemy URL), where studies on the cluster find "
                                "it (the newest stored for a cluster is what its next study predicts with)")
    p.add_argument("--bandwidths", choices=["auto", "shared", "per-level"], default="auto",
                   help="fit one effective bandwidth shared by all levels or one per level (auto: shared where "
                        "every run had all its ranks on one host, whose levels cross the same transport)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("tune", help="run a study without a server and print the recommendation")
    p.add_argument("--model", required=True, help="model preset or JSON file")
    p.add_argument("--cluster", required=True, help="cluster preset or JSON file")
    p.add_argument("--executor", choices=["model", "local", "slurm"], default="model")
    p.add_argument("--trials", type=int, default=40, help="trials to finish (invalid combinations do not count)")
    p.add_argument("--objective", choices=["throughput", "pareto"], default="throughput")
    p.add_argument("--sampler", choices=["tpe", "nsga2", "random"], default="tpe")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step, the same for every trial (default: world size x 4)")
    p.add_argument("--tokens-per-step", type=int, default=None, help="the same batch in tokens")
    p.add_argument("--time-budget", type=float, default=None, help="stop starting trials after this many seconds")
    p.add_argument("--steps", type=int, default=10, help="steps per measured trial")
    p.add_argument("--trial-timeout", type=float, default=600.0, help="seconds before a measured trial is killed")
    p.add_argument("--calibration", help="a stored calibration to predict with (default: the newest stored for the "
                                         "cluster in --db, else the cluster's profile), or a zerotune calibrate file")
    p.add_argument("--measure-shortlist", choices=["local", "slurm"], default=None,
                   help="after a model study, measure the partitions within the model's error of its winner (its "
                        "three fastest where that error is unknown) with this executor, and answer with the fastest")
    p.add_argument("--partition", help="Slurm partition (slurm executor)")
    p.add_argument("--db", help="SQLAlchemy URL (default: SQLite under the user's data directory)")
    p.add_argument("--workdir", help="where trials write their files (default .zerotune/<request>)")
    p.add_argument("--full", action="store_true", help="print the whole recommendation record")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("serve", help="the HTTP service (FastAPI under uvicorn) with embedded workers")
    p.add_argument("--host", help="address to listen on (ZEROTUNE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (ZEROTUNE_PORT, default 8000)")
    p.add_argument("--db", help="SQLAlchemy URL (ZEROTUNE_DB; default: SQLite under the user's data directory)")
    p.add_argument("--workers", type=int, help="embedded worker processes (ZEROTUNE_WORKERS, default 1; 0: none)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run studies for the service: claim jobs from a shared database")
    p.add_argument("--db", help="SQLAlchemy URL of the service's database (ZEROTUNE_DB), e.g. postgresql://...")
    p.add_argument("--max-jobs", type=int, help="exit after this many jobs (default: run until stopped)")
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # embedded: stop when the service is gone
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("upload", help="send run.json files measured elsewhere to the service as trials")
    p.add_argument("runs", nargs="+", help="run.json files (zerotune train --out)")
    p.add_argument("--url", default=os.environ.get("ZEROTUNE_URL", "http://127.0.0.1:8000"),
                   help="the service (ZEROTUNE_URL, default http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("ZEROTUNE_TOKEN"), help="bearer token (ZEROTUNE_TOKEN)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("health", help="check that a service answers (exit 0) or not (exit 1)")
    p.add_argument("--url", default=os.environ.get("ZEROTUNE_URL"),
                   help="the service (ZEROTUNE_URL; default http://127.0.0.1:$ZEROTUNE_PORT)")
    p.add_argument("--ready", action="store_true", help="ask /readyz (database and workers) instead of /healthz")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=cmd_health)

    add_recommend_parser(sub)

    p = sub.add_parser("db", help="database maintenance")
    dbsub = p.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    q = dbsub.add_parser("upgrade", help="apply the schema migrations (idempotent)")
    q.add_argument("--db", help="SQLAlchemy URL (default: SQLite under the user's data directory)")
    q.add_argument("--revision", default="head")
    q.set_defaults(func=cmd_db)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one ``zerotune`` command; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _command(argv) == "recommend":  # the prologue client: nothing but the standard library
        return _main_recommend(argv, os.environ if env is None else env)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage line
        return ExitStatus.SUCCESS if exc.code == 0 else ExitStatus.USAGE_ERROR
    if args.command == "train":  # the ranks get the same arguments, minus the launcher's own
        args.argv = _strip(argv[argv.index("train") + 1:], ("--run-timeout",), ("--quiet",))
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitStatus.USAGE_ERROR
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("zerotune: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except Exception as exc:
        from zerotune.strategies.errors import SpecError

        if args.debug or os.environ.get("ZEROTUNE_DEBUG"):
            raise
        if isinstance(exc, SpecError):
            print(f"zerotune: error: {exc}", file=sys.stderr)
            return ExitStatus.USAGE_ERROR
        print(f"zerotune: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return ExitStatus.ERROR


def _strip(argv: list[str], with_value: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in with_value:
            skip = True
        elif a in flags or a.split("=", 1)[0] in with_value:
            continue
        else:
            out.append(a)
    return out


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
