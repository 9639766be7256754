"""The ``zerotune`` command line: one module per command group, one error path.

- ``model``: catalog, validate, predict, calibrate (presets and the cost model);
- ``study``: tune (a study without a server);
- ``runs``: train, upload (short runs of the trainer, and their run.json sent to a service);
- ``service``: serve, worker, health, db;
- ``recommend``: the Slurm prologue client (standard library only).

Each command is ``cmd(args, env) -> int`` and imports what it needs when it runs, so ``zerotune
--help`` and the light commands stay fast and never load torch. ``main(argv, env)`` returns an
:class:`ExitStatus`; tests call it directly with injected arguments and environment. Every command's
errors go through :func:`run`: an error zerotune raises on purpose (``zerotune.errors``) is one line on
stderr and its exit status; anything else is a bug, one line too (the traceback with ``--debug``).
This module is standard library only: ``zerotune recommend`` imports it.
"""

from __future__ import annotations

import argparse
import enum
import sys
from collections.abc import Callable, Mapping, Sequence


class ExitStatus(enum.IntEnum):
    """Exit codes of every ``zerotune`` command (3-6: ``zerotune recommend``, docs/prologue.md)."""

    SUCCESS = 0
    """Done. For ``recommend``: the service's answer, or (without ``--strict``) a fallback, with a warning."""
    ERROR = 1
    """An unexpected failure (a bug, a failed run or study, an output file that cannot be written); details on
    stderr."""
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


Command = Callable[[argparse.Namespace, Mapping[str, str]], int]
GROUPS = ("modeling", "runs", "tune", "serving", "recommend")
"""The command groups, in the order ``zerotune --help`` lists their commands."""
DESCRIPTION = "Pick the partition strategy for sharded LLM training."


def exit_status(exc: BaseException) -> ExitStatus:
    """The exit status of an error zerotune raised on purpose: bad input or a name that does not exist is
    the caller's to fix (2); a study that could not answer is a failure (1)."""
    from zerotune.errors import FieldError

    return ExitStatus.USAGE_ERROR if isinstance(exc, FieldError) else ExitStatus.ERROR


def run(command: Command, args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run one command: the one place where its errors become a line on stderr and an exit status."""
    from zerotune.errors import ZerotuneError

    try:
        return int(command(args, env))
    except KeyboardInterrupt:
        print("zerotune: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except ZerotuneError as exc:
        print(f"zerotune: error: {exc}", file=sys.stderr)
        return exit_status(exc)
    except Exception as exc:
        if getattr(args, "debug", False) or env.get("ZEROTUNE_DEBUG"):
            raise
        print(f"zerotune: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return ExitStatus.ERROR


def build_parser(env: Mapping[str, str] | None = None, groups: Sequence[str] = GROUPS) -> argparse.ArgumentParser:
    """The parser of the commands of ``groups``; defaults named after ZEROTUNE_* variables come from ``env``."""
    import importlib
    import os

    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog="zerotune", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in groups:
        importlib.import_module(f"zerotune.api.cli.{group}").add_parsers(sub, env)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (after the global ``--debug``), or None."""
    for arg in argv:
        if arg != "--debug":
            return None if arg.startswith("-") else arg
    return None


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one ``zerotune`` command; return its exit status."""
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    # the prologue client parses its own command alone: nothing but the standard library is imported
    parser = build_parser(env, ("recommend",) if _command(argv) == "recommend" else GROUPS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage line
        return ExitStatus.SUCCESS if exc.code == 0 else ExitStatus.USAGE_ERROR
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitStatus.USAGE_ERROR
    args.argv = argv[argv.index(args.command) + 1:]  # what followed the command, as given (train passes it on)
    warn_secret_in_argv(getattr(args, "db", None))
    return run(args.func, args, env)


def has_password(url: str) -> bool:
    """Whether a database URL carries a password (``postgresql://user:PW@host/db``)."""
    from urllib.parse import urlsplit

    try:
        return bool(urlsplit(url).password)
    except ValueError:  # not a URL the database layer would take either; it says so itself
        return False


def warn_secret_in_argv(db: str | None) -> None:
    """One line on stderr when ``--db`` holds a password: any user of the host reads a process's argv (``ps``)."""
    if db and has_password(db):
        print("zerotune: warning: --db holds a password, which any user of this host can read in the process list; "
              "set ZEROTUNE_DB or ZEROTUNE_DB_FILE (a file holding the URL) instead", file=sys.stderr)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


