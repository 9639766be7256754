"""Request and response bodies (pydantic v2): ``XCreate`` in, ``XPublic`` out, ``XsPublic{data, count}`` pages.

Input bounds are the service's, not the science's: they keep every stored number finite and every
id inside the database's integer range, so no input can reach a 500.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zerotune.tuner.executors import ExecutorName

MAX_ID = 2**31 - 1  # PostgreSQL INTEGER: larger ids cannot exist
Name = Annotated[str, Field(min_length=1, max_length=64)]
Positive = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]


class _In(BaseModel):
    """Every request body: no unknown fields, no NaN or infinity, and no coercion (``"5"`` or ``true``
    is not the integer a field asks for). Subclasses that set ``model_config`` (for examples) keep these:
    pydantic merges a subclass's config into its parent's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


MAX_DEPTH = 32
"""How deep an uploaded run.json may nest (lists and objects) before it is refused."""


def check_plain_json(value: Any, field: str, depth: int = 0) -> None:
    """Refuse what a stored trial could not serve back: NaN or infinite numbers, or nesting deeper
    than ``MAX_DEPTH`` (JSON has neither, and a deep value fails to render later)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{field.split('.')[0].split('[')[0]}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: {value!r} is not a finite number (JSON has no NaN or Infinity)")
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain_json(item, f"{field}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_plain_json(item, f"{field}[{i}]", depth + 1)


class LevelCreate(_In):
    """One tier of the interconnect, innermost first."""

    name: Name
    size: int = Field(ge=1, le=65536, description="fan-out: groups of the level below in one group of this level")
    bandwidth_gbps: Positive = Field(description="per-rank GB/s when all ranks send at once")
    latency_us: float = Field(default=5.0, ge=0, le=1e7, allow_inf_nan=False)
    busbw_gbps: Positive | None = Field(
        default=None, description="measured bus bandwidth (GB/s) of one collective spanning this level and those "
        "under it, e.g. nccl-tests' busbw at 256 MB across the nodes; at most bandwidth_gbps x the ranks under it")
    all_gather_busbw_gbps: Positive | None = Field(
        default=None, description="busbw_gbps of the all-gather alone (all_gather_perf), where it was measured apart: "
        "the level's all-gathers reach it")
    reduce_scatter_busbw_gbps: Positive | None = Field(
        default=None, description="busbw_gbps of the reduce-scatter alone (reduce_scatter_perf)")
    all_reduce_busbw_gbps: Positive | None = Field(
        default=None, description="busbw_gbps of the all-reduce alone (all_reduce_perf)")


class ClusterCreate(_In):
    """An explicit ClusterSpec (``zerotune validate --json`` prints one to start from)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "my-cluster", "device": "NVIDIA H100 80GB", "device_memory_gib": 80, "peak_tflops": 989,
        "levels": [{"name": "node", "size": 8, "bandwidth_gbps": 450, "latency_us": 3},
                   {"name": "inter-node", "size": 16, "bandwidth_gbps": 50, "latency_us": 8}]}]})

    name: Name
    levels: list[LevelCreate] = Field(min_length=1, max_length=8)
    device: Name = "cpu"
    device_memory_gib: Positive = 16.0
    peak_tflops: Positive = 1.0


class ModelCreate(_In):
    """An explicit ModelSpec: a decoder-only GPT-2 (``arch`` "gpt") or Llama (``arch`` "llama": RMSNorm, rotary
    positions, SwiGLU of width ffn_hidden, no biases; kv_heads and tied_head false as the model has them)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "my-gpt", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "seq_len": 2048}]})

    name: Name = "custom"
    layers: int = Field(ge=1, le=1024)
    hidden: int = Field(ge=1, le=131072)
    heads: int = Field(ge=1, le=1024)
    vocab: int = Field(ge=1, le=4_194_304)
    seq_len: int = Field(ge=1, le=1_048_576)
    ffn_hidden: int | None = Field(default=None, ge=1, le=1_048_576)
    kv_heads: int | None = Field(default=None, ge=1, le=1024, description="key/value heads (grouped-query "
                                 "attention; a divisor of heads); none: heads")
    tied_head: bool = Field(default=True, description="the LM head is the token embedding (GPT-2); false: its own "
                            "V x h matrix (Llama)")
    arch: Literal["gpt", "llama"] = Field(default="gpt", description="block family: gpt (GPT-2: LayerNorm, learned "
                                          "positions, GELU) or llama (RMSNorm, rotary positions, SwiGLU)")


class StrategyCreate(_In):
    """An explicit Strategy (spans count the cluster's levels, innermost first)."""

    param_span: int = Field(ge=0, le=8)
    grad_span: int = Field(ge=0, le=8)
    optim_span: int = Field(ge=0, le=8)
    secondary_span: int | None = Field(default=None, ge=0, le=8)
    weight_bits: Literal[16, 8, 4] = 16
    grad_bits: Literal[32, 16, 8, 4] = 16
    quantize_above: int = Field(default=1, ge=1, le=8)
    allgather_bucket_mb: float = Field(default=25.0, gt=0, le=1e5, allow_inf_nan=False)
    reduce_bucket_mb: float = Field(default=25.0, gt=0, le=1e5, allow_inf_nan=False)
    prefetch_buckets: int = Field(default=1, ge=0, le=64)
    micro_batch_size: int = Field(default=1, ge=1, le=65536)
    activation_checkpointing: bool = False
    checkpoint_policy: Literal["full", "selective"] = Field(
        default="full", description="with activation_checkpointing: full (a block keeps its input and reruns its "
        "forward) or selective (torchtitan's per-op policy: attention and every second matmul kept)")
    checkpoint_every: int = Field(default=1, ge=1, le=1024, description="with full checkpointing, checkpoint every "
                                  "k-th block only (1: every block)")
    name: str | None = Field(default=None, max_length=64)


ModelField = Annotated[str | ModelCreate, Field(
    description="a preset name (GET /v1/catalog) or an explicit ModelSpec", examples=["gpt-neox-20b"])]
ClusterField = Annotated[str | ClusterCreate, Field(
    description="a preset (frontier:48, dgx-h100:4, local:2x2) or an explicit ClusterSpec", examples=["frontier:48"])]


class Budget(_In):
    trials: int = Field(default=40, ge=1, le=10000, description="trials to finish (invalid points do not count)")
    time_s: float | None = Field(default=None, gt=0, le=604800, allow_inf_nan=False,
                                 description="stop starting trials after this many seconds")


class RecommendationCreate(_In):
    """What to tune. Equivalent requests (after presets are expanded and defaults filled) share one answer."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"model": "gpt-neox-20b", "cluster": "frontier:48", "executor": "model", "budget": {"trials": 40}},
        {"model": "gpt-tiny", "cluster": "local:2x2", "executor": "local", "budget": {"trials": 4}},
    ]})

    model: ModelField
    cluster: ClusterField
    objective: Literal["throughput", "pareto"] = Field(
        default="throughput", description="max TFLOPS per rank, or the TFLOPS-vs-memory Pareto front (NSGA-II)")
    budget: Budget = Field(default_factory=Budget)
    executor: ExecutorName = Field(
        default="model", description="model: cost model only; local: short runs here; slurm: short runs via Slurm")
    global_batch: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="sequences per optimizer step, held fixed for every trial (a multiple of the world size); "
                    "default: world size x 4")
    tokens_per_step: int | None = Field(
        default=None, ge=1, le=MAX_ID, description="the same batch in tokens (a whole number of sequences)")
    calibration: str | None = Field(
        default=None, min_length=1, max_length=128,
        description="a stored calibration to predict with (GET /v1/calibrations); default: the newest stored for "
                    "the cluster, else the cluster's own profile")
    measure_shortlist: Literal["local", "slurm"] | None = Field(
        default=None, description="after a model study whose leaders lie within the model's error, measure that "
                                  "shortlist with this executor and answer with the measured fastest")
    emulate: bool = Field(
        default=False, description="local executor only: run the short runs on an emulated cluster (network "
        "namespaces per innermost group, links shaped to this cluster's levels); needs CAP_NET_ADMIN on the workers")
    runner: Literal["zerotune", "deepspeed", "fsdp"] = Field(
        default="zerotune", description="who trains with the answer: the study searches only what that runner runs "
        "exactly and predicts its collectives as it issues them (DeepSpeed and FSDP2: flat NCCL rings over the "
        "whole group, gradients reduced during backward); deepspeed and fsdp need executor model")
    grad_reduce_in_fp32: bool = Field(
        default=False, description="the training reduces gradients in fp32 (torchtitan's default, FSDP2 "
        "reduce_dtype=float32, Megatron's grad_reduce_in_fp32): every strategy searched reduces them in fp32 "
        "(grad_bits 32, twice the bytes of bf16; no quantized gradients), and the exports keep it")


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


class TrialCreate(BaseModel):
    """A run.json measured elsewhere (``zerotune train --out run.json`` on a real cluster).

    Its ``model``, ``cluster`` and ``strategy`` say what ran; every other field is stored as the
    trial's metrics. It counts as measured evidence for later studies (warm starts, calibration).
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True, json_schema_extra={"examples": [{
        "status": "ok", "model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero3",
        "step_time_s": 0.05, "tokens_per_s": 41000, "tflops_per_rank": 0.012}]})

    status: Literal["ok", "failed"] = "ok"
    model: ModelField
    cluster: ClusterField
    strategy: Annotated[str | StrategyCreate, Field(description="a preset name or the Strategy that ran")]
    tflops_per_rank: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False,
                                          description="required when status is ok")
    global_batch: int | None = Field(default=None, ge=1, le=MAX_ID)
    device: str | None = Field(default=None, max_length=255,
                               description="the device the run ran on (run.json's device); must be the cluster's")
    error: str | None = Field(default=None, max_length=10000)
    logs: str | None = Field(default=None, max_length=1_000_000)

    @model_validator(mode="after")
    def _plain_extra(self) -> TrialCreate:
        for key, value in (self.model_extra or {}).items():
            check_plain_json(value, key)
        return self


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
