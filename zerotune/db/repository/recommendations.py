"""Recommendations: a study's answer, and the one served for a request key."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from zerotune.db.models import (
    EVIDENCE_KINDS,
    Recommendation,
    Study,
)
from zerotune.db.repository._common import (
    JsonDict,
    JsonObject,
    _check,
    _check_key,
    json_safe,
)


def save_recommendation(
    *, session: Session, study_id: int, request_key: str, strategy: JsonDict, metrics: JsonObject, evidence: str,
    exports: JsonDict, margin: float | None = None, runner_up_trial_id: int | None = None,
    trial_id: int | None = None,
) -> Recommendation:
    """Store a study's recommendation; the newest one per ``request_key`` is the one served.

    Args:
        evidence: ``predicted``, ``proxy-verified`` or ``measured``.
        exports: ``{"zerotune": ..., "deepspeed": ..., "fsdp": ...}``.
        margin: relative margin of the chosen trial over ``runner_up_trial_id``.
    """
    _check_key("request_key", request_key)
    recommendation = Recommendation(
        study_id=study_id, request_key=request_key, strategy=strategy, metrics=json_safe(metrics),
        evidence=_check("evidence", evidence, EVIDENCE_KINDS), exports=exports, margin=margin,
        runner_up_trial_id=runner_up_trial_id, trial_id=trial_id)
    session.add(recommendation)
    session.flush()
    return recommendation




def served_recommendation(*, session: Session, request_key: str) -> Recommendation | None:
    """The newest recommendation for ``request_key`` whose study finished (state ``done``).

    What the service answers with: a stopped or failed study's partial answer is never served."""
    query = (select(Recommendation).join(Study, Study.id == Recommendation.study_id)
             .where(Recommendation.request_key == request_key, Study.state == "done")
             .order_by(Recommendation.id.desc()).limit(1))
    return session.scalars(query).first()


def get_recommendation(*, session: Session, recommendation_id: int) -> Recommendation | None:
    return session.get(Recommendation, recommendation_id)


def latest_recommendation(*, session: Session, study_id: int | None = None, request_id: int | None = None,
                          ) -> Recommendation | None:
    """The newest answer of one study, or of any study of one request (exactly one of the two)."""
    if (study_id is None) == (request_id is None):
        raise ValueError("latest_recommendation: give study_id or request_id, not both or neither")
    query = select(Recommendation)
    if study_id is not None:
        query = query.where(Recommendation.study_id == study_id)
    else:
        query = query.join(Study, Study.id == Recommendation.study_id).where(Study.request_id == request_id)
    return session.scalars(query.order_by(Recommendation.id.desc()).limit(1)).first()


def job_measured_recommendations(*, session: Session, limit: int = 20, scan: int = 200) -> list[Recommendation]:
    """The newest answers made from a training job's measurements of its shortlist (``zerotune recommend
    --measure``: metrics ``measured_on_job``), newest first, at most ``limit`` of the newest ``scan`` answers of
    uploaded-run studies."""
    query = (select(Recommendation).join(Study, Study.id == Recommendation.study_id)
             .where(Study.executor == "external").order_by(Recommendation.id.desc()).limit(scan))
    return [r for r in session.scalars(query) if (r.metrics or {}).get("measured_on_job")][:limit]
