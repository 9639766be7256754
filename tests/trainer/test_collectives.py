"""Hierarchical vs flat collectives on real gloo ranks: equality, byte counts, quantization bounds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from zerotune.core import volume
from zerotune.costmodel.catalog import parse_cluster
from zerotune.trainer.quant import QMAX

CHECKS = Path(__file__).with_name("dist_checks.py")
BLOCK = 64  # as dist_checks.BLOCK
TOPOLOGIES = ["local:2x2", "local:2x4", "local:2x2x2", "local:2x1x2"]  # a level of one rank too


@pytest.fixture(scope="module", params=TOPOLOGIES)
def measured(request, ranks_runner):
    cluster = parse_cluster(request.param)
    return cluster, ranks_runner(cluster.world_size, CHECKS, [request.param])


def test_every_range_and_algorithm_was_exercised(measured):
    cluster, ranks = measured
    records = ranks[0]["records"]
    ranges = {tuple(r["levels"]) for r in records}
    assert len(ranges) == cluster.num_levels * (cluster.num_levels + 1) // 2
    assert {(r["op"], r["flat"], r["bits"]) for r in records} >= {
        ("all_gather", f, b) for f in (False, True) for b in (16, 8, 4)}


def test_hierarchical_equals_flat_and_reference_exactly(measured):
    _, ranks = measured
    for rank in ranks:
        checked = [r for r in rank["records"] if "equal" in r]
        assert checked, "no exact checks recorded"
        wrong = [r for r in checked if not r["equal"]]
        assert not wrong, f"rank {rank['rank']}: {wrong[:3]}"


def expected_volume(cluster, r):
    levels = tuple(r["levels"])
    args = dict(elem_bytes=4, bits=r["bits"], quantize_above=r["qa"], block=BLOCK, flat=r["flat"])
    fn = {"all_gather": volume.all_gather_volume, "reduce_scatter": volume.reduce_scatter_volume,
          "all_reduce": volume.all_reduce_volume}[r["op"]]
    return fn(cluster, levels, r["n"], **args)


def test_counted_bytes_equal_closed_form(measured):
    cluster, ranks = measured
    for rank in ranks:
        for r in rank["records"]:
            assert r["bytes"] == expected_volume(cluster, r), r


def test_flat_books_everything_on_the_outermost_level(measured):
    cluster, ranks = measured
    for r in ranks[0]["records"]:
        if r["flat"]:
            outer = cluster.levels[r["levels"][1] - 1].name
            assert set(r["bytes"]) <= {outer}


def test_hierarchical_gather_puts_fewer_bytes_on_the_outer_level(measured):
    """MiCS's point: outer-first gathers send only a shard's worth across the slowest link."""
    cluster, ranks = measured
    full_range = (1, cluster.num_levels)
    outer = cluster.levels[-1].name
    for r in ranks[0]["records"]:
        if r["op"] == "all_gather" and tuple(r["levels"]) == full_range and r["bits"] == 16 and not r["flat"]:
            flat = expected_volume(cluster, {**r, "flat": True})
            assert r["bytes"][outer]["all_gather"] < flat[outer]["all_gather"]


def test_quantized_reduce_scatter_within_documented_bound(measured):
    cluster, ranks = measured
    for rank in ranks:
        for r in rank["records"]:
            if "max_err" not in r:
                continue
            lo, hi = r["levels"]
            sizes = cluster.sizes
            world = 1
            for level in range(lo, hi + 1):
                world *= sizes[level - 1]
            x, qmax = r["max_abs_input"], QMAX[r["bits"]]
            if r["flat"]:
                bound = world * x / (2 * qmax)
            else:
                bound, inner = 0.0, 1
                for level in range(lo, hi + 1):
                    if level >= r["qa"]:
                        bound += world * inner * x / (2 * qmax)
                    inner *= sizes[level - 1]
            assert r["max_err"] <= bound * 1.01 + 1e-6, r
            # and typical error is far below the worst case
            assert r["rel_rms"] < (0.02 if r["bits"] == 8 else 0.3), r


def test_cost_model_charges_the_quantization_the_collectives_run(measured):
    """The elements ``comm.py`` quantizes and dequantizes equal what the cost model charges for
    (``volume.quant_elements``, which ``timing.Costs`` and ``tally`` read)."""
    cluster, ranks = measured
    checked = 0
    for r in ranks[0]["records"]:
        if r["flat"]:
            continue  # the engine runs the hierarchical algorithm; the cost model prices that one
        lo, hi = r["levels"]
        numel = r["n"] if r["op"] == "all_gather" else volume.pad_to(r["n"], math.prod(cluster.sizes[lo - 1:hi]))
        want = volume.quant_elements(cluster, r["qa"], r["op"], lo, hi, numel) if r["bits"] < 16 else 0
        assert r["quant_elems"] == want, r
        checked += want > 0
    assert checked, "no quantized collective crossed a quantized level"
