"""Service settings, read from ``ZEROTUNE_*`` environment variables (pydantic-settings).

Every field below is one variable: ``db`` is ``ZEROTUNE_DB``, ``token`` is ``ZEROTUNE_TOKEN``, and
so on; ``zerotune serve`` and ``zerotune worker`` flags override them. A ``.env`` file is not read:
a service's configuration should be visible in its process environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from zerotune.tuner.executors import NAMES

EXECUTORS = NAMES
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_WAIT_S = 3600.0
"""The longest ``?wait=`` a request may name and the largest ``ZEROTUNE_WAIT_MAX_S``; the service holds a request
``min(wait, wait_max_s)`` seconds."""


class Settings(BaseSettings):
    """How the service and its workers run. Defaults make ``zerotune serve`` useful at once."""

    model_config = SettingsConfigDict(env_prefix="ZEROTUNE_", extra="ignore")

    db: str | None = None
    """SQLAlchemy URL; unset means SQLite under the user's data dir (``ZEROTUNE_DATA_DIR``)."""
    db_file: Path | None = None
    """A file holding the SQLAlchemy URL (a mounted secret), read when ``db`` is unset: a password in it never
    reaches any process's argv or environment listing."""
    token: SecretStr | None = None
    """When set, POST and DELETE need ``Authorization: Bearer <token>``; reads stay open."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=0, le=64)
    """Embedded worker processes started by ``zerotune serve`` (0: only ``zerotune worker`` processes run studies)."""
    executors: tuple[str, ...] = EXECUTORS
    """The executors requests may ask for (e.g. ``["model"]`` on a host without torch)."""
    max_trials: int = Field(default=2000, ge=1)
    """The largest ``budget.trials`` a request may ask for."""
    wait_max_s: float = Field(default=600.0, ge=0, le=MAX_WAIT_S)
    """The longest a POST's ``?wait=`` holds its connection (a longer ``?wait`` is held this long)."""
    cache_size: int = Field(default=4096, ge=1)
    """Stored recommendations kept in memory, serialized, for repeat requests."""
    watch_s: float = Field(default=0.5, gt=0)
    """How often the service re-reads the jobs it is waiting on."""
    heartbeat_s: float = Field(default=5.0, gt=0)
    """How often a worker stamps its running job (and checks for a cancel)."""
    stale_after_s: float = Field(default=60.0, gt=0)
    """A running job whose heartbeat is older than this is given back to the queue."""
    job_max_runner_deaths: int = Field(default=5, ge=1)
    """A job whose runner died this many times under it (its heartbeat went stale each time: a worker killed,
    a host lost) fails, its error naming the deaths, instead of being given back again. A stop (SIGTERM, a
    restart) hands the job back without counting."""
    lease_s: float = Field(default=30.0, gt=0)
    """A trial's lease: a trial whose runner died is retried once its lease has run out."""
    poll_s: float = Field(default=1.0, gt=0)
    """How often an idle worker looks for a queued job."""
    shutdown_grace_s: float = Field(default=60.0, ge=0)
    """How long a stopping service waits for its workers to hand their jobs back before killing them."""
    workdir: Path | None = None
    """Where trials write their files (default: ``<data dir>/work``)."""
    steps: int = Field(default=10, ge=2)
    """Training steps of one measured trial (``local`` and ``slurm`` executors)."""
    trial_timeout_s: float = Field(default=600.0, gt=0)
    verify_quantized: bool = True
    """Check a predicted quantized winner with a short local proxy run before recommending it."""
    slurm_partition: str | None = None
    slurm_mode: Literal["steps", "jobs"] = "steps"
    """``slurm`` executor: ``steps`` runs each trial as a job step of the allocation the worker runs in, or of one
    allocation held for the whole study (one queue wait per study); ``jobs`` submits each trial as a batch job of
    its own (clusters that forbid steps)."""
    allowed_hosts: tuple[str, ...] | None = None
    """Host headers the service answers (JSON list; ``["*"]`` for any). Unset: any when a token is set or
    the service listens beyond loopback, else only loopback names, so that a web page on this machine
    cannot reach an open service through a rebound DNS name."""
    max_body_mb: float = Field(default=8.0, gt=0, le=1024)
    """The largest request body, in MiB (an upload's logs are at most 1 MB): larger ones get 413 before
    anything is parsed."""
    body_memory_mb: float = Field(default=16.0, gt=0, le=65536)
    """The request bodies read and parsed at once, in MiB together (each counted by its ``Content-Length``, a body
    without one as ``max_body_mb``): a body that does not fit waits ``body_wait_s``, then gets 503 with
    ``Retry-After``."""
    body_wait_s: float = Field(default=5.0, ge=0, le=600)
    """How long a body waits for room under ``body_memory_mb`` before its 503."""
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """A body must arrive whole within this many seconds once the service starts reading it, else 408."""
    header_timeout_s: float = Field(default=20.0, gt=0, le=60)
    """A connection that has not sent a complete request head this long after it opened (or after its previous
    response) is closed (``api.connections``)."""
    max_connections: int | None = Field(default=None, ge=16)
    """Open client connections at most; past it, the oldest one waiting on its client is closed. Unset: the
    process's open-file limit less 128."""

    @field_validator("token", "db", "db_file", "slurm_partition", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value  # ZEROTUNE_TOKEN= (as compose passes an unset variable) means no token

    @model_validator(mode="after")
    def _check(self) -> Settings:
        unknown = [e for e in self.executors if e not in EXECUTORS]
        if unknown:
            raise ValueError(f"executors={list(self.executors)}: {unknown} unknown; known: {list(EXECUTORS)}")
        if self.db is None and self.db_file is not None:
            try:
                self.db = self.db_file.read_text().strip() or None
            except OSError as exc:
                raise ValueError(f"db_file={str(self.db_file)!r} cannot be read: {exc.strerror or exc}") from None
        if self.stale_after_s < self.lease_s:
            # a job given back while its trial still holds a lease would leave that trial running forever
            raise ValueError(f"stale_after_s={self.stale_after_s} must be >= lease_s={self.lease_s}")
        return self

    def hosts(self) -> list[str]:
        """The allowed Host headers in effect (see ``allowed_hosts``)."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        if self.token is not None or self.host not in LOOPBACK:
            return ["*"]
        return sorted(LOOPBACK)

    def url(self) -> str:
        """The database URL in use (the default SQLite file when ``db`` is unset)."""
        from zerotune.db.session import default_url, normalize_url

        return normalize_url(self.db) if self.db else default_url()

    def work_root(self) -> Path:
        from zerotune.db.session import data_dir

        return self.workdir or data_dir() / "work"
