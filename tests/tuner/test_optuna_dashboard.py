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
    # why a point does not fit is beside it in the dashboard (its user attributes), the cost model's reason
    for trial_id in infeasible:
        attrs = {a["key"]: a["value"] for a in trials[trial_id]["user_attrs"]}
        assert attrs["reason"] == rows[trial_id].reason and attrs["reason"], attrs
    # the constraint is stored once: Optuna reads one value per trial (its samplers), the dashboard the same one
    from optuna.study._constrained_optimization import _get_constraints_from_system_attrs

    storage = optuna.storages.RDBStorage(url)
    for trial_id, t in trials.items():
        read = _get_constraints_from_system_attrs(storage.get_trial_system_attrs(trial_id))
        assert read == {"0": t["constraints"][0]}
    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert "memory_gib_over" in study_attrs["constraints"]
    # which trial zerotune chose, and why the best shown was passed over: the study's user attributes and note
    chosen = next(t for t in trials.values() if rows[t["trial_id"]].id == rec["trial_id"])
    assert study_attrs["zt_chosen_trial"] == str(chosen["number"])
    assert detail["note"]["body"] == study_attrs["zt_choice"]
    lossy = rec["decision"]["lossy"]
    if best["number"] == chosen["number"]:
        assert study_attrs["zt_choice"].endswith("the best trial shown.")
    else:  # a quantized leader inside the model's error band (gpt-13b on dgx-h100:1 with seed 0 has one)
        assert lossy["kept"] == "unquantized" and rows[best["trial_id"]].id == lossy["quantized_trial_id"]
        assert study_attrs["zt_choice"].startswith(f"zerotune chose trial {chosen['number']} (")
        assert f"not trial {best['number']} shown as best" in study_attrs["zt_choice"]
        assert lossy["why"] in study_attrs["zt_choice"]


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
