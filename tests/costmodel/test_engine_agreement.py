"""The cost model against the engine it models: for a grid of strategies on three topologies, the bytes
and the memory it predicts equal the trainer's own counts exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from zerotune.core.spec import Strategy
from zerotune.costmodel import (
    activation_memory,
    predict,
    step_volume,
)
from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, parse_cluster, parse_model
from zerotune.errors import SpecError

CHECKS = Path(__file__).parents[1] / "trainer" / "engine_checks.py"


TOPOLOGIES = ["local:2x2", "local:2x4", "local:2x2x2"]


def strategy_grid(cluster_text: str, count: int = 22) -> list[dict]:
    """The presets plus random valid strategies (seeded), as engine_checks cases of one step."""
    cluster = parse_cluster(cluster_text)
    L = cluster.num_levels  # noqa: N806
    cases = []
    for name in STRATEGY_PRESETS:
        try:
            build_strategy(name, cluster)
        except SpecError:
            continue
        cases.append({"name": name, "strategy": name, "set": {"allgather_bucket_mb": 0.1, "reduce_bucket_mb": 0.2}})
    rng = random.Random(cluster_text)
    while len(cases) < count:
        p = rng.randint(0, L)
        g = rng.randint(p, L)
        o = rng.randint(g, L)
        fields = {"param_span": p, "grad_span": g, "optim_span": o,
                  "secondary_span": rng.choice([None] + list(range(p))),
                  "quantize_above": rng.randint(1, L), "weight_bits": rng.choice([16, 8, 4]),
                  "grad_bits": rng.choice([16, 8, 4]), "allgather_bucket_mb": rng.choice([0.05, 0.1, 0.3, 25]),
                  "reduce_bucket_mb": rng.choice([0.1, 0.25, 25]), "prefetch_buckets": rng.randint(0, 2),
                  "micro_batch_size": rng.choice([1, 2])}
        try:
            s = build_strategy(fields, cluster)
        except SpecError:
            continue
        cases.append({"name": f"random{len(cases)}", "strategy": s.to_dict(), "accum": rng.choice([1, 2]),
                      "quant_block": 256})
    for case in cases:
        case["steps"] = 1
    return cases


@pytest.fixture(scope="module", params=TOPOLOGIES)
def grid_runs(request, ranks_runner, tmp_path_factory):
    cluster = parse_cluster(request.param)
    cases = strategy_grid(request.param)
    ranks_runner(cluster.world_size, CHECKS, [request.param, json.dumps(cases)], timeout_s=420)
    out_dir = max(tmp_path_factory.getbasetemp().glob("engine_checks*"), key=lambda p: p.stat().st_mtime)
    return cluster, [(c, torch.load(out_dir / f"{c['name']}.pt")) for c in cases]


def test_grid_has_at_least_20_distinct_strategies(grid_runs):
    _, runs = grid_runs
    assert len({json.dumps(r["strategy"], sort_keys=True) for _, r in runs}) >= 20


def test_predicted_bytes_equal_measured_bytes_exactly(grid_runs):
    cluster, runs = grid_runs
    model = parse_model("gpt-tiny")
    for case, result in runs:
        s = Strategy.from_dict(result["strategy"])
        accum = case.get("accum", 1)
        want = step_volume(model, cluster, s, elem_bytes=4, accum=accum, block=case.get("quant_block", 2048))
        assert result["bytes"] == want, case["name"]
        p = predict(model, cluster, s, elem_bytes=4, global_batch=cluster.world_size * s.micro_batch_size * accum,
                    block=case.get("quant_block", 2048))
        assert p["bytes_per_level"] == want, case["name"]
        # the (de)quantized elements the model charges at quant_elems_per_s are the ones the engine ran
        assert p["quantization"]["elements"] == result["quant_elements"], case["name"]
    assert any(r["quant_elements"] for _, r in runs)  # the grid quantizes


def test_predicted_state_memory_equals_the_accountant(grid_runs):
    cluster, runs = grid_runs
    model = parse_model("gpt-tiny")
    for case, result in runs:
        s = Strategy.from_dict(result["strategy"])
        p = predict(model, cluster, s, elem_bytes=4)
        for key in ("params", "secondary_params", "grads", "optim_states"):
            assert p["memory_bytes"][key] == result["memory"][key], (case["name"], key)


def test_activation_estimate_equals_the_accountant(grid_runs):
    cluster, runs = grid_runs
    model = parse_model("gpt-tiny")
    for case, result in runs:
        s = Strategy.from_dict(result["strategy"])
        measured, predicted = result["memory"]["activations"], activation_memory(model, s, 4)
        assert predicted == measured, (case["name"], predicted, measured)
