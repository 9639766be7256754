"""A study whose runs all fail says the cause once, with its count, and stops early instead of repeating it."""

from __future__ import annotations

import pytest

from tests.support import session_factory
from tests.tuner.test_study import trials_of
from zerotune.costmodel.catalog import parse_cluster, parse_model
from zerotune.db.migrate import upgrade
from zerotune.errors import StudyFailed
from zerotune.tuner import failures
from zerotune.tuner.executors.base import Executor, TrialResult
from zerotune.tuner.request import TuneRequest
from zerotune.tuner.study import Tuner

SBATCH = ("sbatch failed (exit 1): sbatch: error: Batch job submission failed: Unable to contact slurm controller "
          "(connect failure) [job {n}]")


def test_one_cause_is_named_once_with_its_count_before_the_infeasible_points():
    rows = [("infeasible", f"needs {g} GiB of 64 GiB; largest: optim_states") for g in (94.7, 120.1, 81.2)]
    rows += [("failed", SBATCH.format(n=n)) for n in range(16)]
    text = failures.summary(rows)
    assert text.startswith("16 failed, 3 infeasible; "), text
    assert f"{SBATCH.format(n=0)} (16x); needs 94.7 GiB of 64 GiB; largest: optim_states (3x)" in text
    assert "[" not in text.split("; ")[0]  # a sentence, not a Python list


def test_repeated_failure_needs_the_same_cause_and_no_completed_run():
    same = [("failed", SBATCH.format(n=n)) for n in range(3)]
    assert failures.repeated_failure(same) == SBATCH.format(n=2)
    assert failures.repeated_failure(same[:2]) is None
    assert failures.repeated_failure([*same, ("complete", None)]) is None
    mixed = [("failed", SBATCH.format(n=0)), ("failed", "timed out after 600 s"), ("failed", SBATCH.format(n=1))]
    assert failures.repeated_failure(mixed) is None
    ended_from_outside = [("failed", "pruned: step times worse than the study's best")] * 3
    ended_from_outside += [("failed", "runner died: its lease expired without a heartbeat; retried once")] * 3
    assert failures.repeated_failure(ended_from_outside) is None
    assert failures.repeated_failure([("infeasible", "needs 90 GiB")] * 5) is None


class UnreachableSlurm(Executor):
    """Every submission fails the way sbatch does with no reachable controller."""

    name = "slurm"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, spec, *, stop, on_step=None):
        self.calls += 1
        return TrialResult(status="failed", reason=SBATCH.format(n=self.calls), executor=self.name)


def test_a_study_stops_after_three_runs_fail_for_one_cause(tmp_path):
    url = f"sqlite:///{tmp_path / 'zt.sqlite'}"
    upgrade(url)
    executor = UnreachableSlurm()
    request = TuneRequest(model=parse_model("gpt-tiny"), cluster=parse_cluster("local:2x2"), executor="slurm",
                          trials=16, seed=0)
    with pytest.raises(StudyFailed) as err:
        Tuner(request, sessions=session_factory(url), executor=executor, workdir=tmp_path).run()
    assert executor.calls == failures.FAIL_FAST  # not 16
    message = str(err.value)
    assert "stopped after 3 failed runs and none completed, all with one cause" in message
    assert "Unable to contact slurm controller" in message
    stored = [t for t in trials_of(url, 1) if t.status == "failed"]
    assert len(stored) == 3
