"""Studies end to end: Optuna ask/tell, trials in SQLite and PostgreSQL, fault paths, recommendation."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from tests.support import ROOT, session_factory
from tests.support.postgres import fresh_database
from zerotune.core.spec import Strategy
from zerotune.costmodel import calibration_for
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.db.migrate import upgrade
from zerotune.db.models import Recommendation, Study, Trial
from zerotune.db.session import make_engine, make_session_factory, session_scope
from zerotune.errors import SpecError
from zerotune.tuner import calibrating, optuna_study, remeasure, seeding
from zerotune.tuner.choice import _checkpointing_call, _lossy_within_band, partition
from zerotune.tuner.executors import make_executor
from zerotune.tuner.executors.local import LocalExecutor
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.seeding import PRESETS
from zerotune.tuner.study import Tuner
from zerotune.tuner.study_options import TunerOptions, prunes


@pytest.fixture
def sqlite_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    return url


@pytest.fixture
def pg_url():
    with fresh_database("zt_study") as url:
        upgrade(url)
        yield url
        make_engine(url).dispose()


def trials_of(url: str, study_id: int) -> list[Trial]:
    with make_session_factory(make_engine(url))() as s:
        return list(s.scalars(select(Trial).where(Trial.study_id == study_id).order_by(Trial.id)))


def test_model_study_enqueues_presets_and_recommends_the_best(sqlite_url, tmp_path):
    request = TuneRequest(model=parse_model("gpt-neox-20b"), cluster=parse_cluster("frontier:48"), trials=25, seed=1)
    tuner = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path)
    rec = tuner.run()
    trials = trials_of(sqlite_url, rec["study_id"])
    done = [t for t in trials if t.status in ("complete", "failed", "infeasible")]
    assert len(done) == 25
    first = [t.strategy.get("name") for t in trials[:len(PRESETS)]]
    assert first[0] == "zero3" and "zeropp" in first  # known-good strategies go first
    best = max((t for t in trials if t.status == "complete"), key=lambda t: t.value)
    lossy = rec["decision"]["lossy"]
    if lossy and lossy["kept"] == "unquantized":  # the fastest was quantized, within the model's error of the pick
        assert best.id == lossy["quantized_trial_id"] and rec["trial_id"] == lossy["unquantized_trial_id"]
        best = next(t for t in trials if t.id == rec["trial_id"])
    assert rec["trial_id"] == best.id and rec["value"] == best.value
    assert rec["evidence"] in ("predicted", "proxy-verified")
    assert set(rec["exports"]) >= {"zerotune", "deepspeed", "fsdp"}
    assert all(t.prediction is not None for t in done)
    with make_session_factory(make_engine(sqlite_url))() as s:
        assert s.scalars(select(Recommendation)).one().trial_id == best.id
    # one training: no batch given, every trial trains world x 4 sequences, however it splits them
    assert request.global_batch == 384 * 4 and request.tokens_per_step == 384 * 4 * 2048
    assert {t.prediction["global_batch"] for t in done} == {request.global_batch}
    assert len({t.strategy["micro_batch_size"] for t in done}) > 1  # micro-batch and accumulation do vary
    assert all(t.prediction["grad_accum_steps"] * t.strategy["micro_batch_size"] * 384 == 1536 for t in done)
    assert rec["exports"]["deepspeed"]["train_batch_size"] == rec["exports"]["zerotune"]["global_batch"] == 1536
    assert rec["exports"]["fsdp"]["global_batch"] == 1536


def test_a_global_batch_fixes_the_micro_batches_the_space_offers(sqlite_url, tmp_path):
    """32 sequences on 16 ranks: 2 per rank, so micro-batch 4 is never tried; tokens_per_step says the same."""
    cluster = parse_cluster("dgx-h100:2")
    request = TuneRequest(model=parse_model("gpt-7b"), cluster=cluster, trials=10, seed=0, global_batch=32)
    assert TuneRequest(model=parse_model("gpt-7b"), cluster=cluster, trials=10, seed=0,
                       tokens_per_step=32 * 2048).key() == request.key()
    rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    done = [t for t in trials_of(sqlite_url, rec["study_id"]) if t.status in ("complete", "infeasible")]
    assert {t.strategy["micro_batch_size"] for t in done} <= {1, 2}
    assert {t.prediction["global_batch"] for t in done} == {32}
    for bad, words in [({"global_batch": 100}, "must be a multiple of 16; nearest: 96"),
                       ({"tokens_per_step": 1000}, "whole number of sequences of 2048 tokens"),
                       ({"global_batch": 32, "tokens_per_step": 2048}, "names another batch than global_batch=32")]:
        with pytest.raises(SpecError, match=words):
            TuneRequest(model=parse_model("gpt-7b"), cluster=cluster, **bad)


def test_zero1_zero2_and_ddp_are_tried_first_where_they_fit(sqlite_url, tmp_path):
    fits = TuneRequest(model=parse_model("gpt-125m"), cluster=parse_cluster("dgx-h100:1"), trials=8, seed=0)
    rec = Tuner(fits, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    first = [t.strategy.get("name") for t in trials_of(sqlite_url, rec["study_id"])[:len(PRESETS)]]
    assert {"zero2", "zero1", "ddp"} <= set(first), first
    big = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("dgx-h100:1"), trials=8, seed=0)
    rec = Tuner(big, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    names = {t.strategy.get("name") for t in trials_of(sqlite_url, rec["study_id"])}
    assert "ddp" not in names and "zero2" in names  # DDP replicates 16 bytes per parameter: 208 GB of 80


def test_infeasible_points_are_never_run(sqlite_url, tmp_path):
    small = parse_cluster("frontier:1")  # 8 GCDs: most strategies cannot hold 20B
    request = TuneRequest(model=parse_model("gpt-neox-20b"), cluster=small, trials=15, seed=3)
    rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    trials = trials_of(sqlite_url, rec["study_id"])
    infeasible = [t for t in trials if t.status == "infeasible"]
    assert infeasible and all("GiB of 64 GiB" in t.reason for t in infeasible)
    assert all(t.metrics is None for t in infeasible)  # screened by the cost model, not dispatched
    assert rec["metrics"]["feasible"]


def test_local_study_stores_every_trial_and_recommends_the_measured_best(pg_url, tmp_path):
    """A measured study on PostgreSQL (on SQLite, the same Tuner's measured studies are tests/tuner/test_tune_cli.py's
    and tests/api/test_service.py's)."""
    url, budget = pg_url, 5
    req = TuneRequest(model=parse_model("gpt-tiny"), cluster=parse_cluster("local:2x2"), executor="local",
                      trials=budget, seed=0)
    rec = Tuner(req, sessions=session_factory(url), executor=LocalExecutor(), workdir=tmp_path,
                options=TunerOptions(steps=8, trial_timeout_s=120)).run()
    trials = trials_of(url, rec["study_id"])
    complete = [t for t in trials if t.status == "complete"]
    assert len([t for t in trials if t.status in ("complete", "failed")]) >= budget
    assert len(complete) >= budget - 2
    for t in complete:
        assert t.metrics["status"] == "ok" and t.metrics["health"]["verdict"] == "ok"
        assert t.prediction["bytes_per_level"] == t.metrics["bytes_per_level"]  # the model agrees on bytes
        # rank 0's seconds in each collective are kept beside the bytes (the trial page shows both)
        assert {lv: set(k) for lv, k in t.metrics["seconds_per_level"].items()} == {
            lv: set(k) for lv, k in t.metrics["bytes_per_level"].items()}
        assert t.metrics["global_batch"] == req.global_batch == 16  # measured on the same training
    best = max(complete, key=lambda t: t.value)
    lossy = rec["decision"]["lossy"]  # a quantized leader inside the runs' spread gives way to an unquantized one
    chosen = lossy["unquantized_trial_id"] if lossy and lossy["kept"] == "unquantized" else best.id
    assert rec["trial_id"] == chosen and rec["evidence"] == "measured"
    assert rec["leaders"][0]["trial_id"] == best.id and set(rec["remeasured"]) <= {t.id for t in complete}
    assert chosen in {lead["trial_id"] for lead in rec["leaders"]}
    for t in complete:  # a re-measured leader pooled the timed steps of both its runs
        runs = 2 if t.id in rec["remeasured"] else 1
        assert len(remeasure.timed_steps(t.metrics)) == runs * 6 and (t.metrics.get("remeasured") is not None) == (
            runs == 2)
    # a run the health gate failed as flat or diverged still ran its steps as a healthy one does
    ran = [t for t in trials if (t.metrics or {}).get("status") == "ok"
           and t.metrics["health"]["verdict"] in calibrating.TIMED_VERDICTS]
    # the measured runs refit the cluster's calibration: closer than the nominal model it started from
    refit = rec["refit"]
    assert refit["name"] == f"local:2x2-study{rec['study_id']}" and refit["start"] == "nominal"
    assert refit["runs"] == refit["study_trials"] == len(ran)
    assert refit["after"]["rows"]["median"] < refit["before"]["rows"]["median"]
    assert refit["cross_validated"]["rows"]["count"] == len(ran)
    # and the next study on that cluster starts from it: its predictions carry the measured error as their band
    sessions = make_session_factory(make_engine(url))
    with session_scope(sessions) as s:
        name = calibrating.resolve_name(s, req.cluster, None)
        calib = calibrating.load(s, name)
    assert name == refit["name"] and calib is not None and calib.measured_error is not None
    nxt = TuneRequest(model=req.model, cluster=req.cluster, trials=4, seed=0, calibration=name)
    assert nxt.key() != dataclasses.replace(nxt, calibration=None).key()  # a new calibration, a new question
    answer = Tuner(nxt, sessions=session_factory(url), executor=make_executor("model", calibration=calib),
                   workdir=tmp_path).run()
    predicted = [t for t in trials_of(url, answer["study_id"]) if t.status == "complete"]
    assert predicted and {t.prediction["calibration"] for t in predicted} == {name}
    band = predicted[0].prediction["error_band"]
    assert band["row_median"] == pytest.approx(refit["cross_validated"]["rows"]["median"])
    assert f"{len(ran)} measured runs on local:2x2" in band["source"]
    assert answer["decision"]["band"] == band["comparison_median"] and answer["refit"] is None


class FaultyExecutor(LocalExecutor):
    """The local executor with an injected fault for one trial's run."""

    def __init__(self, env: dict[str, str], extra: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.env, self.extra = env, extra

    def run(self, spec, *, stop, on_step=None):
        spec = dataclasses.replace(spec, env=tuple(self.env.items()), extra_args=self.extra)
        return super().run(spec, stop=stop, on_step=on_step)


@pytest.mark.parametrize("env, extra, timeout, reason", [
    ({"ZEROTUNE_FAULT": "crash@1:1"}, (), 180, "rank 1 failed: RuntimeError: injected crash"),
    ({"ZEROTUNE_FAULT": "hang@0:1"}, (), 20, "timed out after 20 s"),
    ({}, ("--lr", "1.0"), 180, "unhealthy run (diverged)"),
])
def test_a_bad_trial_fails_alone_with_its_reason(env, extra, timeout, reason, sqlite_url, tmp_path):
    req = TuneRequest(model=parse_model("gpt-tiny"), cluster=parse_cluster("local:2"), executor="local", trials=1)
    tuner = Tuner(req, sessions=session_factory(sqlite_url), executor=FaultyExecutor(env, extra), workdir=tmp_path,
                  options=TunerOptions(steps=6, trial_timeout_s=timeout))
    with pytest.raises(Exception, match="no trial of study"):
        tuner.run()
    (trial,) = [t for t in trials_of(sqlite_url, 1) if t.status != "queued"]
    assert trial.status == "failed" and reason in trial.reason
    # this trial's own ranks (their command line names its run.json), not another test's on the same machine
    run_json = tmp_path / f"trial-{trial.id}" / "run.json"
    assert run_json.parent.is_dir()
    leftover = subprocess.run(["pgrep", "-f", re.escape(str(run_json))], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "ranks left behind"


def test_killed_runner_is_recovered_and_its_trial_run_again(sqlite_url, tmp_path):
    """Kill -9 a `zerotune tune` mid-trial; a restarted runner records the dead trial as interrupted and runs it
    again, to the end. The restarted study prunes by its own rule against the retry's measured step time."""
    args = [sys.executable, "-m", "zerotune.api.cli", "tune", "--model", "gpt-tiny", "--cluster", "local:2",
            "--executor", "local", "--trials", "1", "--steps", "30", "--db", sqlite_url, "--workdir", str(tmp_path),
            "--quiet", "--seed", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    running = None
    while time.monotonic() < deadline and running is None and proc.poll() is None:
        time.sleep(0.5)
        running = next((t for t in trials_of(sqlite_url, 1) if t.status == "running"), None)
    if running is None:
        proc.kill()
        pytest.fail(f"no trial started (exit {proc.wait()}): {proc.stderr.read()[-2000:]}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    # one trial, so the retry has no best to be pruned against (with more, it runs after the other presets, and on
    # a busy machine one of its steps can take over 3x their best: pruned, as the rule says); 10 steps, as a study
    # runs them: 8 timed losses are enough for the health gate to see gpt-tiny learn
    req = TuneRequest(model=parse_model("gpt-tiny"), cluster=parse_cluster("local:2"), executor="local", trials=1,
                      seed=0)
    tuner = Tuner(req, sessions=session_factory(sqlite_url), executor=LocalExecutor(), workdir=tmp_path,
                  options=TunerOptions(steps=10, lease_s=1.0))
    # the dead runner's lease (60 s) must run out first: move its expiry into the past instead of waiting
    with make_session_factory(make_engine(sqlite_url))() as s:
        for t in s.scalars(select(Trial).where(Trial.status == "running")):
            t.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
        s.commit()
    rec = tuner.run()
    trials = trials_of(sqlite_url, rec["study_id"])
    dead = next(t for t in trials if t.id == running.id)
    assert dead.status == "failed" and dead.reason.startswith("interrupted: its runner died")
    assert dead.reason.endswith("; run again")  # cut short from outside: not counted, not a failure
    (retried,) = [t for t in trials if t.strategy_key == dead.strategy_key and t.id != dead.id]
    assert retried.status == "complete", retried.reason  # the retry ran to the end, health gate passed
    assert retried.strategy == dead.strategy and retried.metrics["step_time_s"] > 0
    assert rec["trial_id"] == retried.id and isinstance(rec["strategy"], dict)
    assert Strategy.from_dict(rec["strategy"]) == Strategy.from_dict(retried.strategy)
    # the study's own pruning rule, against its best trial's measured step time
    best = retried.metrics["step_time_s"]
    prune = tuner._pruner()
    assert prune(3, math.nextafter(3 * best, math.inf)) and not prune(3, 3 * best)
    assert not prune(2, 100 * best) and not prune(1, 100 * best)


def test_pareto_objective_uses_nsga2_with_two_values(sqlite_url, tmp_path, monkeypatch):
    import optuna

    # the study the tuner asks and tells, as it built it (optuna.load_study would build one with the default sampler)
    built = []

    def create(*args, **kwargs):
        built.append(real_create(*args, **kwargs))
        return built[-1]
    real_create = optuna_study.create
    monkeypatch.setattr(optuna_study, "create", create)
    req = TuneRequest(model=parse_model("gpt-7b"), cluster=parse_cluster("dgx-h100:4"), trials=12, seed=0,
                      objective="pareto")
    tuner = Tuner(req, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path)
    rec = tuner.run()
    (study,) = built
    assert isinstance(study.sampler, optuna.samplers.NSGAIISampler)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(len(t.values) == 2 for t in complete)
    assert study.best_trials  # the Pareto front
    fastest = max(t.values[0] for t in complete if t.user_attrs.get("zt_trial_id"))
    lossy = rec["decision"]["lossy"]
    if lossy and lossy["kept"] == "unquantized":  # the fastest was quantized, within the model's error of the pick
        assert fastest / rec["value"] - 1 <= lossy["band"]
    else:
        assert rec["value"] == fastest
    # the answer carries the whole front, not one point: Optuna's non-dominated trials, one per distinct point
    front = rec["front"]
    assert len(front) >= 2
    optuna_front = {(round(t.values[0], 9), round(t.values[1], 9)): t.user_attrs["zt_trial_id"]
                    for t in study.best_trials}
    ours = {(round(p["value"], 9), round(p["peak_memory_bytes"] / 2**30, 9)): p["trial_id"] for p in front}
    assert ours.keys() == optuna_front.keys()
    memories = [p["peak_memory_bytes"] for p in front]
    values = [p["value"] for p in front]
    assert memories == sorted(memories) and values == sorted(values)  # more memory buys more speed along it
    assert values[-1] == fastest


def test_warm_start_enqueues_the_best_strategies_of_a_similar_request(sqlite_url, tmp_path):
    import optuna

    first = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=15, seed=0)
    rec = Tuner(first, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    # a budget for the seven presets and the three warm starts (none of which is a preset's point)
    second = TuneRequest(model=parse_model("gpt-7b"), cluster=parse_cluster("frontier:8"), trials=10, seed=0)
    tuner = Tuner(second, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path)
    with make_session_factory(make_engine(sqlite_url))() as s:
        warm = seeding.warm_start(s, second)
    assert warm and warm[0].to_dict() == rec["strategy"]  # the recommended (verified) strategy ranks first
    tuner.run()
    with make_session_factory(make_engine(sqlite_url))() as s:
        name = s.scalars(select(Study).order_by(Study.id.desc())).first().optuna_study_name
    trials = optuna.load_study(study_name=name, storage=sqlite_url).trials
    wanted = [tuner.space.strategy_params(s) for s in warm]
    assert all(any(t.params == p for t in trials[:10]) for p in wanted)  # run among the first (seeded) trials
    # an unrelated cluster family gets no warm start
    other = TuneRequest(model=parse_model("gpt-7b"), cluster=parse_cluster("dgx-h100:8"), trials=3)
    with make_session_factory(make_engine(sqlite_url))() as s:
        assert seeding.warm_start(s, other) == []


def test_local_executor_prunes_a_slow_run(tmp_path):
    """The study's pruning rule (``study_options.prunes``) on real runs: with no best it never stops one; against the
    best trial's measured step time it stops a run at the first step after step 2 that takes over 3x as long."""
    from zerotune.costmodel.catalog import build_strategy
    from zerotune.tuner.executors.base import TrialSpec

    cluster = parse_cluster("local:2")

    def run(model: str, best: float | None, **kw) -> tuple[object, list[tuple[int, float, bool]]]:
        seen: list[tuple[int, float, bool]] = []

        def on_step(step: int, seconds: float) -> bool:
            seen.append((step, seconds, prunes(step, seconds, best)))
            return seen[-1][2]
        spec = TrialSpec(model=parse_model(model), cluster=cluster, strategy=build_strategy("zero3", cluster),
                         workdir=tmp_path / model, timeout_s=240, **kw)
        return LocalExecutor().run(spec, stop=threading.Event(), on_step=on_step), seen

    # the first trial of a study: nothing to compare with, so no step stops it however long it takes
    first, seen = run("gpt-tiny", None, steps=10)
    assert first.status == "complete", first.reason
    assert [s for s, _, _ in seen] == list(range(1, 11)) and not any(p for _, _, p in seen)
    best = first.metrics["step_time_s"]
    assert best > 0
    assert not prunes(3, 3 * best, best) and prunes(3, math.nextafter(3 * best, math.inf), best)
    assert not prunes(2, 1000 * best, best) and not prunes(1, 1000 * best, best)
    # a slower run (gpt-mini: 59x the FLOPs of a sequence; twice the batch, in 8 micro-steps): over 3x the best
    # from its first step, yet it runs through the warm-up and stops at step 3
    slow, seen = run("gpt-mini", best, steps=50, global_batch=16)
    assert slow.status == "pruned" and slow.reason.startswith("pruned") and slow.extra["pruned"]
    assert [s for s, _, _ in seen] == [1, 2, 3] and all(seconds > 3 * best for _, seconds, _ in seen), (best, seen)
    assert [p for _, _, p in seen] == [False, False, True]


def test_a_stopped_tuner_stores_no_recommendation_and_resumes(sqlite_url, tmp_path):
    request = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=12, seed=0)
    stop = threading.Event()
    seen = []

    def progress(p):
        seen.append(p.done)
        if len(seen) == 4:
            stop.set()  # a cancel or a shutdown mid-study

    tuner = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path, stop=stop,
                  progress=progress, options=TunerOptions(verify_quantized=False))
    assert tuner.run() == {}
    with make_session_factory(make_engine(sqlite_url))() as s:
        study = s.scalars(select(Study)).one()
        assert study.state == "cancelled"
        assert s.scalars(select(Recommendation)).all() == []  # a partial study's answer is never stored
    rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path,
                options=TunerOptions(verify_quantized=False)).run(study.id)
    trials = trials_of(sqlite_url, study.id)
    assert rec["study_id"] == study.id
    assert len([t for t in trials if t.status in ("complete", "failed", "infeasible")]) == 12  # the budget, once
    with make_session_factory(make_engine(sqlite_url))() as s:
        assert len(s.scalars(select(Recommendation)).all()) == 1


def test_resume_records_unfinished_trials_as_interrupted_and_runs_them_again(sqlite_url, tmp_path):
    """A runner killed mid-trial leaves a running trial (lease not yet expired) and maybe one it added but never
    started; the next runner records both as interrupted, with the reason, and runs each again. Only an exclusive
    runner (a worker holding the job) may take a running trial whose lease is still valid for dead."""
    import threading

    from zerotune.db import repository as repo
    from zerotune.db.session import session_scope

    request = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=10, seed=0)
    stop = threading.Event()
    first = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path, stop=stop,
                  progress=lambda p: stop.set(), options=TunerOptions(verify_quantized=False))
    assert first.run() == {}
    study_id = first.study_id
    done = next(t for t in trials_of(sqlite_url, study_id) if t.status == "complete")
    sessions = make_session_factory(make_engine(sqlite_url))
    with session_scope(sessions) as s:  # what a killed runner leaves behind
        running = repo.add_trial(session=s, study_id=study_id, strategy=done.strategy, strategy_key="r" * 64,
                                 executor="model")
        repo.claim_trial(session=s, trial_id=running.id, owner="dead-worker", lease_s=3600)
        queued = repo.add_trial(session=s, study_id=study_id, strategy=done.strategy, strategy_key="q" * 64,
                                executor="model")
        running_id, queued_id = running.id, queued.id

    stopped = threading.Event()
    stopped.set()  # recover, then stop before any new trial
    Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path,
          stop=stopped).run(study_id)
    by_id = {t.id: t for t in trials_of(sqlite_url, study_id)}
    assert by_id[queued_id].status == "failed"
    assert by_id[queued_id].reason == "interrupted: its runner stopped before starting it; run again"
    assert by_id[running_id].status == "running"  # its lease is valid and someone else may hold the study

    rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path,
                options=TunerOptions(exclusive=True, verify_quantized=False)).run(study_id)
    trials = trials_of(sqlite_url, study_id)
    by_id = {t.id: t for t in trials}
    assert by_id[running_id].status == "failed"
    assert by_id[running_id].reason == ("interrupted: its runner died (the study was resumed by another runner); "
                                        "run again")
    assert not [t for t in trials if t.status in ("queued", "running")]  # nothing left dangling
    retries = [t for t in trials if t.id > queued_id and t.strategy == done.strategy]
    assert len(retries) == 2 and all(t.status == "complete" for t in retries)  # each run again
    assert rec["study_id"] == study_id


def test_a_calibration_given_to_the_study_ranks_its_trials(tmp_path):
    """The model executor predicts with the study's calibration (make_executor): a slow network reorders the trials,
    and every trial's value is the prediction stored beside it."""
    cluster, model = parse_cluster("frontier:8"), parse_model("gpt-13b")
    profile = calibration_for(cluster)
    # a calibration with its own network rate, as a fit gives one: no fabric law at scale stands in for it
    slow = dataclasses.replace(profile, name="slow-network", bandwidth_efficiency=(0.82, 0.82, 0.01), fabric="")
    values = {}
    for calib in (profile, slow):
        request = TuneRequest(model=model, cluster=cluster, trials=8, seed=0, sampler="random")
        url = f"sqlite:///{tmp_path / calib.name}.sqlite"
        upgrade(url)
        tuner = Tuner(request, sessions=session_factory(url), workdir=tmp_path,
                      executor=make_executor("model", calibration=calib), calibration=calib)
        rec = tuner.run()
        trials = [t for t in trials_of(url, rec["study_id"]) if t.status == "complete"]
        assert all(t.value == t.prediction["tflops_per_rank"] for t in trials)
        assert {t.prediction["calibration"] for t in trials} == {calib.name}
        values[calib.name] = {t.strategy.get("name"): t.value for t in trials if t.strategy.get("name")}
    fast, slowed = values[profile.name], values["slow-network"]
    assert slowed["zero3"] < fast["zero3"] / 2  # ZeRO-3's cross-node gathers dominate on a slow network
    assert slowed["zeropp"] / slowed["zero3"] > fast["zeropp"] / fast["zero3"]  # and ZeRO++ gains from it


def test_a_lossy_choice_wins_only_beyond_the_model_error():
    """The quantized leader loses to its unquantized twin when its gain is inside the 90th-percentile comparison
    error, and keeps the lead beyond it; bucket-size variants of one partition are not each other's runner-up."""
    plain = Strategy(3, 3, 3)
    quant = Strategy(3, 3, 3, secondary_span=2, weight_bits=8, grad_bits=4)
    for gain, kept in ((0.05, "unquantized"), (0.20, "quantized")):
        ranked = [(1, quant, 100.0 * (1 + gain), "predicted", {}), (2, plain, 100.0, "predicted", {})]
        order, lossy = _lossy_within_band(ranked, 0.126)
        assert lossy["kept"] == kept and lossy["gain"] == pytest.approx(gain)
        assert order[0][1] == (plain if kept == "unquantized" else quant)
    assert _lossy_within_band([(1, plain, 100.0, "predicted", {})], 0.126)[1] is None  # nothing lossy to judge
    assert partition(plain) == partition(plain.replace(allgather_bucket_mb=250, prefetch_buckets=2))
    assert partition(plain) != partition(quant)


def test_a_pick_is_held_to_the_models_lean_on_checkpointed_runs():
    """The model's figures for checkpointed runs sat about 10% below its uncheckpointed ones in the published tables
    that measured both: an uncheckpointed pick 5% ahead of a checkpointed rival no longer leads once that lean is
    allowed for (within: both worth measuring); 20% ahead, it does (beyond). A checkpointed pick gains from the lean;
    a pick with no rival of the other setting, or no lean, has no call."""
    lean = {"lean": -0.10, "source": "test"}
    plain, ckpt = Strategy(3, 3, 3), Strategy(3, 3, 3, activation_checkpointing=True, micro_batch_size=4)
    for gain, verdict in ((0.05, "within"), (0.20, "beyond")):
        pick, rival = (1, plain, 100.0 * (1 + gain), "predicted", {}), (2, ckpt, 100.0, "predicted", {})
        call = _checkpointing_call(pick, [pick, rival], lean)
        assert call["verdict"] == verdict and call["rival_trial_id"] == 2 and call["gain"] == pytest.approx(gain)
        assert ("no longer leads" in call["why"]) == (verdict == "within") and "-10.0%" in call["why"]
        assert ("leads beyond that lean" in call["why"]) == (verdict == "beyond")
    pick, rival = (1, ckpt, 95.0, "predicted", {}), (2, plain, 100.0, "predicted", {})  # 95 / 0.9 = 105.6 > 100
    call = _checkpointing_call(pick, [pick, rival], lean)
    assert call["verdict"] == "beyond" and "only widens the pick's lead" in call["why"]
    assert _checkpointing_call(pick, [pick, (3, ckpt, 90.0, "predicted", {})], lean) is None
    assert _checkpointing_call(pick, [pick, rival], None) is None
    # the lean was measured between full checkpointing and none: a selective pick or rival is not held to it
    selective = ckpt.replace(checkpoint_policy="selective")
    mine = (1, selective, 105.0, "predicted", {})
    assert _checkpointing_call(mine, [mine, (2, plain, 100.0, "predicted", {})], lean) is None
    pick = (1, plain, 105.0, "predicted", {})
    assert _checkpointing_call(pick, [pick, (2, selective, 100.0, "predicted", {})], lean) is None
    assert _checkpointing_call(pick, [pick, (2, selective, 104.0, "predicted", {}), (3, ckpt, 100.0, "predicted", {})],
                               lean)["rival_trial_id"] == 3


def test_a_predicted_answer_states_its_margin_against_the_model_error(sqlite_url, tmp_path):
    request = TuneRequest(model=parse_model("gpt-7b"), cluster=parse_cluster("dgx-h100:8"), trials=40, seed=0)
    rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).run()
    d = rec["decision"]
    assert rec["evidence"] == "predicted" and d["band"] == rec["metrics"]["error_band"]["comparison_median"]
    assert d["margin_vs_band"] == ("beyond" if rec["margin"] > d["band"] else "within")
    p90 = rec["metrics"]["error_band"]["comparison_p90"]
    assert not strategy_of(rec).quantized or d["lossy"] is None or d["lossy"]["gain"] > p90
    runner = next(t for t in trials_of(sqlite_url, rec["study_id"]) if t.id == rec["runner_up_trial_id"])
    assert partition(strategy_of(rec)) != partition(strategy_of({"strategy": runner.strategy}))
    lean = rec["metrics"]["error_band"]["checkpointing"]
    assert -0.2 < lean["lean"] < 0 and "llm_foundry" in lean["source"]  # the published tables' lean, stated
    call = d.get("checkpointing")
    if call is not None:  # the best trial of the other checkpointing setting, held to that lean
        rival = next(t for t in trials_of(sqlite_url, rec["study_id"]) if t.id == call["rival_trial_id"])
        assert {strategy_of({"strategy": rival.strategy}).recompute, strategy_of(rec).recompute} == {"none", "full"}
        if call["verdict"] == "within":
            assert {rec["trial_id"], rival.id} <= {c["trial_id"] for c in d["shortlist"]}
    if d["margin_vs_band"] == "within":
        assert d["shortlist"] and all(c["value"] >= rec["value"] * (1 - d["band"]) for c in d["shortlist"]
                                      if c["trial_id"] != (call or {}).get("rival_trial_id"))
    assert (rec["global_batch"], rec["tokens_per_step"]) == (256, 256 * 2048)


def strategy_of(rec):
    return Strategy.from_dict(rec["strategy"])


@pytest.mark.parametrize("fault", ["could not run", "unhealthy"])
def test_only_an_unhealthy_verification_disqualifies_a_quantized_pick(fault, tmp_path, monkeypatch):
    """A predicted quantized leader is verified by a short local run. A run that cannot finish (here: a 0.5 s limit,
    as on a host without torch) gives no verdict: the pick stays, as a prediction, and says why nothing verified it.
    A run that trains to a NaN loss (injected) is a verdict: the pick and every unhealthy leader after it lose their
    place to the best strategy that verifies or quantizes nothing."""
    cluster, model = parse_cluster("frontier:8"), parse_model("gpt-13b")
    slow = dataclasses.replace(calibration_for(cluster), name="slow-network", bandwidth_efficiency=(0.82, 0.82, 0.01))
    url = f"sqlite:///{tmp_path / 'v.sqlite'}"
    upgrade(url)
    if fault == "unhealthy":
        monkeypatch.setenv("ZEROTUNE_FAULT", "nan@0:2")
    # one micro-step a step (64 sequences on 64 GCDs): quantized gathers then move less across the slow network than
    # a replicated strategy's once-a-step reductions (with accumulation they would not)
    request = TuneRequest(model=model, cluster=cluster, trials=10, seed=0, global_batch=64)
    rec = Tuner(request, sessions=session_factory(url), workdir=tmp_path, calibration=slow,
                executor=make_executor("model", calibration=slow),
                options=TunerOptions(trial_timeout_s=0.5 if fault == "could not run" else 180)).run()
    ranked = sorted((t for t in trials_of(url, rec["study_id"]) if t.status == "complete"), key=lambda t: -t.value)
    top = ranked[0]
    assert Strategy.from_dict(top.strategy).quantized  # a slow network: quantized collectives lead
    verification = rec["verification"]
    assert verification["outcome"] == fault and verification["trial_id"] in {t.id for t in ranked[:3]}
    if fault == "could not run":
        assert rec["trial_id"] == top.id and rec["evidence"] == "predicted" and verification["healthy"] is None
        assert "timed out after 0.5 s" in verification["detail"]
    else:
        assert top.id in verification["disqualified"] and rec["trial_id"] not in verification["disqualified"]
        assert "unhealthy run (nan)" in verification["detail"] and verification["healthy"] is False
        chosen = next(t for t in ranked if t.id == rec["trial_id"])
        assert not Strategy.from_dict(chosen.strategy).quantized


def test_a_study_refines_around_its_best_trial_before_tpe_samples(sqlite_url, tmp_path):
    """After the presets, a study tries the neighbours of its best trial (``seeding.refine``: up to a quarter of the
    budget left, around at most three incumbents, each once), then TPE; a random-search study samples as asked."""
    import optuna

    request = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=30, seed=0)
    tuner = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path)
    rec = tuner.run()
    with make_session_factory(make_engine(sqlite_url))() as s:
        name = s.scalars(select(Study).order_by(Study.id.desc())).first().optuna_study_name
    study = optuna.load_study(study_name=name, storage=sqlite_url)
    trials = study.trials
    presets = [t for t in trials if t.user_attrs.get("preset")]
    assert [t.number for t in presets] == list(range(len(presets)))  # the presets first
    best_preset = max((t for t in presets if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.values[0])
    first_round = [t for t in trials if t.user_attrs.get("refine") == str(best_preset.number)]
    assert first_round and [t.number for t in first_round] == list(range(len(presets), len(presets) + len(first_round)))
    assert len(first_round) == (request.trials - len(presets)) // 4  # a quarter of what the presets left
    # each one of the best preset's neighbours, in the order Space.neighbours gives them
    near = [tuner.space.strategy_params(n) for n in tuner.space.neighbours(tuner.space.strategy_of(best_preset.params))]
    assert [t.params for t in first_round] == near[:len(first_round)]
    refined = study.user_attrs[seeding.REFINED]
    assert refined[0] == best_preset.number and len(refined) == len(set(refined)) <= seeding.REFINE_ROUNDS
    assert {t.user_attrs["refine"] for t in trials if t.user_attrs.get("refine")} <= {str(n) for n in refined}
    assert any(not t.user_attrs.get("refine") and not t.user_attrs.get("preset") for t in trials)  # then TPE
    # here the best preset's micro-batch neighbour is faster than every preset: the study found it at once
    complete = optuna.trial.TrialState.COMPLETE
    assert any(t.state == complete and t.values[0] > best_preset.values[0] for t in first_round)
    assert rec["trial_id"] is not None
    random = TuneRequest(model=parse_model("gpt-13b"), cluster=parse_cluster("frontier:8"), trials=12, seed=0,
                         sampler="random")
    assert not Tuner(random, sessions=session_factory(sqlite_url), executor=ModelExecutor(), workdir=tmp_path).refines


def test_the_requests_reserve_decides_what_the_study_finds_feasible(sqlite_url, tmp_path):
    """ZeRO-3 of gpt-neox-20b on one Frontier node fits a GCD's 64 GiB but not beside the computed reserve
    (``costmodel.memory.runtime_reserve``): a request that keeps no reserve seeds and runs the preset as it is, one
    that keeps the computed reserve screens it out and tries it checkpointed. Every trial's verdict is its peak
    beside the reserve the request asked for, the model executor's as the screen's, and the answer says what it
    kept."""
    from zerotune.costmodel.catalog import build_strategy
    from zerotune.tuner.executors.base import TrialSpec

    cluster, neox = parse_cluster("frontier:1"), parse_model("gpt-neox-20b")
    zero3 = build_strategy("zero3", cluster)
    capacity = 64 * 2**30
    for reserve in (None, 0.0):
        request = TuneRequest(model=neox, cluster=cluster, trials=6, seed=3, memory_reserve_gib=reserve)
        rec = Tuner(request, sessions=session_factory(sqlite_url), executor=ModelExecutor(),
                    workdir=tmp_path / str(reserve)).run()
        trials = [t for t in trials_of(sqlite_url, rec["study_id"]) if t.prediction is not None]
        for t in trials:
            kept = t.prediction["memory_reserve"]
            assert kept["source"] == ("computed" if reserve is None else "request")
            assert kept["total_bytes"] > 2**30 if reserve is None else kept["total_bytes"] == 0
            assert (t.status == "infeasible") == (t.prediction["memory_bytes"]["peak"] + kept["total_bytes"] > capacity)
        as_preset = [t for t in trials if Strategy.from_dict(t.strategy) == zero3]
        assert bool(as_preset) == (reserve == 0.0)  # seeded as it is only where it fits
        assert rec["memory"]["headroom_gib"] >= 0 and rec["memory"]["source"] == kept["source"]
        assert rec["memory"]["capacity_gib"] == 64.0 and "GiB kept for the runtime" in rec["memory"]["reason"]
        spec = TrialSpec(model=neox, cluster=cluster, strategy=zero3, workdir=tmp_path, memory_reserve_gib=reserve)
        ran = ModelExecutor().run(spec, stop=threading.Event())
        assert ran.status == ("infeasible" if reserve is None else "complete")
