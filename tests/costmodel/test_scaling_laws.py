"""The step time against the scaling laws published measurements show: ZeRO++'s gain as bandwidth falls and
tokens grow, ZeRO-3's weak scaling, fp32 reductions, overlap and what stays exposed."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

from tests.costmodel.common import GPT_18B
from zerotune.costmodel import Calibration, calibration_for, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.profiles import profile_calibration, profile_cluster


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
    assert all(a < b for a, b in pairwise(gains)) and gains[0] > 1.0, gains  # each halving gains more
    assert gains[-1] > 1.8, gains  # communication-bound at 100 Gb/s: most of ZeRO-3's step is its cross-node bytes


def test_zeropp_gain_shrinks_as_tokens_per_gpu_grow():
    """ZeRO++ blog Figs. 6 and 7: 1.56x at 1K tokens per GPU, 1.41x at 2K (400 Gb/s); 2.21x / 1.77x (100 Gb/s)."""
    for links in (1, 4):
        gains = [zeropp_gain(*dgx2(links), micro_batch=mbs) for mbs in (1, 2, 4, 8)]
        assert all(a > b for a, b in pairwise(gains)) and gains[-1] >= 1.0, (links, gains)


def test_zero3_weak_scaling_falls_below_one_at_scale():
    """Cross-node bytes appear from 2 nodes on and ring latency grows with the node count: tokens/s per rank falls."""
    model = parse_model("gpt-neox-20b")
    per_rank = []
    for nodes in (1, 2, 8, 48, 256):
        cluster = parse_cluster(f"frontier:{nodes}")
        p = predict(model, cluster, build_strategy("zero3", cluster))
        per_rank.append(p["tokens_per_s"] / cluster.world_size)
    scaling = [x / per_rank[0] for x in per_rank]
    assert all(a > b for a, b in pairwise(scaling)), scaling  # each step out adds bytes or ring hops
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
