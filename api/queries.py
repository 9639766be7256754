"""The few reads the service needs beyond ``db.repository``, and rows turned into response bodies."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api import schemas
from db import repository as repo
from db.models import Job, Recommendation, Request, Study, Trial


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None and NUL characters dropped (JSON- and PostgreSQL-safe)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {finite(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def served_recommendation(session: Session, key: str) -> Recommendation | None:
    """The newest recommendation for ``key`` whose study finished: a stopped study's partial answer is never served."""
    query = (select(Recommendation).join(Study, Study.id == Recommendation.study_id)
             .where(Recommendation.request_key == key, Study.state == "done")
             .order_by(Recommendation.id.desc()).limit(1))
    return session.scalars(query).first()


def recommendation_public(row: Recommendation) -> schemas.RecommendationPublic:
    metrics = row.metrics or {}
    value = metrics.get("tflops_per_rank")
    return schemas.RecommendationPublic(
        id=row.id, request_key=row.request_key, study_id=row.study_id, trial_id=row.trial_id,
        runner_up_trial_id=row.runner_up_trial_id, strategy=row.strategy, value=value if isinstance(value, float | int)
        else None, evidence=row.evidence,  # type: ignore[arg-type]  # the table's CHECK constraint holds it to these
        margin=row.margin, metrics=metrics, exports=row.exports,
        created_at=row.created_at)


def answer_bytes(row: Recommendation) -> bytes:
    """A recommendation serialized once, as every repeat request gets it."""
    return recommendation_public(row).model_dump_json().encode()


def job_public(session: Session, job: Job) -> schemas.JobPublic:
    """A job with what a client polls for: progress, best so far, the recommendation once done."""
    request = session.get(Request, job.request_id)
    assert request is not None, f"job {job.id} without its request"
    best = repo.best_trial(session=session, study_id=job.study_id) if job.study_id else None
    rec = served_recommendation(session, request.key) if job.state == "done" else None
    return schemas.JobPublic(
        id=job.id, state=job.state,  # type: ignore[arg-type]  # CHECK constraint
        progress=job.progress, trials_done=job.trials_done,
        trials_total=int((request.budget or {}).get("trials") or 0), best_value=best.value if best else None,
        error=job.error, request_key=request.key, request_id=request.id, study_id=job.study_id,
        recommendation_id=rec.id if rec else None,
        worker=job.worker, created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
        heartbeat_at=job.heartbeat_at)


def study_detail(session: Session, study: Study) -> schemas.StudyDetailPublic:
    counts = dict(session.execute(select(Trial.status, func.count()).where(Trial.study_id == study.id)
                                  .group_by(Trial.status)).all())
    best = repo.best_trial(session=session, study_id=study.id)
    request = session.get(Request, study.request_id)
    assert request is not None
    rec = session.scalars(select(Recommendation).where(Recommendation.study_id == study.id)
                          .order_by(Recommendation.id.desc()).limit(1)).first()
    return schemas.StudyDetailPublic(
        **schemas.StudyPublic.model_validate(study, from_attributes=True).model_dump(),
        request=schemas.RequestPublic.model_validate(request, from_attributes=True),
        trial_counts={str(k): int(v) for k, v in counts.items()}, best_trial_id=best.id if best else None,
        best_value=best.value if best else None, recommendation_id=rec.id if rec else None)


def counts_by(session: Session, column: Any) -> dict[str, int]:
    """Rows per value of ``column`` (jobs by state, trials by status) for /metrics."""
    return {str(k): int(v) for k, v in session.execute(select(column, func.count()).group_by(column)).all()}


def jobs_by_state(session: Session) -> dict[str, int]:
    return counts_by(session, Job.state)


def trials_by_status(session: Session) -> dict[str, int]:
    return counts_by(session, Trial.status)


def cancel_job(session: Session, job_id: int, reason: str) -> Job:
    """Cancel a queued or running job (its worker stops after the current trial).

    Raises:
        NotFoundError: no such job. ValueError: the job has already ended (its state says how).
    """
    from sqlalchemy import update

    from db.models import utcnow

    done = session.execute(update(Job).where(Job.id == job_id, Job.state.in_(repo.ACTIVE_JOB_STATES))
                           .values(state="cancelled", error=reason, finished_at=utcnow()).returning(Job.id))
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise repo.NotFoundError(f"no job with id {job_id}")
    if done.scalar_one_or_none() is None:
        raise ValueError(f"job {job_id} has already ended ({job.state}); nothing to cancel")
    return job
