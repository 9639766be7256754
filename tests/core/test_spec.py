"""ClusterSpec, ModelSpec and Strategy: presets, formulas, JSON round trips and validation messages."""

from __future__ import annotations

import dataclasses
import json

import pytest

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import MODELS, STRATEGY_PRESETS, build_strategy, parse_cluster, parse_model
from zerotune.costmodel.files import load_cluster, load_model, load_strategy
from zerotune.errors import SpecError, UnknownPresetError


def test_frontier_preset_matches_design_figures():
    c = parse_cluster("frontier:48")
    assert c.world_size == 384 and c.num_levels == 3
    assert [(lv.name, lv.size, lv.bandwidth_gbps) for lv in c.levels] == [
        ("gcd-pair", 2, 200.0), ("node", 4, 50.0), ("inter-node", 48, 12.5)]
    assert (c.device_memory_gib, c.peak_tflops) == (64.0, 191.5)
    assert c.node_span == 2 and c.span_size(2) == 8


def test_dgx_and_local_presets():
    d = parse_cluster("dgx-h100:4")
    assert d.world_size == 32 and d.levels[0].size == 8 and d.peak_tflops == 989.0
    local = parse_cluster("local:2x2x2")
    assert local.sizes == (2, 2, 2) and local.world_size == 8 and local.levels[-1].name == "inter-node"
    assert parse_cluster("local:4").num_levels == 1


@pytest.mark.parametrize("text, fragment", [
    ("summit:4", "unknown cluster preset"),
    ("frontier:0", "whole number"),
    ("frontier:x", "whole number"),
    ("local:2x0", "sizes >= 1"),
    ("local:", "local:AxBxC"),
    ("", "must be a preset"),
])
def test_bad_cluster_strings_name_the_value(text, fragment):
    with pytest.raises(SpecError) as err:
        parse_cluster(text)
    assert fragment in str(err.value) and repr(text) in str(err.value)


def test_cluster_json_file_round_trip(tmp_path):
    c = parse_cluster("frontier:2")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(c.to_dict()))
    assert load_cluster(str(path)) == c  # the command lines read files ...
    with pytest.raises(UnknownPresetError, match="unknown cluster preset"):
        parse_cluster(str(path))  # ... the catalog (what the service uses) never does
    assert ClusterSpec.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    (tmp_path / "m.json").write_text(json.dumps({**MODELS["gpt-tiny"].to_dict(), "layers": 3}))
    assert load_model(str(tmp_path / "m.json")).layers == 3
    (tmp_path / "s.json").write_text(json.dumps({"preset": "zeropp", "grad_bits": 8}))
    s = load_strategy(str(tmp_path / "s.json"), c, prefetch_buckets=2)
    assert (s.name, s.grad_bits, s.weight_bits, s.prefetch_buckets) == ("zeropp", 8, 8, 2)
    with pytest.raises(SpecError, match="file not found"):
        load_cluster(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(SpecError, match="is not valid JSON"):
        load_model(str(tmp_path / "broken.json"))


def test_a_measured_bus_bandwidth_is_checked_kept_and_left_out_when_absent():
    """``busbw_gbps`` on a level: a measured bus bandwidth, at most what the level's links carry (a ring leaves
    each group through its ranks' links), round-tripped through JSON; a level without one writes no such key,
    so clusters keep the form (and requests the key) they had before the field; another outer size drops it
    (it was measured at one node count)."""
    levels = [{"name": "node", "size": 8, "bandwidth_gbps": 450.0, "latency_us": 3.4},
              {"name": "inter-node", "size": 32, "bandwidth_gbps": 50.0, "latency_us": 14.0, "busbw_gbps": 64.9}]
    c = ClusterSpec(name="p5", levels=tuple(levels), device="NVIDIA H100 80GB", peak_tflops=989.0)
    assert c.to_dict()["levels"][1]["busbw_gbps"] == 64.9 and "busbw_gbps" not in c.to_dict()["levels"][0]
    assert ClusterSpec.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert all("busbw_gbps" not in lv for lv in parse_cluster("dgx-h100:4").to_dict()["levels"])
    assert c.with_outer_size(32) == c and c.with_outer_size(16).levels[1].busbw_gbps is None
    assert ClusterSpec(name="edge", levels=(levels[0], {**levels[1], "busbw_gbps": 400.0})).levels[1].busbw_gbps == 400
    with pytest.raises(SpecError) as bad:
        ClusterSpec(name="over", levels=(levels[0], {**levels[1], "busbw_gbps": 400.5}))
    assert bad.value.field == "level[inter-node].busbw_gbps" and bad.value.value == 400.5
    assert "8 rank(s) under it x bandwidth_gbps 50 = 400 GB/s" in bad.value.rule
    with pytest.raises(SpecError, match="busbw_gbps"):
        ClusterSpec(name="neg", levels=(levels[0], {**levels[1], "busbw_gbps": -1}))


def test_each_collective_may_carry_its_own_measured_bus_bandwidth():
    """``all_gather_busbw_gbps``, ``reduce_scatter_busbw_gbps`` and ``all_reduce_busbw_gbps``: a collective measured
    apart (nccl-tests' all_gather_perf beside all_reduce_perf), checked as ``busbw_gbps`` is (positive, at most what the
    level's links carry, named in the error), round-tripped through JSON, left out when absent, dropped with the outer
    size; ``collective_busbw`` lists the collectives measured apart (the all-reduce here reaches ``busbw_gbps``:
    ``test_a_levels_measured_bus_bandwidth_is_what_its_collectives_reach``)."""
    node = {"name": "node", "size": 8, "bandwidth_gbps": 450.0, "latency_us": 3.4}
    outer = {"name": "inter-node", "size": 32, "bandwidth_gbps": 50.0, "latency_us": 14.0, "busbw_gbps": 64.9,
             "all_gather_busbw_gbps": 28.0, "reduce_scatter_busbw_gbps": 27.9}
    c = ClusterSpec(name="p5", levels=(node, outer), device="NVIDIA H100 80GB", peak_tflops=989.0)
    lv = c.levels[1]
    assert lv.collective_busbw() == (("all_gather", 28.0), ("reduce_scatter", 27.9)) and lv.busbw_gbps == 64.9
    assert c.levels[0].collective_busbw() == () and c.levels[0].measured_busbw() == ()
    written = c.to_dict()["levels"]
    assert written[1]["all_gather_busbw_gbps"] == 28.0 and "all_reduce_busbw_gbps" not in written[1]
    assert not {"all_gather_busbw_gbps", "reduce_scatter_busbw_gbps", "all_reduce_busbw_gbps"} & set(written[0])
    assert ClusterSpec.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.with_outer_size(16).levels[1].measured_busbw() == ()
    with pytest.raises(SpecError) as bad:
        ClusterSpec(name="over", levels=(node, {**outer, "all_reduce_busbw_gbps": 401.0}))
    assert bad.value.field == "level[inter-node].all_reduce_busbw_gbps" and bad.value.value == 401.0
    with pytest.raises(SpecError, match="reduce_scatter_busbw_gbps"):
        ClusterSpec(name="neg", levels=(node, {**outer, "reduce_scatter_busbw_gbps": 0}))


def test_num_params_gpt2_small_shape():
    # GPT-2 small (124,439,808 parameters with tied head, vocab 50257, positions 1024)
    gpt2 = ModelSpec("gpt2", layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024)
    assert gpt2.num_params() == 124_439_808


def test_neox_20b_shape_and_flops():
    m = parse_model("gpt-neox-20b")
    assert (m.layers, m.hidden, m.heads, m.seq_len) == (44, 6144, 64, 2048)
    assert 19.9e9 < m.num_params() < 20.6e9
    assert m.flops_per_token() == 6 * m.num_params() + 12 * 44 * 6144 * 2048


def test_a_llama_counts_meta_s_parameters():
    """Llama 3 8B (32 x 4096, 32 query and 8 key/value heads, SwiGLU 14336, vocab 128256, an untied head) as a
    Llama: exactly Meta's 8,030,261,248 parameters (per block two RMSNorms, q and o h², k and v h·k, three
    h x f matrices; no positions, no biases), and Llama 2 7B's 6,738,415,616 with Llama's default SwiGLU width
    (11,008 at h = 4,096). The untied embedding is a lookup and adds no FLOPs; a GPT of the same shape counts its
    learned positions, LayerNorms and biases."""
    llama = ModelSpec("llama3-8b", layers=32, hidden=4096, heads=32, vocab=128256, seq_len=8192,
                      ffn_hidden=14336, kv_heads=8, tied_head=False, arch="llama")
    assert llama.kv == 1024 and llama.position_numel == 0
    assert llama.num_params() == 8_030_261_248 == 32 * 218_112_000 + 2 * 128256 * 4096 + 4096
    assert llama.flops_per_token() == 6 * (llama.num_params() - 128256 * 4096) + 12 * 32 * 4096 * 8192
    llama2 = ModelSpec("llama2-7b", layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, tied_head=False,
                       arch="llama")
    assert llama2.ffn == 11008 and llama2.num_params() == 6_738_415_616
    assert parse_model("llama3-8b").num_params() == 8_030_261_248
    gpt = dataclasses.replace(llama, arch="gpt")
    h, k, f = 4096, 1024, 14336
    # GPT-2's block: LayerNorms (4h) and biases (h + 2k, h, f, h) where a Llama has two RMSNorms (2h) and a third
    # h x f matrix; the learned positions; a LayerNorm's 2h at the end where an RMSNorm has h
    assert gpt.num_params() - llama.num_params() == 32 * (5 * h + 2 * k + f - h * f) + 8192 * h + h


def test_model_presets_round_trip_and_tiny_is_tiny():
    for m in MODELS.values():
        assert ModelSpec.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert parse_model("gpt-tiny").num_params() < 200_000


def test_model_validation():
    with pytest.raises(SpecError, match=r"model.heads=5: must divide hidden=64"):
        ModelSpec("m", layers=1, hidden=64, heads=5, vocab=10, seq_len=8)
    with pytest.raises(SpecError, match=r"model.layers=0: must be >= 1"):
        ModelSpec("m", layers=0, hidden=64, heads=4, vocab=10, seq_len=8)
    with pytest.raises(UnknownPresetError, match="unknown model preset"):
        parse_model("gpt-5")
    with pytest.raises(SpecError, match=r"model.kv_heads=3: must divide heads=8"):
        ModelSpec("m", layers=1, hidden=64, heads=8, vocab=10, seq_len=8, kv_heads=3)
    with pytest.raises(SpecError, match=r"model.kv_heads=0: must be >= 1"):
        ModelSpec("m", layers=1, hidden=64, heads=8, vocab=10, seq_len=8, kv_heads=0)
    with pytest.raises(SpecError, match=r"model.tied_head='no': must be true or false"):
        ModelSpec("m", layers=1, hidden=64, heads=8, vocab=10, seq_len=8, tied_head="no")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"model.arch='mamba': must be one of \['gpt', 'llama'\]"):
        ModelSpec("m", layers=1, hidden=64, heads=8, vocab=10, seq_len=8, arch="mamba")


def test_a_gpt2_shaped_model_is_written_as_before_and_a_grouped_one_in_full():
    gpt = parse_model("gpt-tiny")
    assert not {"kv_heads", "tied_head", "arch"} & set(gpt.to_dict())
    gqa = dataclasses.replace(gpt, kv_heads=2, tied_head=False)
    assert gqa.to_dict()["kv_heads"] == 2 and gqa.to_dict()["tied_head"] is False
    assert ModelSpec.from_dict(json.loads(json.dumps(gqa.to_dict()))) == gqa
    llama = dataclasses.replace(gqa, arch="llama")
    assert llama.to_dict()["arch"] == "llama" and ModelSpec.from_dict(json.loads(json.dumps(llama.to_dict()))) == llama


@pytest.mark.parametrize("name", sorted(STRATEGY_PRESETS))
@pytest.mark.parametrize("cluster", ["frontier:48", "dgx-h100:8", "local:2x2x2", "local:2x4"])
def test_presets_resolve_and_round_trip(name, cluster):
    c = parse_cluster(cluster)
    s = build_strategy(name, c)
    assert s.name == name and s.optim_span <= c.num_levels
    assert Strategy.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_preset_spans_follow_design():
    c = parse_cluster("frontier:48")
    spans = {n: (s.param_span, s.grad_span, s.optim_span, s.secondary_span)
             for n in STRATEGY_PRESETS for s in [build_strategy(n, c)]}
    assert spans["zero1"] == (0, 0, 3, None)
    assert spans["zero2"] == (0, 3, 3, None)
    assert spans["zero3"] == (3, 3, 3, None)
    assert spans["mics"] == (2, 2, 2, None)
    assert spans["zeropp"] == (3, 3, 3, 2)
    assert spans["3level-a"] == (1, 2, 3, None)
    assert spans["3level-b"] == (3, 3, 3, 1)
    pp = build_strategy("zeropp", c)
    assert (pp.weight_bits, pp.grad_bits) == (8, 4)


def test_overrides_and_dict_with_preset():
    c = parse_cluster("local:2x2x2")
    s = build_strategy("zeropp", c, weight_bits=16, grad_bits=16)
    assert not s.quantized and s.secondary_span == 2
    d = build_strategy({"preset": "zero3", "micro_batch_size": 4}, c)
    assert d.micro_batch_size == 4 and d.param_span == 3


BASE = dict(param_span=2, grad_span=2, optim_span=2)


@pytest.mark.parametrize("changes, field, fragment", [
    (dict(param_span=3), "strategy.param_span", "must be <= grad_span=2"),
    (dict(grad_span=3, optim_span=2, param_span=1), "strategy.grad_span", "must be <= optim_span=2"),
    (dict(param_span=-1), "strategy.param_span", "must be >= 0"),
    (dict(param_span=1.5), "strategy.param_span", "must be an integer"),
    (dict(secondary_span=2), "strategy.secondary_span", "must be < param_span=2"),
    (dict(weight_bits=2), "strategy.weight_bits", "must be one of [16, 8, 4]"),
    (dict(grad_bits=2), "strategy.grad_bits", "must be one of [32, 16, 8, 4]"),
    (dict(weight_bits=32), "strategy.weight_bits", "must be one of [16, 8, 4]"),
    (dict(quantize_above=0), "strategy.quantize_above", "must be >= 1"),
    (dict(weight_bits=8, quantize_above=3), "strategy.weight_bits", "crosses no level >= quantize_above=3"),
    (dict(allgather_bucket_mb=0), "strategy.allgather_bucket_mb", "must be > 0"),
    (dict(reduce_bucket_mb=float("nan")), "strategy.reduce_bucket_mb", "finite number"),
    (dict(prefetch_buckets=-1), "strategy.prefetch_buckets", "must be >= 0"),
    (dict(micro_batch_size=0), "strategy.micro_batch_size", "must be >= 1"),
    (dict(activation_checkpointing="yes"), "strategy.activation_checkpointing", "true or false"),
])
def test_each_broken_rule_has_its_own_message(changes, field, fragment):
    with pytest.raises(SpecError) as err:
        Strategy(**{**BASE, **changes})
    assert err.value.field == field
    assert fragment in err.value.rule
    assert str(err.value).startswith(f"{field}=")


def test_strategy_that_cannot_fit_the_cluster_is_refused():
    two_levels = parse_cluster("local:2x2")
    with pytest.raises(SpecError, match=r"param_span=3: must be within 0..2 on local:2x2 \(0 = unsharded, "
                       r"1 = node \(2 ranks\), 2 = inter-node \(4 ranks\)\)"):
        build_strategy({"param_span": 3, "grad_span": 3, "optim_span": 3}, two_levels)
    # a span past the levels is told what the levels are, before any rule between spans
    with pytest.raises(SpecError, match=r"param_span=5: must be within 0..3 on frontier:48 .*3 = inter-node"):
        build_strategy("zero3", parse_cluster("frontier:48"), param_span=5)
    with pytest.raises(SpecError, match=r"optim_span=4: must be within 0..3"):
        build_strategy({"param_span": 1, "grad_span": 1, "optim_span": 4}, parse_cluster("frontier:2"))
    with pytest.raises(SpecError, match=r"quantize_above=3: must be <= 2"):
        build_strategy("zero3", two_levels, quantize_above=3)
    with pytest.raises(SpecError, match="needs a cluster with an hpZ level"):
        build_strategy("zeropp", parse_cluster("local:4"))


def test_unknown_fields_and_presets_are_named():
    with pytest.raises(SpecError, match=r"strategy.stage=3: unknown field"):
        Strategy.from_dict({**BASE, "stage": 3})
    with pytest.raises(UnknownPresetError, match=r"strategy='zero4': unknown strategy preset"):
        build_strategy("zero4", parse_cluster("local:2x2"))
    with pytest.raises(SpecError, match=r"cluster.levels\[\].speed=1: unknown field"):
        ClusterSpec.from_dict({"name": "x", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 1, "speed": 1}]})
    with pytest.raises(SpecError, match="level names must be unique"):
        ClusterSpec.from_dict({"name": "x", "levels": [{"name": "a", "size": 2, "bandwidth_gbps": 1}] * 2})


def test_error_detail_is_json_friendly():
    with pytest.raises(SpecError) as err:
        Strategy(**{**BASE, "weight_bits": 3})
    assert err.value.as_detail() == {"field": "strategy.weight_bits", "value": 3, "rule": "must be one of [16, 8, 4]"}
