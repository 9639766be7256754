"""A trial cut short from outside (a stop, a restart, a dead runner, a fault of the database) is recorded as
interrupted and its point run again, whatever number of times, and never counts; the answer says what it was
built on."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from tests.support import session_factory
from tests.tuner.test_study import trials_of
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.db import repository as repo
from zerotune.db.migrate import upgrade
from zerotune.db.session import session_scope
from zerotune.tuner import failures, infrastructure, leases
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.study import Tuner
from zerotune.tuner.study_options import TunerOptions
from zerotune.tuner.worker import Worker

REQUEST = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=4, seed=0)


@pytest.fixture
def sqlite_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    return url


class Stalls(ModelExecutor):
    """The cost model, but the first run of each point in ``stall`` waits for the runner's stop (a long run that a
    restart cuts short), ``times`` times in all."""

    def __init__(self, stall: str, times: int, stopped: threading.Event) -> None:
        super().__init__()
        self.stall, self.left, self.stopped = stall, times, stopped

    def run(self, spec, *, stop, on_step=None):
        if spec.strategy.name == self.stall and self.left > 0:
            self.left -= 1
            self.stopped.set()  # the service is told to stop while this trial runs
            assert stop.wait(30), "the stop never reached the run"
            return self.interrupted("the run was stopped")
        return super().run(spec, stop=stop, on_step=on_step)


def test_two_restarts_during_one_trial_leave_every_strategy_measured(sqlite_url, tmp_path):
    """The issue's case: the first preset's run is stopped, the study resumed, the same point's run stopped again;
    resumed once more, the study measures all four points its budget holds and says two runs were interrupted."""
    studied = None
    for restart in range(3):
        stop = threading.Event()
        executor = Stalls("zero3", times=1 if restart < 2 else 0, stopped=stop)
        tuner = Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=executor, workdir=tmp_path, stop=stop,
                      options=TunerOptions(exclusive=True, verify_quantized=False, worker_id=f"w{restart}"))
        rec = tuner.run(studied)
        studied = tuner.study_id
        assert (rec == {}) == (restart < 2)
    trials = trials_of(sqlite_url, studied)
    cut = [t for t in trials if t.status == "failed"]
    assert len(cut) == 2 and all(t.reason == "interrupted: the run was stopped; run again" for t in cut), \
        [(t.status, t.reason) for t in trials]
    ended = [t for t in trials if t.status != "failed"]
    assert len(ended) == REQUEST.trials and all(t.status in ("complete", "infeasible") for t in ended)
    assert any(t.strategy.get("name") == "zero3" and t.status == "complete" for t in ended)  # measured at last
    assert len({t.number for t in trials}) == len(trials)
    assert rec["trials"]["interrupted"] == 2 and rec["trials"]["budget"] == REQUEST.trials
    assert rec["trials"]["failed"] == []


def test_a_point_whose_runner_died_three_times_is_failed(sqlite_url, tmp_path):
    """A killed runner leaves its trial running; the runner that resumes the study records it as interrupted and
    runs the point again, and again after a second death; the third death fails the point (it may be what kills
    its runner), with that reason."""
    stop = threading.Event()
    stop.set()  # create the study, run nothing
    first = Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path, stop=stop)
    assert first.run() == {}
    study_id, sessions = first.study_id, session_factory(sqlite_url)
    strategy = next(s for s, _ in first._first_picks() if s.name == "zero3").to_dict()
    reasons = []
    for death in range(3):
        with session_scope(sessions) as s:  # what a runner killed mid-trial leaves behind
            row = repo.add_trial(session=s, study_id=study_id, strategy=strategy, strategy_key="k" * 64,
                                 executor="model")
            repo.claim_trial(session=s, trial_id=row.id, owner=f"dead-{death}", lease_s=3600)
            trial_id = row.id
        stop = threading.Event()
        stop.set()
        Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path, stop=stop,
              options=TunerOptions(exclusive=True)).run(study_id)
        reasons.append(next(t for t in trials_of(sqlite_url, study_id) if t.id == trial_id).reason)
    assert reasons[:2] == ["interrupted: its runner died (the study was resumed by another runner); run again"] * 2
    assert reasons[2].startswith("its runner died 3 times while running it") and reasons[2].endswith("not run again")
    assert failures.is_run_failure("failed", reasons[2])  # the point's own failure: it counts, and is named
    with session_scope(sessions) as s:
        assert repo.count_spent_trials(session=s, study_id=study_id, unspent=leases.UNSPENT) == 1


def raise_lost() -> None:
    import psycopg

    error = OperationalError("UPDATE zt_trials ...", {}, psycopg.errors.AdminShutdown(
        "terminating connection due to administrator command"))
    error.connection_invalidated = True
    raise error


def test_a_study_cut_short_by_a_database_fault_is_resumed_where_it_stood(sqlite_url, tmp_path, monkeypatch):
    """A fault of the database in the middle of a trial leaves the study as it stood (not failed); resumed by the
    same runner, the trial it cut short is recorded as interrupted, its point runs again, and the budget is kept."""
    options = TunerOptions(exclusive=True, verify_quantized=False, worker_id="the-worker")
    tuner = Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path,
                  options=options)
    original = tuner._finish
    calls = {"n": 0}

    def finish(*args, **kwargs):  # the connection drops while the second trial's result is stored
        calls["n"] += 1
        if calls["n"] == 2:
            raise_lost()
        return original(*args, **kwargs)

    monkeypatch.setattr(tuner, "_finish", finish)
    with pytest.raises(OperationalError):
        tuner.run()
    study_id = tuner.study_id
    with session_scope(session_factory(sqlite_url)) as s:
        assert repo.get_study(session=s, study_id=study_id).state == "running"  # not failed: resumable
    rec = Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path,
                options=options).run(study_id)
    trials = trials_of(sqlite_url, study_id)
    (cut,) = [t for t in trials if t.status == "failed"]
    assert cut.reason == "interrupted: cut short by a fault of the database this runner recovered from; run again"
    assert len([t for t in trials if t.status != "failed"]) == REQUEST.trials
    assert [t.status for t in trials if t.strategy_key == cut.strategy_key][-1] in ("complete", "infeasible")
    assert rec["trials"]["interrupted"] == 1


def test_an_answer_on_fewer_trials_than_its_budget_says_why():
    zero3, mics = {"name": "zero3"}, {"name": None, "param_span": 1, "grad_span": 1, "optim_span": 2,
                                      "weight_bits": 16, "grad_bits": 16}
    rows = [("complete", None, zero3), ("failed", "rank 1 failed: RuntimeError: CUDA out of memory", mics),
            ("failed", "interrupted: the run was stopped; run again", zero3), ("infeasible", "needs 90 GiB", mics)]
    tally = failures.account(6, rows, time_budget_s=600)
    assert tally["measured"] == 1 and tally["infeasible"] == 1 and tally["interrupted"] == 1
    assert tally["failed"] == [{"strategy": "spans 1/1/2", "reason": "rank 1 failed: RuntimeError: CUDA out of memory"}]
    assert tally["short"] == ("built on 1 completed trial(s) of a budget of 6: 1 failed (1 failed; rank 1 failed: "
                              "RuntimeError: CUDA out of memory (1x)); 1 did not fit in memory (the cost model ruled "
                              "them out; nothing ran); 3 never ran (the time budget of 600 s ran out); 1 run(s) cut "
                              "short from outside were run again and are not counted")
    assert failures.account(1, rows[:1])["short"] is None


@dataclass
class Settings:
    """What a worker reads (``tuner.worker.WorkerSettings``), with short waits."""

    root: Path
    poll_s: float = 0.1
    heartbeat_s: float = 0.2
    stale_after_s: float = 30.0
    job_max_runner_deaths: int = 5
    lease_s: float = 10.0
    trial_timeout_s: float = 60.0
    steps: int = 4
    verify_quantized: bool = False
    slurm_partition: str | None = None
    slurm_mode: str = "steps"

    def work_root(self) -> Path:
        return self.root


def queue(url: str, request: TuneRequest) -> int:
    with session_scope(session_factory(url)) as s:
        row, _ = repo.get_or_create_request(session=s, key=request.key(), spec=request.to_dict())
        return repo.create_job(session=s, request_id=row.id).id


def test_a_worker_resumes_after_faults_and_fails_only_after_the_stated_attempts(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.setattr(infrastructure, "backoff_s", lambda attempt: 0.01)
    worker = Worker(Settings(tmp_path), sqlite_url)
    calls = {"n": 0}
    real = worker._attempt

    def flaky(*args, **kwargs):  # the database drops twice, then stays
        calls["n"] += 1
        if calls["n"] <= 2:
            raise_lost()
        return real(*args, **kwargs)

    job = queue(sqlite_url, REQUEST)
    monkeypatch.setattr(worker, "_attempt", flaky)
    assert worker.claim() == job and worker.run_job(job) == "done" and calls["n"] == 3
    with session_scope(session_factory(sqlite_url)) as s:
        assert repo.get_job(session=s, job_id=job).trials_done == REQUEST.trials

    calls["n"] = 0

    def away(*args, **kwargs):  # the database never comes back
        calls["n"] += 1
        raise_lost()

    job = queue(sqlite_url, dataclasses.replace(REQUEST, trials=2))
    monkeypatch.setattr(worker, "_attempt", away)
    assert worker.claim() == job and worker.run_job(job) == "failed"
    assert calls["n"] == infrastructure.JOB_ATTEMPTS
    with session_scope(session_factory(sqlite_url)) as s:
        error = repo.get_job(session=s, job_id=job).error
    assert error == (f"gave up after {infrastructure.JOB_ATTEMPTS} attempts, each ended by a fault of the "
                     "infrastructure (not of the request): psycopg.AdminShutdown: terminating connection due to "
                     "administrator command"), error

    calls["n"] = 0

    def broken(*args, **kwargs):  # the work's own failure: at once
        calls["n"] += 1
        raise ValueError("a bug in the work")

    job = queue(sqlite_url, dataclasses.replace(REQUEST, trials=3))
    monkeypatch.setattr(worker, "_attempt", broken)
    assert worker.claim() == job and worker.run_job(job) == "failed" and calls["n"] == 1
    with session_scope(session_factory(sqlite_url)) as s:
        assert repo.get_job(session=s, job_id=job).error == "ValueError: a bug in the work"


def test_a_point_of_the_queue_asked_for_and_lost_before_it_was_stored_is_enqueued_again(sqlite_url, tmp_path):
    """A fault between Optuna's ask (which takes a point off the queue) and the trial's row loses the point unless
    the recovery puts it back: a preset must not vanish from the study."""
    import optuna

    from zerotune.db.session import url_of
    from zerotune.tuner import optuna_study

    stop = threading.Event()
    stop.set()
    tuner = Tuner(REQUEST, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path, stop=stop)
    assert tuner.run() == {}
    with session_scope(tuner.sessions) as s:
        name = repo.get_study(session=s, study_id=tuner.study_id).optuna_study_name
    study = optuna_study.create(REQUEST, url_of(tuner.sessions), name)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    asked = study.ask()  # the first point of the queue, RUNNING in Optuna, never stored: the fault came here
    point = waiting[0].system_attrs["fixed_params"]
    assert point and study.trials[asked.number].system_attrs["fixed_params"] == point
    leases.recover_dead_trials(tuner.sessions, study, tuner.study_id, tuner.space, exclusive=True)
    assert study.trials[asked.number].state == optuna.trial.TrialState.FAIL
    again = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(again) == len(waiting) and again[-1].system_attrs["fixed_params"] == point
    assert again[-1].user_attrs == waiting[0].user_attrs  # it keeps what it was (a preset's name)


def test_a_job_that_kills_its_workers_fails_after_the_stated_deaths(sqlite_url, tmp_path, caplog):
    """Workers that die mid-job (claimed, then never heard from again) hand the job back through whichever worker
    finds it stale; at ``job_max_runner_deaths`` the job fails with the deaths named, and a job is never run by a
    worker after that."""
    settings = Settings(tmp_path, stale_after_s=0.05, job_max_runner_deaths=2)
    job = queue(sqlite_url, REQUEST)
    for death in (1, 2):
        dead = Worker(settings, sqlite_url)
        assert dead.claim() == job  # ... and dies: no heartbeat, no hand-back
        threading.Event().wait(0.1)
        finder = Worker(settings, sqlite_url)
        with caplog.at_level("WARNING", logger="zerotune.worker"):
            given_back = finder.requeue_stale()
        assert given_back == ([job] if death == 1 else [])
    assert finder.claim() is None
    with session_scope(session_factory(sqlite_url)) as s:
        ended = repo.get_job(session=s, job_id=job)
        assert (ended.state, ended.runner_deaths) == ("failed", 2)
        assert ended.error.startswith("gave up after its runner died 2 times without ending it")
    assert f"job {job} failed: its runner died 2 times" in caplog.text
