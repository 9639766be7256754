"""How the cost model is asked and how fast it answers: the predict command's sweep, table and JSON; the
bucket pipeline's skip against the plain schedule; memoized schedules and cuts equal to fresh ones; the rate bench."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tests.support import ROOT
from zerotune.api.cli import main
from zerotune.costmodel import (
    calibration_for,
    predict,
)
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model


def test_predict_cli_sweep_table_and_json(capsys):
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:1,2,48", "--strategy", "zero3",
                 "--strategy", "zero1"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("frontier:") for line in out.splitlines()) == 6 and "no (params)" in out
    # every row states its error: the published band near its scale, one footnote per band naming its source
    band = predict(parse_model("gpt-neox-20b"), parse_cluster("frontier:48"),
                   build_strategy("zero3", parse_cluster("frontier:48")))["error_band"]
    row48 = next(line for line in out.splitlines() if line.startswith("frontier:48   zero3"))
    assert row48.endswith(f"{band['row_median']:.0%}/{band['row_p90']:.0%}")
    assert f"error on frontier:48: figures {band['row_median']:.0%} median" in out and "bench/published.py" in out
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--runner", "deepspeed"]) == 0
    # RCCL's flat rings past 16 Frontier nodes are charged by their measured law (fabrics.py): no residual to state
    assert "flat rings over" not in capsys.readouterr().out
    assert main(["predict", "--model", "gpt-mini", "--cluster", "local:2x2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].endswith(" -") and "'zerotune calibrate'" in out
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--strategy", "zeropp",
                 "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert {"step_time_s", "tokens_per_s", "tflops_per_rank", "bytes_per_level", "memory_bytes"} <= set(p)
    assert {"params", "secondary_params", "grads", "optim_states", "comm_buffers", "activations", "peak"} <= set(
        p["memory_bytes"])
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--calibration", "nope"]) == 2
    capsys.readouterr()
    # the same spans as DeepSpeed would run them: one ring over the whole group, gradients reduced in backward
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--strategy", "zeropp",
                 "--runner", "deepspeed", "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert flat["bytes_per_level"] == p["bytes_per_level"] and flat["step_time_s"] != p["step_time_s"]
    # and what DeepSpeed's coordinator gathers and holds under the export's stage-3 settings, which it prints
    from zerotune.costmodel.coordinator import settings_for, simulate
    from zerotune.tuner.exports import deepspeed_config

    neox, c48 = parse_model("gpt-neox-20b"), parse_cluster("frontier:48")
    zeropp = build_strategy("zeropp", c48)
    step = simulate(neox, settings_for(neox, c48, zeropp, "export"), zeropp.activation_checkpointing)
    ds = flat["deepspeed"]
    written = deepspeed_config(neox, c48, zeropp)["zero_optimization"]
    assert ds["stage3_settings"] == "export" and all(written[k] == v for k, v in ds["stage3"].items()), ds
    assert ds["gathered_per_step"] == pytest.approx(sum(step.elements) / step.partitioned)
    assert ds["held_peak_bytes"] == 2 * step.peak and 1.9 < ds["gathered_per_step"] <= 2.0, ds
    assert "deepspeed" not in p  # zerotune's engine: no such block
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--strategy", "zeropp",
                 "--runner", "deepspeed"]) == 0
    assert (f"DeepSpeed on frontier:48 zeropp (zerotune's export stage-3 settings): gathers its partitioned "
            f"parameters {ds['gathered_per_step']:.2f} times a step") in capsys.readouterr().out
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:48", "--runner", "fsdp"]) == 0
    assert "run by fsdp" in capsys.readouterr().out
    assert "host-bound" not in out
    # a small model at one sequence per micro-step: the table says it waits for the host, and how to leave it
    assert main(["predict", "--model", "gpt-1.3b", "--cluster", "dgx-h100:1", "--set", "micro_batch_size=1"]) == 0
    out = capsys.readouterr().out
    assert "host-bound on dgx-h100:1 zero3: " in out and "--set micro_batch_size=N" in out
    assert main(["predict", "--model", "gpt-1.3b", "--cluster", "dgx-h100:1", "--set", "micro_batch_size=4"]) == 0
    out = capsys.readouterr().out
    assert "host-bound" not in out and "checkpointed:" not in out
    # a checkpointed prediction states the model's lean on checkpointed runs, from the published tables
    assert main(["predict", "--model", "gpt-1.3b", "--cluster", "dgx-h100:1", "--set", "micro_batch_size=4",
                 "--set", "activation_checkpointing=true"]) == 0
    lean = predict(parse_model("gpt-1.3b"), parse_cluster("dgx-h100:1"), build_strategy(
        "zero3", parse_cluster("dgx-h100:1")))["error_band"]["checkpointing"]
    assert f"checkpointed: the model's figures for checkpointed runs sat {lean['lean']:+.1%}" in \
        capsys.readouterr().out
    # measured between full checkpointing and none: a selectively checkpointed prediction does not state it
    assert main(["predict", "--model", "gpt-1.3b", "--cluster", "dgx-h100:1", "--set", "micro_batch_size=4",
                 "--set", "activation_checkpointing=true", "--set", "checkpoint_policy=selective"]) == 0
    assert "checkpointed:" not in capsys.readouterr().out
    # --breakdown: each row's terms add up to its step, and the row names the term beyond compute that costs most
    assert main(["predict", "--model", "gpt-neox-20b", "--cluster", "frontier:2,48", "--strategy", "zero3",
                 "--strategy", "3level-b", "--runner", "deepspeed", "--breakdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if line.startswith("cluster ") and "most beyond compute" in line))
    rows = [line.split() for line in out[head + 1:head + 5]]
    assert [r[:2] for r in rows] == [["frontier:2", "zero3"], ["frontier:48", "zero3"],
                                     ["frontier:2", "3level-b"], ["frontier:48", "3level-b"]]
    names = ["compute", "exposed", "slowdn", "bound.", "optim.", "fixed"]
    for r in rows:
        step, terms = float(r[2]), [float(x) for x in r[3:9]]
        # each figure printed to 4 significant digits: six terms may round apart by 3 units in the step's 4th digit
        assert sum(terms) == pytest.approx(step, rel=3e-3, abs=0.004), r
        assert 0 < float(r[10]) < terms[0], r  # the memory-bound kernels: a part of compute
        assert 0 < float(r[11]) < terms[0] - float(r[10]), r  # the attention kernel: another part
        assert float(r[12]) == pytest.approx(calibration_for(parse_cluster(r[0])).compute_efficiency, abs=0.005), r
        beyond = max(range(1, 6), key=lambda i: terms[i])
        assert r[13] == names[beyond] and r[14] == f"{terms[beyond] / step:.0%}", r  # (no kernel rate on MI250X)
    # a batch the strategy cannot run is refused, not rounded to another training
    assert main(["predict", "--model", "gpt-7b", "--cluster", "dgx-h100:8", "--global-batch", "100"]) == 2
    assert "global_batch=100: must be a multiple of world size x micro_batch_size = 64 x 1 = 64" in \
        capsys.readouterr().err
    assert main(["predict", "--model", "gpt-7b", "--cluster", "dgx-h100:8", "--global-batch", "128", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert (p["global_batch"], p["grad_accum_steps"]) == (128, 2)


def _naive_pipeline(t, comm, gathers, computes, reductions, p, slowdown=0.0):
    """The bucket schedule written plainly, one iteration per bucket (the reference for the fast one)."""
    nb, ends, issued, lost = len(computes), [0.0] * len(computes), 0, 0.0
    for i in range(nb):
        while issued < min(nb, i + 1 + p):
            if gathers[issued]:
                comm = max(comm, t) + gathers[issued]
                ends[issued] = comm
            else:  # nothing to gather (a replicated bucket): no place in the queue, nothing to wait for
                ends[issued] = t
            issued += 1
        t = max(t, ends[i])
        extra = slowdown * min(max(comm - t, 0.0), computes[i])  # compute beside a busy queue runs slower
        t, lost = t + computes[i] + extra, lost + extra
        if reductions and reductions[i]:
            comm = max(comm, t) + reductions[i]
    return t, comm, lost


def _last_of_runs(keys):
    """For each iteration, the last iteration of its run of equal ``keys`` (an iteration whose key ends in None, its
    gather ahead past the last bucket, joins no run): the ``runs`` argument of ``pipeline``, written plainly."""
    runs = list(range(len(keys)))
    for i in range(len(keys) - 2, -1, -1):
        if keys[i] == keys[i + 1] and keys[i][-1] is not None:
            runs[i] = runs[i + 1]
    return runs


@pytest.mark.parametrize("seed", range(40))
def test_the_pipeline_skip_is_exact_against_the_plain_schedule(seed):
    """Runs of identical buckets (with odd ones between), comm- or compute-bound, any prefetch, with or without
    compute slow-down beside running collectives, with buckets that have nothing to gather (the queue idle
    through a run): the skipped simulation ends where the plain one does."""
    from zerotune.costmodel.pipeline import pipeline

    rng = random.Random(seed)
    nb = rng.randint(1, 60)
    lengths, units, groups = [], [], []
    while len(lengths) < nb:  # runs of identical buckets, as transformer blocks make them
        run = rng.randint(1, 25)
        n, u, g = rng.choice([100, 200, 300]), rng.choice([1, 2]), rng.choice([0, 0, 500, 700])
        lengths += [n] * run
        units += [u] * run
        groups += [g] * run
    lengths, units, groups = lengths[:nb], units[:nb], groups[:nb]
    scale = rng.choice([0.1, 1.0, 10.0])  # communication much cheaper, similar, much dearer than compute
    gathers = {n: scale * rng.uniform(0.5, 2.0) for n in set(lengths)}
    if seed % 4 == 0:  # a replicated model: nothing to gather, the queue idle but for reductions
        gathers = dict.fromkeys(gathers, 0.0)
    elif seed % 4 == 1:  # some lengths replicated, others gathered
        gathers[min(gathers)] = 0.0
    reductions = {g: scale * rng.uniform(0.5, 2.0) for g in set(groups) if g}
    compute, p = rng.uniform(0.5, 2.0), rng.randint(0, 3)
    kappa = rng.choice([0.0, 0.15, 0.5])
    keys = [(units[i], lengths[i + p] if i + p < nb else None) for i in range(nb)]
    runs = _last_of_runs(keys)
    t0, c0 = rng.uniform(0, 3), rng.uniform(0, 3)
    fast = pipeline(t0, c0, gathers, lengths, compute, units, None, None, p, runs, kappa)
    plain = _naive_pipeline(t0, c0, [gathers[n] for n in lengths], [compute * u for u in units], None, p, kappa)
    assert fast == pytest.approx(plain, rel=1e-12)
    keys = [(units[i], groups[i], lengths[i + p] if i + p < nb else None) for i in range(nb)]
    runs = _last_of_runs(keys)
    fast = pipeline(t0, c0, gathers, lengths, compute, units, reductions, groups, p, runs, kappa)
    plain = _naive_pipeline(t0, c0, [gathers[n] for n in lengths], [compute * u for u in units],
                            [reductions.get(g, 0.0) for g in groups], p, kappa)
    assert fast == pytest.approx(plain, rel=1e-12)


def test_the_pipeline_skip_waits_out_a_busy_queue_before_a_run_with_nothing_to_gather():
    """A run of buckets with nothing to gather that starts while earlier gathers, or a pass before's reductions,
    still hold the queue: its compute is slowed until the queue drains, so it is not skipped as an idle one until
    then."""
    from zerotune.costmodel.pipeline import pipeline

    def check(lengths, gathers, comm0, kappa, p=3):
        nb = len(lengths)
        keys = [(1, lengths[i + p] if i + p < nb else None) for i in range(nb)]
        runs = _last_of_runs(keys)
        fast = pipeline(0.0, comm0, gathers, lengths, 1.0, (1,) * nb, None, None, p, runs, kappa)
        plain = _naive_pipeline(0.0, comm0, [gathers[n] for n in lengths], [1.0] * nb, None, p, kappa)
        assert fast == pytest.approx(plain, rel=1e-12), (lengths, comm0, kappa)
        return fast

    for kappa in (0.0, 0.5):
        for comm0 in (0.0, 4.0):  # the queue free at the start, or busy with a pass before's reductions
            for p in (0, 1, 3):
                check((100, 100, 100, *[200] * 12), {100: 5.0, 200: 0.0}, comm0, kappa, p)
                slowed = check((200,) * 12, {200: 0.0}, comm0, kappa, p)  # nothing gathered: the queue slows it
    assert slowed[2] == pytest.approx(1.5)  # 3 compute spans of 1 s stretched by half beside the 4 s of queue


def test_bucket_sizes_that_cut_the_same_plan_share_one_schedule():
    """A schedule is keyed on what the bucket sizes cut (the blocks in each bucket and each reduce group), not on
    the sizes: two strategies whose sizes cut the same plan get the very same schedule (and so the same bytes and
    time), and ones whose plans differ get their own, each that of its own plan."""
    import random

    from zerotune.core.plan import plan_buckets
    from zerotune.costmodel.schedule import build_schedule

    rng = random.Random(1)
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("dgx-h100:16")
    seen: dict[tuple, tuple] = {}
    for _ in range(400):
        ag, rs = rng.uniform(1, 4096), rng.uniform(1, 4096)
        s = build_strategy("zero3", cluster, allgather_bucket_mb=ag, reduce_bucket_mb=rs)
        plan = plan_buckets(model, cluster.world_size, ag, rs)
        cut = (plan.blocks, plan.reduce_groups)
        sched = build_schedule(model, cluster, s)
        assert sched.lengths == plan.padded[1:] and sched.units == plan.blocks
        if cut in seen:  # the same cut from other sizes: the same schedule, and the same prediction
            first, other = seen[cut]
            assert sched is first and predict(model, cluster, s) == predict(model, cluster, other), (ag, rs)
        else:
            seen[cut] = (sched, s)
    assert 5 <= len(seen) < 400  # many sizes, few cuts
    assert len({id(first) for first, _ in seen.values()}) == len(seen)  # a schedule per cut


def test_reduce_groups_memoized_by_where_the_size_falls_cut_as_the_plain_greedy_does():
    """``cut_reduce_groups`` memoizes a cut on where the bucket size falls among the sums of consecutive buckets:
    at sizes on, just below and just above each such sum, and at random ones, its groups are those the greedy
    cut gives afresh, for uniform buckets with an odd last one and for buckets of random lengths."""
    from zerotune.core.plan import BYTES_PER_16BIT, _cut, _run_sums, clear_cuts, cut_reduce_groups

    rng = random.Random(3)
    layouts = [(500, *[1000] * 11, 300), (700, *(rng.randint(1, 5000) for _ in range(17))), (9, 4)]
    for padded in layouts:
        clear_cuts()
        sums = _run_sums(padded)
        assert len(sums) == len(set(sums)) and min(sums) == min(padded[1:]) and max(sums) == sum(padded[1:])
        caps = [s + d for s in sums for d in (-1, 0, 1)] + [rng.uniform(0, 2 * sum(padded)) for _ in range(200)]
        for cap in caps:
            mb = cap * BYTES_PER_16BIT / 1e6
            assert cut_reduce_groups(padded, mb) == _cut(padded, mb * 1e6 / BYTES_PER_16BIT), (padded, cap)


@pytest.mark.parametrize("runner", ["zerotune", "deepspeed", "fsdp"])
def test_predictions_made_warm_equal_those_made_cold(runner, monkeypatch):
    """What the model memoizes as it runs (each schedule's collective seconds per runner and its pipeline passes,
    the reduce-group cuts) changes no prediction: strategies of the tuner's space and the presets, over 1 and 4
    micro-steps, give bit for bit what they give with every cache cleared before each and every pipeline pass run
    afresh, whatever was predicted before them."""
    from zerotune.costmodel import clear_caches
    from zerotune.costmodel import pipeline as pipeline_module
    from zerotune.costmodel.pipeline import pipeline
    from zerotune.costmodel.rates import run_by
    from zerotune.tuner.space import Space

    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("dgx-h100:16")
    calib = run_by(calibration_for(cluster), runner)
    batch = 4 * cluster.world_size
    rng = random.Random(5)
    strategies = rng.sample(list(Space(cluster, global_batch=batch).enumerate_space()), 40) + [
        build_strategy(name, cluster, micro_batch_size=mbs) for name in ("ddp", "zero1", "zero2", "zero3", "mics",
                                                                         "zeropp") for mbs in (1, 2)]
    calls = [(s, b) for s in strategies for b in (None, 4 * s.micro_batch_size * cluster.world_size)]
    cold = []
    with monkeypatch.context() as patch:
        patch.setattr(pipeline_module, "_pass", lambda memo, key, *args: pipeline(*args))
        for s, b in calls:
            clear_caches()
            cold.append(predict(model, cluster, s, global_batch=b, calibration=calib))
    clear_caches()
    for order in (range(len(calls)), reversed(range(len(calls)))):
        for i in order:
            s, b = calls[i]
            assert predict(model, cluster, s, global_batch=b, calibration=calib) == cold[i], (runner, s, b)


def test_predict_rate_bench_times_warm_search_and_unseen_predictions():
    """bench/predict_rate.py prints predictions per second of the three workloads it names, over the tuner's real
    search space; it measures and asserts nothing about speed. Bad flags exit 2 with one line naming them."""
    out = subprocess.run([sys.executable, "bench/predict_rate.py", "--seconds", "0.05", "--limit", "300", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert [(r["model"], r["cluster"]) for r in results] == [("gpt-neox-20b", "frontier:48"),
                                                             ("gpt-neox-20b", "dgx-h100:16")]
    for r in results:
        assert r["space_size"] == 300 and 16 <= r["search_calls"] <= 300
        assert r["warm_calls"] >= 16 and r["unseen_calls"] >= 16 and 1 <= r["unseen_schedules"] <= r["unseen_calls"]
        assert all(r[k] > 0 for k in ("warm_per_s", "search_per_s", "unseen_per_s"))
    assert "3level-b" in results[0]["warm_strategies"] and "3level-b" not in results[1]["warm_strategies"]
    bad = subprocess.run([sys.executable, "bench/predict_rate.py", "--limit", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "--limit=0: must be >= 1"
