"""The Tuner as its callers build it: validated options, a constructor that reads nothing and changes nothing it is
given, and the shortlist measurement as a study of its own (exactly its candidates, each run in full, answered under
the predicted request's key)."""

from __future__ import annotations

import math
import re
import threading

import pytest

from tests.support import session_factory
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.db.migrate import upgrade
from zerotune.tuner.executors.base import Executor, TrialResult
from zerotune.tuner.executors.predicted import ModelExecutor
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.shortlist import Plan, ShortlistTuner
from zerotune.tuner.study import Tuner
from zerotune.tuner.study_options import TunerOptions


@pytest.mark.parametrize("field, value", [
    ("steps", 0), ("steps", 2.5), ("steps", True), ("trial_timeout_s", 0), ("trial_timeout_s", -1.0),
    ("trial_timeout_s", math.inf), ("lease_s", math.nan), ("lease_s", "60"), ("worker_id", " "),
])
def test_options_refuse_a_bad_value_by_name(field, value):
    with pytest.raises(ValueError, match="^" + re.escape(f"{field}={value!r}: ")) as bad:
        TunerOptions(**{field: value})
    assert bad.value.field == field and repr(bad.value.value) == repr(value)
    TunerOptions(steps=1, trial_timeout_s=0.5, lease_s=1, worker_id="host:1")  # the smallest that run


def test_the_constructor_reads_no_database_and_leaves_the_executor_as_it_was(tmp_path):
    """A request that names a calibration and a runner: the Tuner reads them when it runs, not when it is made (the
    database here cannot even be opened), and the model executor keeps the calibration it was made with."""
    cluster = parse_cluster("frontier:8")
    request = TuneRequest(model=parse_model("gpt-13b"), cluster=cluster, trials=4, runner="deepspeed",
                          calibration="frontier-measured")
    executor = ModelExecutor()
    unreachable = session_factory(f"sqlite:///{tmp_path / 'no-such-dir' / 'zt.sqlite'}")
    tuner = Tuner(request, sessions=unreachable, executor=executor, workdir=tmp_path)
    assert executor.calibration is None and tuner.calibration is None
    assert tuner.options == TunerOptions() and tuner.worker_id != Tuner(request, sessions=unreachable,
                                                                         executor=executor, workdir=tmp_path).worker_id
    with pytest.raises(Exception, match="unable to open database file"):
        tuner.run()  # the first read is the run's


class Recorded(Executor):
    """Completes every run at a fixed speed per strategy, recording whether a pruner was handed to it."""

    name, measures = "recorded", True

    def __init__(self, cluster, seconds: dict[str, float]) -> None:
        self.cluster, self.seconds = cluster, seconds
        self.calls: list[tuple[str, bool]] = []

    def run(self, spec, *, stop: threading.Event, on_step=None):
        self.calls.append((spec.strategy.name, on_step is not None))
        t = self.seconds.get(spec.strategy.name, 1.0)
        metrics = {"status": "ok", "step_times_s": [t] * 8, "warmup_steps": 2, "step_time_s": t,
                   "tflops_per_rank": 1.0 / t, "health": {"verdict": "ok"}, "cluster": self.cluster.to_dict()}
        return TrialResult(status="complete", metrics=metrics, executor=self.name)


def test_a_shortlist_runs_exactly_its_candidates_in_full_and_answers_for_the_predicted_request(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    cluster = parse_cluster("local:2x2")
    predicted = TuneRequest(model=parse_model("gpt-tiny"), cluster=cluster, trials=8)
    measured = TuneRequest(model=predicted.model, cluster=cluster, executor="local", trials=2,
                           shortlist_of=predicted.key())
    candidates = [build_strategy(n, cluster).replace(name=n) for n in ("zero2", "zero3")]
    note = {"measured_shortlist": {"of_request": predicted.key(), "predicted_strategy": candidates[0].to_dict(),
                                   "why": "two partitions within the model's error"}}
    todo = Plan(request=measured, candidates=candidates, answer_key=predicted.key(), note=note)
    executor = Recorded(cluster, {"zero2": 1.0, "zero3": 0.5})
    tuner = ShortlistTuner(todo, sessions=session_factory(url), executor=executor, workdir=tmp_path)
    assert not tuner.refines
    rec = tuner.run()
    assert sorted(executor.calls) == [("zero2", False), ("zero3", False)]  # these two, never a pruner
    assert rec["strategy"]["name"] == "zero3" and rec["evidence"] == "measured"
    assert rec["request_key"] == predicted.key() != measured.key()
    assert rec["measured_shortlist"] == {**note["measured_shortlist"], "agrees": False}  # zero2 was predicted
    # a plain study of the same request is handed the pruner, and tries the known-good strategies first
    plain = Recorded(cluster, {})
    url2 = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    upgrade(url2)
    Tuner(measured, sessions=session_factory(url2), executor=plain, workdir=tmp_path / "plain").run()
    assert plain.calls[:2] == [("zero3", True), ("zeropp", True)]  # then the tied leaders run again, in full
