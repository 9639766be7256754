"""Workers: claim queued jobs from the database, run their studies with the tuner, report back.

The loop of one worker (``zerotune worker --db URL``, or an embedded one that ``zerotune serve``
starts as a child process, see ``zerotune/api/pool.py``)::

    give stale jobs back   running jobs whose heartbeat is older than stale_after_s → queued
    claim_next_job         FOR UPDATE SKIP LOCKED on PostgreSQL: each job goes to one worker
    run the study          Tuner(...).run(); a heartbeat thread stamps the job every heartbeat_s
                           and, after each trial, its progress; a cancelled job stops the tuner
    finish                 done (the tuner stored the recommendation) or failed with the reason

A fault of the infrastructure while the study runs (a dropped or terminated database connection, a
serialization failure: ``tuner.infrastructure``) is not the job's failure: the worker waits (1, 2, 4
... 30 s) and runs the study again from where it stood, keeping the job heartbeating meanwhile; only
``infrastructure.JOB_ATTEMPTS`` faults in a row with no trial ended between them fail the job, and
its error names the fault. A trial the fault cut short is recorded as interrupted and run again.

A worker that stops (SIGTERM/SIGINT, or its parent service went away) finishes the trial in
progress and gives the job back to the queue; the next worker resumes the same study (Tuner.open
finds it) and recovers trials whose lease ran out. A worker that dies without stopping stops
heartbeating, and any other worker gives its job back after ``stale_after_s``, counting the death on the
job: the job whose runner has died ``job_max_runner_deaths`` times (one that kills every worker that runs it)
fails, its error naming the deaths and their cause.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from zerotune.db import repository as repo
from zerotune.db.models import Request, utcnow
from zerotune.db.session import make_engine, make_session_factory, session_scope
from zerotune.errors import StudyFailed
from zerotune.tuner import calibrating, infrastructure, shortlist
from zerotune.tuner.leases import UNSPENT
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.study import Tuner
from zerotune.tuner.study_options import Progress, TunerOptions

log = logging.getLogger("zerotune.worker")


class WorkerSettings(Protocol):
    """What a worker reads from its settings (``api.settings.Settings`` provides it: ``ZEROTUNE_*``)."""

    poll_s: float
    heartbeat_s: float
    stale_after_s: float
    job_max_runner_deaths: int
    lease_s: float
    trial_timeout_s: float
    steps: int
    verify_quantized: bool
    slurm_partition: str | None
    slurm_mode: str

    def work_root(self) -> Path: ...
TRIALS_SHARE = 0.95
"""The share of a job's progress its trials make up: what follows them (re-measuring overlapping leaders,
verifying a predicted pick, storing the answer) is the rest, so a job reads 1.0 only once it is done."""


def tune_request(row: Request) -> TuneRequest:
    """The TuneRequest a stored request row was made from (same key)."""
    return TuneRequest.from_dict(row.spec)


class Worker:
    """Claims and runs jobs until :meth:`stop` (or a signal) asks it to end."""

    def __init__(self, settings: WorkerSettings, url: str, parent_pid: int | None = None) -> None:
        self.settings, self.url, self.parent_pid = settings, url, parent_pid
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.sessions = make_session_factory(make_engine(url))
        self.shutdown = threading.Event()
        self.jobs_run = 0
        self._stamped = -math.inf

    def stamp(self, state: str, job_id: int | None = None, force: bool = False) -> None:
        """Say in ``zt_workers`` that this worker is alive (at most every ``heartbeat_s`` unless ``force``)."""
        if not force and time.monotonic() - self._stamped < self.settings.heartbeat_s:
            return
        with session_scope(self.sessions) as s:
            repo.stamp_worker(session=s, worker_id=self.id, host=socket.gethostname(), pid=os.getpid(), state=state,
                              job_id=job_id, jobs_run=self.jobs_run)
        self._stamped = time.monotonic()

    def stop(self, *_: Any) -> None:
        self.shutdown.set()

    def _orphaned(self) -> bool:
        """An embedded worker ends with its service, even one killed without a chance to stop it."""
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    # -- the loop ------------------------------------------------------------------------------
    def run(self, max_jobs: int | None = None) -> int:
        """Work until stopped (or ``max_jobs`` jobs were run); return the number of jobs run."""
        log.info("worker %s: watching %s", self.id, _safe(self.url))
        try:
            with session_scope(self.sessions) as s:  # rows of workers gone for a day are history
                repo.forget_workers(session=s, before=utcnow() - timedelta(days=1))
            return self._loop(max_jobs)
        finally:
            try:
                self.stamp("stopped", force=True)
            except Exception as exc:  # the database is away: the row simply ages out
                log.warning("worker %s: could not record the stop: %s", self.id, exc)

    def _loop(self, max_jobs: int | None) -> int:
        while not self.shutdown.is_set() and (max_jobs is None or self.jobs_run < max_jobs):
            if self._orphaned():
                log.info("worker %s: the service went away; stopping", self.id)
                break
            try:
                self.stamp("idle")
                self.requeue_stale()
                job_id = self.claim()
            except Exception as exc:  # the database is away: wait and try again
                log.warning("worker %s: %s: %s", self.id, type(exc).__name__, exc)
                self.shutdown.wait(self.settings.poll_s)
                continue
            if job_id is None:
                self.shutdown.wait(self.settings.poll_s)
                continue
            self.jobs_run += 1
            try:
                self.stamp("busy", job_id=job_id, force=True)
                self.run_job(job_id)
            except Exception as exc:  # reporting failed (the database went away): the job goes stale, then back
                log.exception("worker %s: job %d: %s: %s", self.id, job_id, type(exc).__name__, exc)
            self._stamped = -math.inf  # say idle again at once
        return self.jobs_run

    def requeue_stale(self) -> list[int]:
        """Give back running jobs whose worker stopped heartbeating (it died or hung); a job whose runner has
        died ``job_max_runner_deaths`` times fails instead. Returns the ids given back."""
        before = utcnow() - timedelta(seconds=self.settings.stale_after_s)
        with session_scope(self.sessions) as s:
            ended = repo.requeue_stale_jobs(session=s, before=before,
                                            reason="re-queued: its worker stopped heartbeating",
                                            max_runner_deaths=self.settings.job_max_runner_deaths)
        for job_id, state in ended:
            if state == "failed":
                log.error("worker %s: job %d failed: its runner died %d times without ending it", self.id, job_id,
                          self.settings.job_max_runner_deaths)
            else:
                log.warning("worker %s: job %d re-queued (its worker stopped heartbeating)", self.id, job_id)
        return [job_id for job_id, state in ended if state == "queued"]

    def claim(self) -> int | None:
        with session_scope(self.sessions) as s:
            job = repo.claim_next_job(session=s, worker=self.id)
            return job.id if job is not None else None

    # -- one job -------------------------------------------------------------------------------
    def run_job(self, job_id: int) -> str:
        """Run one claimed job to its end; return its final state (``queued`` when handed back)."""
        started = time.monotonic()
        with session_scope(self.sessions) as s:
            job = repo.get_job(session=s, job_id=job_id)
            assert job is not None
            row = repo.get_request(session=s, request_id=job.request_id)
            assert row is not None
            try:
                request = tune_request(row)
            except Exception as exc:
                return self._finish(job_id, "failed", f"the stored request is invalid: {exc}")
            if repo.served_recommendation(session=s, request_key=request.key()) is not None:  # answered meanwhile
                return self._finish(job_id, "done", None)
        label = (f"job {job_id} ({request.model.name} on {request.cluster.name}, {request.executor}, "
                 f"{request.trials} trials)")
        log.info("worker %s: %s started", self.id, label)
        stop, why = threading.Event(), {"reason": ""}
        beat = _Heartbeat(self, job_id, stop, why)
        beat.start()
        faults, ended = 0, -1
        try:
            while True:
                try:
                    result = self._attempt(job_id, request, beat, stop)
                    break
                except StudyFailed as exc:
                    log.warning("worker %s: %s → failed in %.1f s: %s", self.id, label, time.monotonic() - started,
                                exc)
                    return self._finish(job_id, "failed", str(exc))
                except Exception as exc:
                    fault = infrastructure.fault(exc)
                    if fault is None:
                        log.exception("worker %s: %s → failed in %.1f s", self.id, label, time.monotonic() - started)
                        return self._finish(job_id, "failed", f"{type(exc).__name__}: {exc}")
                    faults = 1 if beat.trials_done > ended else faults + 1  # a trial ended since: count again
                    ended = beat.trials_done
                    if faults >= infrastructure.JOB_ATTEMPTS:
                        log.error("worker %s: %s → failed: %d faults of the infrastructure in a row: %s", self.id,
                                  label, faults, fault)
                        return self._finish(job_id, "failed", f"gave up after {faults} attempts, each ended by a "
                                            f"fault of the infrastructure (not of the request): {fault}")
                    wait = infrastructure.backoff_s(faults)
                    log.warning("worker %s: %s: a fault of the infrastructure (%s); the study resumes where it "
                                "stood in %g s (attempt %d of %d)", self.id, label, fault, wait, faults + 1,
                                infrastructure.JOB_ATTEMPTS)
                    if stop.wait(wait):  # stopping, cancelled or lost meanwhile
                        result = {}
                        break
        finally:
            beat.stop()
        if result:
            state = self._finish(job_id, "done", None)
        elif why["reason"] == "cancelled" or why["reason"] == "lost":
            state = why["reason"]
        else:  # stopping: hand the job back, a worker resumes the study
            state = self._finish(job_id, "queued", None)
        log.info("worker %s: %s → %s in %.1f s", self.id, label, state, time.monotonic() - started)
        return state

    def _attempt(self, job_id: int, request: TuneRequest, beat: _Heartbeat, stop: threading.Event) -> dict[str, Any]:
        """Run (or resume) the job's study, then measure its shortlist when the request asks; the answer, or ``{}``
        when stopped first."""
        tuner = self._tuner(request, beat, stop)
        study_id = tuner.open()
        self._update(job_id, study_id=study_id)
        beat.study_id = study_id
        result = tuner.run(study_id)
        if result and request.measure and not stop.is_set():
            result = self._measure_shortlist(job_id, request, result, beat, stop)
        return result

    def _tuner(self, what: TuneRequest | shortlist.Plan, beat: _Heartbeat, stop: threading.Event) -> Tuner:
        """The Tuner of one study of a job (of its request, or of a shortlist of it to measure), predicting with
        the calibration the request names (as its runner runs the collectives)."""
        from zerotune.tuner.executors import make_executor

        request = what.request if isinstance(what, shortlist.Plan) else what
        with session_scope(self.sessions) as s:
            calibration = calibrating.for_request(s, request)
        trials = len(what.candidates) if isinstance(what, shortlist.Plan) else request.trials
        executor = make_executor(request.executor, calibration=calibration, partition=self.settings.slurm_partition,
                                 slurm_mode=self.settings.slurm_mode,
                                 slurm_hold_s=(trials + 3) * (self.settings.trial_timeout_s + 60),
                                 emulate=request.emulate)
        # exclusive: holding the job means holding its study, so trials left unfinished by a
        # dead runner are recorded as interrupted and run again at resume, without waiting for their leases
        options = TunerOptions(steps=self.settings.steps, trial_timeout_s=self.settings.trial_timeout_s,
                               lease_s=self.settings.lease_s, verify_quantized=self.settings.verify_quantized,
                               exclusive=True, worker_id=self.id)
        workdir = self.settings.work_root() / request.key()[:16]
        if isinstance(what, shortlist.Plan):
            return shortlist.ShortlistTuner(what, sessions=self.sessions, executor=executor, workdir=workdir,
                                            options=options, calibration=calibration, progress=beat.progress,
                                            stop=stop)
        return Tuner(request, sessions=self.sessions, executor=executor, workdir=workdir, options=options,
                     calibration=calibration, progress=beat.progress, stop=stop)

    def _measure_shortlist(self, job_id: int, request: TuneRequest, predicted: dict[str, Any], beat: _Heartbeat,
                           stop: threading.Event) -> dict[str, Any]:
        """Measure the partitions the predicted answer could not tell apart (``tuner.shortlist``) and answer
        with the measured fastest; the predicted answer stands where the decision leaves nothing to measure."""
        with session_scope(self.sessions) as s:
            todo = shortlist.plan(s, request, predicted)
        if todo is None:
            log.info("job %d: the predicted winner is beyond the model's error; no shortlist to measure", job_id)
            return predicted
        tuner = self._tuner(todo, beat, stop)
        study_id = tuner.open()
        self._update(job_id, study_id=study_id)
        beat.study_id = study_id
        log.info("job %d: measuring a shortlist of %d with %s (study %d)", job_id, len(todo.candidates),
                 todo.request.executor, study_id)
        return tuner.run(study_id)

    def _update(self, job_id: int, **values: Any) -> bool:
        """Stamp our running job (a heartbeat); False when it is no longer ours to run."""
        with session_scope(self.sessions) as s:
            return repo.stamp_job(session=s, job_id=job_id, owner=self.id, **values)

    def _finish(self, job_id: int, state: str, error: str | None) -> str:
        """End our job (``queued``: handed back); the state it has afterwards."""
        with session_scope(self.sessions) as s:
            return repo.end_job(session=s, job_id=job_id, owner=self.id, state=state, error=error)


class _Heartbeat:
    """Stamps a running job every ``heartbeat_s`` and after each trial; stops the tuner on a cancel."""

    def __init__(self, worker: Worker, job_id: int, stop: threading.Event, why: dict[str, str]) -> None:
        self.worker, self.job_id, self.stop_tuner, self.why = worker, job_id, stop, why
        self.study_id: int | None = None
        self.trials_done = 0
        """The trials the job's study had ended at its last progress report."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"zerotune-job-{job_id}")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def progress(self, progress: Progress) -> None:
        self.beat(with_progress=True, phase=progress.phase)

    def _loop(self) -> None:
        while not self.done.wait(self.worker.settings.heartbeat_s):
            try:
                self.beat(with_progress=False)
            except Exception as exc:  # keep beating: the database may come back
                log.warning("job %d heartbeat: %s: %s", self.job_id, type(exc).__name__, exc)

    def beat(self, with_progress: bool, phase: str | None = None) -> None:
        if self.worker.shutdown.is_set() or self.worker._orphaned():
            self.stop_tuner.set()  # the worker is stopping: the job will be handed back
        values: dict[str, Any] = {}
        if with_progress and self.study_id is not None:
            with session_scope(self.worker.sessions) as s:
                done = repo.count_spent_trials(session=s, study_id=self.study_id, unspent=UNSPENT)
                study = repo.get_study(session=s, study_id=self.study_id)
                total = study.n_trials if study is not None else 1
            values = {"trials_done": done, "progress": TRIALS_SHARE * min(1.0, done / total)}
            self.trials_done = done
        if phase:
            values["phase"] = phase[:64]
        try:
            self.worker.stamp("busy", job_id=self.job_id)
        except Exception as exc:  # only the worker list goes stale; the job's own heartbeat follows
            log.warning("worker %s: stamp: %s: %s", self.worker.id, type(exc).__name__, exc)
        if not self.worker._update(self.job_id, **values):
            with session_scope(self.worker.sessions) as s:
                job = repo.get_job(session=s, job_id=self.job_id)
                self.why["reason"] = "cancelled" if job is not None and job.state == "cancelled" else "lost"
            self.stop_tuner.set()


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def serve_worker(settings: WorkerSettings, url: str, parent_pid: int | None = None, max_jobs: int | None = None) -> int:
    """Run a worker in this process until SIGTERM/SIGINT; return the number of jobs run."""
    from zerotune.db.migrate import prepare_optuna_storage, upgrade

    upgrade(url)
    prepare_optuna_storage(url)
    worker = Worker(settings, url, parent_pid=parent_pid)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    return worker.run(max_jobs=max_jobs)
