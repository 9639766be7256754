"""Build the FastAPI app: ``create_app(settings)``; ``zerotune serve`` runs it under uvicorn."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine
from starlette.middleware.trustedhost import TrustedHostMiddleware

from zerotune.api import http_errors
from zerotune.api.cache import FastAnswer
from zerotune.api.dashboard import views as dashboard
from zerotune.api.guard import BodyGuard
from zerotune.api.metrics import RequestMetrics
from zerotune.api.routes import calibrations, jobs, presets, probes, recommendations, studies, trials
from zerotune.api.schemas import Message, ValidationErrorPublic
from zerotune.api.service import Service
from zerotune.api.settings import Settings

DESCRIPTION = """POST a model and a cluster, get a recommended partition strategy (ZeRO-3, ZeRO++,
hierarchical) with DeepSpeed and FSDP2 exports. Studies run in workers, never in the request path;
identical requests share one job. Writes need `Authorization: Bearer <token>` when the service has
`ZEROTUNE_TOKEN` set. Every bad input is a 422 naming the field, the value and the rule."""


def create_app(settings: Settings | None = None, *, engine: Engine | None = None) -> FastAPI:
    """The service's ASGI app. ``engine``: a database of the caller's instead of ``settings``' URL."""
    settings = settings or Settings()
    service = Service(settings, engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        gc.collect()
        gc.freeze()  # the app's long-lived objects (schemas, routes, ORM) stay out of every later collection
        try:
            yield
        finally:
            service.stop()

    # /docs from assets installed with fastapi-offline: the API page works with no network, as the dashboard
    # does (FastAPI's own page loads Swagger UI from a CDN). No /redoc: ReDoc's bundle fetches its logo from one.
    app = FastAPIOffline(title="zerotune", version="0.1.0", description=DESCRIPTION, lifespan=lifespan, redoc_url=None,
                  responses={422: {"model": ValidationErrorPublic, "description": "Bad input: field, value, rule."},
                             413: {"model": Message, "description": "Body over ZEROTUNE_MAX_BODY_MB."},
                             503: {"model": Message, "description": "No room for the body now "
                                   "(ZEROTUNE_BODY_MEMORY_MB), or the database is away: retry after Retry-After."}})
    app.state.service = service
    http_errors.install(app)
    for module in (recommendations, jobs, studies, trials, calibrations, presets, probes):
        app.include_router(module.router)
    dashboard.install(app)  # the HTML pages under /dashboard, their JSON aggregates, static files

    token = settings.token.get_secret_value() if settings.token else None
    # added last = runs first: Host, then the token and body size (BodyGuard), then the cached fast path
    app.add_middleware(FastAnswer, cache=service.cache, lookup=service.fast_answer)
    app.add_middleware(BodyGuard, token=token, max_body_bytes=int(settings.max_body_mb * 2**20),
                       body_memory_bytes=int(settings.body_memory_mb * 2**20), body_wait_s=settings.body_wait_s,
                       body_timeout_s=settings.body_timeout_s)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.hosts())
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    return app
