"""Identical requests share one job and one study; a restart loses nothing; workers share a queue."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.api.conftest import rows, wait_job

NEOX = {"model": "gpt-neox-20b", "cluster": "frontier:48", "executor": "model", "budget": {"trials": 10}}


async def _storm(url: str, body: dict, n: int, wait: float) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=wait + 60) as client:
        return await asyncio.gather(*(client.post("/v1/recommendations", json=body, params={"wait": wait})
                                      for _ in range(n)))


@pytest.mark.timeout(300)
def test_200_identical_concurrent_posts_make_one_job_and_one_study(db_url, launcher):
    url_db = db_url
    url = launcher.serve(url_db).url
    answers = asyncio.run(_storm(url, NEOX, 200, wait=180))
    assert {r.status_code for r in answers} == {200}, {r.status_code for r in answers}
    assert len({r.content for r in answers}) == 1  # everyone got the same answer, byte for byte
    assert rows(url_db, "SELECT count(*) FROM zt_requests")[0][0] == 1
    assert rows(url_db, "SELECT count(*) FROM zt_jobs")[0][0] == 1
    assert rows(url_db, "SELECT count(*) FROM zt_studies")[0][0] == 1
    assert rows(url_db, "SELECT count(*) FROM zt_recommendations")[0][0] == 1


def trial_ledger(url_db: str, study_id: int) -> list[tuple]:
    return rows(url_db, "SELECT id, number, status, strategy_key, attempts FROM zt_trials WHERE study_id = :s "
                "ORDER BY id", s=study_id)


def assert_no_trial_lost_or_duplicated(url_db: str, study_id: int, budget: int) -> list[tuple]:
    trials = trial_ledger(url_db, study_id)
    numbers = [t[1] for t in trials]
    assert len(numbers) == len(set(numbers)), "an Optuna trial number was stored twice"
    assert not [t for t in trials if t[2] in ("queued", "running")], "a trial was left unfinished"
    counted = [t for t in trials if t[2] in ("complete", "failed", "infeasible")]
    assert len(counted) == budget, f"{len(counted)} trials counted for a budget of {budget}"
    assert all(t[4] <= 1 for t in trials), "a trial was claimed twice"
    optuna = rows(url_db, "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                  "JOIN zt_studies z ON z.optuna_study_name = s.study_name WHERE z.id = :s", s=study_id)[0][0]
    assert optuna >= len(trials)  # every stored trial is an Optuna trial (pruned asks are Optuna's only)
    return trials


@pytest.mark.timeout(300)
def test_service_restart_mid_job_loses_and_repeats_nothing(sqlite_url, launcher):
    budget = 30
    first = launcher.serve(sqlite_url)
    body = {**NEOX, "budget": {"trials": budget}}
    job_id = httpx.post(f"{first.url}/v1/recommendations", json=body).json()["id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{first.url}/v1/jobs/{job_id}").json()["trials_done"] < 3:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.1)
    first.stop(signal.SIGTERM)  # graceful: the worker finishes its trial and hands the job back
    assert f"job {job_id} (gpt-neox-20b on frontier:48, model, {budget} trials) → queued" in first.tail()
    (state, done), = rows(sqlite_url, "SELECT state, trials_done FROM zt_jobs WHERE id = :j", j=job_id)
    assert state == "queued" and 3 <= done < budget, (state, done)
    (study_id, study_state), = rows(sqlite_url, "SELECT id, state FROM zt_studies")
    before = trial_ledger(sqlite_url, study_id)

    second = launcher.serve(sqlite_url)
    job = wait_job(second.url, job_id, timeout=180)
    assert job["state"] == "done" and job["study_id"] == study_id and job["trials_done"] == budget
    trials = assert_no_trial_lost_or_duplicated(sqlite_url, study_id, budget)
    assert trials[:len(before)] == before  # the first service's trials were kept as they were
    assert rows(sqlite_url, "SELECT count(*) FROM zt_studies")[0][0] == 1
    rec = httpx.post(f"{second.url}/v1/recommendations", json=body)
    assert rec.status_code == 200 and rec.json()["study_id"] == study_id


@pytest.mark.timeout(300)
def test_killed_service_job_is_given_back_and_finished(sqlite_url, launcher):
    """SIGKILL the service and its worker mid-job: the job goes stale, is re-queued and finishes."""
    budget = 25
    first = launcher.serve(sqlite_url)
    body = {**NEOX, "cluster": "frontier:16", "budget": {"trials": budget}}
    job_id = httpx.post(f"{first.url}/v1/recommendations", json=body).json()["id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{first.url}/v1/jobs/{job_id}").json()["trials_done"] < 3:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.1)
    first.kill_group()  # no chance to hand anything back
    assert rows(sqlite_url, "SELECT state FROM zt_jobs WHERE id = :j", j=job_id)[0][0] == "running"
    second = launcher.serve(sqlite_url)
    job = wait_job(second.url, job_id, timeout=180)
    assert job["state"] == "done", job
    (study_id,), = rows(sqlite_url, "SELECT id FROM zt_studies")
    trials = trial_ledger(sqlite_url, study_id)
    numbers = [t[1] for t in trials]
    assert len(numbers) == len(set(numbers)), trials
    assert not [t for t in trials if t[2] in ("queued", "running")], trials
    dead = rows(sqlite_url, "SELECT strategy_key FROM zt_trials WHERE reason LIKE 'interrupted: its runner died%'")
    for (key,) in dead:  # a trial in flight at the kill is recorded as interrupted and its point run again
        assert len([t for t in trials if t[3] == key]) >= 2


@pytest.mark.timeout(300)
def test_two_workers_on_postgresql_share_the_queue(pg_url, launcher):
    server = launcher.serve(pg_url, workers=0)
    a, b = launcher.worker(pg_url), launcher.worker(pg_url)
    for w in (a, b):
        w.wait_log("watching")
    deadline = time.monotonic() + 30  # the service sees remote workers through their heartbeat rows
    while (listed := httpx.get(f"{server.url}/v1/workers").json())["count"] < 2:
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    assert {w["pid"] for w in listed["data"]} == {a.proc.pid, b.proc.pid}, listed
    assert httpx.get(f"{server.url}/readyz").json()["checks"]["workers"]["live"] == 2
    bodies = [{**NEOX, "cluster": f"frontier:{n}", "budget": {"trials": 4}} for n in range(1, 7)]
    jobs = [httpx.post(f"{server.url}/v1/recommendations", json=body).json()["id"] for body in bodies]
    finished = [wait_job(server.url, j, timeout=240) for j in jobs]
    assert [j["state"] for j in finished] == ["done"] * len(jobs), finished
    workers = {j["worker"] for j in finished}
    assert len(workers) == 2, f"one worker ran every job: {workers}"
    assert rows(pg_url, "SELECT count(*) FROM zt_studies")[0][0] == len(jobs)  # one study per job: none ran twice
    for (study_id,) in rows(pg_url, "SELECT id FROM zt_studies"):
        assert_no_trial_lost_or_duplicated(pg_url, study_id, 4)
    for w in (a, b):
        assert w.stop() == 0, w.tail()


@pytest.mark.timeout(300)
def test_a_dead_workers_job_is_finished_by_another(pg_url, launcher):
    server = launcher.serve(pg_url, workers=0)
    a = launcher.worker(pg_url)
    a.wait_log("watching")
    body = {**NEOX, "budget": {"trials": 30}}
    job_id = httpx.post(f"{server.url}/v1/recommendations", json=body).json()["id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{server.url}/v1/jobs/{job_id}").json()["trials_done"] < 3:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.1)
    a.kill_group()
    b = launcher.worker(pg_url)
    job = wait_job(server.url, job_id, timeout=180)
    assert job["state"] == "done" and f":{a.proc.pid}:" not in job["worker"]  # b finished it
    assert "re-queued" in b.log.read_text()
    (study_id,), = rows(pg_url, "SELECT id FROM zt_studies")
    trials = trial_ledger(pg_url, study_id)
    numbers = [t[1] for t in trials]
    assert len(numbers) == len(set(numbers)), trials
    assert not [t for t in trials if t[2] in ("queued", "running")], trials


@pytest.mark.timeout(180)
def test_cancelling_a_running_job_stops_its_study_and_stores_no_answer(sqlite_url, launcher):
    server = launcher.serve(sqlite_url)
    body = {**NEOX, "cluster": "frontier:24", "budget": {"trials": 200}}
    job_id = httpx.post(f"{server.url}/v1/recommendations", json=body).json()["id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{server.url}/v1/jobs/{job_id}").json()["trials_done"] < 2:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.1)
    cancelled = httpx.delete(f"{server.url}/v1/jobs/{job_id}").json()
    assert cancelled["state"] == "cancelled" and "DELETE" in cancelled["error"]
    deadline = time.monotonic() + 60
    while rows(sqlite_url, "SELECT state FROM zt_studies")[0][0] != "cancelled":  # the worker saw it
        assert time.monotonic() < deadline, "the study was not stopped"
        time.sleep(0.2)
    job = httpx.get(f"{server.url}/v1/jobs/{job_id}").json()
    assert job["state"] == "cancelled" and job["trials_done"] < 200 and job["recommendation_id"] is None
    assert rows(sqlite_url, "SELECT count(*) FROM zt_recommendations")[0][0] == 0
    assert not rows(sqlite_url, "SELECT id FROM zt_trials WHERE status IN ('queued', 'running')")
