"""Which stored runs calibrate: complete ones and those the health gate failed as flat or diverged, not NaN ones."""

from __future__ import annotations

import json

from tests.trainer.test_train import zerotune
from zerotune.db import repository as repo
from zerotune.db.migrate import upgrade
from zerotune.db.session import make_engine, make_session_factory, session_scope
from zerotune.tuner.calibrating import measured_runs


def test_a_gate_failed_run_still_calibrates_unless_it_went_nan(tmp_path):
    out = tmp_path / "run.json"
    r = zerotune("train", "--cluster", "local:2", "--steps", "4", "--warmup", "1", "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    run = json.loads(out.read_text())
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as s:
        req, _ = repo.get_or_create_request(session=s, key="k" * 64, spec={"model": run["model"],
                                                                          "cluster": run["cluster"], "trials": 3,
                                                                          "executor": "local"})
        study = repo.create_study(session=s, request_id=req.id, optuna_study_name="runs", sampler="tpe",
                                  executor="local", n_trials=3)
        ids = {}
        for verdict, status in (("ok", "complete"), ("flat", "failed"), ("nan", "failed")):
            trial = repo.add_trial(session=s, study_id=study.id, strategy=run["strategy"], strategy_key=verdict,
                                   executor="local")
            metrics = {**run, "health": {"verdict": verdict, "evidence": "recorded"}}
            repo.finish_trial(session=s, trial_id=trial.id, status=status, metrics=metrics,
                              value=run["tflops_per_rank"] if status == "complete" else None,
                              reason=None if status == "complete" else f"unhealthy run ({verdict})")
            ids[verdict] = trial.id
        s.flush()
        assert [i for i, _ in measured_runs(s, "local:2")] == [ids["ok"], ids["flat"]]
    engine.dispose()
