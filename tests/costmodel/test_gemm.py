"""The GEMM law (``costmodel.gemm``): its points are the kept sweeps', the host's dispatch of each product is fitted out
of them, what is left is held to the sweeps, and a model's matmuls run at their figure's efficiency times the law at
their micro-batch over the law at the figure's run."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from zerotune.core.spec import ModelSpec
from zerotune.costmodel import gemm, hardware, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster
from zerotune.costmodel.profiles import calibration_for, profile_calibration, profile_cluster

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"


@pytest.mark.parametrize("part", ["H100", "H200"])
def test_the_sweeps_are_the_kept_measurements(part):
    kept = json.loads((DATA / f"{part.lower()}-1gpu" / "gemm-efficiency.json").read_text())
    assert kept["device"].startswith(hardware.DEVICES[part].name) and kept["peak_tflops"] == gemm.SWEEP_PEAK_TFLOPS
    assert gemm.SWEEPS[part] == tuple((r["tokens"], r["hidden"], round(r["of_peak"], 3)) for r in kept["rows"])
    for r in kept["rows"]:  # of_peak is the layer's FLOPs over its time, as gemm.layer_flops counts them
        assert r["tflops"] * 1e12 / (gemm.SWEEP_PEAK_TFLOPS * 1e12) == pytest.approx(r["of_peak"], rel=1e-6)


def test_the_fixed_cost_of_a_product_is_the_hosts():
    """Both sweeps fit FLOPs / (e·peak) + 12·t0 with the same e (same SMs) and a t0 of tens of microseconds that
    differs by host: the host's dispatch of one product, which the law takes out."""
    (e100, t100), (e200, t200) = gemm.dispatch_fit("H100"), gemm.dispatch_fit("H200")
    assert e100 == pytest.approx(e200, abs=0.01) and 0.70 < e100 < 0.74
    assert 14e-6 < t100 < 17e-6 and 24e-6 < t200 < 28e-6
    peak = gemm.SWEEP_PEAK_TFLOPS * 1e12
    for part, (e, t0), smallest in (("H100", (e100, t100), 0.14), ("H200", (e200, t200), 0.27)):
        errors = []
        for t, h, measured in gemm.SWEEPS[part]:
            flops = gemm.layer_flops(t, h)
            errors.append(abs(flops / peak / (flops / (e * peak) + 12 * t0) / measured - 1))
        # every row within 16% but the smallest (512 tokens x 1,024), within 14% and 27%: median under 5%
        assert statistics.median(errors) < 0.05 and max(errors[1:]) < 0.16 and errors[0] < smallest


@pytest.mark.parametrize("part", ["H100", "H200"])
def test_the_law_reproduces_its_points(part):
    """At each token count the law (times the plateau) is the median of the device rates over the hidden sizes: at
    least three of the five widths lie within 15% of it at every count, all five from 4,096 tokens on (below, the
    host's dispatch is most of a row's time and what is left of it scatters: the H200's 1,024-token rows run
    0.56-0.98)."""
    rates, points = gemm.device_rates(part), dict(gemm.law_points(part))
    plateau = max(statistics.median(e for t, _, e in rates if t == n) for n in points)
    for n, law in points.items():
        at = [e for t, _, e in rates if t == n]
        assert law * plateau == pytest.approx(statistics.median(at), rel=1e-9) or law == 1.0
        near = [abs(e / (law * plateau) - 1) <= 0.15 for e in at]
        assert all(near) if n >= 4096 else sum(near) >= 3
        assert gemm.gemm_law(part, n) == law


@pytest.mark.parametrize("part", ["H100", "H200"])
def test_the_law_is_monotone_and_saturates_where_the_data_is(part):
    """Non-decreasing in the tokens, 1 from ``PLATEAU_TOKENS`` on and held beyond the sweep; below it the device rate
    falls in both sweeps. No width runs slower than a wider one at the same tokens on the plateau, so the hidden size
    is no argument of the law."""
    laws = [gemm.gemm_law(part, t) for t in (256, 512, 700, 1024, 1500, 2048, 4096, 16384, 1 << 20)]
    assert laws == sorted(laws) and laws[0] == laws[1] < 0.9 and laws[-4:] == [1.0] * 4
    rates = gemm.device_rates(part)
    for n in (2048, 4096, 8192, 16384):
        by_width = {h: e for t, h, e in rates if t == n}
        assert by_width[1024] >= by_width[8192]


def test_a_device_without_a_sweep_takes_the_nearest_documented_one():
    for key in hardware.DEVICES:
        assert gemm.SWEEP_OF[key] in gemm.SWEEPS
    assert gemm.gemm_law("A100", 512) == gemm.gemm_law("H100", 512)
    assert gemm.gemm_curve("TPU", 2048) == ()


def test_the_source_runs_own_prediction_is_unchanged_by_the_law():
    """IBM's 7B on 128 A100 at 2 sequences of 4,096 tokens: the law's factor at its own micro-batch is 1, so its step
    is the same with the curve as without (the re-base, which solves on this step, holds)."""
    run, model = hardware.SOURCE_RUNS[("A100", "pytorch")], hardware.IBM_FSDP_7B
    calib = profile_calibration("x", "A100", tuple(lv[2] for lv in run.levels), stack="pytorch", rings=run.rings,
                                outer_reduce=run.outer_reduce)
    assert gemm.curve_factor(calib.gemm_curve, run.micro_batch * model.seq_len) == 1.0
    cluster = profile_cluster("x", "A100", tuple(lv[:3] for lv in run.levels), tuple(lv[3] for lv in run.levels))
    strategy = build_strategy(dict(run.strategy), cluster, micro_batch_size=run.micro_batch)
    with_law = predict(model, cluster, strategy, calibration=calib)["step_time_s"]
    without = predict(model, cluster, strategy, calibration=dataclasses.replace(calib, gemm_curve=()))["step_time_s"]
    assert with_law == without


def test_a_small_micro_batch_runs_its_matmuls_slower_than_before():
    """gpt-125m-shaped at one sequence of 512 tokens on the DGX A100 preset: its matmuls now run at the law's 0.84 of
    the figure's rate, so compute is longer than with the curve left out, by the matmuls' share; at 2,048 tokens and
    more nothing changes. (The engine's own host floor, 2.4 ms a block, holds this step up more than either: it is
    left out here to see the device.)"""
    cluster = parse_cluster("dgx-a100:8")
    calib = dataclasses.replace(calibration_for(cluster), host_s_per_layer=0.0)  # a runner the host never holds up
    flat = dataclasses.replace(calib, gemm_curve=())
    strategy = build_strategy({"preset": "zero3"}, cluster, micro_batch_size=1)
    for seq, slower in ((512, True), (4096, False)):
        model = ModelSpec("small", layers=12, hidden=768, heads=12, vocab=50304, seq_len=seq)
        now = predict(model, cluster, strategy, calibration=calib)["breakdown"]["compute_s"]
        before = predict(model, cluster, strategy, calibration=flat)["breakdown"]["compute_s"]
        assert (now > before * 1.02) if slower else now == before
    assert gemm.gemm_law("A100", 512) == pytest.approx(0.84, abs=0.01)


def test_an_eager_block_pays_its_memory_bound_kernels_fixed_cost():
    """The floor is a per-block cost whatever the tokens: the same on a micro-batch of one sequence as of eight, so
    it weighs most on the smallest; fused stacks (megatron, flash) pay none."""
    cluster = parse_cluster("dgx-h100:8")
    calib = calibration_for(cluster)
    assert calib.memory_floor_s_per_block == gemm.EAGER_BLOCK_FLOOR_S
    bare = dataclasses.replace(calib, memory_floor_s_per_block=0.0)
    model = ModelSpec("small", layers=12, hidden=768, heads=12, vocab=50304, seq_len=1024)
    for mb in (1, 8):
        strategy = build_strategy({"preset": "zero3"}, cluster, micro_batch_size=mb)
        now = predict(model, cluster, strategy, calibration=calib)["breakdown"]["memory_bound_s"]
        before = predict(model, cluster, strategy, calibration=bare)["breakdown"]["memory_bound_s"]
        assert now - before == pytest.approx(model.layers * gemm.EAGER_BLOCK_FLOOR_S, rel=1e-9)
    assert profile_calibration("x", "H100", (), stack="megatron").memory_floor_s_per_block == 0.0
