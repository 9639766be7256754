"""The published bench (bench/published.py) that holds the time and memory model to the transcribed tables
of published runs, and what those tables' runs say of checkpointing and attention kernels."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tomllib

import pytest

from tests.costmodel.common import GPT_18B
from tests.support import ROOT
from zerotune.costmodel import calibration_for, predict
from zerotune.costmodel.attention import FIGURE_ATTENTION, attention_efficiency
from zerotune.costmodel.catalog import build_strategy, parse_cluster
from zerotune.costmodel.error import at_scale, on_device
from zerotune.costmodel.hardware import (
    DEVICES,
    FA2_A100_TFLOPS,
    GPT3_2_7B_2K,
    IBM_FSDP_7B,
    SOURCE_RUNS,
)
from zerotune.costmodel.profiles import profile_calibration
from zerotune.costmodel.rates import run_by


def test_the_bench_states_which_published_runs_the_memory_model_puts_over_capacity(monkeypatch):
    """Every published run fit its GPUs, so a row predicted over capacity is the memory model's error, and the bench
    says how many there are, beside the runtime's reserve and against the capacity itself. llm-foundry's MPT computes
    its loss with flash-attn's fused cross-entropy (the table's ``loss = "fused"``): charged so, every one of its
    runs' peaks fits the capacity, where torch's loss on fp32 logits put 14 of them up to 13% over (the 350m at
    micro-batch 18 at 1.12-1.13 of 40 GB)."""
    out = subprocess.run([sys.executable, "bench/published.py", "--table", "llm_foundry"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = subprocess.run([sys.executable, "bench/published.py", "--table", "llm_foundry", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    rows = json.loads(data.stdout)["rows"]
    assert all(r["feasible"] == (r["peak_over_memory"] <= 1) for r in rows)
    assert all(r["peak_over_capacity"] <= 1 for r in rows), [r for r in rows if r["peak_over_capacity"] > 1]
    assert max(r["peak_over_capacity"] for r in rows) > 0.85  # the largest micro-batches come near the capacity
    over = [r for r in rows if not r["feasible"]]  # beside the runtime's reserve: the bench says how many
    assert (f"the model puts {len(over)} of the {len(rows)} scored rows over their memory beside the runtime's "
            f"reserve" if over else f"the model puts each of the {len(rows)} scored rows within its memory") \
        in out.stdout
    assert not over or "0 over the capacity itself" in out.stdout  # every peak fits, as asserted above
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "llm_foundry.toml")
    row = "a100-40g-x16/mpt-350m/18/fsdp"
    fused = table.predict(row)
    assert table.loss == "fused" and fused["memory_bytes"]["peak"] <= 40 * 2**30
    for name, (cluster, calib) in list(table.clusters.items()):  # torch's loss: the 350m's rows over 40 GB
        table.clusters[name] = (cluster, dataclasses.replace(calib, loss_kernel="torch"))
    table._predicted.clear()
    assert 1.1 < table.predict(row)["memory_bytes"]["peak"] / (40 * 2**30) < 1.15


def test_published_bench_reproduces_its_tables(monkeypatch):
    """Every transcribed table loads and every row gets a finite prediction; the median error stays within 15%."""
    out = subprocess.run([sys.executable, "bench/published.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # the error band every profile prediction carries is what the bench computes from today's model and tables
    assert json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text()) == result["error"], \
        "run: python bench/published.py --write-error"
    for name in ("dgx-h100:2", "frontier:48", "dgx-h100:128"):  # each prediction reads the items near its scale
        cluster = parse_cluster(name)
        band = predict(GPT_18B, cluster, build_strategy("zero3", cluster))["error_band"]
        items = result["error"]["items"]["comparisons"]
        near, span = at_scale(items, cluster.world_size)
        mine = on_device(items, cluster.device, span)  # and on its device there, the wider band kept
        expect = [max(near[k], mine[k]) if mine else near[k] for k in ("median", "p90")]
        assert [band["comparison_median"], band["comparison_p90"]] == expect, name
        # and names the tables those items came from, not every table
        _, row_span = at_scale(result["error"]["items"]["rows"], cluster.world_size)
        read = {it[3] for it in items if span[0] <= it[0] <= span[1]} | {
            it[3] for it in result["error"]["items"]["rows"] if row_span[0] <= it[0] <= row_span[1]}
        tables = f"({', '.join(sorted(read))})"
        if "device" in band:  # the device's own items widened it: the source says so after the tables
            assert f"{tables}; on {cluster.device}: " in band["source"], (name, band["source"])
        else:
            assert band["source"].endswith(tables), (name, band["source"])
        assert len(read) < len(result["error"]["tables"]), name
    assert predict(GPT_18B, parse_cluster("local:2x2"), build_strategy("zero3", parse_cluster("local:2x2")))[
        "error_band"] is None  # nominal calibration: no published error
    tables = {p.stem for p in (ROOT / "bench" / "published").glob("*.toml")}
    assert {r["table"] for r in result["rows"]} | {r["table"] for r in result["ratios"]} == tables
    assert all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in result["rows"] + result["ratios"])
    assert result["summary"]["median_abs_error"] <= 0.15, result["summary"]
    # the tally by table covers every scored item once and agrees with the total
    summary = result["summary"]
    by_table = summary["by_table"]
    scored = [r for r in result["rows"] + result["ratios"] if r["role"] == "agreement"]
    assert sum(n for _, n in by_table.values()) == len(scored) == summary["rows"] + summary["ratios"]
    assert sum(ok for ok, _ in by_table.values()) == summary["within_goal"]
    assert set(by_table) == {r["table"] for r in scored} == set(result["error"]["tables"])
    # weak scaling: every published comparison of one model and strategy on two cluster sizes, at micro-batches
    # within 2x of each other, is predicted within 10% (FSDP on 8-512 GPUs, MiCS, and the rest of stock engines):
    # measured at 0.94-1.01, so this holds the model from charging scale what the clusters did not. Frontier's
    # 3-level runs, on an extension of DeepSpeed whose code was not available, are held to the 15%: the
    # model charges them DeepSpeed ZeRO-3's 354 per-parameter gathers of persistent parameters after each step
    # (0.40 s over 384 GCDs at RCCL's ring latencies, 0.02 s over 16), which their 0.94 scaling leaves no room for
    # unless that extension gathers them otherwise
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from published import RowId, is_scaling

    ids = {id(r): (RowId.parse(r["of"]), RowId.parse(r["over"])) for r in result["ratios"]}
    weak = [r for r in result["ratios"] for of, over in [ids[id(r)]]
            if (of.model, of.strategy) == (over.model, over.strategy) and of.cluster != over.cluster
            and max(of.mbs, over.mbs) < 2 * min(of.mbs, over.mbs)]
    assert len(weak) >= 12 and {r["table"] for r in weak} >= {"llm_foundry", "torchtitan_h100", "fsdp_paper"}
    stock = [r for r in weak if r["table"] != "frontier_3level"]
    assert all(abs(r["error"]) <= 0.10 for r in stock), [(r["of"], r["error"]) for r in stock if abs(r["error"]) > 0.1]
    assert all(abs(r["error"]) <= 0.15 for r in weak), [(r["of"], r["error"]) for r in weak if abs(r["error"]) > 0.15]
    # the band a decision is held to reads comparisons of two strategies only: one strategy's scaling is kept apart
    scored_ratios = [r for r in result["ratios"] if r["role"] == "agreement"]
    two = [r for r in scored_ratios if not is_scaling(r)]
    items = result["error"]["items"]
    assert len(items["comparisons"]) == len(two) and len(items["scaling"]) == len(scored_ratios) - len(two) >= 14
    assert sorted(it[1] for it in items["comparisons"]) == sorted(round(r["error"], 4) for r in two)
    # the comparisons keep their direction: ZeRO++ over ZeRO-3 is predicted > 1 wherever it was measured > 1
    for r in result["ratios"]:
        if r["table"] == "zeropp_blog":
            assert r["predicted"] > 1.0, r
    bad = subprocess.run([sys.executable, "bench/published.py", "--table", "nope"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--table=nope: no such table" in bad.stderr


def test_a_table_says_how_its_engine_ran_and_a_column_may_differ(tmp_path, monkeypatch):
    """A table names its engine's runner (for preset clusters) and how it gathers; a column whose engine
    gathered otherwise overrides it; an unknown value is refused by name."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    amsp_text = (ROOT / "bench" / "published" / "amsp_paper.toml").read_text()
    assert published.Table(ROOT / "bench" / "published" / "amsp_paper.toml").stack == "flash"
    # the same table with its baselines on Megatron-class kernels and AMSP's 13B column on its own
    mixed = tmp_path / "mixed_stacks.toml"
    mixed.write_text(amsp_text.replace('\nstack = "flash"', '\nstack = "megatron"', 1).replace(
        'amsp_13b = { preset = "zero3", ', 'amsp_13b = { preset = "zero3", stack = "flash", ', 1))
    amsp = published.Table(mixed)
    assert amsp.gathers == "module" and amsp.strategies["amsp_7b"]["gathers"] == "bucket"
    halfnode, calib = amsp.clusters["a800-1024-halfnode"]
    fields = {k: v for k, v in amsp.strategies["amsp_13b"].items() if k not in ("gathers", "stack")}
    s, model = build_strategy(fields, halfnode, micro_batch_size=1), amsp.models["llama-13b"]
    by_block = predict(model, halfnode, s, calibration=dataclasses.replace(calib, gathers="bucket"))["step_time_s"]
    by_module = predict(model, halfnode, s, calibration=calib)["step_time_s"]
    assert amsp.predict("a800-1024-halfnode/llama-13b/1/amsp_13b")["step_time_s"] != by_block != by_module
    # a column that ran other kernels than the table's: its own stack (InternEvo's FlashAttention-2)
    assert amsp.stack == "megatron" and amsp.strategies["amsp_13b"]["stack"] == "flash"
    # and the flash stack's attention kernel (FlashAttention-2 at its own rate) where the table's is unfused (the
    # Megatron-class stack's own: its fused softmax between batched matmuls at the stack's rate)
    assert amsp.attention == "fused-softmax" and calib.attention_efficiency == 0.0 and calib.score_passes == (2, 3)
    _, flash = published.build_cluster("a800-1024-halfnode", amsp.cluster_specs["a800-1024-halfnode"], "flash",
                                       amsp.rings, amsp.outer_reduce, amsp.gathers, amsp.runner, attention="flash2")
    assert flash.attention_efficiency == attention_efficiency("flash2", "A100") > 0
    on_flash = predict(model, halfnode, s, calibration=dataclasses.replace(flash, gathers="bucket"))["step_time_s"]
    assert amsp.predict("a800-1024-halfnode/llama-13b/1/amsp_13b")["step_time_s"] == on_flash < by_block
    unfused = predict(model, halfnode, s, calibration=dataclasses.replace(
        flash, gathers="bucket", attention_efficiency=0.0, attention_curve=()))["step_time_s"]
    assert unfused > on_flash
    bad_kernel = tmp_path / "bad_attention.toml"
    bad_kernel.write_text((ROOT / "bench" / "published" / "amsp_paper.toml").read_text().replace(
        '[source]\n', '[source]\nattention = "xformers"\n', 1))
    with pytest.raises(ValueError, match=(r"attention='xformers': must be one of "
                                          r"\['matmul', 'eager', 'fused-softmax', 'flash2', 'triton', 'sdpa'\]")):
        published.Table(bad_kernel)
    bad = tmp_path / "bad_stack.toml"
    bad.write_text(mixed.read_text().replace('stack = "flash"', 'stack = "jax"'))
    with pytest.raises(ValueError, match="stack='jax': must be one of"):
        published.Table(bad).predict("a800-1024-halfnode/llama-13b/1/amsp_13b")
    frontier = published.Table(ROOT / "bench" / "published" / "frontier_3level.toml")
    assert frontier.runner == "deepspeed" and frontier.how() == "cluster presets, run by deepspeed"
    # a published DeepSpeed run held its parameters under DeepSpeed's own stage-3 settings, not the export's
    assert frontier.clusters["frontier48"][1] == dataclasses.replace(
        run_by(calibration_for(parse_cluster("frontier:48")), "deepspeed"), stage3_settings="defaults")
    text = (ROOT / "bench" / "published" / "frontier_3level.toml").read_text()
    internevo = published.Table(ROOT / "bench" / "published" / "internevo_a100.toml")
    assert internevo.how().endswith("weights synced by a broadcast per owning rank")
    assert {calib.weight_sync for _, calib in internevo.clusters.values()} == {"broadcast"}
    assert {calib.weight_sync for _, calib in frontier.clusters.values()} == {"gather"}
    for key, line in (("runner", 'runner = "nope"'), ("gathers", 'runner = "deepspeed"\ngathers = "nope"'),
                      ("weight_sync", 'runner = "deepspeed"\nweight_sync = "nope"')):
        bad = tmp_path / f"bad_{key}.toml"
        bad.write_text(text.replace('runner = "deepspeed"', line))
        with pytest.raises(ValueError, match=f"source.{key}='nope': must be one of"):
            published.Table(bad)


def test_a_group_sets_its_micro_batches_per_step(tmp_path, monkeypatch):
    """A group's ``accumulation`` is predicted as that many micro-batches per optimizer step (the global batch
    the source ran), and a group without one as a single micro-step."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "llm_foundry.toml")
    row = "a100-40g-x8/mpt-13b/4x16/fsdp_ckpt"  # the row id names its accumulation: 16 micro-batches of 4
    assert row in table.rows and "a100-40g-x16/mpt-13b/10/fsdp_ckpt" in table.rows
    assert published.RowId.parse(row) == ("a100-40g-x8", "mpt-13b", 4, "fsdp_ckpt", 16)
    assert published.RowId.parse("a100-40g-x16/mpt-13b/10/fsdp_ckpt").accum == 1
    assert str(published.RowId.parse(row)) == row
    cluster, calib = table.clusters["a100-40g-x8"]
    s = build_strategy(table.strategies["fsdp_ckpt"], cluster, micro_batch_size=4)
    model = table.models["mpt-13b"]
    accumulated = predict(model, cluster, s, calibration=calib, global_batch=8 * 4 * 16)
    assert table.predict(row)["step_time_s"] == accumulated["step_time_s"]
    one = predict(model, cluster, s, calibration=calib)
    assert accumulated["step_time_s"] > 15 * one["step_time_s"]  # 16 micro-steps, one optimizer step
    assert table.predict(row)["value"] == pytest.approx(accumulated["tokens_per_s"] / 8)
    text = (ROOT / "bench" / "published" / "llm_foundry.toml").read_text()
    for bad_value in ("0", "2.5", '"4"'):
        bad = tmp_path / "bad_accumulation.toml"
        bad.write_text(text.replace("accumulation = 16", f"accumulation = {bad_value}"))
        with pytest.raises(ValueError, match=r"groups\[3\]\.accumulation=.*must be a whole number >= 1"):
            published.Table(bad)
    # two groups that give the same row (cluster, model, micro-batch, accumulation, column) are refused, not merged
    first = text.index("[[groups]]")
    twice = tmp_path / "twice.toml"
    twice.write_text(text + "\n" + text[first:text.index("[[groups]]", first + 1)])
    with pytest.raises(ValueError, match=r"row a100-40g-x8/.* is already given by an earlier group"):
        published.Table(twice)


def test_each_campaign_of_a_table_runs_on_the_software_its_raw_results_name(tmp_path, monkeypatch):
    """llm-foundry's 8-GPU context table holds two campaigns: the A100 40GB rows (bf16 PURE, torch 1.13) and the
    A100 80GB re-run (amp_bf16 with MP Mode DEFAULT on torch 2.1.0, as its raw results, h100new.csv, record row by
    row). The 80 GB cluster sets its own ``early_stop`` and its groups ``set`` fp32 gradient reductions: a checkpointed
    row there is charged a shorter recompute and more reduction bytes than the same strategy on the 40 GB cluster, an
    uncheckpointed one only the bytes; a ``set`` that is no table of strategy fields, or names a column's setting, is
    refused by name, and so is an ``early_stop`` that is no boolean."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    path = ROOT / "bench" / "published" / "llm_foundry_context.toml"
    table = published.Table(path)
    assert table.early_stop is False
    assert table.clusters["a100-80g-x8"][1].recompute_early_stop is True
    assert table.clusters["a100-40g-x8"][1].recompute_early_stop is False
    rerun = [r for r in table.rows if r.startswith("a100-80g-x8/")]
    assert len(rerun) == 59 and all(table.row_fields[r] == {"grad_bits": 32} for r in rerun)
    assert not any(r in table.row_fields for r in table.rows if r.startswith("a100-40g-x8/"))
    cluster, calib = table.clusters["a100-80g-x8"]
    for row in ("a100-80g-x8/mpt-13b-8k/5x3/fsdp_ckpt", "a100-80g-x8/mpt-7b-2k/6x2/fsdp"):
        key = published.RowId.parse(row)
        fields = table.strategies[key.strategy]
        model = table.models[key.model]
        bf16 = build_strategy(fields, cluster, micro_batch_size=key.mbs)
        fp32 = build_strategy({**fields, "grad_bits": 32}, cluster, micro_batch_size=key.mbs)
        batch = 8 * key.mbs * key.accum
        got = table.predict(row)
        assert got["step_time_s"] == predict(model, cluster, fp32, calibration=calib, global_batch=batch)["step_time_s"]
        as_pure = predict(model, cluster, bf16, calibration=calib, global_batch=batch)
        assert got["bytes_per_level"] != as_pure["bytes_per_level"] and got["step_time_s"] > as_pure["step_time_s"]
        full = predict(model, cluster, fp32, global_batch=batch,
                       calibration=dataclasses.replace(calib, recompute_early_stop=False))["step_time_s"]
        assert (full > got["step_time_s"]) == fp32.activation_checkpointing
    text = path.read_text()
    for bad_set, rule in (("set = 32", "must be a table of strategy fields"),
                          ('set = { stack = "flash" }', "not preset, stack, gathers or overlap_comm")):
        bad = tmp_path / "bad_set.toml"
        bad.write_text(text.replace("set = { grad_bits = 32 }", bad_set, 1))
        with pytest.raises(ValueError, match=rf"groups\[0\]\.set=.*{rule}"):
            published.Table(bad)
    bad = tmp_path / "bad_early_stop.toml"
    bad.write_text(text.replace("\nearly_stop = true\n", '\nearly_stop = "yes"\n', 1))
    with pytest.raises(ValueError, match=r"clusters\.a100-80g-x8\.early_stop='yes': must be true or false"):
        published.Table(bad)


def test_a_column_that_ran_its_collectives_on_the_compute_stream_pays_them_in_series(tmp_path, monkeypatch):
    """DeepSpeed's autotuner ran ZeRO-2 and ZeRO-3 from templates with ``overlap_comm`` false: those columns say
    ``overlap_comm = false`` and are predicted with every collective serialized with the compute
    (``Calibration.overlap`` 0), so GPT-2 1.5B's ZeRO-2 pays its reduce-scatters in full and is predicted no faster
    than ZeRO-1, which reduces at the boundary; a value that is no boolean is refused by name."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    path = ROOT / "bench" / "published" / "ds_autotuning.toml"
    table = published.Table(path)
    assert table.strategies["z2"]["overlap_comm"] is False and "overlap_comm" not in table.strategies["z1"]
    cluster, calib = table.clusters["dgx2"]
    row = "dgx2/gpt2-xl/1/z2"
    fields = {k: v for k, v in table.strategies["z2"].items() if k != "overlap_comm"}
    s, model = build_strategy(fields, cluster, micro_batch_size=1), table.models["gpt2-xl"]
    serial = predict(model, cluster, s, calibration=dataclasses.replace(calib, overlap=0.0), global_batch=16)
    hidden = predict(model, cluster, s, calibration=calib, global_batch=16)
    assert table.predict(row)["step_time_s"] == serial["step_time_s"] > hidden["step_time_s"]
    assert table.predict(row)["value"] <= table.predict("dgx2/gpt2-xl/1/z1")["value"] * 1.001
    bad = tmp_path / "bad_overlap.toml"
    bad.write_text(path.read_text().replace("overlap_comm = false }", 'overlap_comm = "no" }', 1))
    with pytest.raises(ValueError, match=r"strategies\.z2\.overlap_comm='no': must be true or false"):
        published.Table(bad).predict(row)


def test_more_micro_batches_per_step_amortize_the_step_boundary_in_the_measured_order(monkeypatch):
    """What AMSP's Table V (64 A800s, M = 1-8 micro-batches per step) and InternEvo's 1,024-GPU runs (M = 1, 2, 4)
    measured: the more micro-batches share one step boundary, the more tokens per second each GPU trains. The model
    predicts every series in the measured order, and the M = 8 figures within 15%."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    amsp = published.Table(ROOT / "bench" / "published" / "amsp_paper.toml")
    internevo = published.Table(ROOT / "bench" / "published" / "internevo_a100.toml")
    series = [(amsp, [f"{cluster}/llama-{size}/1{m}/amsp_{size}" for m in ("", "x2", "x4", "x8")])
              for cluster, size in (("a800-64", "7b"), ("a800-64-halfnode", "13b"), ("a800-64-leaf", "30b"))]
    series.append((internevo, [f"a100-roce-1024/internlm-7b/2{m}/zero1_node" for m in ("", "x2", "x4")]))
    for table, ids in series:
        published_values = [table.rows[i][0] for i in ids]
        predicted = [table.predict(i)["value"] for i in ids]
        for values in (published_values, predicted):  # strictly: each added micro-batch gains
            assert all(a < b for a, b in zip(values, values[1:], strict=False)), (ids, values)
    for size, cluster in (("7b", "a800-64"), ("13b", "a800-64-halfnode"), ("30b", "a800-64-leaf")):
        row = f"{cluster}/llama-{size}/1x8/amsp_{size}"
        assert abs(amsp.predict(row)["value"] / amsp.rows[row][0] - 1) <= 0.15, row


def test_a_clusters_own_collective_benchmark_sets_its_links(tmp_path, monkeypatch):
    """The Ultra-Scale Playbook measured its own cluster's 256 MB AllReduce at a bus bandwidth of 361.7, 160.1,
    99.6, 84.7 and 64.9 GB/s on 2-32 nodes (EFA; a figure of its own, not the scaling one scored). Each of the
    table's clusters carries it on its inter-node level (``busbw_gbps``, as a user's cluster file may): the
    model's ring over a node's 8 ranks reaches exactly that rate. With it the
    data-parallel scaling is followed within 15% at every point, the drop at 256 GPUs included; with the
    profile's nominal 400 Gb/s per GPU instead, that point is predicted more than 50% fast."""
    import re

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    path = ROOT / "bench" / "published" / "hf_playbook.toml"
    table = published.Table(path)
    for gpus, busbw in {16: 361.7, 32: 160.1, 64: 99.6, 128: 84.7, 256: 64.9}.items():
        cluster, calib = table.clusters[f"h100x{gpus}"]
        ranks_per_node, inter = cluster.sizes[0], cluster.levels[1]
        assert ranks_per_node * inter.bandwidth_gbps * calib.level_efficiency(2) == pytest.approx(busbw, rel=1e-3)
    bars = ("h100x8/llama-1b/2x16/ddp", "h100x16/llama-1b/1x16/ddp", "h100x32/llama-1b/1x8/ddp",
            "h100x64/llama-1b/1x4/ddp", "h100x128/llama-1b/2/ddp", "h100x256/llama-1b/1/ddp")  # the figure's
    errors = {row: table.predict(row)["value"] / table.rows[row][0] - 1 for row in bars}
    assert all(abs(e) <= 0.15 for e in errors.values()), errors
    nominal = tmp_path / "hf_playbook.toml"
    nominal.write_text(re.sub(r", busbw_gbps = [0-9.]+", "", path.read_text()))
    row = "h100x256/llama-1b/1/ddp"
    assert published.Table(nominal).predict(row)["value"] / table.rows[row][0] - 1 > 0.5


def test_zero1_runs_on_what_the_cluster_measured_for_its_collectives(monkeypatch):
    """The same sweep's ZeRO-1 runs move a reduce-scatter and an all-gather where ZeRO-0 moves an all-reduce; the
    Playbook measured the cluster's AllGather and ReduceScatter at a lower bus bandwidth than its AllReduce (28.0
    against 64.9 GB/s on 32 nodes). Each cluster carries all three (``all_gather_busbw_gbps`` and its kin), each
    collective reaching its own: ZeRO-1 and ZeRO-0 are level (within 2%) from 8
    to 32 GPUs, where the collectives hide behind the backward, and within 4% at 64 (published 0.6%: ZeRO-0's fp32
    all-reduce, twice the bytes of ZeRO-1's reduce-scatter, hides less behind the short backward of nanotron's block,
    56 ms of it left exposed against 20), and at 256 GPUs ZeRO-1's all-gather after the update, which nothing hides,
    costs it 28%: predicted within 1% of the published 0.721."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "hf_playbook.toml")
    for gpus, gather, scatter in ((16, 184.6, 181.6), (32, 119.0, 115.8), (64, 69.0, 68.6), (128, 55.0, 54.5),
                                  (256, 28.0, 27.9)):
        cluster, calib = table.clusters[f"h100x{gpus}"]
        links = cluster.sizes[0] * cluster.levels[1].bandwidth_gbps
        assert links * calib.level_efficiency(2, "all_gather") == pytest.approx(gather, rel=1e-3)
        assert links * calib.level_efficiency(2, "reduce_scatter") == pytest.approx(scatter, rel=1e-3)
    ratios = {(c["of"], c["over"]): c for c in table.compares}

    def predicted(of: str, over: str) -> float:
        return table.predict(of)["value"] / table.predict(over)["value"]
    for gpus, acc in ((8, 32), (16, 16), (32, 8), (64, 4)):
        pair = (f"h100x{gpus}/llama-1b/1x{acc}/zero1", f"h100x{gpus}/llama-1b/1x{acc}/ddp")
        assert pair in ratios and abs(predicted(*pair) - 1) < (0.04 if gpus == 64 else 0.02)
        assert abs(table.value(pair[0]) / table.value(pair[1]) - 1) < 0.02  # as measured
    pair = ("h100x256/llama-1b/1/zero1", "h100x256/llama-1b/1/ddp")
    published_ratio = table.value(pair[0]) / table.value(pair[1])
    assert published_ratio == pytest.approx(0.721, abs=1e-3)
    assert predicted(*pair) == pytest.approx(published_ratio, rel=0.01)
    assert table.predict(pair[0])["breakdown"]["boundary_s"] > table.predict(pair[1])["breakdown"]["boundary_s"] + 0.05


def test_a_source_of_ratios_only_is_scored_on_its_ratios(tmp_path, monkeypatch):
    """DeepSpeed's autotuner times only its own forward, backward and step: its figures are printed, its ratios
    between ZeRO stages scored; ``samples_per_s`` is sequences per second of the cluster; a bad ``scored`` or
    ``metric`` is refused by name."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    path = ROOT / "bench" / "published" / "ds_autotuning.toml"
    table = published.Table(path)
    assert table.scored == "ratios" and table.metric == "samples_per_s"
    result = published.evaluate([table])
    assert result["rows"] and all(r["role"] == "reference" for r in result["rows"])
    assert result["summary"]["rows"] == 0 and result["summary"]["ratios"] == len(result["ratios"]) == 7
    assert result["summary"]["by_table"]["ds_autotuning"][1] == 7
    row = table.predict("dgx2/gpt2-xl/1/z3")
    assert row["value"] == pytest.approx(row["tokens_per_s"] / 1024)
    text = path.read_text()
    for key, line in (("scored", 'scored = "rows"'), ("metric", 'metric = "mfu"')):
        bad = tmp_path / f"bad_{key}.toml"
        bad.write_text(text.replace('scored = "ratios"', line) if key == "scored"
                       else text.replace('metric = "samples_per_s"', line))
        with pytest.raises(ValueError, match=f"source.{key}=.*must be one of"):
            published.Table(bad)


def test_vendor_collectives_at_scale_hold_the_ring_model_to_its_range():
    """bench/collectives_at_scale.py: measured RCCL / NCCL all-gathers and reduce-scatters at 32-2,048 GPUs (the PCCL
    paper) beside one flat ring of the model. NCCL on Perlmutter is within 15% up to 256 GPUs and within 30% at every
    scale once multi-node rings pay the host's network overhead on each step (without it: 2.5x slower than the model
    at 2,048); RCCL falls off a cliff past 16 Frontier nodes, which the bench prints rather than fits."""
    out = subprocess.run([sys.executable, "bench/collectives_at_scale.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    table = tomllib.loads((ROOT / "bench" / "published" / "collectives" / "pccl.toml").read_text())
    assert len(result["rows"]) == sum(len(s["ms"]) for s in table["series"]) == 56
    # the transcription: PCCL's own times against the speedups the paper prints
    check = table["pccl_check"]
    for mb, speedup in check["printed_speedup_2048"].items():
        rccl = next(s["ms"][-1] for s in table["series"] if s["library"] == "RCCL" and s["collective"] == "all_gather"
                    and s["mb"] == int(mb))
        assert rccl / check["ms_2048"][mb] == pytest.approx(speedup, rel=0.03)
    nccl = [r for r in result["rows"] if r["library"] == "NCCL"]
    assert len(nccl) == 28 and all(abs(r["error"]) <= 0.15 for r in nccl if r["gpus"] <= 256)
    assert all(abs(r["error"]) <= 0.30 for r in nccl)
    by = {(s["library"], s["gpus"]): s["measured_over_predicted"] for s in result["summary"]}
    assert by[("RCCL", 2048)] > 3 * by[("RCCL", 128)] and by[("NCCL", 2048)] < 1.3


def test_the_frontier_readings_bench_weighs_the_3_level_table_under_both_readings_and_rccls_cliff():
    """bench/frontier_readings.py: the seed paper's ratios under both readings of its 3-level method, with and
    without the per-step cost RCCL paid past 128 GCDs in the PCCL study. Its floor is read off pccl.toml (72-90 µs a
    step there); the table's own reading without it is what bench/published.py scores; with it every ring over 384
    GCDs slows, so ZeRO-3 and ZeRO++ fall, and the 3-level method read as ZeRO++ with hpZ on the GCD pair
    (3level-b, whose forward gathers span every GCD) scales far below the paper's 0.94, while read as AMSP's plan
    (3level-a, whose only collectives beyond the node are its optimizer span's, one GCD a node) it keeps the scaling
    it has without the cliff. A what-if: bench/published.py's scores do not move."""
    out = subprocess.run([sys.executable, "bench/frontier_readings.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert 72e-6 <= result["rccl_floor_s"] <= 90e-6 and result["rccl_floor_above_ranks"] == 128
    v = {(x["reading"], x["rccl_cliff"]): x for x in result["variants"]}
    assert set(v) == {(r, c) for r in ("3level-a", "3level-b") for c in (False, True)}
    scored = json.loads(subprocess.run([sys.executable, "bench/published.py", "--table", "frontier_3level", "--json"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout)
    assert [r["predicted"] for r in scored["ratios"]] == pytest.approx(
        [r["predicted"] for r in v[("3level-b", False)]["ratios"]], rel=1e-3)

    for s in ("zero3", "zeropp"):  # every gather and reduction of theirs is a ring over all 384 GCDs
        row = f"frontier48/gpt-neox-20b/1/{s}"
        assert v[("3level-a", True)]["tflops_per_gcd"][row] < 0.5 * v[("3level-a", False)]["tflops_per_gcd"][row]
    scaling = {k: x["ratios"][1]["predicted"] for k, x in v.items()}  # 384 GCDs over 16, the paper's 0.94
    assert "scaling" in v[("3level-a", False)]["ratios"][1]["caption"]
    assert scaling[("3level-b", True)] < 0.5 * scaling[("3level-b", False)]
    assert scaling[("3level-a", True)] == pytest.approx(scaling[("3level-a", False)], rel=0.01)


def test_the_pytorch_figures_source_runs_are_the_ones_their_table_prints_and_reproduce_them(monkeypatch):
    """``IBM_FSDP_7B`` and ``SOURCE_RUNS``, the run the eager PyTorch efficiencies are re-based on, are the
    llama2-7b, clusters, strategy, micro-batch and figures of ``bench/published/ibm_fsdp.toml`` (the table
    they come from, printed, never scored): one description, not two copies that could drift apart. The
    bench then predicts those two rows at their published tokens/s, where the re-base on the run's compute
    alone left both 4% slow (its exposed communication and slow-down beside collectives uncharged)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published
    from published import RowId
    path = ROOT / "bench" / "published" / "ibm_fsdp.toml"
    raw = tomllib.loads(path.read_text())
    assert raw["source"]["role"] == "calibration"
    written = raw["models"]["llama2-7b"]
    assert {k: getattr(IBM_FSDP_7B, "ffn" if k == "ffn_hidden" else k) for k in written} == written
    table = published.Table(path)
    assert (table.stack, table.rings, table.outer_reduce) == ("pytorch", "flat", "backward")
    assert table.attention == FIGURE_ATTENTION["pytorch"] == "flash2"  # SDPA's FlashAttention-2, re-based with it
    seven_b = {RowId.parse(i).cluster: (RowId.parse(i), v) for i, (v, _) in table.rows.items() if "/llama2-7b/" in i}
    assert len(seven_b) == 2
    for (key, stack), run in SOURCE_RUNS.items():
        assert stack == "pytorch" and DEVICES[key].source_model(stack) == (IBM_FSDP_7B, key)
        row, value = next((r, v) for name, (r, v) in seven_b.items() if raw["clusters"][name]["device"] == key)
        spec = raw["clusters"][row.cluster]
        assert [(lv["name"], lv["size"], lv["link"], lv.get("gbps_per_rank")) for lv in spec["levels"]] == \
            [tuple(lv) for lv in run.levels]
        assert dict(run.strategy) == table.strategies[row.strategy] and run.micro_batch == row.mbs
        assert (run.rings, run.outer_reduce) == (table.rings, table.outer_reduce)
        assert run.tokens_per_s_per_gpu == value
        predicted = table.predict(f"{row.cluster}/{row.model}/{row.mbs}/{row.strategy}")["value"]
        assert predicted == pytest.approx(value, rel=1e-4)
        # the same calibration re-based on the compute alone: 3-5% slow
        cluster, calib = table.clusters[row.cluster]
        alone = profile_calibration("x", key, tuple(lv[2] for lv in run.levels), stack, run.rings,
                                    run.outer_reduce, whole_run=False, attention=table.attention)
        assert calib.compute_efficiency > alone.compute_efficiency
        strategy = build_strategy(dict(run.strategy), cluster, micro_batch_size=run.micro_batch)
        slow = predict(IBM_FSDP_7B, cluster, strategy, calibration=alone, global_batch=cluster.world_size * row.mbs)
        assert -0.06 < slow["tokens_per_s"] / slow["world_size"] / value - 1 < -0.03


def test_the_flash_figure_is_the_one_its_table_prints_and_carries_to_the_tables_other_rows(monkeypatch):
    """The A100's FlashAttention-2 figure is [fa2]'s GPT3-2.7B at 2k, as bench/published/flash_attention2.toml
    prints it (a calibration table: shown, not scored); the model re-based on it predicts that row within 2% and
    the same table's other sizes and sequence lengths within 5%. The 8k rows, where attention is 2.5 times the
    share of the FLOPs it is at 2k, hold only with the kernel's own rate (its repository's benchmark at each row's
    length and head size, not this table): charged at the matmul rate, as before kernels had rates, they are 5% or
    more slow."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "flash_attention2.toml")
    assert table.role == "calibration" and table.stack == "flash"
    source = "a100x8/gpt3-2.7b-2k/4x16/zero1"
    assert table.rows[source][0] == FA2_A100_TFLOPS and table.models["gpt3-2.7b-2k"] == dataclasses.replace(
        GPT3_2_7B_2K, name="gpt3-2.7b-2k")
    for row, (value, _) in table.rows.items():
        assert abs(table.predict(row)["value"] / value - 1) <= (0.02 if row == source else 0.05), row
    assert table.attention == "flash2"  # the flash stack's kernel
    cluster, calib = table.clusters["a100x8"]
    assert calib.attention_efficiency == attention_efficiency("flash2", "A100") > calib.compute_efficiency
    table.clusters["a100x8"] = (cluster, dataclasses.replace(calib, attention_efficiency=0.0, attention_curve=()))
    table._predicted.clear()
    for row in ("a100x8/gpt3-1.3b-8k/4x4/zero1", "a100x8/gpt3-2.7b-8k/2x8/zero1"):
        assert table.predict(row)["value"] / table.rows[row][0] - 1 < -0.05, row


def test_the_triton_kernel_rate_carries_from_512_to_65536_tokens_a_context(monkeypatch):
    """llm-foundry's MPT on 8 A100s at 512 to 65,536 tokens a sequence (bench/published/llm_foundry_context.toml;
    no constant is taken from it): at 64k tokens the 125m spends most of its FLOPs in attention, at 512 almost none.
    Every row run without activation checkpointing is predicted within 15% at every length, but the two the
    table's own earlier run measured 15-20% faster (the 760m at 1k and 512 tokens on 80 GB) and the 125m's at 2k
    tokens and fewer, which the model puts 17-25% fast since MPT's fused loss is charged (the small model's step is
    a third loss and memory-bound kernels: a term it does not charge, not found); and they are predicted in the
    measured order of context length per model and device. With the attention charged at the
    matmuls' rate instead of the Triton kernel's (triton-lang's own regression figure), every row from 16k tokens on
    is 10% or more fast."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "llm_foundry_context.toml")
    assert table.attention == "triton" and table.role == "agreement"
    plain = {row: value for row, (value, _) in table.rows.items() if row.endswith("/fsdp")}
    assert len(plain) >= 60 and {published.RowId.parse(r).model.rsplit("-", 1)[1] for r in plain} >= {
        "512", "1k", "2k", "4k", "8k", "16k", "32k", "64k"}
    rerun = {"a100-80g-x8/mpt-760m-1k/48x2/fsdp", "a100-80g-x8/mpt-760m-512/96x2/fsdp"}
    off = {row for row, value in plain.items() if abs(table.predict(row)["value"] / value - 1) > 0.15}
    small = {row for row in off if "/mpt-125m-" in row and row.split("/")[1].endswith(("-512", "-1k", "-2k"))}
    assert off - small == rerun and all(table.predict(row)["value"] > plain[row] for row in small), sorted(off)
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for row, value in plain.items():
        key = published.RowId.parse(row)
        size, length = key.model.rsplit("-", 1)
        tokens = int(length) if length.isdigit() else int(length[:-1]) * 1024
        if row not in rerun:
            series.setdefault((key.cluster, size), []).append((tokens, value, table.predict(row)["value"]))
    assert sum(len(s) >= 3 for s in series.values()) >= 8
    for key, points in series.items():  # longer context, fewer tokens a second, measured and predicted
        points.sort()
        for (short, *at_short), (longer, *at_long) in zip(points, points[1:], strict=False):
            if longer > short:  # (the 125m at 2k on 80 GB has two rows: two micro-batch sizes)
                assert at_long[0] < at_short[0] and at_long[1] < at_short[1], (key, short, longer)
    for name, (cluster, calib) in list(table.clusters.items()):
        device = table.cluster_specs[name]["device"]
        assert calib.attention_efficiency == attention_efficiency("triton", device) < calib.compute_efficiency
        table.clusters[name] = (cluster, dataclasses.replace(calib, attention_efficiency=0.0, attention_curve=()))
    table._predicted.clear()
    long = [row for row in plain if row.split("/")[1].endswith(("16k", "32k", "64k"))]
    assert len(long) >= 15
    for row in long:
        assert table.predict(row)["value"] / plain[row] - 1 > 0.10, row


def test_selective_checkpointing_costs_and_saves_what_torchtitan_measured(monkeypatch):
    """torchtitan's per-op selective checkpointing (``checkpoint_policy = "selective"``), against its published
    runs (``bench/published/torchtitan_*.toml``): on 64 A100s the 13B ran 0.881 times as fast with it as without
    (1904 / 2162 WPS), and 0.885 with every second block fully checkpointed; the 70B fit at one sequence per GPU
    with it, ran out of memory at two (the doc's footnote), and fit at two with full checkpointing; on 8 and 128
    H100s the 8B's peak memory fell by 15.4 GiB (82.4 and
    67.0 GiB reserved), each above what the model books (the allocator reserves more than it hands out)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    a100 = published.Table(ROOT / "bench" / "published" / "torchtitan_a100.toml")
    plain = a100.predict("a100x64/llama2-13b/2/fsdp")["value"]
    assert a100.predict("a100x64/llama2-13b/2/fsdp_sac")["value"] / plain == pytest.approx(1904 / 2162, rel=0.05)
    # and every second block fully checkpointed (torchtitan's selective per-layer): about the same cost, 1914 WPS
    assert a100.predict("a100x64/llama2-13b/2/fsdp_layer")["value"] / plain == pytest.approx(1914 / 2162, rel=0.05)
    full = a100.predict("a100x64/llama2-13b/2/fsdp_ckpt")["value"]
    assert full < a100.predict("a100x64/llama2-13b/2/fsdp_sac")["value"]  # full recomputes more
    fits = {rid: a100.predict(f"a100x64/llama2-70b/{rid}")["feasible"] for rid in ("1/fsdp_sac", "2/fsdp_sac",
                                                                                     "2/fsdp_ckpt", "1/fsdp")}
    assert fits == {"1/fsdp_sac": True, "2/fsdp_sac": False, "2/fsdp_ckpt": True, "1/fsdp": False}
    h100 = published.Table(ROOT / "bench" / "published" / "torchtitan_h100.toml")
    peaks = [h100.predict(f"{c}/llama3-8b/2/fsdp")["memory_bytes"]["peak"] / 2**30 for c in ("h100x8", "h100x128")]
    assert peaks[0] < 82.4 and peaks[1] < 67.0
    assert peaks[0] - peaks[1] == pytest.approx(82.4 - 67.0, rel=0.1)
