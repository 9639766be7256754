"""zerotune's tables: requests, studies, trials, recommendations, calibrations and jobs (SQLAlchemy 2.0 typed ORM).

Every table name starts with ``zt_``: Optuna's RDB storage keeps its own tables (``studies``,
``trials``, ``alembic_version`` …) in the same database, and the prefix is how our migrations
tell ours from theirs. JSON columns use ``sqlalchemy.JSON`` so the same models run on SQLite and
PostgreSQL; every timestamp is a timezone-aware UTC ``datetime`` on both.

The schema here is the target of the hand-written migrations in ``zerotune/db/migrations/versions``; a
test compares the two, so a change here needs a new revision there.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

TABLE_PREFIX = "zt_"

STUDY_STATES = ("pending", "running", "done", "failed", "cancelled")
TRIAL_STATUSES = ("queued", "running", "complete", "failed", "pruned", "infeasible")
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
WORKER_STATES = ("idle", "busy", "stopped")
EVIDENCE_KINDS = ("predicted", "proxy-verified", "measured")

# Constraint names are spelled out by a convention so migrations (and SQLite's batch table
# recreate, which can only keep *named* CHECK constraints) refer to them reliably.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so the value is stored as naive
    UTC text (which still sorts and compares correctly) and UTC is attached again on load.
    Naive datetimes are refused: their time zone is a guess.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one (datetime.now(UTC))")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _in(column: str, values: tuple[str, ...]) -> str:
    """SQL text for ``column IN ('a', 'b', ...)`` (values are our own constants)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


JsonDoc = JSON(none_as_null=True)  # Python None is SQL NULL, never the JSON literal 'null'


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JsonDoc}


class Request(Base):
    """A normalized tuning request: ``spec`` holds it whole (the model, the cluster and every field, as
    ``tuner.request.TuneRequest.to_dict`` writes it), ``key`` is its hash; a new request field needs no column
    (revision 0009 moved the earlier ones into ``spec``)."""

    __tablename__ = "zt_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    spec: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Study(Base):
    """One search for one request, mirrored by the Optuna study ``optuna_study_name``."""

    __tablename__ = "zt_studies"
    __table_args__ = (CheckConstraint(_in("state", STUDY_STATES), name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("zt_requests.id", ondelete="CASCADE"), index=True)
    optuna_study_name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    sampler: Mapped[str] = mapped_column(String(32))
    executor: Mapped[str] = mapped_column(String(32))
    n_trials: Mapped[int] = mapped_column(Integer)  # the target number of trials
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Trial(Base):
    """One evaluation of a Strategy: queued → running (under a lease) → a terminal status.

    ``number`` is the Optuna trial number (unique within a study when set). A running trial
    belongs to ``lease_owner`` until ``lease_expires_at``; a worker that stops heartbeating loses
    it, and another may claim it again (``attempts`` counts the claims).
    """

    __tablename__ = "zt_trials"
    __table_args__ = (
        CheckConstraint(_in("status", TRIAL_STATUSES), name="status"),
        UniqueConstraint("study_id", "number"),
        Index(None, "study_id", "status"),
        Index(None, "status", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_studies.id", ondelete="CASCADE"), index=True)
    number: Mapped[int | None] = mapped_column(Integer)
    optuna_trial_id: Mapped[int | None] = mapped_column(Integer)
    strategy: Mapped[dict[str, Any]]
    strategy_key: Mapped[str] = mapped_column(String(64))
    executor: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    value: Mapped[float | None] = mapped_column(Float)  # the objective, e.g. TFLOPS per rank
    metrics: Mapped[dict[str, Any] | None]  # run.json of a measured run, or the prediction
    prediction: Mapped[dict[str, Any] | None]  # the cost model's prediction for the same point
    reason: Mapped[str | None] = mapped_column(Text)  # why it failed or is infeasible
    logs: Mapped[str] = mapped_column(Text, default="")
    proxy_model: Mapped[dict[str, Any] | None]  # the scaled-down model actually run (revision 0002)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class Recommendation(Base):
    """The chosen Strategy for a request key, with its evidence and exports."""

    __tablename__ = "zt_recommendations"
    __table_args__ = (CheckConstraint(_in("evidence", EVIDENCE_KINDS), name="evidence"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_studies.id", ondelete="CASCADE"), index=True)
    request_key: Mapped[str] = mapped_column(String(64), index=True)
    strategy: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]
    evidence: Mapped[str] = mapped_column(String(16))
    margin: Mapped[float | None] = mapped_column(Float)  # relative margin over the runner-up
    runner_up_trial_id: Mapped[int | None] = mapped_column(ForeignKey("zt_trials.id", ondelete="SET NULL"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("zt_trials.id", ondelete="SET NULL"))
    exports: Mapped[dict[str, Any]]  # {"zerotune": ..., "deepspeed": ..., "fsdp": ...}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StoredCalibration(Base):
    """A calibration of the cost model for one cluster, refitted from measured trials (revision 0004).

    The newest one whose ``cluster`` is a request's cluster (else the newest of the same family and
    level count) is what the next study there predicts with; ``report`` holds the error on the runs
    before and after the refit (``costmodel.calibration.refit``)."""

    __tablename__ = "zt_calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    cluster: Mapped[str] = mapped_column(String(128), index=True)  # the cluster the runs ran on
    family: Mapped[str] = mapped_column(String(64))
    num_levels: Mapped[int] = mapped_column(Integer)
    calibration: Mapped[dict[str, Any]]
    report: Mapped[dict[str, Any]]
    study_id: Mapped[int | None] = mapped_column(ForeignKey("zt_studies.id", ondelete="SET NULL"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """A unit of work for a worker: run (or resume) the study of a request."""

    __tablename__ = "zt_jobs"
    __table_args__ = (
        CheckConstraint(_in("state", JOB_STATES), name="state"),
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress"),
        Index(None, "state", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("zt_requests.id", ondelete="CASCADE"), index=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("zt_studies.id", ondelete="SET NULL"))
    state: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)  # 0..1
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    phase: Mapped[str | None] = mapped_column(String(64))
    """What the running study is doing: screening, measuring, re-measuring k/n, verifying."""
    error: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(128))
    runner_deaths: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Times the job's runner died under it (its heartbeat went stale and the job was handed back); at
    ``max_runner_deaths`` the job fails instead (``repository.requeue_stale_jobs``)."""
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class WorkerProcess(Base):
    """A worker process (embedded or ``zerotune worker`` anywhere) and its last heartbeat.

    Each worker stamps its row while it polls and while it runs a job; ``/readyz``, ``/metrics``
    and ``GET /v1/workers`` count the ones heard from recently, wherever they run.
    """

    __tablename__ = "zt_workers"
    __table_args__ = (CheckConstraint(_in("state", WORKER_STATES), name="state"),)

    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # host:pid:random, as on zt_jobs.worker
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="idle")
    job_id: Mapped[int | None] = mapped_column(ForeignKey("zt_jobs.id", ondelete="SET NULL"))
    jobs_run: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
