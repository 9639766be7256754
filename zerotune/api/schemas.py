"""Response bodies (pydantic v2): ``XPublic`` out, ``XsPublic{data, count}`` pages (what clients send, ``XCreate``:
``api.inputs``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from zerotune.core.fields import MAX_ID as MAX_ID  # the routes' bound on an id, beside the bodies they answer


class RecommendationPublic(BaseModel):
    """The recommended strategy with its evidence and its exports (zerotune, DeepSpeed, FSDP2)."""

    id: int
    request_key: str
    study_id: int
    trial_id: int | None
    runner_up_trial_id: int | None
    strategy: dict[str, Any]
    value: float | None = Field(description="the objective: TFLOPS per rank")
    evidence: Literal["predicted", "proxy-verified", "measured"]
    margin: float | None = Field(description="relative margin over the runner-up")
    memory: dict[str, Any] | None = Field(
        default=None, description="the pick's predicted peak per rank, the device's memory, the reserve kept beside it "
        "for the runtime (device context, the collective library's buffers, the allocator's fragmentation; or the "
        "request's memory_reserve_gib) and what is left, in GiB, with the reason in words")
    metrics: dict[str, Any]
    exports: dict[str, Any]
    created_at: datetime


class CalibrationPublic(BaseModel):
    """A calibration of the cost model refitted from measured trials, with its error before and after."""

    id: int
    name: str
    cluster: str = Field(description="the cluster the measured runs ran on")
    study_id: int | None
    calibration: dict[str, Any]
    report: dict[str, Any] = Field(description="runs, fitted factors, error before / after / cross-validated")
    created_at: datetime


class CalibrationsPublic(BaseModel):
    data: list[CalibrationPublic]
    count: int


class JobPublic(BaseModel):
    """A study job: queued → running → done | failed | cancelled (with the reason)."""

    id: int
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    progress: float
    trials_done: int
    trials_total: int
    phase: str | None = Field(default=None, description="what a running study is doing: screening (cost model), "
                              "measuring, re-measuring k/n (leaders whose intervals overlap), verifying")
    best_value: float | None = Field(description="best TFLOPS per rank so far")
    error: str | None = Field(description="why a job failed or was cancelled")
    request_key: str
    request_id: int
    study_id: int | None
    recommendation_id: int | None = Field(description="set once the job is done: GET /v1/recommendations/{id}")
    worker: str | None
    runner_deaths: int = Field(default=0, description="times the job's runner died under it (its heartbeat went "
                               "stale and the job was handed back); at ZEROTUNE_JOB_MAX_RUNNER_DEATHS it fails")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None


class RequestPublic(BaseModel):
    id: int
    key: str
    model: dict[str, Any]
    cluster: dict[str, Any]
    objective: str
    budget: dict[str, Any]
    executor: str
    global_batch: int | None
    created_at: datetime


class StudyPublic(BaseModel):
    id: int
    request_id: int
    optuna_study_name: str
    state: Literal["pending", "running", "done", "failed", "cancelled"]
    sampler: str
    executor: str
    n_trials: int
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class StudyDetailPublic(StudyPublic):
    request: RequestPublic
    trial_counts: dict[str, int] = Field(description="trials by status")
    best_trial_id: int | None
    best_value: float | None
    recommendation_id: int | None


class StudiesPublic(BaseModel):
    data: list[StudyPublic]
    count: int


class TrialPublic(BaseModel):
    id: int
    study_id: int
    number: int | None
    status: Literal["queued", "running", "complete", "failed", "pruned", "infeasible"]
    strategy: dict[str, Any]
    strategy_key: str
    executor: str
    value: float | None
    reason: str | None
    attempts: int
    proxy_model: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class TrialDetailPublic(TrialPublic):
    metrics: dict[str, Any] | None = Field(description="the run.json of a measured run, or the prediction")
    prediction: dict[str, Any] | None = Field(description="the cost model's prediction for the same point")
    logs: str


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


class CatalogPublic(BaseModel):
    clusters: dict[str, Any]
    models: dict[str, Any]
    strategies: dict[str, str]
    executors: list[str]


class WorkerPublic(BaseModel):
    id: str = Field(description="host:pid:random, as in a job's worker field")
    host: str
    pid: int
    state: Literal["idle", "busy", "stopped"]
    job_id: int | None = Field(description="the job it runs when busy")
    jobs_run: int
    started_at: datetime
    heartbeat_at: datetime


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, Any] = Field(default_factory=dict)


class FieldProblem(BaseModel):
    field: str = Field(description="where: body.budget.trials, query.wait, path.job_id ...")
    value: Any = Field(default=None, description="what was given")
    rule: str = Field(description="the rule it broke")


class ValidationErrorPublic(BaseModel):
    detail: list[FieldProblem]


class Message(BaseModel):
    detail: str


# -- aggregates the dashboard draws (/v1/studies/{id}/points, /v1/studies/{id}/importance) --------------
class TrialPointPublic(BaseModel):
    """One trial as the study page draws it: its outcome, memory, and the cost model's error."""

    id: int
    number: int | None
    status: Literal["queued", "running", "complete", "failed", "pruned", "infeasible"]
    executor: str
    strategy: dict[str, Any]
    label: str = Field(description="the preset name, or the spans and bits in short (P3/G3/OS3 hpZ1 w8 g4)")
    value: float | None = Field(description="the objective: TFLOPS per rank (complete trials)")
    reason: str | None = Field(description="why it failed or is infeasible")
    measured: bool = Field(description="metrics come from a run (run.json), not from the cost model")
    predicted_tflops_per_rank: float | None
    peak_memory_bytes: int | None = Field(description="peak bytes per rank: measured when measured, else predicted")
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    inter_node_bytes: int | None = Field(description="bytes one rank sends per step on the outermost level")
    health: str | None = Field(description="the health verdict of a measured run: ok, nan, diverged, flat")
    proxy: bool = Field(description="a scaled-down proxy model ran instead of the requested one")
    finished_at: datetime | None


class TrialPointsPublic(BaseModel):
    data: list[TrialPointPublic]
    count: int


class ImportancePublic(BaseModel):
    param: str = Field(description="the Optuna parameter name (spans, quantize_above, secondary_span_p3 ...)")
    importance: float = Field(description="share of the total importance (they sum to 1)")


class ParamImportancePublic(BaseModel):
    """Which strategy dimension mattered: Optuna's own importance evaluator over the study's feasible trials."""

    study_id: int
    method: str = Field(description="the evaluator used")
    trials_used: int = Field(description="complete, feasible trials the evaluator saw")
    data: list[ImportancePublic] = Field(description="most important first; empty when it cannot be computed")
    note: str | None = Field(description="why the list is empty, when it is")
