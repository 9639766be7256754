"""Repository round trips on SQLite and PostgreSQL, including the races that workers and prologues run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from zerotune.db import repository as repo
from zerotune.db.session import session_scope
from zerotune.errors import NotFoundError

Factory = sessionmaker[Session]
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
STRATEGY = {"param_span": 1, "grad_span": 2, "optim_span": 3, "weight_bits": 16}


def new_request(session: Session, key: str = "k" * 64) -> Any:
    request, _ = repo.get_or_create_request(
        session=session, key=key, spec={"model": {"preset": "gpt-tiny"}, "cluster": {"preset": "local:2x2"},
                                        "objective": "tflops", "trials": 8, "executor": "model", "global_batch": 32})
    return request


def new_study(session: Session, name: str = "zt-study-1") -> Any:
    request = new_request(session)
    return repo.create_study(session=session, request_id=request.id, optuna_study_name=name, sampler="tpe",
                             executor="model", n_trials=8)


def race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` on ``n`` threads released together; return the results (re-raise the first error)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[Exception] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except Exception as error:  # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_request_dedupe_by_key(factory: Factory) -> None:
    with session_scope(factory) as session:
        first, created = repo.get_or_create_request(
            session=session, key="a" * 64, spec={"model": {"layers": 2}, "cluster": {"levels": []}})
        again, created_again = repo.get_or_create_request(
            session=session, key="a" * 64, spec={"model": {"layers": 2}, "cluster": {"levels": []}})
        other = new_request(session, key="b" * 64)
        with pytest.raises(ValueError, match="must be 1 to 64 characters"):
            new_request(session, key="c" * 65)
    assert created and not created_again
    assert again.id == first.id != other.id
    with session_scope(factory) as session:
        stored = repo.get_request_by_key(session=session, key="a" * 64)
        assert stored is not None and stored.spec == {"model": {"layers": 2}, "cluster": {"levels": []}}
        assert stored.created_at.tzinfo is not None and stored.created_at.utcoffset() == timedelta(0)


def test_identical_concurrent_requests_share_one_request_and_one_job(factory: Factory) -> None:
    """A prologue storm: many callers post the same request at once; one row, one job."""

    def post(_: int) -> tuple[int, bool]:
        with session_scope(factory) as session:
            request, created = repo.get_or_create_request(session=session, key="s" * 64, spec={"model": {}})
            return request.id, created

    requests = race(6, post)
    assert len({request_id for request_id, _ in requests}) == 1 and sum(created for _, created in requests) == 1

    def queue(_: int) -> tuple[int, bool]:
        with session_scope(factory) as session:
            job, created = repo.get_or_create_job(session=session, request_id=requests[0][0])
            return job.id, created

    jobs = race(6, queue)
    assert len({job_id for job_id, _ in jobs}) == 1 and sum(created for _, created in jobs) == 1
    with session_scope(factory) as session:  # once that job is over, the next call queues a new one
        repo.update_job(session=session, job_id=jobs[0][0], state="done")
        job, created = repo.get_or_create_job(session=session, request_id=requests[0][0])
        assert created and job.id != jobs[0][0]
        with pytest.raises(NotFoundError, match="no request with id"):
            repo.get_or_create_job(session=session, request_id=10**6)


def test_studies(factory: Factory) -> None:
    with session_scope(factory) as session:
        studies = [new_study(session, name=f"zt-study-{i}") for i in range(3)]
        assert repo.get_study(session=session, study_id=studies[1].id).optuna_study_name == "zt-study-1"
        assert repo.studies_of_request(session=session, request_id=studies[0].request_id)[0].id == studies[0].id
        with pytest.raises(ValueError, match="n_trials=0"):
            repo.create_study(session=session, request_id=studies[0].request_id, optuna_study_name="x",
                              sampler="tpe", executor="model", n_trials=0)
    with session_scope(factory) as session:
        rows, count = repo.list_studies(session=session, offset=1, limit=1)
        assert count == 3 and [study.id for study in rows] == [studies[1].id]  # newest first
        study = repo.set_study_state(session=session, study_id=studies[0].id, state="running", now=T0)
        assert study.started_at == T0 and study.finished_at is None
        study = repo.set_study_state(session=session, study_id=studies[0].id, state="failed", error="boom",
                                     now=T0 + timedelta(minutes=5))
        with pytest.raises(ValueError, match="state='sleeping'"):
            repo.set_study_state(session=session, study_id=studies[0].id, state="sleeping")
        with pytest.raises(NotFoundError, match="no study with id"):
            repo.set_study_state(session=session, study_id=10**6, state="done")
    with session_scope(factory) as session:
        study = repo.get_study(session=session, study_id=studies[0].id)
        assert (study.state, study.error, study.started_at) == ("failed", "boom", T0)
        assert study.finished_at == T0 + timedelta(minutes=5)


def test_trial_lifecycle_with_lease_expiry(factory: Factory) -> None:
    with session_scope(factory) as session:
        study = new_study(session)
        trial = repo.add_trial(session=session, study_id=study.id, strategy=STRATEGY, strategy_key="sk1",
                               executor="local", number=0, optuna_trial_id=11)
    assert (trial.status, trial.attempts, trial.logs) == ("queued", 0, "")

    with session_scope(factory) as session:  # worker A claims it; B cannot while A's lease runs
        claimed = repo.claim_trial(session=session, trial_id=trial.id, owner="A", lease_s=60, now=T0)
        assert claimed is not None
        assert (claimed.status, claimed.lease_owner, claimed.attempts) == ("running", "A", 1)
        assert claimed.lease_expires_at == T0 + timedelta(seconds=60) and claimed.started_at == T0
        assert repo.claim_trial(session=session, trial_id=trial.id, owner="B", lease_s=60, now=T0) is None
        assert repo.heartbeat_trial(session=session, trial_id=trial.id, owner="A", lease_s=60,
                                    now=T0 + timedelta(seconds=30))
        assert not repo.heartbeat_trial(session=session, trial_id=trial.id, owner="B", lease_s=60)

    later = T0 + timedelta(seconds=91)  # A went silent after its heartbeat at T0+30
    with session_scope(factory) as session:
        assert repo.dead_trials(session=session, study_id=trial.study_id, now=T0 + timedelta(seconds=89)) == []
        assert [t.id for t in repo.dead_trials(session=session, study_id=trial.study_id, now=later)] == [trial.id]
        assert [t.id for t in repo.dead_trials(session=session, study_id=trial.study_id, all_running=True)] == [
            trial.id]  # a runner holding the study alone takes every running trial for dead
        reclaimed = repo.claim_trial(session=session, trial_id=trial.id, owner="B", lease_s=60, now=later)
        assert reclaimed is not None and (reclaimed.lease_owner, reclaimed.attempts) == ("B", 2)

    with session_scope(factory) as session:  # A wakes up: its heartbeat and its result are refused
        assert not repo.heartbeat_trial(session=session, trial_id=trial.id, owner="A", lease_s=60, now=later)
        assert repo.finish_trial(session=session, trial_id=trial.id, status="complete", value=1.0, owner="A") is None
        finished = repo.finish_trial(
            session=session, trial_id=trial.id, status="complete", value=42.5, metrics={"tflops": 42.5},
            prediction={"tflops": 40.0}, logs="step 1 ...", proxy_model={"layers": 2}, owner="B", now=later)
        assert finished is not None

    with session_scope(factory) as session:
        stored = repo.get_trial(session=session, trial_id=trial.id)
        assert (stored.status, stored.value, stored.metrics, stored.prediction) == (
            "complete", 42.5, {"tflops": 42.5}, {"tflops": 40.0})
        assert stored.proxy_model == {"layers": 2} and stored.reason is None and stored.logs == "step 1 ..."
        assert stored.finished_at == later and stored.lease_expires_at is None
        assert repo.dead_trials(session=session, study_id=trial.study_id, now=later + timedelta(days=1)) == []
        assert repo.claim_trial(session=session, trial_id=trial.id, owner="C", lease_s=60) is None
        with pytest.raises(ValueError, match="status='running'"):
            repo.finish_trial(session=session, trial_id=trial.id, status="running")
        with pytest.raises(ValueError, match="naive datetime"):
            repo.claim_trial(session=session, trial_id=trial.id, owner="C", lease_s=60, now=datetime(2025, 1, 1))


def test_a_trial_goes_to_one_claimer(factory: Factory) -> None:
    with session_scope(factory) as session:
        study = new_study(session)
        trial_id = repo.add_trial(session=session, study_id=study.id, strategy=STRATEGY, strategy_key="sk",
                                  executor="local").id

    def claim(i: int) -> bool:
        with session_scope(factory) as session:
            return repo.claim_trial(session=session, trial_id=trial_id, owner=f"w{i}", lease_s=60) is not None

    assert sum(race(4, claim)) == 1


def test_best_trial_and_list_trials(factory: Factory) -> None:
    with session_scope(factory) as session:
        study = new_study(session)
        outcomes = [("complete", 10.0), ("complete", 30.0), ("failed", 99.0), ("infeasible", None),
                    ("complete", 30.0), ("queued", None)]
        ids = []
        for number, (status, value) in enumerate(outcomes):
            trial = repo.add_trial(session=session, study_id=study.id, strategy=STRATEGY, strategy_key=f"sk{number}",
                                   executor="model", number=number)
            if status != "queued":
                repo.finish_trial(session=session, trial_id=trial.id, status=status, value=value,
                                  reason="OOM" if status == "infeasible" else None)
            ids.append(trial.id)
        assert repo.best_trial(session=session, study_id=study.id).id == ids[1]  # the earliest of the tie
        rows, count = repo.list_trials(session=session, study_id=study.id, offset=2, limit=2)
        assert count == 6 and [t.id for t in rows] == ids[2:4]
        rows, count = repo.list_trials(session=session, study_id=study.id, status="complete")
        assert count == 3 and [t.id for t in rows] == [ids[0], ids[1], ids[4]]
        assert [t.id for t in repo.trials_with_strategy_key(session=session, strategy_key="sk1")] == [ids[1]]
        assert repo.list_trials(session=session, study_id=study.id, status="pruned") == ([], 0)
        other = new_study(session, name="zt-study-empty")
        assert repo.best_trial(session=session, study_id=other.id) is None


def test_recommendation_by_key(factory: Factory) -> None:
    with session_scope(factory) as session:
        study = new_study(session)
        trial = repo.add_trial(session=session, study_id=study.id, strategy=STRATEGY, strategy_key="sk",
                               executor="model", status="complete")
        exports = {"zerotune": STRATEGY, "deepspeed": {"zero_optimization": {"stage": 3}}, "fsdp": {"mesh": [2, 2]}}
        repo.save_recommendation(session=session, study_id=study.id, request_key="r" * 64, strategy=STRATEGY,
                                 metrics={"tflops": 1.0}, evidence="predicted", exports=exports)
        newer = repo.save_recommendation(session=session, study_id=study.id, request_key="r" * 64,
                                         strategy=STRATEGY, metrics={"tflops": 2.0}, evidence="measured",
                                         exports=exports, margin=0.12, trial_id=trial.id)
        with pytest.raises(ValueError, match="evidence='guessed'"):
            repo.save_recommendation(session=session, study_id=study.id, request_key="r" * 64, strategy={},
                                     metrics={}, evidence="guessed", exports={})
    with session_scope(factory) as session:
        found = repo.latest_recommendation(session=session, study_id=study.id)
        assert found is not None and found.id == newer.id
        assert (found.evidence, found.margin, found.trial_id, found.exports) == ("measured", 0.12, trial.id, exports)
        assert repo.served_recommendation(session=session, request_key="x" * 64) is None


def test_job_queue(factory: Factory) -> None:
    with session_scope(factory) as session:
        request = new_request(session)
        jobs = [repo.create_job(session=session, request_id=request.id) for _ in range(2)]
    with session_scope(factory) as session:
        first = repo.claim_next_job(session=session, worker="w1", now=T0)
        second = repo.claim_next_job(session=session, worker="w2", now=T0)
        assert repo.claim_next_job(session=session, worker="w3") is None
    assert (first.id, first.state, first.worker, first.started_at) == (jobs[0].id, "running", "w1", T0)
    assert (second.id, second.worker) == (jobs[1].id, "w2")

    with session_scope(factory) as session:
        study = new_study(session)
        job = repo.update_job(session=session, job_id=first.id, progress=0.5, trials_done=4, study_id=study.id,
                              now=T0 + timedelta(seconds=10))
        assert (job.progress, job.trials_done, job.heartbeat_at) == (0.5, 4, T0 + timedelta(seconds=10))
        assert [j.id for j in repo.stale_jobs(session=session, before=T0 + timedelta(seconds=5))] == [second.id]
        job = repo.update_job(session=session, job_id=first.id, state="done", progress=1.0,
                              now=T0 + timedelta(seconds=20))
        with pytest.raises(ValueError, match="progress=1.5"):
            repo.update_job(session=session, job_id=first.id, progress=1.5)
    with session_scope(factory) as session:
        stored = repo.get_job(session=session, job_id=first.id)
        assert (stored.state, stored.study_id, stored.finished_at) == ("done", study.id, T0 + timedelta(seconds=20))
        assert repo.get_job(session=session, job_id=10**6) is None


def test_each_job_goes_to_one_worker(factory: Factory) -> None:
    with session_scope(factory) as session:
        request = new_request(session)
        for _ in range(3):
            repo.create_job(session=session, request_id=request.id)

    def claim_all(i: int) -> list[int]:
        claimed = []
        while True:
            with session_scope(factory) as session:
                job = repo.claim_next_job(session=session, worker=f"w{i}")
                if job is None:
                    return claimed
                claimed.append(job.id)

    results = race(4, claim_all)
    all_claimed = sorted(job_id for claimed in results for job_id in claimed)
    assert len(all_claimed) == 3 and len(set(all_claimed)) == 3


def test_a_job_whose_runner_keeps_dying_fails_after_the_stated_deaths(factory: Factory) -> None:
    """Each stale heartbeat hands the job back and counts a death on it; the third death of three fails it, with
    the deaths and the last cause in its error. A job that heartbeats in time is left alone, and a worker's own
    hand-back (a stop) counts nothing."""
    reason = "re-queued: its worker stopped heartbeating"
    with session_scope(factory) as session:
        request = new_request(session)
        job_id = repo.create_job(session=session, request_id=request.id).id
        alive = repo.create_job(session=session, request_id=request.id).id
    t = T0
    for death in (1, 2):
        with session_scope(factory) as session:
            assert repo.claim_next_job(session=session, worker=f"w{death}", now=t).id == job_id
        with session_scope(factory) as session:
            ended = repo.requeue_stale_jobs(session=session, before=t + timedelta(seconds=1), reason=reason,
                                            max_runner_deaths=3)
            assert ended == [(job_id, "queued")]
            job = repo.get_job(session=session, job_id=job_id)
            assert (job.state, job.runner_deaths, job.worker, job.error) == ("queued", death, None, reason)
        t += timedelta(seconds=10)
    with session_scope(factory) as session:  # a stop hands the job back: no death
        assert repo.claim_next_job(session=session, worker="stopping", now=t).id == job_id
        assert repo.end_job(session=session, job_id=job_id, owner="stopping", state="queued") == "queued"
        assert repo.get_job(session=session, job_id=job_id).runner_deaths == 2
    with session_scope(factory) as session:
        assert repo.claim_next_job(session=session, worker="w3", now=t).id == job_id
        assert repo.claim_next_job(session=session, worker="busy", now=t).id == alive
        repo.update_job(session=session, job_id=alive, progress=0.1, now=t + timedelta(seconds=5))
    with session_scope(factory) as session:
        ended = repo.requeue_stale_jobs(session=session, before=t + timedelta(seconds=1), reason=reason,
                                        max_runner_deaths=3, now=t + timedelta(seconds=2))
        assert ended == [(job_id, "failed")]  # the job that heartbeat in time is not touched
        job = repo.get_job(session=session, job_id=job_id)
        assert (job.state, job.runner_deaths, job.finished_at) == ("failed", 3, t + timedelta(seconds=2))
        assert job.error == ("gave up after its runner died 3 times without ending it (at most 3: "
                             f"ZEROTUNE_JOB_MAX_RUNNER_DEATHS); the last: {reason}")
        assert repo.get_job(session=session, job_id=alive).state == "running"
    with session_scope(factory) as session:  # with no cap, a stale job is handed back whatever its count
        assert repo.requeue_stale_jobs(session=session, before=t + timedelta(seconds=60), reason=reason) == [
            (alive, "queued")]


@pytest.mark.parametrize("migrated_url", ["postgresql"], indirect=True)
def test_claim_next_job_skips_a_locked_job_on_postgresql(factory: Factory) -> None:
    """While one worker's claim is uncommitted, another gets the next job at once, not the same one."""
    with session_scope(factory) as session:
        request = new_request(session)
        first, second = (repo.create_job(session=session, request_id=request.id).id for _ in range(2))

    holder_claimed = threading.Event()
    other_done = threading.Event()
    claims: dict[str, int | None] = {}

    def holder() -> None:
        with session_scope(factory) as session:
            job = repo.claim_next_job(session=session, worker="holder")
            claims["holder"] = job.id if job else None
            holder_claimed.set()
            other_done.wait(timeout=30)  # keep the row lock until the other worker has tried

    def other() -> None:
        holder_claimed.wait(timeout=30)
        with session_scope(factory) as session:
            job = repo.claim_next_job(session=session, worker="other")
            claims["other"] = job.id if job else None
        other_done.set()

    threads = [threading.Thread(target=holder), threading.Thread(target=other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert claims == {"holder": first, "other": second}


def test_worker_heartbeats_live_and_forgotten(factory: Factory) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with session_scope(factory) as session:
        job = repo.create_job(session=session, request_id=new_request(session).id)
        repo.stamp_worker(session=session, worker_id="a:1:x", host="a", pid=1, state="idle", now=t0)
        repo.stamp_worker(session=session, worker_id="b:2:y", host="b", pid=2, state="busy", job_id=job.id,
                          jobs_run=3, now=t0 + timedelta(seconds=30))
        repo.stamp_worker(session=session, worker_id="c:3:z", host="c", pid=3, state="stopped",
                          now=t0 + timedelta(seconds=30))
        with pytest.raises(ValueError, match="state"):
            repo.stamp_worker(session=session, worker_id="d:4:w", host="d", pid=4, state="asleep")
    with session_scope(factory) as session:
        live = repo.live_workers(session=session, since=t0 + timedelta(seconds=10))
        assert [(w.id, w.state, w.job_id, w.jobs_run) for w in live] == [("b:2:y", "busy", job.id, 3)]
        assert {w.id for w in repo.live_workers(session=session, since=t0)} == {"a:1:x", "b:2:y"}  # not stopped
        repo.stamp_worker(session=session, worker_id="a:1:x", host="a", pid=1, state="idle",
                          now=t0 + timedelta(seconds=40))  # the same row again, newer
        assert repo.forget_workers(session=session, before=t0 + timedelta(seconds=35)) == 2
    with session_scope(factory) as session:
        left = repo.live_workers(session=session, since=t0)
        assert [(w.id, w.started_at) for w in left] == [("a:1:x", t0)]  # started_at kept across stamps


def test_a_diverged_runs_nan_metrics_are_stored_as_null(factory: Factory) -> None:
    """PostgreSQL's json refuses NaN and text refuses NUL: what a diverged run reports is stored JSON-safe."""
    with session_scope(factory) as session:
        study = new_study(session)
        trial = repo.add_trial(session=session, study_id=study.id, strategy={}, strategy_key="n" * 64, executor="local")
        repo.finish_trial(session=session, trial_id=trial.id, status="failed", reason="loss nan\x00",
                          metrics={"loss": [2.5, float("nan"), float("inf")], "health": {"verdict": "nan"}},
                          logs="step 2 loss nan\x00")
        trial_id = trial.id
    with session_scope(factory) as session:
        row = repo.get_trial(session=session, trial_id=trial_id)
        assert row.metrics == {"loss": [2.5, None, None], "health": {"verdict": "nan"}}
        assert row.reason == "loss nan" and row.logs == "step 2 loss nan"
