"""Turn a finished study into a Recommendation: the best feasible trial, its evidence and exports.

Evidence says what backs the choice:
- ``measured``: the trial ran the requested model on the requested cluster (``slurm``, or
  ``local`` when the request is for this machine);
- ``proxy-verified``: a short local run of a scaled-down model with the same strategy trained
  healthily — what a ``local`` study on an emulated cluster gives, and what a ``model`` study gets
  by default before it recommends a quantized strategy (an unhealthy verification drops the
  candidate and the next best is tried);
- ``predicted``: the cost model only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from db import repository as repo
from db.models import Trial
from db.session import session_scope
from strategies.errors import ZerotuneError
from strategies.spec import Strategy
from tuner.executors.base import TrialSpec

if TYPE_CHECKING:
    from tuner.study import Tuner


class StudyFailed(ZerotuneError):
    """A study could not produce a recommendation."""


def exports(tuner: Tuner, strategy: Strategy) -> dict[str, Any]:
    """The recommendation in every format: zerotune trainer JSON, DeepSpeed config, FSDP2 settings."""
    from tuner import exports as ex

    r = tuner.request
    gb = r.global_batch
    return {"zerotune": ex.zerotune_config(r.model, r.cluster, strategy, global_batch=gb),
            "deepspeed": ex.deepspeed_config(r.model, r.cluster, strategy, global_batch=gb),
            "deepspeed_notes": ex.deepspeed_notes(r.model, r.cluster, strategy, global_batch=gb),
            "fsdp": ex.fsdp_config(r.model, r.cluster, strategy, global_batch=gb)}


def _evidence(tuner: Tuner, row: Trial) -> str:
    if row.executor == "model":
        return "predicted"
    if row.proxy_model or (row.metrics or {}).get("cluster", {}).get("name") != tuner.request.cluster.name:
        return "proxy-verified"
    return "measured"


def _verify(tuner: Tuner, strategy: Strategy, trial_id: int) -> tuple[bool, str]:
    """A short healthy run of a proxy with this strategy on this machine (quantized strategies)."""
    from tuner.executors.local import LocalExecutor

    spec = TrialSpec(model=tuner.request.model, cluster=tuner.request.cluster, strategy=strategy,
                     workdir=tuner.workdir / f"verify-{trial_id}", steps=16, warmup=1, timeout_s=tuner.trial_timeout_s)
    # a health check, not a speed test: a small proxy that learns the synthetic stream within 16 steps
    result = LocalExecutor(max_ranks=4, proxy_hidden=128, proxy_vocab=512, proxy_seq_len=64).run(spec)
    return result.status == "complete", result.reason or "healthy"


def recommend(tuner: Tuner, study_id: int, verify_quantized: bool = True, candidates: int = 3) -> dict[str, Any]:
    """Pick, verify, export and store the recommendation of a study."""
    with session_scope(tuner.sessions) as s:
        rows = s.scalars(select(Trial).where(Trial.study_id == study_id, Trial.status == "complete",
                                             Trial.value.is_not(None)).order_by(Trial.value.desc())).all()
        ranked = [(t.id, Strategy.from_dict(t.strategy), t.value, _evidence(tuner, t), t.metrics) for t in rows]
        if not ranked:
            failed = s.scalars(select(Trial).where(Trial.study_id == study_id)).all()
            reasons = sorted({t.reason for t in failed if t.reason})[:3]
            raise StudyFailed(f"no trial of study {study_id} completed ({len(failed)} tried); "
                              f"reasons: {reasons or ['none recorded']}")
    verification = None
    chosen = 0
    for i, (trial_id, strategy, _, evidence, _) in enumerate(ranked[:candidates]):
        if evidence == "predicted" and strategy.quantized and verify_quantized:
            ok, why = _verify(tuner, strategy, trial_id)
            verification = {"trial_id": trial_id, "healthy": ok, "detail": why}
            if not ok:
                continue
            ranked[i] = (*ranked[i][:3], "proxy-verified", ranked[i][4])
        chosen = i
        break
    trial_id, strategy, value, evidence, metrics = ranked[chosen]
    runner = next((r for j, r in enumerate(ranked) if j != chosen), None)
    margin = (value - runner[2]) / value if runner and value and runner[2] is not None else None
    body: dict[str, Any] = {"study_id": study_id, "request_key": tuner.request.key(), "trial_id": trial_id,
            "strategy": strategy.to_dict(), "value": value, "evidence": evidence, "margin": margin,
            "runner_up_trial_id": runner[0] if runner else None, "verification": verification,
            "metrics": metrics, "exports": exports(tuner, strategy)}
    with session_scope(tuner.sessions) as s:
        saved = repo.save_recommendation(
            session=s, study_id=study_id, request_key=body["request_key"], strategy=body["strategy"],
            metrics={**(metrics or {}), "verification": verification}, evidence=evidence, margin=margin,
            runner_up_trial_id=body["runner_up_trial_id"], trial_id=trial_id, exports=body["exports"])
        body["id"] = saved.id
    return body
