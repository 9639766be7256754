"""A collective's time against NCCL's and RCCL's own tuning models: latency and bandwidth, flat and per-level
rings, chains, trees, the host's overhead, and how each runner issues its gathers and reductions."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tests.costmodel.common import GPT_18B
from zerotune.core.spec import ClusterSpec, ModelSpec
from zerotune.costmodel import Calibration, calibration_for, predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.hardware import (
    DEVICES,
)
from zerotune.costmodel.links import (
    HOSTS,
    LINKS,
    NCCL_RING_BASE_US,
    NCCL_RING_PROTOCOLS,
    NCCL_TREE_PROTOCOLS,
    NET_HOP_US,
    NVLINK_HOP_US,
    RCCL_RING_PROTOCOLS,
)
from zerotune.costmodel.profiles import profile_calibration, profile_cluster
from zerotune.costmodel.rates import NOMINAL_LINK_EFFICIENCY, run_by
from zerotune.costmodel.timing import costs_for


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
    and xGMI / network hop latencies, LL128 off, Simple (17 us base, 3.6 / 19.8 us hops) for large ones: the α-β
    ring of a fabric with nothing measured (the law measured for RCCL over Slingshot: test_collectives_at_scale)."""
    cluster = parse_cluster("frontier:4")
    calib = dataclasses.replace(calibration_for(cluster), fabric="")
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
    the message size at which the model's bus bandwidth crosses half its peak, found by bisection, is within
    50% of that measurement."""
    cluster = parse_cluster("dgx-h100:1")
    costs = costs_for(cluster, calibration_for(cluster), 2, 1, 2048)
    peak = LINKS["nvlink4-nvswitch"].bandwidth_gbps * LINKS["nvlink4-nvswitch"].efficiency * 1e9

    def busbw(nbytes: float) -> float:  # nccl-tests' all-reduce bus bandwidth: 2 (R - 1) / R bytes per byte
        return 2 * 7 / 8 * nbytes / costs.time(("all_reduce", (1, 1), round(nbytes / 2), 16))

    small, large = 4e3, 4e9
    assert busbw(small) < peak / 2 < busbw(large)
    while large - small > 1e3:  # bisect on the byte count, to a kilobyte
        middle = (small + large) / 2
        small, large = (middle, large) if busbw(middle) < peak / 2 else (small, middle)
    assert 0.5 * 16e6 <= large <= 1.5 * 17e6, large
