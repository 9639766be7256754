"""The time model against the laws published measurements show, and the published bench that holds it to them."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
import tomllib

import pytest

from tests.support import ROOT
from zerotune.core.spec import ClusterSpec, ModelSpec
from zerotune.costmodel import Calibration, calibration_for, predict
from zerotune.costmodel.attention import FIGURE_ATTENTION, attention_efficiency
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.error import at_scale, error_band, on_device
from zerotune.costmodel.hardware import (
    DEVICES,
    ENGINE_STACK,
    FA2_A100_TFLOPS,
    GPT3_2_7B_2K,
    H100_EAGER_MEMORY_FRACTION,
    H100_ENGINE_EFFICIENCY,
    H200_EAGER_MEMORY_FRACTION,
    H200_ENGINE_EFFICIENCY,
    IBM_FSDP_7B,
    SOURCE_RUNS,
    STREAM_FRACTION,
    device_of,
    gemm_efficiency,
    peak_tflops_of,
)
from zerotune.costmodel.links import (
    HOSTS,
    LINKS,
    NCCL_RING_BASE_US,
    NCCL_RING_PROTOCOLS,
    NCCL_TREE_PROTOCOLS,
    NET_HOP_US,
    NVLINK_HOP_US,
    RCCL_RING_BASE_US,
    RCCL_RING_PROTOCOLS,
)
from zerotune.costmodel.profiles import PROFILES, profile_calibration, profile_cluster, source_run_efficiency
from zerotune.costmodel.rates import NOMINAL_LINK_EFFICIENCY, run_by
from zerotune.costmodel.timing import costs_for

GPT_18B = ModelSpec("gpt-18b", layers=40, hidden=6144, heads=32, vocab=50257, seq_len=512)


def dgx2(ib_links: int, nodes: int = 24):
    """DGX-2 nodes (16 V100 on NVSwitch) with ``ib_links`` x 100 Gb/s per node, as the ZeRO++ evaluation."""
    cluster = profile_cluster("dgx2", "V100", (("node", 16, "nvlink2-nvswitch"), ("inter-node", nodes, "ib-edr-100")))
    inter = dataclasses.replace(cluster.levels[1], bandwidth_gbps=ib_links * 12.5 / 16)
    return (dataclasses.replace(cluster, levels=(cluster.levels[0], inter)),
            profile_calibration("dgx2", "V100", ("nvlink2-nvswitch", "ib-edr-100")))


def zeropp_gain(cluster, calib, micro_batch: int) -> float:
    def tflops(name: str) -> float:
        s = build_strategy(name, cluster, micro_batch_size=micro_batch, activation_checkpointing=True)
        return predict(GPT_18B, cluster, s, calibration=calib)["tflops_per_rank"]
    return tflops("zeropp") / tflops("zero3")


def test_zeropp_gain_grows_as_inter_node_bandwidth_falls():
    """ZeRO++ blog Figs. 6-8: 1.15x at 800 Gb/s per node, up to 2.2x at 100 Gb/s (384 V100)."""
    gains = [zeropp_gain(*dgx2(links), micro_batch=2) for links in (8, 4, 2, 1)]
    assert gains == sorted(gains) and gains[0] > 1.0, gains
    assert gains[-1] > 1.8, gains  # communication-bound at 100 Gb/s: most of ZeRO-3's step is its cross-node bytes


def test_zeropp_gain_shrinks_as_tokens_per_gpu_grow():
    """ZeRO++ blog Figs. 6 and 7: 1.56x at 1K tokens per GPU, 1.41x at 2K (400 Gb/s); 2.21x / 1.77x (100 Gb/s)."""
    for links in (1, 4):
        gains = [zeropp_gain(*dgx2(links), micro_batch=mbs) for mbs in (1, 2, 4, 8)]
        assert gains == sorted(gains, reverse=True) and gains[-1] >= 1.0, (links, gains)


def test_zero3_weak_scaling_falls_below_one_at_scale():
    """Cross-node bytes appear from 2 nodes on and ring latency grows with the node count: tokens/s per rank falls."""
    model = parse_model("gpt-neox-20b")
    per_rank = []
    for nodes in (1, 2, 8, 48, 256):
        cluster = parse_cluster(f"frontier:{nodes}")
        p = predict(model, cluster, build_strategy("zero3", cluster))
        per_rank.append(p["tokens_per_s"] / cluster.world_size)
    scaling = [x / per_rank[0] for x in per_rank]
    assert all(a >= b for a, b in zip(scaling, scaling[1:], strict=False)), scaling
    assert scaling[3] < 0.97 and scaling[-1] < scaling[3], scaling


def test_an_fp32_gradient_reduction_moves_twice_the_gradient_bytes_and_never_saves_time():
    """grad_bits 32 (FSDP2's reduce_dtype=float32, torchtitan's default; Megatron's grad_reduce_in_fp32): the
    weight gathers are unchanged, every gradient reduction moves 4-byte elements, the grad shards are fp32; on
    frontier:48, where ZeRO-3's reductions cannot hide behind compute, the step is slower."""
    model, cluster = parse_model("gpt-neox-20b"), parse_cluster("frontier:48")
    half, full = (predict(model, cluster, build_strategy("zero3", cluster, grad_bits=bits)) for bits in (16, 32))
    for level, kinds in half["bytes_per_level"].items():
        for kind, nbytes in kinds.items():
            assert full["bytes_per_level"][level][kind] == (2 * nbytes if kind == "reduce_scatter" else nbytes)
    assert full["memory_bytes"]["grads"] == 2 * half["memory_bytes"]["grads"]
    assert full["memory_bytes"]["params"] == half["memory_bytes"]["params"]
    assert full["step_time_s"] > 1.02 * half["step_time_s"]
    assert build_strategy("zero3", cluster, grad_bits=32).quantized is False


def test_presets_carry_their_profile_custom_clusters_their_devices_and_the_rest_stay_nominal():
    frontier = parse_cluster("frontier:48")
    calib = calibration_for(frontier)
    assert calib.name == "frontier-profile" and calib.collective_launch_us == RCCL_RING_BASE_US  # RCCL's Simple
    assert calibration_for(parse_cluster("dgx-h100:2")).collective_launch_us == NCCL_RING_BASE_US
    assert calib.bandwidth_efficiency == tuple(LINKS[k].efficiency for k in ("xgmi-gcd-pair", "xgmi-node",
                                                                            "slingshot-11"))
    assert predict(parse_model("gpt-7b"), parse_cluster("dgx-h100:4"),
                   build_strategy("zero3", parse_cluster("dgx-h100:4")))["calibration"] == "dgx-h100-profile"
    slower = dataclasses.replace(frontier, levels=(*frontier.levels[:2],
                                                   dataclasses.replace(frontier.levels[2], bandwidth_gbps=1.0)))
    # not the preset any more: its links' profile would not describe it, its device's still does
    custom = calibration_for(slower)
    assert custom.name == "MI250X-device" and custom.protocols == "rccl"
    assert custom.compute_efficiency == calib.compute_efficiency
    assert custom.memory_bytes_per_s == calib.memory_bytes_per_s
    assert custom.host_s_per_layer == calib.host_s_per_layer > 0
    # the two untouched levels keep their links' efficiencies, the slowed one is no profiled link
    assert custom.bandwidth_efficiency == (*calib.bandwidth_efficiency[:2], NOMINAL_LINK_EFFICIENCY)
    assert error_band(custom, slower.world_size, slower.device) is None  # its links are not the published ones
    # a device at another peak (a PCIe card, a mis-typed figure) or none known: nominal
    assert calibration_for(dataclasses.replace(slower, peak_tflops=150.0)).name == "nominal"
    assert calibration_for(dataclasses.replace(slower, device="NVIDIA H100 PCIe", peak_tflops=756.0)).name == "nominal"
    assert calibration_for(parse_cluster("local:2x2")).name == "nominal"
    # zerotune's engine takes its own kernel-level figure where it was measured (Hopper), the eager
    # PyTorch one elsewhere (A100: IBM's 7B run re-based), never Megatron's
    h100, a100 = DEVICES["H100"], DEVICES["A100"]
    assert ENGINE_STACK == "zerotune"
    engine = calibration_for(parse_cluster("dgx-h100:2"))
    assert engine.compute_efficiency == H100_ENGINE_EFFICIENCY
    assert engine.memory_bytes_per_s == pytest.approx(H100_EAGER_MEMORY_FRACTION * h100.hbm_gbps * 1e9)
    h200 = calibration_for(parse_cluster("dgx-h200:2"))  # each Hopper part its own measured rates
    assert h200.compute_efficiency == H200_ENGINE_EFFICIENCY
    assert h200.memory_bytes_per_s == pytest.approx(H200_EAGER_MEMORY_FRACTION * DEVICES["H200"].hbm_gbps * 1e9)
    fsdp = profile_calibration("x", "H100", ("nvlink4-nvswitch",), stack="pytorch")
    assert fsdp.compute_efficiency == source_run_efficiency("H100", "pytorch")
    compute_alone = profile_calibration("x", "H100", ("nvlink4-nvswitch",), stack="pytorch", whole_run=False)
    assert compute_alone.compute_efficiency == pytest.approx(gemm_efficiency(
        h100.pytorch_efficiency, IBM_FSDP_7B, h100.peak_tflops, H100_EAGER_MEMORY_FRACTION * h100.hbm_gbps * 1e9,
        attention_efficiency("flash2", "H100", IBM_FSDP_7B)))  # IBM's run: SDPA's FlashAttention-2 at its own rate
    assert fsdp.memory_bytes_per_s == engine.memory_bytes_per_s  # the same eager kernels
    megatron = profile_calibration("x", "H100", ("nvlink4-nvswitch",), stack="megatron")
    assert megatron.memory_bytes_per_s == pytest.approx(STREAM_FRACTION * h100.hbm_gbps * 1e9)
    assert calibration_for(parse_cluster("dgx-a100:2")).compute_efficiency == source_run_efficiency("A100", "pytorch")
    assert a100.efficiency("zerotune") == a100.efficiency("pytorch") == a100.pytorch_efficiency
    assert h100.efficiency("megatron") > h100.efficiency("pytorch")
    assert DEVICES["MI250X"].efficiency("pytorch") == DEVICES["MI250X"].megatron_efficiency  # none published
    assert DEVICES["MI250X"].efficiency("zerotune") == DEVICES["MI250X"].megatron_efficiency
    # a FlashAttention-2 stack: the A100's published figure [fa2] (205 of 312 TFLOPS on a GPT3-2.7B), re-based on
    # that model's memory-bound kernels at the fused kernels' STREAM rate; a device without one takes Megatron's
    assert a100.efficiency("flash") == pytest.approx(FA2_A100_TFLOPS / a100.peak_tflops, abs=1e-3)
    flash = profile_calibration("x", "A100", ("nvlink3-nvswitch",), stack="flash")
    assert flash.compute_efficiency == pytest.approx(gemm_efficiency(
        a100.flash_efficiency, GPT3_2_7B_2K, a100.peak_tflops, STREAM_FRACTION * a100.hbm_gbps * 1e9,
        attention_efficiency("flash2", "A100", GPT3_2_7B_2K)))
    megatron_a100 = profile_calibration("x", "A100", ("nvlink3-nvswitch",), "megatron")
    assert flash.compute_efficiency > megatron_a100.compute_efficiency
    assert flash.memory_bytes_per_s == pytest.approx(STREAM_FRACTION * a100.hbm_gbps * 1e9)
    assert h100.efficiency("flash") == h100.megatron_efficiency
    with pytest.raises(ValueError, match="stack='jax'"):
        h100.efficiency("jax")
    # every preset carries the profile of its device, links and host: the A100 presets differ in NIC placement
    for name, host in (("frontier", "amd"), ("dgx-h100", "intel"), ("dgx-h200", "intel"), ("dgx-a100", "amd"),
                       ("perlmutter", "amd-cpu-nic")):
        c = calibration_for(parse_cluster(f"{name}:4"))
        assert c.name == f"{name}-profile" and c.net_overhead_us == HOSTS[host].net_overhead_us
        assert c.ll128 == HOSTS[host].nic_beside_gpu
        assert Calibration.from_dict(json.loads(json.dumps(c.to_dict()))) == c  # stored and loaded intact
    perlmutter = parse_cluster("perlmutter:2")
    assert (perlmutter.world_size, perlmutter.device_memory_gib, [lv.bandwidth_gbps for lv in perlmutter.levels]) == (
        8, 40.0, [100.0, 25.0])
    assert calibration_for(parse_cluster("dgx-a100:2")).ll_max_busbw_gbps == (87.7, 22.5, 19.0)
    assert calibration_for(parse_cluster("dgx-h100:2")).ll_max_busbw_gbps == (141.0, 39.0, 20.4)


def test_the_h200_preset_is_the_h100s_node_with_its_own_memory_and_measured_rates():
    """``dgx-h200`` is a DGX H100 with H200s: the same peak, NVLink, NICs and hosts, 141 GB of HBM3e at 4.8
    TB/s. zerotune's engine rates were measured on each part (``H100_*``, ``H200_*``: bench/kernel_split.py
    on one H100 and one H200), the published stacks' figures on H100s (the same SMs). The two parts ran
    the engine's forward and backward in the same device time (134.2 and 133.8 ms at 4 sequences of
    gpt-1.3b): the H200's memory-bound kernels move more bytes per second but a smaller fraction of its
    faster HBM. So the model puts their forward and backward within 2% of each other, the H200's
    memory-bound kernels and the optimizer's streaming passes (STREAM's fraction of each HBM) faster."""
    import json

    h100, h200 = parse_cluster("dgx-h100:2"), parse_cluster("dgx-h200:2")
    assert (h200.device, h200.device_memory_gib, h200.peak_tflops) == ("NVIDIA H200", 141.0, h100.peak_tflops)
    assert h200.levels == h100.levels
    a, b = calibration_for(h100), calibration_for(h200)
    assert b.name == "dgx-h200-profile"
    assert (a.compute_efficiency, b.compute_efficiency) == (H100_ENGINE_EFFICIENCY, H200_ENGINE_EFFICIENCY)
    assert a.memory_bytes_per_s == pytest.approx(H100_EAGER_MEMORY_FRACTION * 3350e9)
    assert b.memory_bytes_per_s == pytest.approx(H200_EAGER_MEMORY_FRACTION * 4800e9)
    assert b.optimizer_elems_per_s == pytest.approx(a.optimizer_elems_per_s * 4800 / 3350)
    rates = ("compute_efficiency", "memory_bytes_per_s", "quant_elems_per_s", "optimizer_elems_per_s")
    assert dataclasses.replace(b, name=a.name, **{k: getattr(a, k) for k in rates}) == a
    kept = {part: json.loads((ROOT / "bench" / "data" / f"{part}-kernels" / "kernel_split-gpt-1.3b.json").read_text())
            for part in ("h100", "h200")}
    at4 = {part: next(p for p in k["passes"] if p["batch"] == 4)["kernels_ms"] for part, k in kept.items()}
    assert abs(at4["h100"] / at4["h200"] - 1) < 0.02, at4
    assert peak_tflops_of("NVIDIA H200") == peak_tflops_of("NVIDIA H100 80GB HBM3") == 989.0
    # torch's device names find their profiles, the most specific where two fit
    assert device_of("NVIDIA H200") is DEVICES["H200"] and device_of("NVIDIA H100 80GB HBM3") is DEVICES["H100"]
    assert device_of("NVIDIA A100-SXM4-40GB") is DEVICES["A100-40GB"]
    assert device_of("NVIDIA A100-SXM4-80GB") is DEVICES["A100"]
    assert device_of("AMD Instinct MI250X/MI250") is DEVICES["MI250X"] and device_of("NVIDIA GeForce RTX 4090") is None
    # the profiles are the SXM parts: a PCIe or NVL card, slower and with other memory, is not mistaken for one
    assert device_of("NVIDIA H100 PCIe") is None and device_of("NVIDIA H100 NVL") is None
    assert device_of("NVIDIA A100 80GB PCIe") is None and peak_tflops_of("NVIDIA A100-PCIE-40GB") is None
    for model in ("gpt-1.3b", "gpt-7b"):  # 8 sequences per micro-step: the device's time, not the host's
        times = [predict(parse_model(model), c, build_strategy("zero3", c, micro_batch_size=8))["breakdown"]
                 for c in (h100, h200)]
        assert times[1]["memory_bound_s"] < times[0]["memory_bound_s"] and times[0]["host_wait_s"] == 0
        assert times[1]["optimizer_s"] < times[0]["optimizer_s"]
        assert abs(times[0]["compute_s"] / times[1]["compute_s"] - 1) < 0.02


def test_tiny_messages_are_latency_bound_and_large_ones_bandwidth_bound():
    """α-β with NCCL's own constants: launch + (s - 1) hop latencies dominate small collectives."""
    cluster = parse_cluster("dgx-h100:1")
    calib = calibration_for(cluster)
    costs = costs_for(cluster, calib, 2, 1, 2048)
    link = LINKS["nvlink4-nvswitch"]
    latency = (NCCL_RING_BASE_US + 7 * NVLINK_HOP_US) * 1e-6  # Simple
    ll_base, ll_nvlink, ll_net, _ = NCCL_RING_PROTOCOLS["LL"]
    tiny = costs.time(("all_gather", (1, 1), 4, 16))  # 8 bytes per rank: NCCL runs it with LL
    assert tiny == pytest.approx((ll_base + 7 * ll_nvlink) * 1e-6, rel=1e-3)
    big_numel = 2**28  # 512 MiB shard per rank
    big = costs.time(("all_gather", (1, 1), big_numel, 16))
    assert big == pytest.approx(latency + 7 * big_numel * 2 / (link.bandwidth_gbps * 1e9 * link.efficiency), rel=1e-9)
    assert latency / big < 0.01  # 3.5 GiB through 370 GB/s: 10 ms against 32 µs
    # the ring pays one hop per rank: 8 times the ranks, about 8 times the latency of a tiny collective
    wide = profile_cluster("wide", "H100", (("node", 64, "nvlink4-nvswitch"),))
    wide_tiny = costs_for(wide, calib, 2, 1, 2048).time(("all_gather", (1, 1), 4, 16))
    assert wide_tiny == pytest.approx((ll_base + 63 * ll_nvlink) * 1e-6, rel=1e-3)
    # a calibration that charges Simple's latencies throughout (fitted ones, gloo runs)
    simple = costs_for(cluster, dataclasses.replace(calib, protocols="simple"), 2, 1, 2048)
    assert simple.time(("all_gather", (1, 1), 4, 16)) == pytest.approx(latency, rel=1e-3)
    with pytest.raises(ValueError, match="protocols='LL'"):
        Calibration(protocols="LL")


def test_frontier_collectives_are_timed_with_rccls_own_tuning_model():
    """RCCL's ring model on a Frontier-like node (tuning.cc's tuning_model_3): LL for tiny messages at its own base
    and xGMI / network hop latencies, LL128 off, Simple (17 us base, 3.6 / 19.8 us hops) for large ones."""
    cluster = parse_cluster("frontier:4")
    calib = calibration_for(cluster)
    assert calib.protocols == "rccl" and "LL128" not in RCCL_RING_PROTOCOLS
    costs = costs_for(cluster, calib, 2, 1, 2048)
    ll_base, ll_xgmi, ll_net, ll_bw = RCCL_RING_PROTOCOLS["LL"]
    base, xgmi, net, _ = RCCL_RING_PROTOCOLS["Simple"]
    # one ring per level with 2+ ranks: the GCD pair (1 hop), the node's 4 packages (3), 4 nodes (3)
    tiny = costs.time(("all_gather", (1, 3), 4, 16))
    assert tiny == pytest.approx((3 * ll_base + 4 * ll_xgmi + 3 * ll_net) * 1e-6, rel=1e-3)
    assert [lv.latency_us for lv in cluster.levels] == [xgmi, xgmi, net]
    numel = 2**26  # 128 MiB per rank across the network: Simple, LL's fifth of the bandwidth would cost seconds
    big = costs.time(("all_gather", (3, 3), numel, 16))
    wire = 3 * numel * 2 / (cluster.levels[2].bandwidth_gbps * 1e9 * calib.level_efficiency(3))
    assert big == pytest.approx((base + 3 * net) * 1e-6 + wire, rel=1e-9)
    assert big < (ll_base + 3 * ll_net) * 1e-6 + wire / ll_bw


def a800(nodes: int, rings: str):
    """AMSP's cluster: 8 A800 per node on NVLink, 4 x HDR 200 Gb/s per node (12.5 GB/s per GPU)."""
    links = ("nvlink3-nvswitch", "ib-hdr-200")
    cluster = profile_cluster("a800", "A100", (("node", 8, links[0]), ("inter-node", nodes, links[1])))
    inter = dataclasses.replace(cluster.levels[1], bandwidth_gbps=12.5)
    return (dataclasses.replace(cluster, levels=(cluster.levels[0], inter)),
            profile_calibration("a800", "A100", links, "megatron", rings))


def test_a_flat_ring_pays_a_hop_per_rank_of_the_whole_group():
    """NCCL's ring latency (tuning.cc): base + (nRanks - nNodes) NVLink hops + (nNodes - 1) network hops, for the one
    ring DeepSpeed and FSDP run over their whole group; zerotune's per-level rings pay (nodes - 1) + (8 - 1). A tiny
    message runs with NCCL's LL protocol (the fastest its tuner predicts), Simple's latencies where a calibration
    charges those throughout. Across nodes every NVLink step costs at least the host's network post overhead
    (NCCL's getNetOverhead: 1 us on a host it does not know, as AMSP's)."""
    base, nvlink, net, _ = NCCL_RING_PROTOCOLS["LL"]
    for nodes in (2, 16, 128):
        flat_cluster, flat = a800(nodes, "flat")
        hier_cluster, hier = a800(nodes, "hierarchical")
        assert flat.net_overhead_us == HOSTS["unknown"].net_overhead_us == 1.0
        tiny = ("all_gather", (1, 2), 4, 16)
        world = 8 * nodes
        want = (base + (world - nodes) * max(nvlink, 1.0) + (nodes - 1) * net) * 1e-6
        assert costs_for(flat_cluster, flat, 2, 1, 2048).time(tiny) == pytest.approx(want, rel=1e-2)
        # the node's own ring stays on one node; the inter-node ring has one rank per node, whose hops NCCL charges
        # its tree's network latency ("with ppn=1 latencies are fully exposed")
        per_level = (2 * base + 7 * nvlink + (nodes - 1) * NCCL_TREE_PROTOCOLS["LL"][2]) * 1e-6
        assert costs_for(hier_cluster, hier, 2, 1, 2048).time(tiny) == pytest.approx(per_level, rel=1e-2)
        simple = costs_for(flat_cluster, dataclasses.replace(flat, protocols="simple"), 2, 1, 2048).time(tiny)
        assert simple == pytest.approx(
            (NCCL_RING_BASE_US + (world - nodes) * NVLINK_HOP_US + (nodes - 1) * NET_HOP_US) * 1e-6, rel=1e-2)
    # at 1,024 GPUs the flat ring's latency is nearly twice the hierarchy's
    assert want / per_level > 1.8


def test_a_broadcast_pays_the_fill_of_its_chain_and_an_all_gather_of_the_same_bytes_does_not():
    """NCCL runs a broadcast as a chain along its ring: a segment of s bytes waits α + s·β on each hop, so the buffer's
    first segment fills the R - 1 hops before the rest streams at the slowest hop's rate. At its best segment count
    that is Johnsson and Ho's (√((R - 2)·α) + √(S·β))² on hops of one kind: more than the latency and the bytes add
    up to, by the fill's cross term, where an all-gather of the same bytes moves them shard by shard on every hop."""
    from zerotune.costmodel.protocols import chain

    nodes = 64
    cluster = profile_cluster("ib", "A100", (("inter-node", nodes, "ib-hdr-200"),))
    calib = dataclasses.replace(profile_calibration("ib", "A100", ("ib-hdr-200",), "megatron", "flat"),
                                protocols="simple", collective_launch_us=0.0)
    costs = costs_for(cluster, calib, 2, 99, 2048)
    lv = cluster.levels[0]
    alpha, beta = lv.latency_us * 1e-6, 1 / (lv.bandwidth_gbps * 1e9 * calib.level_efficiency(1))
    for numel in (2**12, 2**20, 2**25):
        nbytes = 2 * numel
        t = costs.broadcast(1, 1, numel)
        optimum = (math.sqrt((nodes - 2) * alpha) + math.sqrt(nbytes * beta)) ** 2
        assert optimum <= t <= optimum * 1.001, numel  # whole segments only: at most a rounding above the optimum
        additive = (nodes - 1) * alpha + nbytes * beta
        assert t > additive + math.sqrt((nodes - 2) * alpha * nbytes * beta)  # the fill's cross term, at least half
        gather = costs.time(("all_gather", (1, 1), numel // nodes, 16))
        assert gather == pytest.approx((nodes - 1) * alpha + (nodes - 1) * (numel // nodes) * 2 * beta)
        assert t > gather
    # a tiny buffer is one segment, latency-bound: R - 1 hops, each waiting α + S·β
    assert costs.broadcast(1, 1, 1) == pytest.approx((nodes - 1) * (alpha + 2 * beta))
    # hops of two kinds (a flat ring over 16 nodes of 8): the closed form's segment counts are the best of all
    stages = [(112, 3.4e-6, 1 / 240e9), (15, 14e-6, 1 / 93e9)]
    nbytes = 96e6
    brute = min(sum(n * (a + nbytes / k * b) for n, a, b in stages)
                + (k - 1) * max(a + nbytes / k * b for _, a, b in stages) for k in range(1, 20_000))
    assert chain(stages, nbytes) == pytest.approx(brute, rel=1e-9)
    flat_cluster, flat = a800(16, "flat")
    t = costs_for(flat_cluster, flat, 2, 1, 2048).broadcast(1, 2, 48_000_000)
    assert t > costs_for(flat_cluster, flat, 2, 1, 2048).time(("all_gather", (1, 2), 48_000_000 // 128, 16))
    with pytest.raises(ValueError, match="weight_sync='scatter'"):
        Calibration(weight_sync="scatter")


def test_an_optimizer_that_hands_out_whole_parameters_pays_a_broadcast_per_owner_more_as_its_group_grows():
    """InternEvo's zero1 = -1 (its optimizer states over every GPU) measured 0.98 of zero1 = 8's throughput at 16 GPUs,
    0.82 at 256 and 0.63 at 1,024 (bench/published/internevo_a100.toml): its optimizer hands out whole parameters,
    largest first, to the rank holding the fewest elements, and each rank that got any broadcasts them over the
    whole group after the step. Charged so (``weight_sync = "broadcast"``), the cost of optimizer states over every
    GPU grows with the group; charged as a gather per bucket it stays near flat."""
    from zerotune.core.plan import parameter_numels
    from zerotune.costmodel.runners import owners
    from zerotune.trainer.gpt import build_gpt

    for spec in ("gpt-tiny", ModelSpec("gqa", layers=2, hidden=64, heads=4, vocab=96, seq_len=32, kv_heads=2,
                                       tied_head=False)):
        model = parse_model(spec) if isinstance(spec, str) else spec
        assert sorted(parameter_numels(model)) == sorted(p.numel() for p in build_gpt(model).parameters())
    model = ModelSpec("internlm-7b", layers=32, hidden=4096, heads=32, vocab=103168, seq_len=2048, ffn_hidden=16512,
                      tied_head=False)
    tensors = parameter_numels(model)
    assert sum(tensors) == model.num_params() and len(tensors) == 5 + 12 * 32
    for ranks in (8, 256, 1024):
        held = owners(model, ranks, 1)
        assert sum(k for _, k in held) == min(ranks, len(tensors))
        assert sum(n * k for n, k in held) == model.num_params()
        assert max(n for n, _ in held) >= max(tensors)  # whole parameters: the embedding's rank holds all of it

    def ratio(nodes: int, sync: str) -> float:
        levels = (("node", 8, "nvlink3-nvswitch"), ("inter-node", nodes, "ib-edr-100"))
        cluster = profile_cluster("roce", "A100", levels, (None, 6.25))
        calib = dataclasses.replace(profile_calibration("roce", "A100", ("nvlink3-nvswitch", "ib-edr-100"), "flash",
                                                        "flat"), weight_sync=sync)
        step = {name: predict(model, cluster, build_strategy(fields, cluster, micro_batch_size=2), calibration=calib,
                              global_batch=cluster.world_size * 8)["step_time_s"]
                for name, fields in (("world", {"preset": "zero1"}), ("node", {"preset": "zero1", "optim_span": 1}))}
        return step["node"] / step["world"]

    broadcast = [ratio(nodes, "broadcast") for nodes in (2, 32, 128)]
    gather = [ratio(nodes, "gather") for nodes in (2, 32, 128)]
    assert broadcast[0] > broadcast[1] > broadcast[2] and broadcast[2] < 0.8
    assert all(g > 0.9 for g in gather) and gather[2] - broadcast[2] > 0.15
    # within one node the eight owners' broadcasts cost about what the gathers of the same bytes do
    cluster = profile_cluster("one", "A100", (("node", 8, "nvlink3-nvswitch"),))
    s = build_strategy("zero1", cluster, micro_batch_size=2)
    calib = profile_calibration("one", "A100", ("nvlink3-nvswitch",), "flash", "flat")
    one = [predict(model, cluster, s, calibration=dataclasses.replace(calib, weight_sync=sync))["breakdown"][
        "boundary_s"] for sync in ("gather", "broadcast")]
    assert one[0] < one[1] < 1.3 * one[0]


def test_a_levels_measured_bus_bandwidth_is_what_its_collectives_reach():
    """A custom cluster may carry its own collective benchmark (``Level.busbw_gbps``: nccl-tests' busbw across the
    nodes, e.g. 64.9 GB/s for a 256 MB all-reduce on 32 AWS p5 nodes, the Ultra-Scale Playbook's measurement):
    the level's efficiency is then busbw over the rate its links carry, so a large all-reduce run as one flat
    ring over all 256 GPUs takes what that bus bandwidth says, 2(n - 1)/n of the buffer over it. The device keeps
    its profile; a device without one keeps the nominal rates with the measured links. Without the measurement
    the same cluster's all-reduce is over 5x faster (the InfiniBand NDR profile's 0.94 of 400 GB/s, which links
    of that rate and latency take)."""
    def p5(busbw: float | None, device: str = "NVIDIA H100 80GB") -> ClusterSpec:
        outer = {"name": "inter-node", "size": 32, "bandwidth_gbps": 50.0, "latency_us": 14.0}
        return ClusterSpec(name="p5-32", device=device, peak_tflops=989.0, levels=(
            {"name": "node", "size": 8, "bandwidth_gbps": 450.0, "latency_us": 3.4},
            outer if busbw is None else {**outer, "busbw_gbps": busbw}))

    measured, nominal = p5(64.9), p5(None)
    calib = calibration_for(measured)
    assert calib.name == "H100-device" and calib.bandwidth_efficiency[1] == pytest.approx(64.9 / (8 * 50))
    assert calibration_for(nominal).bandwidth_efficiency[1] == LINKS["ib-ndr-400"].efficiency
    other = calibration_for(p5(64.9, device="Some Accelerator"))
    assert other.name == "nominal, measured links" and other.bandwidth_efficiency == pytest.approx(
        (NOMINAL_LINK_EFFICIENCY, 64.9 / 400))
    numel, world = 2**31, 256  # 4 GiB of bf16 gradients: the ring's latency is 2% of its time
    seconds = {}
    for name, cluster in (("measured", measured), ("nominal", nominal)):
        flat = run_by(calibration_for(cluster), "fsdp")
        seconds[name] = costs_for(cluster, flat, 2, 1, 2048).time(("all_reduce", (1, 2), numel, 16))
    assert seconds["measured"] == pytest.approx(2 * (world - 1) / world * numel * 2 / 64.9e9, rel=0.05)
    bandwidths = LINKS["ib-ndr-400"].efficiency * 400 / 64.9  # 5.8: the ratio of the two rates; the latency is alike
    assert 5.0 < seconds["measured"] / seconds["nominal"] < bandwidths
    # the all-gather measured apart (28.0 GB/s, the Playbook's on those 32 nodes): all-gathers go at its rate,
    # the all-reduce keeps the level's; without it, an all-gather would run at the all-reduce's 64.9
    split = dataclasses.replace(measured, levels=(measured.levels[0], dataclasses.replace(
        measured.levels[1], all_gather_busbw_gbps=28.0)))
    calib = calibration_for(split)
    assert calib.collective_efficiency == (("all_gather", 2, pytest.approx(28.0 / 400)),)
    assert calib.level_efficiency(2, "all_gather") == pytest.approx(28.0 / 400)
    assert calib.level_efficiency(2, "all_reduce") == calib.level_efficiency(2) == pytest.approx(64.9 / 400)
    flat = run_by(calib, "fsdp")
    gather = costs_for(split, flat, 2, 1, 2048).time(("all_gather", (1, 2), numel // world, 16))
    assert gather == pytest.approx((world - 1) / world * numel * 2 / 28.0e9, rel=0.05)
    assert costs_for(split, flat, 2, 1, 2048).time(("all_reduce", (1, 2), numel, 16)) == seconds["measured"]
    assert Calibration.from_dict(json.loads(json.dumps(calib.to_dict()))) == calib


def test_an_all_reduce_runs_as_nccls_tree_or_ring_whichever_is_faster():
    """NCCL's tree all-reduce (tuning.cc): base + 2 ((ranks per node - 1) NVLink hops + log2(nodes) network hops) at
    half the bus bandwidth, against the ring's 2 (R - 1) hops at its full bus bandwidth. A small all-reduce over 128
    nodes runs LL on the tree in ~85 us where the ring would pay ~2.5 ms; a 1 GiB one runs the Simple ring, whose
    multi-node latency NCCL counts 1.4 times on Ampere (the 'plateau effect', 1.9 on Volta)."""
    cluster, flat = a800(128, "flat")
    costs = costs_for(cluster, flat, 2, 1, 2048)
    base, nvlink, net, _ = NCCL_TREE_PROTOCOLS["LL"]
    tiny = costs.time(("all_reduce", (1, 2), 1024, 16))
    tree_latency = (base + 2 * (7 * nvlink + 7 * net)) * 1e-6  # 8 GPUs per node, log2(128) = 7
    assert tiny == pytest.approx(tree_latency, rel=0.02)
    ring_base, ring_nvlink, ring_net, _ = NCCL_RING_PROTOCOLS["LL"]
    ring_latency = (ring_base + 2 * (896 * max(ring_nvlink, 1.0) + 127 * ring_net)) * 1e-6
    assert ring_latency > 25 * tiny
    # a 1 GiB buffer: on 2 nodes the ring's full bus bandwidth wins (its latency counted 1.4x, the plateau); on 128
    # nodes the ring's 2,046 steps cost more than the tree's halved bandwidth, and NCCL's model picks the tree
    numel = 2**29
    nic = 8 * 12.5e9 * LINKS["ib-hdr-200"].efficiency
    assert flat.ring_plateau == 1.4 and DEVICES["V100"].ring_plateau == 1.9
    two, two_calib = a800(2, "flat")
    t2 = costs_for(two, two_calib, 2, 1, 2048).time(("all_reduce", (1, 2), numel, 16))
    simple_2 = (NCCL_RING_BASE_US + 2 * (14 * max(NVLINK_HOP_US, 3.0) + 1 * NET_HOP_US)) * 1e-6
    assert t2 == pytest.approx(1.4 * simple_2 + 2 * 15 * (numel // 16) * 2 / nic, rel=1e-6)
    big = costs.time(("all_reduce", (1, 2), numel, 16))
    base_s, nvlink_s, net_s, fraction = NCCL_TREE_PROTOCOLS["Simple"]
    tree = (base_s + 2 * (7 * nvlink_s + 7 * net_s)) * 1e-6 + numel * 2 / (0.5 * fraction * nic)
    assert big == pytest.approx(tree, rel=1e-6)  # 1 GiB is past treeCorrectionFactor's 256 MB: no correction
    ring = 1.4 * (NCCL_RING_BASE_US + 2 * (896 * max(NVLINK_HOP_US, 3.0) + 127 * NET_HOP_US)) * 1e-6 + (
        2 * 1023 * (numel // 1024) * 2 / nic)
    assert ring > 1.3 * big
    # a single node's all-reduce pays no plateau, and RCCL's profile (no sourced tree table) runs rings only
    one, _ = a800(1, "flat")
    one_t = costs_for(one, flat, 2, 1, 2048).time(("all_reduce", (1, 2), numel, 16))
    nvl = LINKS["nvlink3-nvswitch"]
    assert one_t == pytest.approx((NCCL_RING_BASE_US + 14 * NVLINK_HOP_US) * 1e-6
                                  + 2 * 7 * (numel // 8) * 2 / (nvl.bandwidth_gbps * 1e9 * nvl.efficiency), rel=1e-6)
    frontier = parse_cluster("frontier:128")
    rccl = costs_for(frontier, calibration_for(frontier), 2, 1, 2048)
    assert rccl.time(("all_reduce", (3, 3), 1024, 16)) > 127 * 2 * RCCL_RING_PROTOCOLS["LL"][2] * 1e-6


def test_a_multi_node_ring_pays_the_hosts_network_overhead_on_every_step():
    """NCCL's tuner (tuning.cc, "inter-node rings still have to launch nsteps * net overhead"): once a ring spans 2+
    nodes each of its NVLink steps costs at least the host's post overhead, 3x under Simple: 6 us on an AMD host
    against NVLink's 3.4, 3 us (below it) on an Intel one; inside one node nothing changes. LL's bus bandwidth is
    capped at llMaxBw (19.0 GB/s on 3+ AMD-hosted nodes), and LL128 runs only where the NICs share the GPUs' PCIe
    switch, so a large all-gather over 512 Perlmutter-like nodes runs Simple."""
    def ring(host: str, nodes: int, ll128: bool | None = None):
        links = ("nvlink3-nvswitch", "slingshot-11")
        cluster = profile_cluster("p", "A100", (("node", 4, links[0]), ("inter-node", nodes, links[1])))
        net = dataclasses.replace(cluster.levels[1], bandwidth_gbps=25.0, latency_us=NET_HOP_US)  # NCCL's hop
        cluster = dataclasses.replace(cluster, levels=(cluster.levels[0], net))
        calib = profile_calibration("p", "A100", links, rings="flat", host=host)
        return cluster, calib if ll128 is None else dataclasses.replace(calib, ll128=ll128)

    numel = 2**20  # 2 MiB shard per rank: bandwidth-bound, Simple where LL128 is off
    big = ("all_gather", (1, 2), numel, 16)
    for nodes in (4, 64):
        intel, amd = (costs_for(*ring(h, nodes, ll128=False), 2, 1, 2048).time(big) for h in ("intel", "amd"))
        steps = 4 * nodes - nodes
        assert amd - intel == pytest.approx(steps * (3 * 2.0 - NVLINK_HOP_US) * 1e-6, rel=1e-6)
    one_intel, one_amd = (costs_for(*ring(h, 1), 2, 1, 2048).time(big) for h in ("intel", "amd-cpu-nic"))
    assert one_intel == one_amd
    # 256 and 512 MiB gathered over 2,048 GPUs on 512 nodes: Simple with 6 us NVLink steps, or LL at its 19 GB/s cap,
    # whichever is faster; LL128 (off here) would have been both the fastest and far from the PCCL measurements
    cluster, calib = ring("amd-cpu-nic", 512)
    assert calib.ll_max_busbw_gbps == (87.7, 22.5, 19.0) and not calib.ll128
    ll_base, ll_nvlink, ll_net, ll_bw = NCCL_RING_PROTOCOLS["LL"]
    chosen = []
    for mib in (256, 512):
        numel = mib * 2**19 // 2048
        coll = ("all_gather", (1, 2), numel, 16)
        t = costs_for(cluster, calib, 2, 1, 2048).time(coll)
        sent = 2047 * numel * 2
        wire = sent / (4 * cluster.levels[1].bandwidth_gbps * 1e9 * calib.level_efficiency(2))
        simple = (NCCL_RING_BASE_US + 1536 * 3 * 2.0 + 511 * NET_HOP_US) * 1e-6 + wire
        ll = (ll_base + 1536 * max(ll_nvlink, 2.0) + 511 * ll_net) * 1e-6 + max(wire / ll_bw, sent / 19.0e9)
        assert t == pytest.approx(min(simple, ll), rel=1e-6)
        chosen.append("Simple" if simple < ll else "LL")
        with_ll128 = costs_for(cluster, dataclasses.replace(calib, ll128=True), 2, 1, 2048).time(coll)
        assert with_ll128 < 0.75 * t
    assert chosen == ["LL", "Simple"]  # LL's cap makes Simple win as the message grows
    with pytest.raises(ValueError, match="host='arm'"):
        profile_calibration("p", "A100", ("nvlink3-nvswitch",), host="arm")


def test_a_flat_ring_is_as_fast_as_its_slowest_link_class():
    """Large messages: the ring is pipelined, so the node's NICs (8 x 12.5 GB/s x 0.93 for a subtree of 8 ranks) set the
    rate: (R - 1) shards per rank over 93 GB/s; zerotune's hierarchy runs its levels one after the other."""
    cluster, flat = a800(16, "flat")
    numel = 2**22  # 8 MiB shard per rank, 1 GiB gathered
    t = costs_for(cluster, flat, 2, 1, 2048).time(("all_gather", (1, 2), numel, 16))
    sent = 127 * numel * 2
    nic = 8 * 12.5e9 * LINKS["ib-hdr-200"].efficiency
    nvlink = LINKS["nvlink3-nvswitch"].bandwidth_gbps * 1e9 * LINKS["nvlink3-nvswitch"].efficiency
    assert sent / nic > sent / nvlink
    latency = (NCCL_RING_BASE_US + 112 * max(NVLINK_HOP_US, 3 * 1.0) + 15 * NET_HOP_US) * 1e-6
    assert t == pytest.approx(latency + sent / nic, rel=1e-6)
    hier_cluster, hier = a800(16, "hierarchical")
    h = costs_for(hier_cluster, hier, 2, 1, 2048).time(("all_gather", (1, 2), numel, 16))
    per_level = (2 * NCCL_RING_BASE_US + 7 * NVLINK_HOP_US + 15 * NET_HOP_US) * 1e-6
    assert h == pytest.approx(per_level + 15 * numel * 2 / (12.5e9 * LINKS["ib-hdr-200"].efficiency)
                              + 7 * 16 * numel * 2 / nvlink, rel=1e-6)
    assert t < h
    # a quantized gradient reduction stays hierarchical in both (ZeRO++'s qgZ all-to-all)
    q = ("reduce_scatter", (1, 2), 2**24, 4)
    assert costs_for(cluster, flat, 2, 1, 2048).time(q) == costs_for(hier_cluster, hier, 2, 1, 2048).time(q)
    with pytest.raises(ValueError, match="rings='ring'"):
        Calibration(rings="ring")


def test_a_stack_that_reduces_in_backward_hides_the_outer_reduction():
    """AMSP Table V (7B, 64 GPUs): overlapping the AllReduce with computation lifts MFU from 0.45 to 0.54. A step
    whose engine queues the reduction beyond grad_span in its final backward (zerotune's engine, DeepSpeed's
    overlap_comm, DDP) pays only the weight gathers at the boundary; with accumulation the earlier micro-steps
    reduce nothing beyond grad_span, so the gain is one final micro-step's, whatever the accumulation."""
    cluster, calib = a800(8, "flat")
    model = parse_model("gpt-7b")
    s = build_strategy("zero1", cluster)
    assert calib.outer_reduce == "backward"  # a profile's default: zerotune's engine reduces in its final backward
    boundary = predict(model, cluster, s, calibration=dataclasses.replace(calib, outer_reduce="boundary"))
    backward = predict(model, cluster, s, calibration=calib)
    assert backward["bytes_per_level"] == boundary["bytes_per_level"]
    # the reduce-scatter left the boundary, the all-gather of the updated weights (the same bytes on a ring) stayed
    assert backward["breakdown"]["boundary_s"] == pytest.approx(0.5 * boundary["breakdown"]["boundary_s"], rel=1e-3)
    assert backward["tflops_per_rank"] > 1.1 * boundary["tflops_per_rank"]
    batch = 4 * cluster.world_size
    accum = [predict(model, cluster, s, calibration=dataclasses.replace(calib, outer_reduce=where), global_batch=batch)
             for where in ("boundary", "backward")]
    assert accum[1]["grad_accum_steps"] == 4 and accum[1]["bytes_per_level"] == accum[0]["bytes_per_level"]
    assert accum[1]["breakdown"]["boundary_s"] == pytest.approx(backward["breakdown"]["boundary_s"])
    saved = boundary["step_time_s"] - backward["step_time_s"]
    assert accum[0]["step_time_s"] - accum[1]["step_time_s"] == pytest.approx(saved, rel=1e-6)
    with pytest.raises(ValueError, match="outer_reduce='later'"):
        Calibration(outer_reduce="later")


def test_fsdp2_copies_each_gathered_and_reduced_element_once_more_on_the_compute_stream():
    """FSDP2 copies each all-gather's output into its parameters and each reduce-scatter's input out of its
    gradients on the compute stream (``Calibration.copies``, set by the fsdp runner): per micro-step 2 x 2 bytes per
    gathered element (forward and the backward re-gather: read and write), and 2 + r per reduced one (r: the
    reduction's bytes, 4 in fp32); zerotune's engine, whose parameters and gradients are views of its buffers, pays
    none, nor does a strategy that gathers and reduce-scatters nothing."""
    from zerotune.costmodel.schedule import build_schedule

    cluster = parse_cluster("dgx-h100:2")
    fsdp = run_by(calibration_for(cluster), "fsdp")
    assert fsdp.copies and not run_by(fsdp, "zerotune").copies and not run_by(fsdp, "deepspeed").copies
    none = dataclasses.replace(fsdp, copies=False)
    for grad_bits, reduce_bytes in ((16, 2), (32, 4)):
        s = build_strategy({"preset": "zero3", "grad_bits": grad_bits}, cluster)
        sched = build_schedule(GPT_18B, cluster, s)
        gathered = sum(n * k for n, k in sched.bucket_counts)  # the root's forward gather included
        regathered = gathered - sched.root  # the blocks again in backward
        with_copies = predict(GPT_18B, cluster, s, calibration=fsdp, global_batch=cluster.world_size * 2)
        without = predict(GPT_18B, cluster, s, calibration=none, global_batch=cluster.world_size * 2)
        extra = with_copies["breakdown"]["memory_bound_s"] - without["breakdown"]["memory_bound_s"]
        per_micro_step = 4 * gathered + 4 * regathered + (2 + reduce_bytes) * gathered
        assert extra == pytest.approx(2 * per_micro_step / fsdp.memory_bytes_per_s)  # two micro-steps
        assert with_copies["step_time_s"] > without["step_time_s"]
    ddp = build_strategy("ddp", cluster)  # nothing gathered, no reduce-scatter: its all-reduce reads its buckets
    assert predict(GPT_18B, cluster, ddp, calibration=fsdp)["step_time_s"] == \
        predict(GPT_18B, cluster, ddp, calibration=none)["step_time_s"]


def test_a_gather_per_sub_module_pays_each_ones_latency_on_the_whole_ring():
    """DeepSpeed ZeRO-3 fetches parameters sub-module by sub-module (four all-gathers per GPT block): the same
    bytes as one gather per block, four times the latency. On a flat ring that latency grows with the whole
    group, so the cost of the finer fetch grows with the cluster and shrinks as the messages grow."""
    model = parse_model("gpt-neox-20b")

    def cost_of_modules(nodes: int, tokens_scale: int = 1) -> float:
        cluster = parse_cluster(f"frontier:{nodes}")
        flat = run_by(calibration_for(cluster), "deepspeed")
        s = build_strategy("zero3", cluster, prefetch_buckets=0, micro_batch_size=tokens_scale)
        by_module = predict(model, cluster, s, calibration=flat)
        by_block = predict(model, cluster, s, calibration=dataclasses.replace(flat, gathers="bucket"))
        assert by_module["bytes_per_level"] == by_block["bytes_per_level"]
        assert by_module["breakdown"]["compute_s"] == by_block["breakdown"]["compute_s"]
        return by_module["breakdown"]["comm_s"] - by_block["breakdown"]["comm_s"]

    assert 0 < cost_of_modules(2) < cost_of_modules(16) < cost_of_modules(48)
    with pytest.raises(ValueError, match="gathers='layer'"):
        Calibration(gathers="layer")


def test_deepspeed_gathers_the_root_again_for_the_backward_and_our_engine_does_not():
    """DeepSpeed's ZeRO-3 gathers every parameter twice a step, the embeddings included (counted on DeepSpeed
    0.19.8 in tests/tuner/test_exports.py); zerotune's engine keeps its root unit gathered from forward into
    backward. So a larger vocabulary (a larger root, the blocks unchanged) adds the root's gather once to our
    engine's communication and twice to DeepSpeed's, and the head's backward waits for DeepSpeed's second one."""
    from zerotune.core.volume import QUANT_BLOCK
    from zerotune.costmodel.schedule import build_schedule
    from zerotune.costmodel.timing import costs_for

    cluster = parse_cluster("frontier:8")
    small, large = parse_model("gpt-neox-20b"), dataclasses.replace(parse_model("gpt-neox-20b"), vocab=4 * 50432)
    s = build_strategy("zero3", cluster, prefetch_buckets=0)
    ds = run_by(calibration_for(cluster), "deepspeed")
    ours = dataclasses.replace(ds, gathers="bucket")
    costs = costs_for(cluster, ds, 2, s.quantize_above, QUANT_BLOCK)  # predict's default block

    def root_gathers(model):
        sched = build_schedule(model, cluster, s)
        assert sched.bwd[sched.root] == sched.fwd[sched.root]  # zero3: the backward gathers what forward did
        return costs.time(sched.fwd[sched.root]), sched

    (f_small, sched_small), (f_large, sched_large) = root_gathers(small), root_gathers(large)
    assert sched_small.lengths == sched_large.lengths  # the same blocks
    runners = (("ds", ds), ("ours", ours))
    grown = {name: predict(large, cluster, s, calibration=c)["breakdown"]["comm_s"]
             - predict(small, cluster, s, calibration=c)["breakdown"]["comm_s"] for name, c in runners}
    assert grown["ds"] - grown["ours"] == pytest.approx(f_large - f_small, rel=1e-9)
    assert grown["ours"] > f_large - f_small > 0  # ours: the forward gather and the root's reduction
    step = {name: predict(large, cluster, s, calibration=c)["step_time_s"] for name, c in runners}
    assert step["ds"] > step["ours"]


def test_deepspeed_stages_1_and_2_pay_an_all_reduce_for_each_gradient_bucket():
    """DeepSpeed's ZeRO-1 and ZeRO-2 (0.19.8, the exports' defaults) all-reduce each gradient bucket and keep their
    slice (counted on DeepSpeed in tests/tuner/test_exports.py): the deepspeed runner is charged an all-reduce where
    the schedule reduce-scatters, every reduction of every micro-step, and the bytes booked stay the schedule's.
    ZeRO-3 reduce-scatters in DeepSpeed too: unchanged."""
    from zerotune.core.volume import QUANT_BLOCK
    from zerotune.costmodel.schedule import build_schedule
    from zerotune.costmodel.tally import step_counts
    from zerotune.costmodel.timing import costs_for

    cluster, model = parse_cluster("dgx-h100:4"), parse_model("gpt-13b")
    ds = run_by(calibration_for(cluster), "deepspeed")
    assert ds.grad_reduce == "all_reduce" and run_by(calibration_for(cluster), "fsdp").grad_reduce == "reduce_scatter"
    scattering = dataclasses.replace(ds, grad_reduce="reduce_scatter")
    for preset, accum in (("zero1", 1), ("zero2", 1), ("zero2", 4), ("zero3", 2)):
        s = build_strategy(preset, cluster, micro_batch_size=1)
        batch = cluster.world_size * accum
        got, want = (predict(model, cluster, s, calibration=c, global_batch=batch) for c in (ds, scattering))
        assert got["bytes_per_level"] == want["bytes_per_level"]
        extra = got["breakdown"]["comm_s"] - want["breakdown"]["comm_s"]
        if preset == "zero3":
            assert extra == 0 and got["step_time_s"] == want["step_time_s"]
            continue
        sched, costs = build_schedule(model, cluster, s), costs_for(cluster, ds, 2, s.quantize_above, QUANT_BLOCK)
        more = 0.0
        for c, times in step_counts(sched, accum).items():
            op, levels, numel, bits = c
            if op == "reduce_scatter" and costs.moves(c):
                more += times * (costs.time(("all_reduce", levels, numel, bits)) - costs.time(c))
        assert more > 0 and extra == pytest.approx(more, rel=1e-9), (preset, accum)
        assert got["step_time_s"] > want["step_time_s"]
    with pytest.raises(ValueError, match="grad_reduce='reduce'"):
        Calibration(grad_reduce="reduce")


def test_prefetch_depth_does_not_move_a_strategy_that_gathers_nothing():
    """ZeRO-1/2 keep every parameter on every rank: no gather is issued, so nothing waits behind the gradient
    reductions in the queue, and the prefetch depth cannot change the step."""
    cluster = parse_cluster("frontier:8")
    times = {p: predict(parse_model("gpt-7b"), cluster, build_strategy("zero2", cluster, prefetch_buckets=p,
                                                                       reduce_bucket_mb=50))["step_time_s"]
             for p in (0, 1, 3)}
    assert times[0] == pytest.approx(times[1], rel=1e-12) and times[1] == pytest.approx(times[3], rel=1e-12)


def test_half_bandwidth_message_size_matches_a_measured_curve():
    """An 8xH100 all-reduce reaches half its bus bandwidth near 16-17 MB (Azure ND H100 v5 nccl-tests, NCCL 2.18):
    the model's latency and achievable bandwidth put that point within a factor of 2 of it."""
    cluster = parse_cluster("dgx-h100:1")
    costs = costs_for(cluster, calibration_for(cluster), 2, 1, 2048)
    peak = LINKS["nvlink4-nvswitch"].bandwidth_gbps * LINKS["nvlink4-nvswitch"].efficiency * 1e9

    def busbw(nbytes: int) -> float:
        return 2 * 7 / 8 * nbytes / costs.time(("all_reduce", (1, 1), nbytes // 2, 16))

    sizes = [2**k for k in range(12, 34)]
    half = next(n for n in sizes if busbw(n) >= peak / 2)
    assert 8e6 <= half <= 34e6, half


def test_overlap_slowdown_is_charged_where_collectives_run_beside_compute():
    cluster = parse_cluster("frontier:48")
    model = parse_model("gpt-neox-20b")
    s = build_strategy("zero3", cluster)
    calib = calibration_for(cluster)
    charged = predict(model, cluster, s, calibration=calib)
    free = predict(model, cluster, s, calibration=dataclasses.replace(calib, overlap_slowdown=0.0))
    assert charged["breakdown"]["overlap_slowdown_s"] > 0 and free["breakdown"]["overlap_slowdown_s"] == 0
    assert charged["step_time_s"] > free["step_time_s"]
    # with nothing to overlap (no prefetch, FIFO queue), no slow-down is charged in the forward pass
    serial = predict(model, cluster, s.replace(prefetch_buckets=0), calibration=calib)
    assert serial["breakdown"]["overlap_slowdown_s"] < charged["breakdown"]["overlap_slowdown_s"]


def test_exposed_first_gather_and_last_reduction_are_charged_even_when_compute_dominates():
    """Plenty of compute per bucket still leaves the root's gather, the first backward gather and the last reduction
    exposed: the step is longer than compute alone by at least their time."""
    cluster = parse_cluster("dgx-h100:2")
    model = parse_model("gpt-7b")
    s = build_strategy("zero3", cluster, micro_batch_size=8)
    calib = Calibration(compute_efficiency=0.47, collective_launch_us=8.4)
    p = predict(model, cluster, s, calibration=calib)
    assert p["step_time_s"] > p["breakdown"]["compute_s"] + p["breakdown"]["boundary_s"]
    assert p["breakdown"]["exposed_comm_s"] > 0


def test_the_error_band_is_read_at_the_predictions_scale():
    """Items measured within a doubling of the prediction's GPUs make its band; too few, and the window widens."""
    items = [[16, 0.05]] * 8 + [[1024, 5.0]] * 8 + [[128, 0.2]] * 3
    small, span = at_scale(items, 16)
    assert (small["count"], small["p90"], span) == (8, 0.05, (16, 16))  # the 1,024-GPU collapse is not its error
    large, span = at_scale(items, 1024)
    assert (large["count"], large["median"], span) == (8, 5.0, (1024, 1024))
    mid, span = at_scale(items, 128)  # 3 near: widened a doubling each way at a time, to 16..1024: every item
    assert mid["count"] == len(items) and span == (16, 1024)
    assert at_scale(items, None)[1] is None and at_scale([], 8)[0]["count"] == 0


def test_a_band_is_no_narrower_than_the_models_error_on_its_device():
    """A prediction reads the items of its own device within its scale's range and keeps the wider band: on
    Frontier the seed paper's comparisons (the model misses them by up to half), not the V100 comparisons that
    dominate 384 GPUs. A device with too few items there, or none, keeps the scale's band."""
    items = [[384, 0.05, "V100"]] * 10 + [[384, -0.4, "MI250X"], [384, 0.06, "MI250X"], [384, -0.53, "MI250X"]]
    assert on_device(items, "MI250X", (256, 512)) == {"count": 3, "median": 0.4, "p90": 0.53}
    assert on_device(items, "MI250X", (16, 128)) is None and on_device(items[:12], "MI250X", None) is None
    assert on_device(items, None, None) is None and on_device(items, "H100", None) is None
    frontier = parse_cluster("frontier:48")
    band = predict(GPT_18B, frontier, build_strategy("zero3", frontier))["error_band"]
    stored = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())["items"]["comparisons"]
    near, span = at_scale(stored, 384)
    own = on_device(stored, frontier.device, span)
    assert own is not None and own["median"] > 2 * near["median"]  # the seed paper's runs, missed by 7-45%
    assert band["comparison_median"] == own["median"] and band["device"]["comparisons"] == own
    assert f"on {frontier.device}: {own['count']} comparisons" in band["source"]
    h100 = parse_cluster("dgx-h100:16")  # the Playbook's ZeRO-1 over ZeRO-0 on 64-256 H100s: the device's own
    band = predict(GPT_18B, h100, build_strategy("zero3", h100))["error_band"]
    near, span = at_scale(stored, h100.world_size)
    own = on_device(stored, h100.device, span)
    assert own is not None and band["device"]["comparisons"] == own
    assert band["comparison_median"] == max(own["median"], near["median"])  # the wider of the two
    rows = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())["items"]["rows"]
    own = on_device(rows, h100.device, at_scale(rows, h100.world_size)[1])  # the Playbook's 64-256 GPU figures
    assert own is not None and band["device"]["rows"] == own and band["row_median"] >= own["median"]


def test_a_band_says_where_the_vendor_library_ran_slower_than_the_ring_model():
    """Flat rings (the DeepSpeed and FSDP runners) at a scale whose vendor collectives were measured more than 15% off
    the model's ring, slower or faster, carry that ratio in their band (bench/collectives_at_scale.py, stored in
    model_error.json); zerotune's per-level rings and scales where the library held to the ring do not."""
    stored = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())["collectives"]
    ratios = {lib: dict(map(tuple, scales)) for lib, scales in stored["measured_over_predicted"].items()}

    def band(cluster_name: str, runner: str) -> dict:
        cluster = parse_cluster(cluster_name)
        calib = run_by(calibration_for(cluster), runner)
        strategy = build_strategy("zero3", cluster)
        return predict(parse_model("gpt-7b"), cluster, strategy, calibration=calib)["error_band"]

    frontier = band("frontier:48", "deepspeed")["collectives"]  # 384 GCDs: the last measured scale below is 256
    assert (frontier["library"], frontier["gpus"]) == ("RCCL", 256)
    assert frontier["measured_over_predicted"] == ratios["rccl"][256] > 2
    assert "collectives" not in band("frontier:48", "zerotune")  # per-level rings: not what was measured
    small = band("frontier:4", "deepspeed")["collectives"]  # 32 GCDs: RCCL ran faster than the ring model
    assert (small["gpus"], small["measured_over_predicted"]) == (32, ratios["rccl"][32]) and ratios["rccl"][32] < 0.85
    assert abs(ratios["nccl"][32] - 1) <= 0.15 and "collectives" not in band("dgx-h100:4", "fsdp")
    big = band("dgx-h100:128", "fsdp")["collectives"]
    assert (big["library"], big["gpus"], big["measured_over_predicted"]) == ("NCCL", 1024, ratios["nccl"][1024])


def test_a_band_states_the_models_lean_on_checkpointed_runs(monkeypatch):
    """Within each table that measured runs with and without activation checkpointing, the model's checkpointed
    figures sit below its uncheckpointed ones (it charges a recomputed forward more than those runs paid): the lean
    is the median of the tables' ratios of the two sides' median errors, tables with one side only left out. Every
    preset prediction's band states it and the tables it came from; nothing is corrected by it."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    rows = [{"table": "a", "checkpointing": "full", "error": e} for e in (-0.10, -0.12, -0.2)] + \
        [{"table": "a", "checkpointing": "none", "error": e} for e in (0.0, 0.02)] + \
        [{"table": "a", "checkpointing": "selective", "error": 0.5}] + \
        [{"table": "b", "checkpointing": "full", "error": -0.5}, {"table": "b", "checkpointing": "selective",
                                                                 "error": -0.5}] + \
        [{"table": "c", "checkpointing": "full", "error": 0.1}, {"table": "c", "checkpointing": "none", "error": 0.1}]
    lean = published.checkpointing_lean(rows)
    # b measured one side only (a selectively checkpointed run is neither side), and a's selective row is not counted
    assert [t["table"] for t in lean["tables"]] == ["a", "c"]
    assert lean["tables"][0]["checkpointed"] == [3, -0.12] and lean["tables"][0]["uncheckpointed"] == [2, 0.01]
    assert lean["tables"][0]["ratio"] == round(0.88 / 1.01 - 1, 4) and lean["tables"][1]["ratio"] == 0
    assert lean["lean"] == round((0.88 / 1.01 - 1) / 2, 4) and published.checkpointing_lean([])["lean"] is None
    stored = json.loads((ROOT / "zerotune" / "costmodel" / "model_error.json").read_text())["checkpointing"]
    assert len(stored["tables"]) >= 5 and all(t["checkpointed"][0] and t["uncheckpointed"][0] for t in stored["tables"])
    assert stored["lean"] == round(statistics.median(t["ratio"] for t in stored["tables"]), 4)
    assert abs(stored["lean"]) < 0.2  # a lean past the band's own scale would be a defect to fix, not to state
    cluster = parse_cluster("dgx-a100:8")
    for ckpt in (False, True):  # the band is the model's, whichever side the prediction is on
        band = predict(parse_model("gpt-7b"), cluster, build_strategy("zero3", cluster).replace(
            activation_checkpointing=ckpt))["error_band"]["checkpointing"]
        assert band["lean"] == stored["lean"] and all(t["table"] in band["source"] for t in stored["tables"])


def test_the_bench_states_which_published_runs_the_memory_model_puts_over_capacity(monkeypatch):
    """Every published run fit its GPUs, so a row predicted over capacity is the memory model's error, and the bench
    says how many there are. llm-foundry's MPT computes its loss with flash-attn's fused cross-entropy (the table's
    ``loss = "fused"``): charged so, every one of its runs fits, where torch's loss on fp32 logits put 14 of them
    up to 13% over (the 350m at micro-batch 18 at 1.12-1.13 of 40 GB)."""
    out = subprocess.run([sys.executable, "bench/published.py", "--table", "llm_foundry"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = subprocess.run([sys.executable, "bench/published.py", "--table", "llm_foundry", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    rows = json.loads(data.stdout)["rows"]
    assert all(r["feasible"] == (r["peak_over_memory"] <= 1) for r in rows)
    assert all(r["feasible"] for r in rows), [r for r in rows if not r["feasible"]]
    assert f"the model puts each of the {len(rows)} scored rows within its memory" in out.stdout
    assert max(r["peak_over_memory"] for r in rows) > 0.85  # the largest micro-batches come near the capacity
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    table = published.Table(ROOT / "bench" / "published" / "llm_foundry.toml")
    row = "a100-40g-x16/mpt-350m/18/fsdp"
    assert table.loss == "fused" and table.predict(row)["feasible"]
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
        assert band["source"].endswith(f"({', '.join(sorted(read))})") or f"({', '.join(sorted(read))}); on " in \
            band["source"], (name, band["source"])
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

def test_presets_built_on_first_use_are_the_same_for_threads_that_ask_at_once():
    """The presets are built on first use (their re-base predicts its source run), once: threads that ask
    while one builds them wait and get that build's calibrations, all of them, the very same objects; and
    whether a calibration is a preset's (``built``) does not start a build."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from zerotune.costmodel import profiles

    source_run_efficiency.cache_clear()  # a build that takes its time: the source runs solved again
    fresh, start = profiles._Presets(), threading.Barrier(6)
    assert fresh.built() == ()  # asked before any build: none, and still none built
    assert fresh._cache is None

    def ask(_: int) -> tuple[int, Calibration, bool]:
        start.wait(timeout=30)
        return len(fresh), fresh["dgx-a100"], "dgx-h100" in fresh

    with ThreadPoolExecutor(6) as pool:
        seen = list(pool.map(ask, range(6), timeout=60))
    assert all(s == (len(PROFILES), profiles.PRESET_CALIBRATIONS["dgx-a100"], True) for s in seen), seen
    assert len({id(calib) for _, calib, _ in seen}) == 1  # one build
    assert fresh.built() == tuple(fresh.values())


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
