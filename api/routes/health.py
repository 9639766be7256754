"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from api import queries
from api.deps import ServiceDep
from api.schemas import Health
from db.session import session_scope

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process answers (no database access: a liveness probe)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "Not ready."}})
async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when the database answers at the current schema and the embedded workers are alive."""
    from db.migrate import head

    checks: dict[str, object] = {}
    ok = True

    def revision() -> str | None:
        from alembic.runtime.migration import MigrationContext

        from db.migrations import VERSION_TABLE

        with service.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()

    try:
        current = await run_in_threadpool(revision)
        checks["database"] = "ok" if current == head() else f"schema at {current}, expected {head()}"
        ok = current == head()
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
        ok = False
    expected = service.settings.workers
    alive = service.pool.alive() if service.pool is not None else 0
    checks["workers"] = {"embedded_alive": alive, "embedded_expected": expected}
    ok = ok and alive == expected
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format 0.0.4."}})
async def metrics(service: ServiceDep) -> PlainTextResponse:
    """Requests, recommendation outcomes, cache hits, jobs by state and trials by status."""
    def counts() -> tuple[dict[str, int], dict[str, int]]:
        with session_scope(service.sessions) as s:
            return queries.jobs_by_state(s), queries.trials_by_status(s)

    try:
        jobs, trials = await run_in_threadpool(counts)
    except Exception:  # the counters still say something useful without the database
        jobs, trials = {}, {}
    cache = service.cache
    body = service.metrics.render(cache_hits=cache.hits, cache_misses=cache.misses, cache_size=len(cache.answers),
                                  jobs=jobs, trials=trials,
                                  workers_alive=service.pool.alive() if service.pool is not None else 0,
                                  workers_expected=service.settings.workers)
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4")
