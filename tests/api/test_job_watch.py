"""The service's job watcher against a job that ends between two of its reads (no server, no worker)."""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from zerotune.api import queries, schemas
from zerotune.api.cache import AnswerCache
from zerotune.api.inputs import RecommendationCreate
from zerotune.api.service import Service, normalize
from zerotune.api.settings import Settings
from zerotune.db import repository as repo
from zerotune.db.migrate import upgrade
from zerotune.db.session import make_engine, make_session_factory, session_scope


def test_a_job_that_ends_while_the_watcher_reads_it_comes_back_with_its_answer(db_url):
    upgrade(db_url)
    settings = Settings(db=db_url, workers=0)
    service = Service(settings)
    request = normalize(RecommendationCreate(model="gpt-tiny", cluster="local:2x2"), settings)
    key = request.key()
    other = make_session_factory(make_engine(db_url))  # the worker's side: another connection
    with session_scope(other) as s:
        req, _ = repo.get_or_create_request(session=s, key=key, spec=request.to_dict())
        job, _ = repo.get_or_create_job(session=s, request_id=req.id)
        study = repo.create_study(session=s, request_id=req.id, optuna_study_name="zt-race", sampler="tpe",
                                  executor="model", n_trials=2)
        repo.set_study_state(session=s, study_id=study.id, state="running")
        repo.update_job(session=s, job_id=job.id, state="running", study_id=study.id, trials_done=1)
        job_id, study_id = job.id, study.id
    with session_scope(service.sessions) as s:
        stored = repo.get_job(session=s, job_id=job_id)
        assert stored is not None
        service.track(key, queries.job_public(s, stored))
    with session_scope(other) as s:  # a trial finished: the watcher has something new to read
        repo.update_job(session=s, job_id=job_id, trials_done=2)

    def finish() -> None:  # what the worker commits at the end: the study, its answer, then the job
        with session_scope(other) as s:
            repo.save_recommendation(session=s, study_id=study_id, request_key=key, strategy={"name": "zero3"},
                                     metrics={"tflops_per_rank": 1.0}, evidence="predicted", exports={})
            repo.set_study_state(session=s, study_id=study_id, state="done")
            repo.update_job(session=s, job_id=job_id, state="done", progress=1.0)

    ended_between: list[bool] = []

    @event.listens_for(service.engine, "after_cursor_execute")
    def job_ends_now(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        # right after the watcher's first query saw the job running, the job ends
        if not ended_between and "zt_jobs.state" in statement and "zt_jobs.id IN" in statement:
            ended_between.append(True)
            finish()

    [(got_key, public, answer)] = service._refresh(dict(service.active))
    assert ended_between == [True]
    assert got_key == key and public.state == "done" and public.recommendation_id is not None
    assert answer is not None, "a done job came back without its answer"
    assert schemas.RecommendationPublic.model_validate_json(answer).id == public.recommendation_id

    # and a POST that waited on the job answers 200 even if the job's end reached it without the answer
    event.remove(service.engine, "after_cursor_execute", job_ends_now)
    service.cache = AnswerCache(settings.cache_size)  # the answer is in the database only

    async def post() -> bytes | None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, service.ended, key, public, None)
        outcome = await service.answer(request, wait_s=5)
        return outcome.answer

    assert asyncio.run(post()) == answer
    assert service.cache.get(key) == answer
    service.stop()
