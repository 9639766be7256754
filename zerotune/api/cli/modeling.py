"""``zerotune catalog | validate | predict | calibrate``: the presets and the cost model, no database."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, Literal, NotRequired

from zerotune.api.cli import ExitStatus
from zerotune.core.batch import SEQUENCES_PER_RANK
from zerotune.core.records import Prediction


def add_parsers(sub: Any, env: Mapping[str, str]) -> None:
    """Add this group's commands to ``sub``."""
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


    p = sub.add_parser("predict", help="predict step time, TFLOPS, memory and bytes with the cost model")
    p.add_argument("--model", required=True, help="model preset or JSON file")
    p.add_argument("--cluster", required=True, help="cluster preset; frontier:1,2,4,8 sweeps sizes")
    p.add_argument("--strategy", action="append", help="strategy preset or JSON file (repeatable; default zero3)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a strategy field")
    p.add_argument("--global-batch", type=int, default=None,
                   help=f"sequences per step, a multiple of world x micro-batch (default: {SEQUENCES_PER_RANK} per "
                        "rank in whole micro-batches, as zerotune train and a request default to)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="run dtype (auto: fp32 on CPU clusters, bf16 otherwise)")
    p.add_argument("--calibration", help="a stored calibration name (zerotune calibrate) or its JSON file")
    p.add_argument("--runner", choices=["deepspeed", "fsdp", "zerotune"], default=None,
                   help="the software that runs the spans: zerotune (its engine: one ring per level, a gather "
                        "per bucket), deepspeed or fsdp (as the exported configs run: one NCCL ring over the whole "
                        "group; DeepSpeed gathers per sub-module in stage 3 and all-reduces each gradient bucket in "
                        "stages 1-2); all three reduce gradients beyond the grad span "
                        "in the last micro-step's backward; default: the calibration's (zerotune for the presets)")
    p.add_argument("--memory-reserve-gib", type=float, default=None, metavar="GIB",
                   help="GiB per rank kept free beside the predicted peak for the runtime (>= 0, under the device's "
                        "memory); default: computed (the device context, the collective library's buffers per "
                        "communicator, the allocator's fragmentation)")
    p.add_argument("--breakdown", action="store_true",
                   help="also print where each step's seconds go: compute, communication left exposed, the "
                        "slow-down of compute beside collectives, the step boundary, the optimizer update")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON (run.json field names)")
    p.add_argument("--baseline", metavar="FILE", help="your config today (a DeepSpeed ds_config.json, FSDP settings "
                   "JSON/YAML or a torchtitan TOML): each row's predicted gain over it")
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
    p.add_argument("--bandwidths", choices=["auto", "shared", "per-level", "measured"], default="auto",
                   help="fit one effective bandwidth shared by all levels or one per level, or read each level's "
                        "off the runs' own clocks (measured: run.json's bytes over seconds per level; only the "
                        "scalars are then fitted to step times). auto: measured where every run timed gloo "
                        "collectives with its ranks over hosts or emulated namespaces; else shared where every run "
                        "had all its ranks on one host (its levels crossed one transport), else per level")
    p.set_defaults(func=cmd_calibrate)


def cmd_catalog(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from zerotune.core.spec import count_label
    from zerotune.costmodel.catalog import catalog

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
        extra = (f" kv_heads={m['kv_heads']}" if m.get("kv_heads") else "") + \
            (" untied head" if m.get("tied_head") is False else "") + (f" {m['arch']}" if m.get("arch") else "")
        print(f"  {name:<14} {count_label(m['num_params']):>8} params  layers={m['layers']} hidden={m['hidden']} "
              f"heads={m['heads']} seq={m['seq_len']}{extra}")
    print("strategies:")
    for name, doc in data["strategies"].items():
        print(f"  {name:<10} {doc}")
    return ExitStatus.SUCCESS

def cmd_validate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from zerotune.costmodel.files import load_cluster, load_model, load_strategy, parse_overrides

    cluster = load_cluster(args.cluster)
    strategy = load_strategy(args.strategy, cluster, **parse_overrides(args.set))
    out: dict[str, Any] = {"cluster": cluster.to_dict(), "world_size": cluster.world_size,
                           "strategy": strategy.to_dict()}
    fits = ""
    if args.model:
        from zerotune.core.batch import default_accumulation
        from zerotune.costmodel import GIB
        from zerotune.trainer.train import check_memory, elem_bytes

        model = load_model(args.model)
        out["model"] = {**model.to_dict(), "num_params": model.num_params(),
                        "flops_per_token": model.flops_per_token()}
        # a strategy that does not fit is not valid for this model: the cost model's peak per rank at the
        # default batch, bf16 on accelerators and fp32 on CPU, as train runs it
        memory = check_memory(model, cluster, strategy, default_accumulation(strategy.micro_batch_size),
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

def _sweep(text: str) -> list[str]:
    """``frontier:1,2,4`` → ``["frontier:1", "frontier:2", "frontier:4"]``."""
    name, sep, counts = text.partition(":")
    if sep and "," in counts:
        return [f"{name}:{c.strip()}" for c in counts.split(",") if c.strip()]
    return [text]

def cmd_predict(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from zerotune.api.prologue import collectives_caveat
    from zerotune.core.batch import default_global_batch
    from zerotune.core.spec import count_label
    from zerotune.costmodel import GIB, calibration_for, cross_node_bytes, predict
    from zerotune.costmodel.calibration import load_calibration
    from zerotune.costmodel.error import lean_sentence
    from zerotune.costmodel.files import load_cluster, load_model, load_strategy, parse_overrides
    from zerotune.costmodel.memory import memory_note
    from zerotune.costmodel.profiles import DEVICE_CALIBRATION_SUFFIX
    from zerotune.costmodel.rates import run_by

    model = load_model(args.model)
    calib = load_calibration(args.calibration) if args.calibration else None
    elem = {"bf16": 2, "fp32": 4}.get(args.dtype)
    rows: list[PredictedRow] = []
    for strategy_name in args.strategy or ["zero3"]:
        base = None
        for text in _sweep(args.cluster):
            cluster = load_cluster(text)
            s = load_strategy(strategy_name, cluster, **parse_overrides(args.set))
            used = calib or calibration_for(cluster)
            if args.runner:
                used = run_by(used, args.runner)
            batch = args.global_batch or default_global_batch(cluster.world_size, s.micro_batch_size)
            p = predict(model, cluster, s, elem_bytes=elem, global_batch=batch, calibration=used,
                        memory_reserve_gib=args.memory_reserve_gib)
            base = base or p
            rows.append({**p, "cluster": cluster.name, "strategy": s.name or strategy_name,
                         "scaling_efficiency": p["tflops_per_rank"] / base["tflops_per_rank"],
                         "cross_node_bytes": cross_node_bytes(p, cluster), "checkpointed": s.activation_checkpointing,
                         "checkpointing": s.checkpointing, "capacity_gib": cluster.device_memory_gib})
            if args.baseline:  # the user's config today, on this cluster, at this batch
                from zerotune.tuner.baseline import load_baseline
                from zerotune.tuner.baseline_gain import compare
                baseline = load_baseline(args.baseline, model, cluster, args.global_batch)
                rows[-1]["baseline"] = compare(model, cluster, baseline, s, args.runner or "zerotune",
                                               global_batch=batch, elem_bytes=elem)
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows, indent=2))
        return ExitStatus.SUCCESS
    rings = f", run by {args.runner}" if args.runner else ""
    print(f"{model.name} ({count_label(model.num_params())} params), calibration {rows[0]['calibration']}{rings}")
    print(f"{'cluster':<14}{'strategy':<10}{'ranks':>6}{'TFLOPS/rank':>12}{'scaling':>9}{'step s':>9}"
          f"{'tokens/s':>11}{'mem GiB':>9}  {'fits':<5}{'x-node GB':>10}  {'error':>9}")
    bands: dict[str, list[str]] = {}
    for p in rows:
        fits = "yes" if p["feasible"] else f"no ({p['overflow']['category']})"
        band = p["error_band"]
        error = f"{band['row_median']:.0%}/{band['row_p90']:.0%}" if band else "-"
        if band:
            note = (f"figures {band['row_median']:.0%} median, {band['row_p90']:.0%} p90; comparisons of two "
                    f"strategies {band['comparison_median']:.0%} median, {band['comparison_p90']:.0%} p90 "
                    f"({band['source']})")
            if band.get("collectives"):
                note += f"; beyond it, {collectives_caveat(band['collectives'], advice=False)}"
            bands.setdefault(note, []).append(p["cluster"])
        print(f"{p['cluster']:<14}{p['strategy']:<10}{p['world_size']:>6}{p['tflops_per_rank']:>12.1f}"
              f"{p['scaling_efficiency']:>9.2f}{p['step_time_s']:>9.3f}{p['tokens_per_s']:>11.0f}"
              f"{p['memory_bytes']['peak'] / GIB:>9.1f}  {fits:<5}{p['cross_node_bytes'] / 1e9:>10.2f}  {error:>9}")
    for note, clusters in bands.items():
        print(f"error on {', '.join(dict.fromkeys(clusters))}: {note}")
    for p in rows:  # what each kept free beside its peak, and why
        print(f"memory on {p['cluster']}, {p['strategy']}: {memory_note(p, p['capacity_gib'])['reason']}")
    for p in rows:
        if p.get("baseline"):
            print(f"{p['strategy']} on {p['cluster']} {p['baseline']['sentence']}")
    lean = next((p["error_band"]["checkpointing"] for p in rows
                 if p["checkpointing"] == "full" and p["error_band"]
                 and p["error_band"].get("checkpointing")), None)
    if lean:  # a fully checkpointed prediction: the model's known lean on such runs (measured against none)
        print(f"checkpointed: {lean_sentence(lean)}; set against an uncheckpointed prediction, allow for it")
    if args.breakdown:
        _print_breakdown(rows)
    for p in rows:  # a DeepSpeed ZeRO-3 run: what its coordinator gathers and holds under its stage-3 settings
        if ds := p.get("deepspeed"):
            which = "zerotune's export" if ds["stage3_settings"] == "export" else "DeepSpeed's default"
            print(f"DeepSpeed on {p['cluster']} {p['strategy']} ({which} stage-3 settings): gathers its partitioned "
                  f"parameters {ds['gathered_per_step']:.2f} times a step ({ds['gathered_forward']:.2f} forward, "
                  f"{ds['gathered_backward']:.2f} backward) and holds at most "
                  f"{ds['held_peak_bytes'] / GIB:.2f} GiB of them gathered")
    for p in rows:  # a prediction that is mostly the host's pace says how to leave it
        wait, mbs = p["breakdown"]["host_wait_s"], p["global_batch"] // (p["world_size"] * p["grad_accum_steps"])
        if wait > 0.05 * p["step_time_s"]:
            print(f"host-bound on {p['cluster']} {p['strategy']}: {wait / p['step_time_s']:.0%} of the step waits for "
                  f"the host to issue a block's kernels ({mbs} sequence(s) per micro-step are too "
                  f"little device work per block); more sequences per micro-step (--set micro_batch_size=N) hide it")
    if any(p["error_band"] is None for p in rows):
        devices = sorted({p["calibration"] for p in rows
                          if p["error_band"] is None and p["calibration"].endswith(DEVICE_CALIBRATION_SUFFIX)})
        why = (f" ({', '.join(devices)}: the device's measured rates, on levels no published run was measured on)"
               if devices else "")
        print(f"error '-': nothing measured this calibration's error{why}; fit one on measured runs with "
              "'zerotune calibrate' to get its band")
    return ExitStatus.SUCCESS


Term = Literal["compute_s", "exposed_comm_s", "overlap_slowdown_s", "boundary_s", "optimizer_s", "overhead_s"]
BREAKDOWN: tuple[tuple[str, Term], ...] = (
    ("compute", "compute_s"), ("exposed", "exposed_comm_s"), ("slowdn", "overlap_slowdown_s"),
    ("bound.", "boundary_s"), ("optim.", "optimizer_s"), ("fixed", "overhead_s"))
"""The breakdown's terms, which add up to the step (``predict``): (column, key)."""


class PredictedRow(Prediction):
    """A row of ``zerotune predict``: the prediction, and what the command says of it beside."""

    cluster: str
    strategy: str
    scaling_efficiency: float
    """TFLOPS per rank over the first cluster's of the sweep."""
    cross_node_bytes: int
    checkpointed: bool
    checkpointing: str
    capacity_gib: float
    """The cluster's memory per rank."""
    baseline: NotRequired[dict[str, Any]]
    """With ``--baseline``: the gain over the user's config (``tuner.baseline_gain.compare``)."""


def _print_breakdown(rows: list[PredictedRow]) -> None:
    """Each prediction's step split into the terms that add up to it, and its communication, with the term beyond
    compute that costs most: what drives the difference between two rows."""
    print("where each step goes, seconds: compute (host wait included), communication not hidden behind it, the "
          "slow-down of compute beside collectives, the step boundary, the optimizer update, fixed overhead; "
          "comm = every collective's time, hidden or not; mem-bd = the part of compute in memory-bound kernels "
          "(LayerNorms, GELU, adds, the loss over the vocabulary); attn = the part in the attention kernel, and "
          "the fraction of peak it is charged at (on the FLOPs MFU counts: the whole square; a fused kernel's at its "
          "published rate for the model's sequence length and head size)")
    print(f"{'cluster':<14}{'strategy':<10}{'step s':>9}" + "".join(f"{c:>9}" for c, _ in BREAKDOWN)
          + f"{'comm':>9}{'mem-bd':>9}{'attn':>9}{'of peak':>8}  most beyond compute")
    for p in rows:
        b = p["breakdown"]
        terms = {k: b[k] for _, k in BREAKDOWN}
        beyond = max(BREAKDOWN[1:], key=lambda term: terms[term[1]])
        most = f"{beyond[0]} {terms[beyond[1]] / p['step_time_s']:.0%}" if terms[beyond[1]] > 0 else "-"
        print(f"{p['cluster']:<14}{p['strategy']:<10} {p['step_time_s']:>8.4g}"
              + "".join(f" {terms[k]:>8.4g}" for _, k in BREAKDOWN)
              + f" {b['comm_s']:>8.4g} {b['memory_bound_s']:>8.4g} {b['attention_s']:>8.4g}"
              f" {b['attention_of_peak']:>7.2f}  {most}")


def cmd_calibrate(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from zerotune.costmodel.calibration import fit, fit_options, save_calibration
    from zerotune.costmodel.measured import Measurement, bandwidths_from_clocks

    fields, start = fit_options(args.fit, args.fix)  # refuse bad options before reading any run
    runs = []
    for path in args.runs:
        try:
            runs.append(Measurement.from_run(json.loads(open(path).read()), path))
        except (OSError, json.JSONDecodeError) as exc:
            from zerotune.errors import SpecError

            raise SpecError("run", path, f"cannot read a run.json: {exc}") from None
    mode = args.bandwidths
    if mode == "auto" and bandwidths_from_clocks(runs):
        mode = "measured"  # gloo runs over hosts or namespaces: each level's seconds are its own links'
    tie = {"auto": None, "shared": True, "per-level": False, "measured": None}[mode]
    calib, stats = fit(runs, name=args.name, fields=fields, start=start, tie_levels=tie,
                       bandwidths="measured" if mode == "measured" else True)
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
    from zerotune.costmodel import calibration_for
    from zerotune.costmodel.calibration import before_after
    from zerotune.db import repository as repo
    from zerotune.db.migrate import upgrade
    from zerotune.db.session import make_engine, make_session_factory, session_scope

    start = calibration_for(runs[0].cluster)
    report = {"runs": len(runs), "cluster": runs[0].cluster.name, "start": start.name, "fit": stats,
              **before_after(runs, start, calib), "cross_validated": None, "source": "zerotune calibrate"}
    upgrade(url)
    engine = make_engine(url)
    try:
        with session_scope(make_session_factory(engine)) as s:
            if repo.get_calibration(session=s, name=calib.name) is not None:
                from zerotune.errors import SpecError

                raise SpecError("name", calib.name, "a calibration of that name is stored in --db already")
            repo.save_calibration(session=s, name=calib.name, cluster=runs[0].cluster.name,
                                  num_levels=runs[0].cluster.num_levels, calibration=calib.to_dict(), report=report)
    finally:
        engine.dispose()
    return f"{calib.name} for {runs[0].cluster.name}"
