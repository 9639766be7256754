"""``predict`` as a pipeline: the walk through it goes forward, its answer is the ``Prediction`` it is typed as,
the trainer's run.json is the ``RunMetrics`` it is typed as, and the memory stage's memo keys on all it reads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support import ROOT
from zerotune.core.records import Breakdown, MemoryBytes, Prediction, RunMetrics, StepMetrics
from zerotune.costmodel import calibration_for, clear_caches, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.rates import run_by

STAGES = ("schedule", "tally", "runners", "traffic", "coordinator", "pipeline", "memory", "result")
"""The modules of ``predict``'s stages, in the order it runs them."""


def _keys(typed: Any) -> tuple[set[str], set[str]]:
    return set(typed.__required_keys__), set(typed.__optional_keys__)


def test_the_walk_through_predict_goes_forward():
    """``bench/predict_walk.py`` follows zero3 and zeropp under each runner through ``predict`` call by call, cold:
    each walk enters the stage modules in the pipeline's order and returns to a module already visited at most
    11 times (40 before the pipeline; the fabrics law at scale, asked by timing, adds one)."""
    out = subprocess.run([sys.executable, "bench/predict_walk.py", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    walks = json.loads(out.stdout)["walks"]
    assert {(w["preset"], w["runner"]) for w in walks} == {(p, r) for p in ("zero3", "zeropp")
                                                           for r in ("zerotune", "deepspeed", "fsdp")}
    for w in walks:
        assert w["returns"] <= 11, (w["preset"], w["runner"], w["sequence"])
        first = [w["sequence"].index(stage) for stage in STAGES]
        assert first == sorted(first), (w["preset"], w["runner"], w["sequence"])
        assert w["sequence"][0] == "predict" and w["visits"]["predict"] == 1
        assert sum(w["visits"].values()) - w["modules"] == w["returns"]


@pytest.mark.parametrize("case", ["fits", "overflows", "deepspeed"])
def test_a_prediction_has_exactly_the_fields_of_its_type(case):
    """Every key ``predict`` writes is one ``Prediction`` defines, every required one is there, and the optional
    ones exactly where they apply (``deepspeed`` for a ZeRO-3 run by DeepSpeed, ``overflow`` where it does not fit);
    so are the nested breakdown and memory."""
    cluster = parse_cluster("dgx-h100:16")
    model = parse_model("gpt-neox-20b" if case != "overflows" else "llama3-70b")
    calib = run_by(calibration_for(cluster), "deepspeed" if case == "deepspeed" else "zerotune")
    s = build_strategy("zero3" if case != "overflows" else "ddp", cluster)
    p = predict(model, cluster, s, calibration=calib, global_batch=4 * cluster.world_size)
    required, optional = _keys(Prediction)
    assert required <= set(p) <= required | optional
    assert set(p) - required == {"fits": set(), "overflows": {"overflow"}, "deepspeed": {"deepspeed"}}[case]
    assert p["feasible"] == (case != "overflows")
    assert set(p["breakdown"]) == _keys(Breakdown)[0]
    assert set(p["memory_bytes"]) == _keys(MemoryBytes)[0]
    assert required >= _keys(StepMetrics)[0]  # the trainer's names, the same fields


def test_the_trainers_run_json_has_exactly_the_fields_of_its_type():
    """The run.json ``trainer.train.run`` builds (rank 0's) writes every field ``RunMetrics`` requires and none it
    does not define, read off the trainer's source (it runs only under torchrun): the dict it declares a
    ``RunMetrics`` and the keys it sets on it after."""
    tree = ast.parse((ROOT / "zerotune" / "trainer" / "train.py").read_text())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    built = next(n for n in ast.walk(run) if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Dict)
                 and ast.unparse(n.annotation) == "RunMetrics")
    assert isinstance(built.target, ast.Name) and built.value is not None
    written = {k.value for k in built.value.keys if isinstance(k, ast.Constant)}
    assert None not in built.value.keys  # no ** unpacking: every key is written out
    set_after = {n.targets[0].slice.value for n in ast.walk(run) if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Subscript) and ast.unparse(n.targets[0].value) == built.target.id
                 and isinstance(n.targets[0].slice, ast.Constant)}
    required, optional = _keys(RunMetrics)
    assert required <= written <= required | optional and set_after <= optional, (written, set_after)
    assert set_after == {"profile"}
    assert required >= _keys(StepMetrics)[0]


@pytest.mark.parametrize("change", [{"prefetch_buckets": 2}, {"micro_batch_size": 2},
                                    {"activation_checkpointing": False}, {"checkpoint_every": 2},
                                    {"checkpoint_policy": "selective"}])
def test_strategies_that_share_a_schedule_get_their_own_memory(change):
    """The memory stage memoizes per schedule and what else it reads: two strategies that share the schedule and
    differ in one such field each get, the one after the other, the memory they get cold (and not the same)."""
    cluster, model = parse_cluster("dgx-h100:16"), parse_model("gpt-neox-20b")
    base = build_strategy("zero3", cluster, activation_checkpointing=True)
    other = base.replace(**change)
    clear_caches()
    cold = [predict(model, cluster, x)["memory_bytes"] for x in (other,)]
    clear_caches()
    warm = [predict(model, cluster, x)["memory_bytes"] for x in (base, other)]
    assert warm[1] == cold[0] and warm[0] != warm[1]
