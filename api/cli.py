"""The ``zerotune`` command line.

Each subcommand imports what it needs when it runs, so ``zerotune --help`` and the light commands
stay fast and never load torch. ``main(argv, env)`` returns an :class:`ExitStatus`; tests call it
directly with injected arguments. Expected failures print one line on stderr (the traceback only
with ``--debug``).
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any


class ExitStatus(enum.IntEnum):
    """Exit codes of every ``zerotune`` command."""

    SUCCESS = 0
    ERROR = 1
    """An unexpected failure (a bug or a failed run); details on stderr."""
    USAGE_ERROR = 2
    """Bad arguments or an invalid spec: the message names the field, value and rule."""
    INTERRUPTED = 130
    """Ctrl-C."""


def _parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["weight_bits=16", "secondary_span=null"]`` → ``{"weight_bits": 16, "secondary_span": None}``."""
    from strategies.errors import SpecError

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SpecError("--set", pair, "must look like FIELD=VALUE (e.g. weight_bits=16)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def cmd_catalog(args: argparse.Namespace) -> int:
    from strategies.catalog import catalog

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
        print(f"  {name:<14} {m['num_params'] / 1e9:8.3f} B params  layers={m['layers']} hidden={m['hidden']} "
              f"heads={m['heads']} seq={m['seq_len']}")
    print("strategies:")
    for name, doc in data["strategies"].items():
        print(f"  {name:<10} {doc}")
    return ExitStatus.SUCCESS


def cmd_validate(args: argparse.Namespace) -> int:
    from strategies.catalog import build_strategy, parse_cluster, parse_model

    cluster = parse_cluster(args.cluster)
    strategy = build_strategy(args.strategy, cluster, **_parse_overrides(args.set))
    out: dict[str, Any] = {"cluster": cluster.to_dict(), "world_size": cluster.world_size,
                           "strategy": strategy.to_dict()}
    if args.model:
        model = parse_model(args.model)
        out["model"] = {**model.to_dict(), "num_params": model.num_params(),
                        "flops_per_token": model.flops_per_token()}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        spans = f"P/G/OS spans {strategy.param_span}/{strategy.grad_span}/{strategy.optim_span}"
        hpz = f", hpZ span {strategy.secondary_span}" if strategy.secondary_span is not None else ""
        bits = f", weights {strategy.weight_bits}-bit, grads {strategy.grad_bits}-bit"
        print(f"ok: {strategy.name or 'strategy'} on {cluster.name} ({cluster.world_size} ranks): {spans}{hpz}{bits}")
    return ExitStatus.SUCCESS


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
    p.add_argument("--model", help="model preset or JSON file (prints its size)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a strategy field, e.g. --set weight_bits=16 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the resolved values as JSON")
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one ``zerotune`` command; return its exit status."""
    del env  # reserved: commands that read ZEROTUNE_* settings take them from here
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage line
        return ExitStatus.SUCCESS if exc.code == 0 else ExitStatus.USAGE_ERROR
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitStatus.USAGE_ERROR
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("zerotune: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except Exception as exc:
        from strategies.errors import SpecError

        if args.debug or os.environ.get("ZEROTUNE_DEBUG"):
            raise
        if isinstance(exc, SpecError):
            print(f"zerotune: error: {exc}", file=sys.stderr)
            return ExitStatus.USAGE_ERROR
        print(f"zerotune: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return ExitStatus.ERROR


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
