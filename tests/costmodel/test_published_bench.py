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
from zerotune.costmodel.error import at_scale, band_items, held_out_near, on_device
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
        items = band_items(result["error"], "comparisons")  # the tables a constant was set from held out
        near, span = at_scale(items, cluster.world_size)
        mine = on_device(items, cluster.device, span)  # and on its device there, the wider band kept
        expect = [max(near[k], mine[k]) if mine else near[k] for k in ("median", "p90")]
        assert [band["comparison_median"], band["comparison_p90"]] == expect, name
        # and names the tables those items came from, not every table
        rows = band_items(result["error"], "rows")
        _, row_span = at_scale(rows, cluster.world_size)
        read = {it[3] for it in items if span[0] <= it[0] <= span[1]} | {
            it[3] for it in rows if row_span[0] <= it[0] <= row_span[1]}
        assert not read & set(result["error"]["held_out"]), name
        tables = f"({', '.join(sorted(read))})"
        held = held_out_near(result["error"], "rows", row_span) + held_out_near(result["error"], "comparisons", span)
        if held:  # the band says how many items near it were held out, and from which tables
            tables += f"; {held} held out (their tables set a constant they are scored with: " \
                f"{', '.join(sorted(result['error']['held_out']))})"
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
    # the tally by table covers every scored item once and agrees with the total: outliers left out, and a ratio of
    # two scored rows counted through its rows
    summary = result["summary"]
    by_table = summary["by_table"]
    scored = [r for r in result["rows"] + result["ratios"] if r["role"] == "agreement" and not r["outlier"]]
    rows = {(r["table"], r["id"]) for r in scored if "id" in r}
    repeats = [r for r in scored if "of" in r and {(r["table"], r["of"]), (r["table"], r["over"])} <= rows]
    assert summary["repeats"] == len(repeats) > 0 and summary["outliers"] == sum(
        bool(r["outlier"]) for r in result["rows"] if r["role"] == "agreement") > 0
    assert sum(n for _, n in by_table.values()) == len(scored) - len(repeats) == summary["rows"] + summary["ratios"]
    assert sum(ok for ok, _ in by_table.values()) == summary["within_goal"]
    assert set(by_table) == {r["table"] for r in scored} == set(result["error"]["tables"])
    # the error by band counts the same items, and the ranking every configuration of two strategies or more
    assert sum(b["count"] for b in result["by_band"].values()) == len(scored) - len(repeats)
    assert sum(b["configurations"] for b in result["ranking"].values()) == len(result["configurations"]) >= 36
    # weak scaling: every published comparison of one model and strategy on two cluster sizes, at micro-batches
    # within 2x of each other, is predicted within 10% (FSDP on 8-512 GPUs, MiCS, and the rest of stock engines):
    # measured at 0.94-1.01, so this holds the model from charging scale what the clusters did not. Frontier's
    # 3-level runs, on an extension of DeepSpeed whose code was not available, miss, and their table's notes say why:
    # the model charges DeepSpeed's flat rings over 384 GCDs the per-step cost RCCL was measured to pay there
    # (costmodel/fabrics.py: ~70 µs a step on the forward gathers' and reductions' chunks, 5.7 s exposed; ~5 µs on
    # the 354 gathers of persistent parameters after each step, 0.7 s), which their 0.94 scaling leaves no room for
    # unless that extension gathers otherwise
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from published import RowId, is_scaling

    ids = {id(r): (RowId.parse(r["of"]), RowId.parse(r["over"])) for r in result["ratios"]}
    weak = [r for r in result["ratios"] for of, over in [ids[id(r)]]
            if (of.model, of.strategy) == (over.model, over.strategy) and of.cluster != over.cluster
            and max(of.mbs, over.mbs) < 2 * min(of.mbs, over.mbs)]
    assert len(weak) >= 12 and {r["table"] for r in weak} >= {"llm_foundry", "torchtitan_h100", "fsdp_paper"}
    stock = [r for r in weak if r["table"] != "frontier_3level"]
    assert all(abs(r["error"]) <= 0.10 for r in stock), [(r["of"], r["error"]) for r in stock if abs(r["error"]) > 0.1]
    frontier = [r for r in weak if r["table"] == "frontier_3level"]
    assert len(frontier) == 1 and frontier[0]["predicted"] < frontier[0]["published"]  # slower at scale, not faster
    # the band a decision is held to reads comparisons of two strategies only: one strategy's scaling is kept apart
    scored_ratios = [r for r in result["ratios"] if r["role"] == "agreement" and not r["outlier"]]
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


def test_vendor_collectives_at_scale_follow_their_fabric_laws():
    """bench/collectives_at_scale.py: every source of bench/published/collectives, each row predicted as one flat ring
    (by its fabric's law where its node is the design the law was measured on, costmodel/fabrics.py; the α-β ring
    elsewhere). The PCCL transcription reproduces the speedups the paper prints; its 56 rows, which the laws of RCCL
    and NCCL over Slingshot are read from, sit within 20% of them; the goal line counts every NCCL and RCCL row
    compared."""
    out = subprocess.run([sys.executable, "bench/collectives_at_scale.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    table = tomllib.loads((ROOT / "bench" / "published" / "collectives" / "pccl.toml").read_text())
    pccl = [r for r in result["rows"] if r["table"] == "pccl"]
    assert len(pccl) == sum(len(s["ms"]) for s in table["series"]) == 56 and all(r["law"] for r in pccl)
    # the transcription: PCCL's own times against the speedups the paper prints
    check = table["pccl_check"]
    for mb, speedup in check["printed_speedup_2048"].items():
        rccl = next(s["ms"][-1] for s in table["series"] if s["library"] == "RCCL" and s["collective"] == "all_gather"
                    and s["mb"] == int(mb))
        assert rccl / check["ms_2048"][mb] == pytest.approx(speedup, rel=0.03)
    assert all(abs(r["error"]) <= 0.20 for r in pccl)
    sources = {p.stem for p in (ROOT / "bench" / "published" / "collectives").glob("*.toml")}
    assert {r["table"] for r in result["rows"]} == sources
    goal = result["goal"]
    counted = [r for r in result["rows"] if r["error"] is not None and r["library"] in ("NCCL", "RCCL")
               and 32 <= r["gpus"] <= 2048]  # the rows compared (not those shown unscored: no device profile ...)
    assert all(r["unscored"] for r in result["rows"] if r["error"] is None)
    assert goal["rows"] == len(counted) and goal["within"] == sum(abs(r["error"]) <= 0.25 for r in counted)
    by = {(s["fabric"], s["law"], s["gpus"]): s["measured_over_predicted"] for s in result["summary"]}
    assert by[("rccl-slingshot-ofi", True, 2048)] == pytest.approx(1, abs=0.05)


def test_the_frontier_readings_bench_weighs_the_3_level_table_under_both_readings_with_and_without_rccls_law():
    """bench/frontier_readings.py: the seed paper's ratios under both readings of its 3-level method, with RCCL's
    rings across nodes charged by the law measured on them (costmodel/fabrics.py: what bench/published.py scores
    under the table's reading) and without it (RCCL's own tuning model, the α-β ring). With it every ring over 384
    GCDs slows, so ZeRO-3 and ZeRO++ fall, and the 3-level method read as ZeRO++ with hpZ on the GCD pair (3level-b,
    whose forward gathers span every GCD) scales far below the paper's 0.94, while read as AMSP's plan (3level-a,
    whose only collectives beyond the node are its optimizer span's, one GCD a node) it keeps most of the scaling
    it has without. A what-if: bench/published.py's scores do not move."""
    out = subprocess.run([sys.executable, "bench/frontier_readings.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    v = {(x["reading"], x["law"]): x for x in result["variants"]}
    assert set(v) == {(r, law) for r in ("3level-a", "3level-b") for law in (False, True)}
    # the table as written (its runner, DeepSpeed, has no quote yet: the main score runs it as zerotune's engine)
    scored = json.loads(subprocess.run([sys.executable, "bench/published.py", "--table", "frontier_3level", "--json",
                                        "--as-written"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout)
    assert [r["predicted"] for r in scored["ratios"]] == pytest.approx(
        [r["predicted"] for r in v[("3level-b", True)]["ratios"]], rel=1e-3)

    for s in ("zero3", "zeropp"):  # every gather and reduction of theirs is a ring over all 384 GCDs
        row = f"frontier48/gpt-neox-20b/1/{s}"  # (0.38 and 0.53 of the α-β ring's: its small gathers are cheaper)
        assert v[("3level-a", True)]["tflops_per_gcd"][row] < 0.6 * v[("3level-a", False)]["tflops_per_gcd"][row]
    scaling = {k: x["ratios"][1]["predicted"] for k, x in v.items()}  # 384 GCDs over 16, the paper's 0.94
    assert "scaling" in v[("3level-a", False)]["ratios"][1]["caption"]
    assert scaling[("3level-b", True)] < 0.6 * scaling[("3level-b", False)]  # 0.42 against 0.81
    assert scaling[("3level-a", True)] > 0.9 * scaling[("3level-a", False)]


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


def _scoreboard(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import scoreboard

    return scoreboard


def test_the_ranking_counts_pairs_in_order_the_winner_and_the_regret(monkeypatch):
    """Pairs closer than 5% published are no order; a strategy within 5% of the published best is a winner; the regret
    is the published best's throughput lost by running the model's first."""
    sb = _scoreboard(monkeypatch)
    published = {"a": 100.0, "b": 90.0, "c": 98.0}
    # (a, c) is 2% apart: not counted; (a, b) and (c, b) are, and this prediction reverses both
    assert sb.pair_order(published, {"a": 1.0, "b": 2.0, "c": 0.5}) == (0, 2)
    assert sb.pair_order(published, {"a": 1.0, "b": 0.5, "c": 2.0}) == (2, 2)
    assert sb.picked(published, {"a": 1.0, "b": 0.5, "c": 2.0})  # c is 2% from the best: a winner too
    assert sb.regret(published, {"a": 1.0, "b": 0.5, "c": 2.0}) == pytest.approx(0.02)
    assert not sb.picked(published, {"a": 1.0, "b": 2.0, "c": 0.5})
    assert sb.regret(published, {"a": 1.0, "b": 2.0, "c": 0.5}) == pytest.approx(0.10)
    assert sb.regret(published, {"a": 3.0, "b": 2.0, "c": 0.5}) == 0
    assert [sb.band_of_gpus(g) for g in (8, 256, 384, 512, 1000, 1024, 4096)] == [
        "<= 256", "<= 256", "384-512", "384-512", "384-512", ">= 1,024", ">= 1,024"]
    configs = [sb.Configuration("t", "k1", 128, published, {"a": 1.0, "b": 2.0, "c": 0.5}),  # wrong: regret 10%
               sb.Configuration("t", "k2", 64, {"a": 10.0, "b": 5.0}, {"a": 2.0, "b": 1.0}),  # right
               sb.Configuration("t", "k3", 32, {"a": 10.0, "b": 5.0}, {"a": 2.0, "b": 3.0}),  # wrong: regret 50%
               sb.Configuration("t", "k4", 384, {"a": 10.0, "b": 10.2}, {"a": 2.0, "b": 1.0}),  # a tie: no pair
               sb.Configuration("t", "k5", 1024, {"a": 1.0}, {"a": 1.0})]  # one strategy: no configuration
    score = sb.ranking(configs)
    small = score["<= 256"]
    assert (small["pairs_in_order"], small["pairs"], small["picked"], small["configurations"]) == (1, 4, 1, 3)
    assert small["regret_median"] == pytest.approx(0.10) and small["regret_p90"] == pytest.approx(0.5)
    mid = score["384-512"]
    assert (mid["pairs"], mid["picked"], mid["configurations"]) == (0, 1, 1)  # a tie: picked, at a small regret
    assert mid["regret_median"] == pytest.approx(1 - 10 / 10.2)
    assert score[">= 1,024"]["configurations"] == 0 and score[">= 1,024"]["regret_median"] is None


def test_a_ratio_of_two_scored_rows_counts_once_and_the_error_splits_its_misses_by_side(monkeypatch):
    """A ratio whose two rows are both scored is no item of its own; one reaching a strategy without a scored row,
    or another table's row of the same id, is. Misses (outside 15%) split into too fast (above the published)
    and too slow, by band."""
    sb = _scoreboard(monkeypatch)
    rows = {("t", "c/m/1/a"), ("t", "c/m/1/b"), ("u", "c/m/1/a")}
    ratios = [{"table": "t", "of": "c/m/1/b", "over": "c/m/1/a"},  # both scored rows: counted through them
              {"table": "t", "of": "c/m/1/x", "over": "c/m/1/a"},  # x has no row: its own item
              {"table": "u", "of": "c/m/1/b", "over": "c/m/1/a"}]  # u's b is not scored
    assert sb.dedup(ratios, rows) == ratios[1:]
    items = [{"gpus": 16, "error": e} for e in (0.0, 0.05, -0.2, 0.3, 0.4)] + [{"gpus": 512, "error": -0.1},
                                                                           {"gpus": 2048, "error": -0.5}]
    by = sb.error_by_band(items)
    assert by["<= 256"] == {"count": 5, "median": 0.2, "p90": 0.4, "misses": 3, "too_fast": 2, "too_slow": 1}
    assert by["384-512"]["misses"] == 0 and by["384-512"]["median"] == 0.1
    assert by[">= 1,024"]["too_slow"] == 1 and by[">= 1,024"]["too_fast"] == 0


def test_the_outlier_rule_finds_the_row_its_own_series_contradicts(monkeypatch):
    """A row faster per GPU by more than 10% than a row of its series that does as much work per GPU on as few GPUs
    contradicts it; the row in every contradiction of its series is the outlier. A series no single row explains
    has none, and more work per GPU (a larger micro-batch, more sequences a step) may run faster."""
    sb = _scoreboard(monkeypatch)

    def p(name, gpus, value, mbs=1, seqs=4, series="s"):
        return sb.Point(name, series, gpus, mbs, seqs, value)

    # the Playbook's 8-node DDP run at 2 x 2 ran half as fast as 1 x 4 on the same nodes and as 2 on twice as many
    series = [p("8", 8, 40.0), p("64a", 64, 31.0), p("64b", 64, 16.0, mbs=2), p("128", 128, 26.0, mbs=2, seqs=2)]
    found, unexplained = sb.outliers(series)
    assert found == {"64b": ["128", "64a"]} and unexplained == []
    assert sb.outliers([p("32", 32, 15.5), p("64", 64, 19.0), p("128", 128, 18.6)])[0] == {"32": ["128", "64"]}
    # within the tolerance, or more work per GPU on the faster row: no contradiction
    assert sb.outliers([p("8", 8, 10.0), p("16", 16, 10.9)]) == ({}, [])
    assert sb.outliers([p("8", 8, 10.0), p("16", 16, 20.0, mbs=2)]) == ({}, [])
    assert sb.outliers([p("8", 8, 10.0), p("16", 16, 20.0, seqs=8)]) == ({}, [])
    assert sb.outliers([p("8", 8, 10.0), p("16", 16, 20.0, series="other")]) == ({}, [])
    # two rows rising independently: no single row explains them
    found, unexplained = sb.outliers([p("8", 8, 10.0), p("16", 16, 12.0), p("32", 32, 9.0), p("64", 64, 11.0)])
    assert found == {} and unexplained == [["16", "32", "64", "8"]]
    # the bench finds both rows in the tables, prints them, and leaves them and the ratios reading them unscored
    import published

    result = published.evaluate([published.Table(ROOT / "bench" / "published" / f"{n}.toml", "quoted")
                                 for n in ("hf_playbook", "llm_foundry")])
    assert sorted(result["outliers"]["rows"]) == ["hf_playbook:h100x64/llama-1b/2x2/ddp",
                                                  "llm_foundry:a100-40g-x32/mpt-1b/10/fsdp"]
    flagged = [r for r in result["rows"] if r["outlier"]]
    assert len(flagged) == 2 and "h100x64/llama-1b/1x4/ddp" in flagged[0]["outlier"] + flagged[1]["outlier"]
    assert all(r["outlier"] for r in result["ratios"] if "h100x64/llama-1b/2x2/ddp" in (r["of"], r["over"]))
    assert result["summary"]["outliers"] == 2
    assert not any(c["key"] == "h100x64/llama-1b/2x2/*" and "ddp" in c["published"] for c in result["configurations"])


def test_a_reading_without_a_quote_takes_its_default(tmp_path, monkeypatch):
    """A per-table reading stands only on a quote in the table's [quotes] (its path, or a table above it); without
    one it takes its global default, a column's or a cluster's too (not the table's own).
    A table without [quotes] loads; a quote that is not a string is refused; quotes that cover no reading are
    reported."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    data = {"source": {"stack": "megatron", "flops": "hardware", "gathers": "module", "outer_reduce": "boundary"},
            "clusters": {"c": {"early_stop": True, "levels": [{"name": "node", "busbw_gbps": 100.0}]}},
            "strategies": {"z": {"preset": "zero3", "gathers": "bucket"},
                           "y": {"preset": "zero3", "gathers": "module"}},
            "groups": [{"set": {"grad_bits": 32}}],
            "quotes": {"stack": "'Megatron-DeepSpeed GPT-2 code' — the tutorial", "strategies.z": "'per bucket' — x.py",
                       "clusters": {"c": {"levels": {"node": "'busbw 100' — nccl-tests log"}}},
                       "clusters.c.host": "'Intel' — doc"}}
    settled, readings, stray = published.settle_readings(data, "quoted")
    assert {r.path: r.quoted for r in readings} == {
        "stack": True, "flops": False, "gathers": False, "clusters.c.early_stop": False,
        "clusters.c.levels.node.busbw_gbps": True, "strategies.y.gathers": False, "groups.0.set.grad_bits": False}
    # outer_reduce is its default: no reading; z's gathers is the global default (no reading), y's falls to it
    assert settled["source"] == {"stack": "megatron", "outer_reduce": "boundary"}
    assert settled["strategies"]["z"]["gathers"] == "bucket" and settled["strategies"]["y"]["gathers"] == "bucket"
    assert settled["clusters"]["c"]["levels"][0]["busbw_gbps"] == 100.0
    assert settled["clusters"]["c"]["early_stop"] is False
    assert settled["groups"][0]["set"] == {} and stray == ["clusters.c.host"]
    assert data["source"]["flops"] == "hardware"  # the table as read is left as it was
    written, _, _ = published.settle_readings(data, "written")
    assert written["source"]["flops"] == "hardware" and written["groups"][0]["set"] == {"grad_bits": 32}
    defaults, _, _ = published.settle_readings(data, "defaults")
    assert defaults["source"] == {"outer_reduce": "boundary"}
    assert defaults["strategies"]["y"] == {"preset": "zero3", "gathers": "bucket"}
    # a level named by its place (from 0) is the same level
    by_place = {**data, "quotes": {"clusters.c.levels.0.busbw_gbps": "'busbw 100' — nccl-tests log"}}
    assert published.settle_readings(by_place)[0]["clusters"]["c"]["levels"][0]["busbw_gbps"] == 100.0
    assert "busbw_gbps" not in published.settle_readings({**data, "quotes": {}})[0]["clusters"]["c"]["levels"][0]
    with pytest.raises(ValueError, match=r"quotes.stack=3: must be a non-empty string"):
        published.settle_readings({**data, "quotes": {"stack": 3}})
    # on a table: zeropp_blog's quoted readings stand, and without its [quotes] they fall to their defaults
    path = ROOT / "bench" / "published" / "zeropp_blog.toml"
    text = path.read_text()
    assert "\n[quotes]\n" in text
    quoted = published.Table(path, "quoted")
    assert (quoted.stack, quoted.flops, quoted.gathers) == ("megatron", "hardware", "module")
    bare = tmp_path / "zeropp_blog.toml"
    bare.write_text(text[:text.index("\n[quotes]\n")] + "\n")
    unquoted = published.Table(bare, "quoted")
    assert (unquoted.stack, unquoted.flops, unquoted.gathers) == ("pytorch", "model", "bucket")
    assert {r.path for r in unquoted.readings if not r.quoted} >= {"stack", "flops", "gathers"}
    row = "dgx2-ib4/gpt-18b/2/zero3"
    assert unquoted.predict(row)["value"] != quoted.predict(row)["value"]
    assert published.Table(bare, "written").predict(row)["value"] == quoted.predict(row)["value"]


def test_the_defaults_score_runs_every_reading_at_its_default_beside_the_main_one(monkeypatch, capsys):
    """``--defaults``: every table again with every reading at its default, quoted or not, printed beside the main
    score, and in the JSON under ``defaults`` with the readings it dropped."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    assert published.main(["--table", "zeropp_blog", "--defaults", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    main_drop = result["readings"]["zeropp_blog"]["dropped"]
    drop = dict(map(tuple, result["defaults"]["readings"]["zeropp_blog"]["dropped"]))
    assert main_drop == [] and drop["stack"] == "megatron" and drop["flops"] == "hardware"
    assert result["defaults"]["by_band"]["384-512"]["median"] != result["by_band"]["384-512"]["median"]
    assert published.main(["--table", "zeropp_blog", "--defaults"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("RANKING (primary)") and out.count("every reading at its default:") == 7
    assert published.main(["--table", "zeropp_blog", "--write-error"]) == 2


def test_a_configuration_joins_the_ratios_of_two_strategies_on_its_setting(monkeypatch):
    """AMSP's 1,024-GPU 7B setting: its row's five strategies and the MiCS plan on AMSP's engine, placed by the
    published 1.3; the seed paper's 384 GCDs, which only ratios give, from 1; weak scaling ratios make none."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    amsp = published.Table(ROOT / "bench" / "published" / "amsp_paper.toml", "quoted")
    configs = {c.key: c for c in published.configurations(amsp, set())}
    seven = configs["a800-1024/llama-7b/1/*"]
    assert set(seven.published) == {"mics", "zero1", "zero3", "zeropp", "amsp_7b", "mics_engine"}
    assert seven.published["mics_engine"] == pytest.approx(159.12 / 1.3) and seven.gpus == 1024
    assert seven.predicted["amsp_7b"] == amsp.predict("a800-1024/llama-7b/1/amsp_7b")["value"]
    assert "a800-64/llama-7b/1x2/*" not in configs  # one strategy
    frontier = published.Table(ROOT / "bench" / "published" / "frontier_3level.toml", "quoted")
    (seed,) = published.configurations(frontier, set())
    assert seed.published["zeropp"] == 1.0 and seed.published["3level-b"] == pytest.approx(1.71)
    assert seed.published["zero3"] == pytest.approx(1 / 1.405)
    assert published.configurations(published.Table(ROOT / "bench" / "published" / "llm_foundry.toml"), set()) == []
    # an outlier leaves its configuration
    without = {c.key: c for c in published.configurations(amsp, {"a800-1024/llama-7b/1/zero3"})}
    assert "zero3" not in without["a800-1024/llama-7b/1/*"].published
