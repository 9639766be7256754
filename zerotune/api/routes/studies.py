"""Studies and their trials (what the dashboard reads)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from zerotune.api import queries
from zerotune.api.deps import Id, SessionDep
from zerotune.api.schemas import (
    MAX_ID,
    Message,
    StudiesPublic,
    StudyDetailPublic,
    StudyPublic,
    TrialPublic,
    TrialsPublic,
)
from zerotune.db import repository as repo
from zerotune.errors import NotFoundError

router = APIRouter(prefix="/v1/studies", tags=["studies"])

Offset = Annotated[int, Query(ge=0, le=MAX_ID, description="rows to skip")]
Limit = Annotated[int, Query(ge=1, le=500, description="rows per page")]
TrialStatus = Literal["queued", "running", "complete", "failed", "pruned", "infeasible"]


@router.get("", response_model=StudiesPublic)
def read_studies(session: SessionDep, offset: Offset = 0, limit: Limit = 50,
                 request_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None) -> StudiesPublic:
    """Studies, newest first."""
    rows, count = repo.list_studies(session=session, offset=offset, limit=limit, request_id=request_id)
    return StudiesPublic(data=[StudyPublic.model_validate(r, from_attributes=True) for r in rows], count=count)


@router.get("/{study_id}", response_model=StudyDetailPublic, responses={404: {"model": Message}})
def read_study(study_id: Id, session: SessionDep) -> StudyDetailPublic:
    """A study with its request, trial counts by status, best trial and recommendation."""
    study = repo.get_study(session=session, study_id=study_id)
    if study is None:
        raise NotFoundError("study", study_id)
    return queries.study_detail(session, study)


@router.get("/{study_id}/trials", response_model=TrialsPublic, responses={404: {"model": Message}})
def read_study_trials(study_id: Id, session: SessionDep, offset: Offset = 0, limit: Limit = 100,
                      status: Annotated[TrialStatus | None, Query(description="only trials in this status")] = None,
                      ) -> TrialsPublic:
    """A study's trials in the order they were added (metrics and logs: GET /v1/trials/{id})."""
    if repo.get_study(session=session, study_id=study_id) is None:
        raise NotFoundError("study", study_id)
    rows, count = repo.list_trials(session=session, study_id=study_id, status=status, offset=offset, limit=limit)
    return TrialsPublic(data=[TrialPublic.model_validate(r, from_attributes=True) for r in rows], count=count)
