"""Trials: read one with its run.json metrics and logs, or upload one measured elsewhere."""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from zerotune.api.deps import Id, ServiceDep, SessionDep, WriteAccess
from zerotune.api.inputs import TrialCreate
from zerotune.api.schemas import Message, TrialDetailPublic
from zerotune.api.uploads import store_run
from zerotune.db import repository as repo
from zerotune.db.session import session_scope
from zerotune.errors import NotFoundError

router = APIRouter(prefix="/v1/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialDetailPublic, responses={404: {"model": Message}})
def read_trial(trial_id: Id, session: SessionDep) -> TrialDetailPublic:
    """A trial with its metrics (run.json or prediction), the cost model's prediction and its logs."""
    trial = repo.get_trial(session=session, trial_id=trial_id)
    if trial is None:
        raise NotFoundError("trial", trial_id)
    return TrialDetailPublic.model_validate(trial, from_attributes=True)


@router.post("", status_code=201, response_model=TrialDetailPublic, dependencies=[WriteAccess],
             responses={200: {"model": TrialDetailPublic, "description": "The same run.json was stored before."},
                        201: {"description": "Stored; Location: /v1/trials/{id}."},
                        401: {"model": Message}})
async def create_trial(run: TrialCreate, service: ServiceDep, response: Response) -> TrialDetailPublic:
    """Store a benchmark trial measured elsewhere (``zerotune upload run.json``) as measured evidence."""
    def store() -> tuple[TrialDetailPublic, bool]:
        with session_scope(service.sessions) as s:
            trial, created = store_run(session=s, run=run)
            return TrialDetailPublic.model_validate(trial, from_attributes=True), created

    trial, created = await run_in_threadpool(store)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/trials/{trial.id}"
    return trial
