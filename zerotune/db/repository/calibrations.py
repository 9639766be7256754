"""Calibrations: refitted cost-model constants, stored by name and cluster."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from zerotune.db.models import (
    StoredCalibration,
)
from zerotune.db.repository._common import (
    JsonDict,
    _page,
    json_safe,
)


def save_calibration(
    *, session: Session, name: str, cluster: str, num_levels: int, calibration: JsonDict, report: JsonDict,
    study_id: int | None = None,
) -> StoredCalibration:
    """Store a calibration of the cost model for ``cluster`` (a cluster name, e.g. ``local:2x2``).

    Args:
        name: unique; a second calibration under the same name is refused.
        report: how it was made and its error before and after (``costmodel.calibration.refit``).
    """
    if not name or len(name) > 128:
        raise ValueError(f"name={name!r}: must be 1-128 characters")
    row = StoredCalibration(name=name, cluster=cluster, family=cluster.partition(":")[0], num_levels=num_levels,
                            calibration=json_safe(calibration), report=json_safe(report), study_id=study_id)
    session.add(row)
    session.flush()
    return row


def get_calibration(*, session: Session, name: str) -> StoredCalibration | None:
    """The stored calibration called ``name``, or None."""
    return session.scalars(select(StoredCalibration).where(StoredCalibration.name == name)).one_or_none()


def calibration_for_cluster(*, session: Session, cluster: str, num_levels: int) -> StoredCalibration | None:
    """The calibration a study on ``cluster`` starts from: the newest stored for that very cluster, else
    the newest for the same family (the name before ``:``) with the same number of levels."""
    newest = select(StoredCalibration).order_by(StoredCalibration.id.desc()).limit(1)
    exact = session.scalars(newest.where(StoredCalibration.cluster == cluster)).first()
    if exact is not None:
        return exact
    return session.scalars(newest.where(StoredCalibration.family == cluster.partition(":")[0],
                                        StoredCalibration.num_levels == num_levels)).first()


def list_calibrations(*, session: Session, offset: int = 0, limit: int = 100) -> tuple[list[StoredCalibration], int]:
    """Stored calibrations, newest first, and their total count."""
    return _page(session, select(StoredCalibration).order_by(StoredCalibration.id.desc()), offset, limit)


def calibration_of_study(*, session: Session, study_id: int) -> StoredCalibration | None:
    """The newest calibration a study's measured runs refitted."""
    return session.scalars(select(StoredCalibration).where(StoredCalibration.study_id == study_id)
                           .order_by(StoredCalibration.id.desc()).limit(1)).first()
