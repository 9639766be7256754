"""Errors as responses: every bad input a 422 naming the field, the value and the rule; no 500s."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from zerotune.errors import FieldError, InputError, NotFoundError, ZerotuneError

log = logging.getLogger("zerotune.api")


def _value(value: Any) -> Any:
    """The offending value, kept short and JSON-safe."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf": JSON has no such numbers
    if isinstance(value, bool | int | float | str) or value is None:
        return value[:200] if isinstance(value, str) else value
    if isinstance(value, bytes):
        return value[:200].decode("utf-8", "replace")
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _field(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def unparsable(cause: BaseException) -> str:
    """Why a body that is not JSON's syntax error could not be read (FastAPI's bare 400 otherwise)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"is not valid UTF-8: byte {cause.object[cause.start:cause.start + 1]!r} at position {cause.start}"
    if isinstance(cause, RecursionError):
        return "is nested too deeply to parse"
    return f"could not be parsed as JSON ({type(cause).__name__})"


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on this request's path (Starlette's 405 names only the first
    route that matches the path: ``HEAD`` alone for ``/healthz``, whose ``GET`` is another route)."""
    routes = request.app.router.routes
    return [method for method in METHODS
            if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)]


def install(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Any:
        """A body FastAPI could not read (invalid UTF-8, nesting past the parser's limit) is bad input like
        any other: 422 on ``body``, not an undocumented 400."""
        if exc.status_code == 400 and exc.__cause__ is not None and request.method in ("POST", "PUT", "PATCH"):
            return JSONResponse({"detail": [{"field": "body", "value": None, "rule": unparsable(exc.__cause__)}]},
                                status_code=422)
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            loc = tuple(p for p in error.get("loc", ()) if not (isinstance(p, str) and p in (
                "str", "constrained-str", "ModelCreate", "HfConfigCreate", "ClusterCreate", "StrategyCreate",
                "function-after[_check()]")))
            problems.append({"field": _field(loc), "value": _value(error.get("input")), "rule": error.get("msg", "")})
        return JSONResponse({"detail": problems}, status_code=422)

    @app.exception_handler(ZerotuneError)
    async def zerotune_error(_: Request, exc: ZerotuneError) -> JSONResponse:
        """The one mapping of zerotune's error family to HTTP: a missing row or name 404, bad input 422 with
        each problem's field, value and rule."""
        if isinstance(exc, NotFoundError):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        if isinstance(exc, InputError):
            problems = exc.problems
        elif isinstance(exc, FieldError):
            problems = [exc.as_detail()]
        else:  # a study that could not answer, raised while serving: the request cannot be met as it is
            problems = [{"field": "body", "value": None, "rule": str(exc)}]
        return JSONResponse({"detail": [{**p, "value": _value(p["value"])} for p in problems]}, status_code=422)

    @app.exception_handler(OperationalError)
    async def database_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable: %s", exc)
        return JSONResponse({"detail": f"database unavailable: {type(exc.orig).__name__}; retry shortly"},
                            status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: say so, log the traceback
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the service log"},
                            status_code=500)
