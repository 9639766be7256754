"""Liveness, readiness, the workers list and Prometheus metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from zerotune.api.deps import ServiceDep
from zerotune.api.schemas import Health, WorkerPublic, WorkersPublic
from zerotune.db import repository as repo
from zerotune.db.models import utcnow
from zerotune.db.session import session_scope

router = APIRouter(tags=["health"])


@router.head("/healthz", include_in_schema=False)
@router.head("/metrics", include_in_schema=False)
async def head_probe() -> Response:
    """HEAD for the probes that monitors send it to: the process answers (no body)."""
    return Response(status_code=200)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process answers (no database access: a liveness probe)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "Not ready."}})
async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when the database answers at the current schema and the embedded workers are alive.

    ``checks.workers.live`` counts every worker heard from within ``stale_after_s`` — embedded ones
    and ``zerotune worker`` processes on other machines alike (informational: a service with no
    live worker still accepts requests; their jobs wait in the queue)."""
    from zerotune.db.migrate import head

    checks: dict[str, object] = {}
    ok = True

    def revision() -> str | None:
        from zerotune.db.migrate import revision_of

        return revision_of(service.engine)

    live: int | None = None
    try:
        current = await run_in_threadpool(revision)
        checks["database"] = "ok" if current == head() else f"schema at {current}, expected {head()}"
        ok = current == head()
        if ok:
            live = len(await run_in_threadpool(_live_workers, service))
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
        ok = False
    expected = service.settings.workers
    alive = service.pool.alive() if service.pool is not None else 0
    checks["workers"] = {"embedded_alive": alive, "embedded_expected": expected, "live": live}
    ok = ok and alive == expected
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


def _live_workers(service: Any) -> list[WorkerPublic]:
    since = utcnow() - timedelta(seconds=service.settings.stale_after_s)
    with session_scope(service.sessions) as s:
        return [WorkerPublic.model_validate(w, from_attributes=True) for w in repo.live_workers(session=s, since=since)]


@router.get("/v1/workers", response_model=WorkersPublic, tags=["workers"])
async def read_workers(service: ServiceDep) -> WorkersPublic:
    """Worker processes heard from within ``stale_after_s`` (embedded and remote), oldest first."""
    rows = await run_in_threadpool(_live_workers, service)
    return WorkersPublic(data=rows, count=len(rows))


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format 0.0.4."}})
async def metrics(service: ServiceDep) -> PlainTextResponse:
    """Requests, recommendation outcomes, cache hits, jobs by state and trials by status."""
    def counts() -> tuple[dict[str, int], dict[str, int], int]:
        with session_scope(service.sessions) as s:
            return repo.job_counts(session=s), repo.trial_counts(session=s), len(_live_workers(service))

    live: int | None
    try:
        jobs, trials, live = await run_in_threadpool(counts)
    except Exception:  # the counters still say something useful without the database
        jobs, trials, live = {}, {}, None
    cache = service.cache
    body = service.metrics.render(cache_hits=cache.hits, cache_misses=cache.misses, cache_size=len(cache.answers),
                                  jobs=jobs, trials=trials,
                                  workers_alive=service.pool.alive() if service.pool is not None else 0,
                                  workers_expected=service.settings.workers, workers_live=live)
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4")
