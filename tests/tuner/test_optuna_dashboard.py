"""optuna-dashboard, the tool docs/dashboard.md points Optuna users to, reads our studies as they are: each
trial's feasibility, the best trial among the points that fit, and no best where nothing fits. The real
optuna-dashboard (its WSGI app over real HTTP) against a study database written by the real tuner."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import optuna
import pytest
from sqlalchemy import select

from tests.support import session_factory
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.db.migrate import upgrade
from zerotune.db.models import Trial
from zerotune.db.session import make_engine, make_session_factory
from zerotune.errors import StudyFailed
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.study import Tuner


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def optuna_dashboard(url: str) -> Iterator[str]:
    import optuna_dashboard as od

    server = make_server("127.0.0.1", 0, od.wsgi(optuna.storages.RDBStorage(url)), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def study_detail(base: str) -> dict:
    studies = httpx.get(f"{base}/api/studies", timeout=30).json()["study_summaries"]
    assert len(studies) == 1, studies
    return httpx.get(f"{base}/api/studies/{studies[0]['study_id']}", timeout=30).json()


def stored(url: str) -> dict[int, Trial]:
    with make_session_factory(make_engine(url))() as s:
        return {t.optuna_trial_id: t for t in s.scalars(select(Trial))}


@pytest.mark.timeout(120)
def test_optuna_dashboard_sees_feasibility_and_crowns_only_a_point_that_fits(tmp_path):
    url = f"sqlite:///{tmp_path / 'fits.sqlite'}"
    upgrade(url)
    request = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("dgx-h100:1"), trials=24, seed=0)
    rec = Tuner(request, sessions=session_factory(url), executor=ModelExecutor(), workdir=tmp_path).run()
    rows = stored(url)
    infeasible = {i for i, t in rows.items() if t.status == "infeasible"}
    assert infeasible and len(infeasible) < len(rows), "the study needs points on both sides of the limit"
    with optuna_dashboard(url) as base:
        detail = study_detail(base)
    trials = {t["trial_id"]: t for t in detail["trials"]}
    for trial_id, t in trials.items():
        (over,) = t["constraints"]  # the dashboard shows every trial's constraint
        assert (over > 0) == (trial_id in infeasible), (t, rows[trial_id].status)
    (best,) = detail["best_trials"]
    assert best["constraints"][0] <= 0 and best["trial_id"] not in infeasible
    fastest_that_fits = max(t.value for t in rows.values() if t.status == "complete")
    assert rows[best["trial_id"]].value == fastest_that_fits
    assert rec["value"] <= fastest_that_fits  # the answer is never a point that does not fit


@pytest.mark.timeout(120)
def test_a_study_where_nothing_fits_has_no_best_in_optuna_dashboard(tmp_path):
    url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    upgrade(url)
    request = TuneRequest(model=parse_model("gpt-neox-20b"), cluster=parse_cluster("local:2x2"), trials=6, seed=0)
    with pytest.raises(StudyFailed, match="no trial of study"):
        Tuner(request, sessions=session_factory(url), executor=ModelExecutor(), workdir=tmp_path).run()
    assert {t.status for t in stored(url).values()} == {"infeasible"}
    with optuna_dashboard(url) as base:
        detail = study_detail(base)
    assert detail["best_trials"] == []
    assert detail["trials"] and all(t["constraints"][0] > 0 for t in detail["trials"])
