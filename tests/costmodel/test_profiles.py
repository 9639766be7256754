"""The calibration each cluster is predicted with: a preset's profile of its device, links and host, a custom
cluster's device, nominal for the rest; the presets built once on first use."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.support import ROOT
from zerotune.costmodel import Calibration, calibration_for, predict
from zerotune.costmodel.attention import attention_efficiency
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.error import error_band
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
    STREAM_FRACTION,
    device_of,
    gemm_efficiency,
    peak_tflops_of,
)
from zerotune.costmodel.links import (
    HOSTS,
    LINKS,
    NCCL_RING_BASE_US,
    RCCL_RING_BASE_US,
)
from zerotune.costmodel.profiles import profile_calibration, source_run_efficiency
from zerotune.costmodel.rates import NOMINAL_LINK_EFFICIENCY


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
    rates = ("compute_efficiency", "memory_bytes_per_s", "quant_elems_per_s", "optimizer_elems_per_s",
             "gemm_curve")  # its own GEMM sweep
    assert b.gemm_curve != a.gemm_curve and b.gemm_curve[-1] == a.gemm_curve[-1] == (16384, 1.0)
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
