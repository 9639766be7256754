"""Calibrations of the cost model refitted from measured trials, with their error before and after."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from zerotune.api.deps import SessionDep
from zerotune.api.schemas import MAX_ID, CalibrationPublic, CalibrationsPublic, Message
from zerotune.db import repository as repo
from zerotune.errors import NotFoundError

router = APIRouter(prefix="/v1/calibrations", tags=["calibrations"])


@router.get("", response_model=CalibrationsPublic)
def read_calibrations(session: SessionDep, offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
                      limit: Annotated[int, Query(ge=1, le=500)] = 50) -> CalibrationsPublic:
    """Stored calibrations, newest first: the newest for a cluster is what its next study predicts with."""
    rows, count = repo.list_calibrations(session=session, offset=offset, limit=limit)
    return CalibrationsPublic(data=[CalibrationPublic.model_validate(r, from_attributes=True) for r in rows],
                              count=count)


@router.get("/{name}", response_model=CalibrationPublic, responses={404: {"model": Message}})
def read_calibration(name: Annotated[str, Path(min_length=1, max_length=128)],
                     session: SessionDep) -> CalibrationPublic:
    """One stored calibration by name (``"calibration"`` in a request body names it)."""
    row = repo.get_calibration(session=session, name=name)
    if row is None:
        raise NotFoundError("calibration", name, f"no calibration named {name!r}")
    return CalibrationPublic.model_validate(row, from_attributes=True)
