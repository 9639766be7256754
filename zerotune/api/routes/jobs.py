"""Jobs: follow a study's progress, or cancel it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from starlette.concurrency import run_in_threadpool

from zerotune.api import queries
from zerotune.api.deps import Id, ServiceDep, WriteAccess
from zerotune.api.schemas import JobPublic, Message
from zerotune.db import repository as repo
from zerotune.db.session import session_scope
from zerotune.errors import NotFoundError

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.get("/{job_id}", response_model=JobPublic, responses={404: {"model": Message}})
async def read_job(job_id: Id, service: ServiceDep) -> JobPublic:
    """State, progress, trials done, best so far, and the error of a failed or cancelled job."""
    def read() -> tuple[JobPublic, str, bytes | None]:
        with session_scope(service.sessions) as s:
            job = repo.get_job(session=s, job_id=job_id)
            if job is None:
                raise NotFoundError("job", job_id)
            view = queries.job_public(s, job)
            answer = queries.served_answer(s, view.request_key) if job.state == "done" else None
            return view, view.request_key, answer

    view, key, answer = await run_in_threadpool(read)
    if view.state not in ("queued", "running"):
        service.ended(key, view, answer)
    return view


@router.delete("/{job_id}", response_model=JobPublic, dependencies=[WriteAccess],
               responses={404: {"model": Message}, 409: {"model": Message, "description": "The job already ended."},
                          401: {"model": Message}})
async def cancel_job(job_id: Id, service: ServiceDep) -> JobPublic:
    """Cancel a queued or running job; its worker stops after the trial in progress."""
    def cancel() -> JobPublic:
        with session_scope(service.sessions) as s:
            job = repo.cancel_job(session=s, job_id=job_id, reason=f"cancelled by a client (DELETE /v1/jobs/{job_id})")
            return queries.job_public(s, job)

    try:
        view = await run_in_threadpool(cancel)
    except ValueError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    service.ended(view.request_key, view)
    return view
