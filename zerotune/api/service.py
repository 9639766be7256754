"""The service's state and the recommendation flow: normalize → key → cache | stored | shared job.

One :class:`Service` per process holds the database engine, the answer cache, the jobs this
process is waiting on and the embedded worker pool. Identical requests share work at three
levels: the answer cache (a stored recommendation costs a lookup), a single-flight table (the
concurrent first requests for one key make one database round trip between them) and the
database itself (:func:`db.repository.get_or_create_job` locks the request row, so requests on
other processes or machines join the same job too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from zerotune.api import queries, schemas
from zerotune.api.cache import AnswerCache
from zerotune.api.inputs import ClusterCreate, HfConfigCreate, ModelCreate, RecommendationCreate
from zerotune.api.metrics import Metrics
from zerotune.api.settings import Settings
from zerotune.core.fields import OPTIONS, from_body
from zerotune.core.spec import ClusterSpec, ModelSpec
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.db import repository as repo
from zerotune.db.session import make_engine, make_session_factory, session_scope
from zerotune.errors import InputError, SpecError
from zerotune.tuner import calibrating, shortlist
from zerotune.tuner.request import TuneRequest

log = logging.getLogger("zerotune.api")

MAX_WORLD_SIZE = 2**24
ACTIVE = ("queued", "running")


def model_spec(value: str | ModelCreate | HfConfigCreate) -> ModelSpec:
    """A preset name, an explicit ModelSpec or a Hugging Face config's object (the catalog never reads a file)."""
    try:
        return parse_model(value if isinstance(value, str) else value.model_dump())
    except SpecError as exc:
        raise InputError.from_spec("model", exc) from None


def cluster_spec(value: str | ClusterCreate) -> ClusterSpec:
    """A preset string (``frontier:48``, ``local:2x2``) or an explicit ClusterSpec, at most 2**24 ranks."""
    try:
        cluster = parse_cluster(value if isinstance(value, str) else value.model_dump())
    except SpecError as exc:
        raise InputError.from_spec("cluster", exc) from None
    if cluster.world_size > MAX_WORLD_SIZE:
        raise InputError("body.cluster", cluster.name, f"has {cluster.world_size} ranks; at most {MAX_WORLD_SIZE}")
    return cluster


BODY_FIELDS = frozenset(d.label for d in OPTIONS if d.about.body is not None)
"""The request's fields by their places in the body (``budget.trials``): a rule one of them breaks names it so."""


def normalize(body: RecommendationCreate, settings: Settings) -> TuneRequest:
    """The request with presets expanded and defaults filled; its ``key()`` names equivalent requests. Its
    calibration is the name the body gives (``Service.normalize`` resolves it against the stored ones)."""
    options = from_body(body.model_dump(exclude={"model", "cluster"}))
    for field, value in (("executor", options["executor"]), ("measure_shortlist", options["measure"])):
        if value is not None and value not in settings.executors:
            raise InputError(f"body.{field}", value, f"this service runs only {list(settings.executors)}")
    if options["trials"] > settings.max_trials:
        raise InputError("body.budget.trials", options["trials"], f"must be <= {settings.max_trials} here")
    model, cluster = model_spec(body.model), cluster_spec(body.cluster)
    try:
        return TuneRequest(model=model, cluster=cluster, **options)
    except SpecError as exc:
        if exc.field in BODY_FIELDS:
            raise InputError(f"body.{exc.field}", exc.as_detail()["value"], exc.rule) from None
        raise InputError.from_spec("request", exc) from None


@dataclass
class Outcome:
    """What a POST gets: the answer bytes (200) or a job (202)."""

    answer: bytes | None = None
    job: schemas.JobPublic | None = None


class Service:
    """Per-process state of the API (one per app)."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        """``engine``: the database to use instead of ``settings``' URL (the in-process tests' in-memory one)."""
        self.settings = settings
        self.url = settings.url() if engine is None else engine.url.render_as_string(hide_password=False)
        self.engine = make_engine(self.url) if engine is None else engine
        self.sessions = make_session_factory(self.engine)
        self.cache = AnswerCache(settings.cache_size)
        self.metrics = Metrics()
        self.active: dict[str, int] = {}  # request key → its queued or running job
        self.jobs: dict[int, schemas.JobPublic] = {}  # job id → latest view, for jobs in ``active``
        self.done: dict[int, asyncio.Future[schemas.JobPublic]] = {}  # job id → its final view, when it ends
        self.inflight: dict[str, asyncio.Future[Outcome]] = {}
        self.pool: Any = None  # api.pool.WorkerPool when workers are embedded
        self._watcher: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        from zerotune.db.migrate import upgrade

        upgrade(engine=self.engine)
        if self.settings.workers:
            from zerotune.api.pool import WorkerPool

            self.pool = WorkerPool(self.settings, self.url)
            self.pool.start()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="zerotune-job-watcher")

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.pool is not None:
            self.pool.stop()
        self.engine.dispose()

    # -- the recommendation flow ---------------------------------------------------------------
    async def normalize(self, body: RecommendationCreate) -> TuneRequest:
        """``normalize`` with the request's calibration resolved against the database: the one the body
        names (422 when none is stored by that name), else the newest stored for its cluster."""
        request = normalize(body, self.settings)
        name = await run_in_threadpool(self._calibration_name, request.cluster, request.calibration)
        return dataclasses.replace(request, calibration=name)

    def _calibration_name(self, cluster: ClusterSpec, name: str | None) -> str | None:
        with session_scope(self.sessions) as s:
            try:
                return calibrating.resolve_name(s, cluster, name)
            except SpecError as exc:
                raise InputError("body.calibration", name, exc.rule) from None

    async def answer(self, request: TuneRequest, wait_s: float) -> Outcome:
        key = request.key()
        answer = self.cache.get(key)
        if answer is not None:
            self.metrics.outcomes["cached"] += 1
            return Outcome(answer=answer)
        job_id = self.active.get(key)
        if job_id is not None and job_id in self.jobs:
            self.metrics.outcomes["job_joined"] += 1
            outcome = Outcome(job=self.jobs[job_id])
        else:
            outcome = await self._single_flight(request)
        job = outcome.job
        if job is not None and wait_s > 0 and job.state in ACTIVE and self.active.get(key) == job.id:
            ended = self.done.get(job.id)
            if ended is None:
                ended = self.done[job.id] = asyncio.get_running_loop().create_future()
            try:
                job = await asyncio.wait_for(asyncio.shield(ended), timeout=min(wait_s, self.settings.wait_max_s))
            except TimeoutError:
                job = self.jobs.get(job.id, job)
            answer = self.cache.get(key)
            if answer is None and job.state == "done":  # ended without its answer in hand: read it
                answer = await run_in_threadpool(self._stored_answer, key)
            return Outcome(answer=answer) if answer is not None else Outcome(job=job)
        return outcome

    def _stored_answer(self, key: str) -> bytes | None:
        with session_scope(self.sessions) as s:
            answer = queries.served_answer(s, key)
        if answer is not None:
            self.cache.put(key, answer)
        return answer

    def fast_answer(self, key: str, waits: bool) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """For the fast path: the stored answer, or the running job unless the client waits for the answer."""
        answer = self.cache.get(key)
        if answer is not None:
            self.metrics.outcomes["cached"] += 1
            return 200, answer, []
        job_id = self.active.get(key)
        job = self.jobs.get(job_id) if job_id is not None and not waits else None
        if job is None:
            return None
        self.metrics.outcomes["job_joined"] += 1
        return 202, job.model_dump_json().encode(), [(b"location", f"/v1/jobs/{job.id}".encode())]

    async def _single_flight(self, request: TuneRequest) -> Outcome:
        key = request.key()
        pending = self.inflight.get(key)
        if pending is not None:
            outcome = await asyncio.shield(pending)
            self.metrics.outcomes["cached" if outcome.answer else "job_joined"] += 1
            return outcome
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.inflight[key] = future
        try:
            outcome, created = await run_in_threadpool(self._lookup_or_queue, request)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # marked retrieved: the waiters re-raise it themselves
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            self.inflight.pop(key, None)
        if outcome.answer is not None:
            self.cache.put(key, outcome.answer)
            self.metrics.outcomes["stored"] += 1
        else:
            assert outcome.job is not None
            self.track(key, outcome.job)
            self.metrics.outcomes["job_created" if created else "job_joined"] += 1
        future.set_result(outcome)
        return outcome

    def _lookup_or_queue(self, request: TuneRequest) -> tuple[Outcome, bool]:
        """In a worker thread: the stored answer, else the request's job (created if none is active)."""
        key = request.key()
        with session_scope(self.sessions) as s:
            row = repo.served_recommendation(session=s, request_key=key)
            # the request's shortlist measured by a training job on this cluster and shape answers it from then on
            measured = shortlist.job_measured_answer(s, request)
            if measured is not None and (row is None or measured.id > row.id):
                row = measured
            if row is not None:
                return Outcome(answer=queries.answer_bytes(row)), False
            req, _ = repo.get_or_create_request(session=s, key=key, spec=request.to_dict())
            job, created = repo.get_or_create_job(session=s, request_id=req.id)
            return Outcome(job=queries.job_public(s, job)), created

    def track(self, key: str, job: schemas.JobPublic) -> None:
        """Follow a job until it ends (the watcher refreshes it), or drop it once it has."""
        if job.state in ACTIVE:
            self.active[key] = job.id
            self.jobs[job.id] = job
        else:
            self.ended(key, job)

    def ended(self, key: str, job: schemas.JobPublic, answer: bytes | None = None) -> None:
        # a measured study may have stored a calibration that a known body now resolves to: relearn them
        self.cache.bodies.clear()
        if answer is not None:
            self.cache.put(key, answer)
        if self.active.get(key) == job.id:
            del self.active[key]
        self.jobs.pop(job.id, None)
        ended = self.done.pop(job.id, None)
        if ended is not None and not ended.done():
            ended.set_result(job)

    # -- following jobs ------------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.watch_s)
            if not self.active:
                continue
            try:
                updates = await run_in_threadpool(self._refresh, dict(self.active))
            except Exception as exc:  # the database is away: try again on the next tick
                log.warning("job watcher: %s: %s", type(exc).__name__, exc)
                continue
            for key, job, answer in updates:
                if job.state in ACTIVE:
                    self.jobs[job.id] = job
                else:
                    self.ended(key, job, answer)

    def _refresh(self, active: dict[str, int]) -> list[tuple[str, schemas.JobPublic, bytes | None]]:
        """The jobs that changed since last seen (one query when none did), with the answer of a done one."""
        ids = {job_id: key for key, job_id in active.items()}
        out = []
        with session_scope(self.sessions) as s:
            rows = repo.job_summaries(session=s, job_ids=ids)
            for job_id, state, trials_done, phase, study_id, error in rows:
                seen = self.jobs.get(job_id)
                if seen is not None and (seen.state, seen.trials_done, seen.phase, seen.study_id, seen.error) == (
                        state, trials_done, phase, study_id, error):
                    continue
                job = repo.get_job(session=s, job_id=job_id)  # read again: it may have ended since the query
                assert job is not None
                public = queries.job_public(s, job)
                # the job as returned, not as first read, decides
                answer = queries.served_answer(s, ids[job_id]) if public.state == "done" else None
                out.append((ids[job_id], public, answer))
        return out
