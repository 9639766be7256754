"""Leaders with their spread: intervals from the timed steps; overlapping leaders run again and are pooled."""

from __future__ import annotations

import pytest

from tests.support import session_factory
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.db.migrate import upgrade
from zerotune.tuner import remeasure
from zerotune.tuner.executors.base import Executor, TrialResult
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.shortlist import Plan, ShortlistTuner


def run_json(times: list[float], tflops_at_median: float, warmup: int = 2) -> dict:
    return {"status": "ok", "step_times_s": [9.0] * warmup + times, "warmup_steps": warmup,
            "tflops_per_rank": tflops_at_median, "health": {"verdict": "ok"}}


def test_interval_is_the_value_at_the_quartiles_of_the_timed_steps():
    m = run_json([1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0], 10.0)
    low, high = remeasure.interval(10.0, m)
    # inclusive quartiles of 1,1,2,2,2,3,3,3: 1.75 and 3.0 around the median 2.0
    assert (low, high) == pytest.approx((10.0 * 2.0 / 3.0, 10.0 * 2.0 / 1.75))
    assert remeasure.timed_steps(m) == [1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0]  # the warm-up is left out


def test_only_rivals_reaching_the_leader_are_remeasured():
    tight = [1.0, 1.01, 0.99, 1.0, 1.0, 1.02, 0.98, 1.0]
    leader = (1, 10.0, run_json(tight, 10.0))
    close = (2, 9.97, run_json(tight, 9.97))  # its high end (9.995) reaches the leader's low end (9.975)
    far = (3, 8.0, run_json(tight, 8.0))
    assert remeasure.overlapping([leader, close, far]) == [1, 2]
    assert remeasure.overlapping([leader, far]) == []
    assert remeasure.overlapping([leader]) == []


def test_pooling_recomputes_value_and_interval_from_both_runs():
    first = run_json([1.0, 1.0, 1.0, 1.0], 10.0)
    value, metrics = remeasure.pooled(first, 10.0, run_json([2.0, 2.0, 2.0, 2.0], 5.0))
    assert value == pytest.approx(10.0 / 1.5)  # the pooled median of 1,1,1,1,2,2,2,2 is 1.5
    assert metrics["remeasured"]["runs"] == 2 and len(metrics["remeasured"]["timed_steps_s"]) == 8
    assert metrics["remeasured"]["first_value"] == 10.0 and metrics["remeasured"]["second_value"] == 5.0
    assert remeasure.timed_steps(metrics) == [1.0] * 4 + [2.0] * 4


class RecordedExecutor(Executor):
    """Returns recorded runs: each strategy's step times in turn (first run, then the second)."""

    name = "recorded"

    def __init__(self, cluster, runs: dict[str, list[list[float]]]) -> None:
        self.cluster, self.runs = cluster, runs
        self.calls: list[str] = []

    def run(self, spec, *, stop, on_step=None):
        name = spec.strategy.name
        self.calls.append(name)
        times = self.runs[name][self.calls.count(name) - 1]
        median = sorted(times)[len(times) // 2]
        metrics = {**run_json(times, 1.0 / median), "cluster": self.cluster.to_dict()}
        return TrialResult(status="complete", metrics=metrics, executor=self.name)


def test_a_study_remeasures_overlapping_leaders_before_it_answers(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    cluster = parse_cluster("local:2x2")
    noisy = [1.0, 1.3, 0.9, 1.2, 1.0, 1.25, 0.95, 1.1]
    runs = {"zero2": [noisy, [1.2] * 8], "zero3": [[t * 1.02 for t in noisy], [1.0] * 8], "zero1": [[3.0] * 8]}
    executor = RecordedExecutor(cluster, runs)
    request = TuneRequest(model=parse_model("gpt-tiny"), cluster=cluster, executor="local", trials=3)
    candidates = [build_strategy(n, cluster).replace(name=n) for n in ("zero2", "zero3", "zero1")]
    todo = Plan(request=request, candidates=candidates, answer_key=request.key(), note={})
    rec = ShortlistTuner(todo, sessions=session_factory(url), executor=executor, workdir=tmp_path).run()
    assert sorted(executor.calls) == ["zero1", "zero2", "zero2", "zero3", "zero3"]  # zero1 stood clear: run once
    assert len(rec["remeasured"]) == 2
    by_id = {lead["trial_id"]: lead for lead in rec["leaders"]}
    # pooled, zero3 (median 1.0) beats zero2 (median 1.2 over both runs), reversing the first runs' order
    assert rec["strategy"]["name"] == "zero3" and rec["trial_id"] == rec["leaders"][0]["trial_id"]
    lead = by_id[rec["trial_id"]]
    assert lead["remeasured"] and lead["steps"] == 16 and lead["interval"][0] <= lead["value"] <= lead["interval"][1]
    assert rec["metrics"]["remeasured"]["runs"] == 2


def test_a_quantized_leader_inside_the_spread_gives_way_to_the_unquantized_one(tmp_path):
    """Measured, ZeRO++ (8-bit weights, 4-bit gradients) leads by 2% but the intervals overlap even after both
    ran twice: the answer is ZeRO-3, and says why; a clear lead keeps the quantized strategy."""
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    cluster = parse_cluster("local:2x2")
    noisy = [1.0, 1.3, 0.9, 1.2, 1.0, 1.25, 0.95, 1.1]
    runs = {"zeropp": [noisy, noisy], "zero3": [[t * 1.02 for t in noisy]] * 2}
    request = TuneRequest(model=parse_model("gpt-tiny"), cluster=cluster, executor="local", trials=2)
    candidates = [build_strategy(n, cluster).replace(name=n) for n in ("zeropp", "zero3")]
    assert candidates[0].quantized and not candidates[1].quantized
    todo = Plan(request=request, candidates=candidates, answer_key=request.key(), note={})
    rec = ShortlistTuner(todo, sessions=session_factory(url), executor=RecordedExecutor(cluster, runs),
                         workdir=tmp_path).run()
    lossy = rec["decision"]["lossy"]
    assert rec["strategy"]["name"] == "zero3" and lossy["kept"] == "unquantized" and lossy["gain"] > 0
    assert "cannot tell from their noise" in lossy["why"]

    clear = {"zeropp": [[0.5] * 8], "zero3": [[1.0] * 8]}
    url2 = f"sqlite:///{tmp_path / 'zt2.sqlite'}"
    upgrade(url2)
    rec = ShortlistTuner(todo, sessions=session_factory(url2), executor=RecordedExecutor(cluster, clear),
                         workdir=tmp_path / "2").run()
    assert rec["strategy"]["name"] == "zeropp" and rec["decision"]["lossy"]["kept"] == "quantized"
