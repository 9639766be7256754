"""``zerotune serve | worker | health | db``: the service, its workers, its health check and its database."""

from __future__ import annotations

import argparse
import errno
import json
import socket
import sys
from collections.abc import Mapping
from typing import Any

from zerotune.api.cli import ExitStatus


def add_parsers(sub: Any, env: Mapping[str, str]) -> None:
    """Add this group's commands to ``sub``."""
    p = sub.add_parser("serve", help="the HTTP service (FastAPI under uvicorn) with embedded workers")
    p.add_argument("--host", help="address to listen on (ZEROTUNE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (ZEROTUNE_PORT, default 8000)")
    p.add_argument("--db", help="SQLAlchemy URL (ZEROTUNE_DB or ZEROTUNE_DB_FILE; default: SQLite under the user's "
                                "data directory). A URL with a password belongs in ZEROTUNE_DB, not here: argv is "
                                "public")
    p.add_argument("--workers", type=int, help="embedded worker processes (ZEROTUNE_WORKERS, default 1; 0: none)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run studies for the service: claim jobs from a shared database")
    p.add_argument("--db", help="SQLAlchemy URL of the service's database (ZEROTUNE_DB or ZEROTUNE_DB_FILE), e.g. "
                                "postgresql://...; a URL with a password belongs in ZEROTUNE_DB, not here")
    p.add_argument("--max-jobs", type=int, help="exit after this many jobs (default: run until stopped)")
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # embedded: stop when the service is gone
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("health", help="check that a service answers (exit 0) or not (exit 1)")
    p.add_argument("--url", default=env.get("ZEROTUNE_URL"),
                   help="the service (ZEROTUNE_URL; default http://127.0.0.1:$ZEROTUNE_PORT)")
    p.add_argument("--ready", action="store_true", help="ask /readyz (database and workers) instead of /healthz")
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=cmd_health)

    p = sub.add_parser("db", help="database maintenance")
    dbsub = p.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)
    q = dbsub.add_parser("upgrade", help="apply the schema migrations (idempotent)")
    q.add_argument("--db", help="SQLAlchemy URL (ZEROTUNE_DB, as the service reads it; default: SQLite under the "
                                "user's data directory)")
    q.add_argument("--revision", default="head")
    q.set_defaults(func=cmd_db)


def cmd_serve(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The HTTP service with its embedded workers, until Ctrl-C or SIGTERM."""
    import uvicorn

    from zerotune.api.app import create_app
    from zerotune.api.connections import default_max_connections, protocol

    settings = service_settings(db=args.db, host=args.host, port=args.port, workers=args.workers)
    sock = _listen(settings.host, settings.port)
    _log_to_stderr(args.debug)
    print(f"zerotune: serving on http://{settings.host}:{settings.port} (database {_safe_url(settings.url())}, "
          f"{settings.workers} embedded worker(s){', token required for writes' if settings.token else ''})",
          file=sys.stderr)
    # uvicorn has no deadline for a request head and no ceiling on connections: api.connections adds both
    http = protocol(settings.header_timeout_s, settings.max_connections or default_max_connections())
    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_level="info",
                            access_log=args.access_log, timeout_graceful_shutdown=5, http=http)
    uvicorn.Server(config).run(sockets=[sock])
    return ExitStatus.SUCCESS

def _listen(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound before anything starts: a busy port or an address this
    host does not have is one line and exit 2, not "serving on ..." followed by a traceback."""
    from zerotune.errors import SpecError

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

def cmd_worker(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Claim jobs from the database and run their studies until Ctrl-C or SIGTERM."""
    from zerotune.tuner.worker import serve_worker

    settings = service_settings(db=args.db)
    _log_to_stderr(args.debug)
    serve_worker(settings, settings.url(), parent_pid=args.parent_pid, max_jobs=args.max_jobs)
    return ExitStatus.SUCCESS

def cmd_health(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Exit 0 when the service answers /healthz (or /readyz with --ready): the container health check."""
    from zerotune.api.prologue.client import Client, ServiceError

    url = args.url or f"http://127.0.0.1:{env.get('ZEROTUNE_PORT', '8000')}"
    try:
        _, _, body = Client(url, timeout=args.timeout).request("GET", "/readyz" if args.ready else "/healthz")
    except ServiceError as exc:
        print(f"zerotune: error: {url}: {exc}", file=sys.stderr)
        return ExitStatus.ERROR
    print(json.dumps(body))
    return ExitStatus.SUCCESS

def cmd_db(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from zerotune.db.migrate import current, prepare_optuna_storage, upgrade

    url = service_settings(db=args.db).url()  # what the service opens: --db, ZEROTUNE_DB, default
    upgrade(url, args.revision)
    if args.revision == "head":
        prepare_optuna_storage(url)  # Optuna's own tables too, so optuna-dashboard can open the database at once
    print(f"zerotune: database {_safe_url(url)} at revision {current(url)}", file=sys.stderr)
    return ExitStatus.SUCCESS

def service_settings(**overrides: Any) -> Any:
    """Service settings from ZEROTUNE_* variables, with command-line flags on top."""
    from pydantic import ValidationError

    from zerotune.api.settings import Settings
    from zerotune.errors import SpecError

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

def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
