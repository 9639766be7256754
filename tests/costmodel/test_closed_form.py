"""Closed-form facts of the cost model: ZeRO's cross-node volumes and memory, what a DeepSpeed run gathers and
holds, what a fused loss and an unfused attention move, infeasibility, and which way overlap and bandwidth go."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from tests.support import ROOT
from zerotune.costmodel import (
    Calibration,
    build_schedule,
    calibration_for,
    cross_node_bytes,
    predict,
    state_memory,
)
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model

NEOX = parse_model("gpt-neox-20b")


FRONTIER48 = parse_cluster("frontier:48")


def test_the_final_backward_times_the_outer_reduction_bucket_by_bucket():
    """The engine reduces each bucket's grad shard beyond grad_span on its own (``_reduce_outer``), so the schedule
    times a reduce group's outer reduction as its members' collectives (each one's first two boundary
    collectives): a group of k buckets pays k launches and hops, and every bucket is reduced once."""
    cluster, model = parse_cluster("frontier:48"), parse_model("gpt-7b")
    multi = False
    for preset in ("3level-a", "mics", "zero2", "zero3"):
        s = build_strategy({"preset": preset, "reduce_bucket_mb": 2000}, cluster)
        sched = build_schedule(model, cluster, s)
        members: Counter[int] = Counter()
        for g, k in sched.group_counts:
            assert sched.outer[g] == tuple(c for n in g for c in sched.boundary[n][:2]), preset
            assert sched.reduce[g][0][2] == sum(g)  # the in-group reduce-scatter is one buffer
            for n in g:
                members[n] += k
            multi |= len(g) > 1
        assert members == Counter(dict(sched.bucket_counts)), preset
    assert multi, "no reduce group of several buckets was exercised"


def test_zero3_vs_zeropp_cross_node_volume_is_3m_vs_075m():
    z3 = predict(NEOX, FRONTIER48, build_strategy("zero3", FRONTIER48))
    zpp = predict(NEOX, FRONTIER48, build_strategy("zeropp", FRONTIER48))
    n = FRONTIER48.levels[-1].size
    m = 2 * NEOX.num_params()  # M: model bytes in 16-bit
    # a hierarchical collective sends (n - 1)/n of 1/8 of M per rank across nodes (8 GCDs share a node's NICs)
    per_m = (n - 1) / n * m / 8
    assert cross_node_bytes(z3, FRONTIER48) == pytest.approx(3 * per_m, rel=0.02)  # root gathered once: -1.5%
    ratio = cross_node_bytes(zpp, FRONTIER48) / cross_node_bytes(z3, FRONTIER48)
    assert 0.25 <= ratio < 0.26, ratio  # + fp32 scales per 2048-element block


def test_zero3_memory_is_16_psi_over_n_and_hpz_adds_2_psi_over_g():
    s3 = build_strategy("zero3", FRONTIER48)
    mem = state_memory(NEOX, FRONTIER48, s3, elem_bytes=2)
    psi, n = NEOX.num_params(), FRONTIER48.world_size
    assert mem["params"] + mem["grads"] + mem["optim_states"] == pytest.approx(16 * psi / n, rel=1e-4)
    for hpz_span, g in [(1, 2), (2, 8)]:
        s = s3.replace(secondary_span=hpz_span)
        extra = state_memory(NEOX, FRONTIER48, s, elem_bytes=2)["secondary_params"]
        blocks_psi = psi - (NEOX.vocab + NEOX.seq_len + 2) * NEOX.hidden  # the root keeps no secondary
        assert extra == pytest.approx(2 * blocks_psi / g, rel=1e-4)


def test_a_deepspeed_run_books_what_deepspeed_holds_not_the_engines_buckets(monkeypatch):
    """A run by DeepSpeed's ZeRO-3 holds its root and the sub-modules its coordinator has gathered (the peak its
    rules give, measured on DeepSpeed itself in tests/tuner/test_exports.py), and stages gradients in and beside its
    reduce bucket, where zerotune's engine holds whole gathered blocks and two reduce groups of them. Under the
    export's settings without a prefetch window that is the root and one weight, or with activation checkpointing
    the whole block, kept from its recompute into its backward; a Llama's untied head is held beside its embedding;
    with a window, what it prefetched besides, within the export's live cap. Under DeepSpeed's defaults a small
    model stays gathered whole. The ZeRO++ blog's 138B runs on 32 GB V100s fit, as they ran (the engine's buckets
    put them 9-17% over)."""
    from zerotune.core.plan import parameter_numels
    from zerotune.costmodel.coordinator import (
        DEEPSPEED_DEFAULTS,
        bucket_elements,
        gathered_peak,
        staged_gradients,
    )
    from zerotune.costmodel.rates import run_by

    cluster, e = parse_cluster("dgx-h100:2"), 2
    ds = run_by(calibration_for(cluster), "deepspeed")
    for name in ("gpt-1.3b", "llama3-8b"):
        model = parse_model(name)
        h, f, k, embedding = model.hidden, model.ffn, model.kv, model.vocab * model.hidden
        weights = ((h * h, h * k, h * k, h * h, h * f, f * h, h * f) if model.llama
                   else (h * (h + 2 * k), h * h, h * f, f * h))
        for checkpointing in (False, True):
            s = build_strategy("zero3", cluster, activation_checkpointing=checkpointing, prefetch_buckets=0)
            ours, theirs = (predict(model, cluster, s, calibration=c)["memory_bytes"]
                            for c in (calibration_for(cluster), ds))
            beside = sum(weights) if checkpointing else max(weights)
            expected = max(2 * embedding, embedding + beside) if model.untied_head_numel else embedding + beside
            staged = staged_gradients(model, bucket_elements(s.reduce_bucket_mb))
            assert theirs["comm_buffers"] == expected * e + staged * e, (name, checkpointing)
            assert theirs["peak"] - theirs["comm_buffers"] == ours["peak"] - ours["comm_buffers"]
            assert theirs["comm_buffers"] < ours["comm_buffers"]
            # with a prefetch window the export's live cap leaves it room beside the root and the running
            # sub-module: DeepSpeed holds what it prefetched too, at most the cap and the one parameter it may
            # launch past it
            window = dataclasses.replace(s, prefetch_buckets=2)
            prefetching = predict(model, cluster, window, calibration=ds)["memory_bytes"]["comm_buffers"]
            cap = max(2 * embedding, embedding + max(weights) + 2 * bucket_elements(s.allgather_bucket_mb))
            if not checkpointing:
                assert expected * e < prefetching - staged * e <= (cap + max(weights)) * e, name
    tiny = parse_model("gpt-mini")
    assert gathered_peak(tiny, DEEPSPEED_DEFAULTS, False) == sum(
        n for n in parameter_numels(tiny) if n >= DEEPSPEED_DEFAULTS.persistence)

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import published

    blog = published.Table(ROOT / "bench" / "published" / "zeropp_blog.toml")
    for row in ("dgx2-ib1/gpt-138b/4/zeropp", "dgx2-ib8/gpt-138b/4/zeropp"):
        # the peak alone fits the device: what DeepSpeed holds is no more than the published run had room for (the
        # runtime's reserve beside it is another mechanism, which bench/published.py's memory section reports)
        p = blog.predict(row)
        assert p["headroom_bytes"] + p["memory_reserve"]["total_bytes"] >= 0, p["memory_bytes"]


def test_a_deepspeed_run_is_charged_the_gathers_its_coordinator_makes():
    """A run by DeepSpeed's ZeRO-3 is timed with each sub-module gathered as often as its coordinator gathers it
    (``deepspeed.simulate``; the counts matched DeepSpeed 0.19.8 in tests/tuner/test_exports.py). Checkpointed
    under DeepSpeed's defaults, a block's recompute releases the parameters whose backward use lies beyond
    ``stage3_max_reuse_distance`` (1e9 elements) and its backward gathers them again: on a block of hidden 10,240
    its qkv and proj (the recompute's proj, fc and out and the backward's fc are 1.05e9 elements), on one of 6,144
    nothing. The export's reuse distance (two blocks) keeps them. The extra gathers are the step's only change."""
    from zerotune.core.spec import ModelSpec
    from zerotune.costmodel.coordinator import DEEPSPEED_DEFAULTS, simulate
    from zerotune.costmodel.rates import run_by

    cluster = parse_cluster("dgx-h100:2")
    export = run_by(calibration_for(cluster), "deepspeed")
    defaults = dataclasses.replace(export, stage3_settings="defaults")
    s = build_strategy("zero3", cluster, activation_checkpointing=True)
    comm = {}
    for hidden in (6144, 10240):
        model = ModelSpec(f"gpt-h{hidden}", layers=40, hidden=hidden, heads=hidden // 128, vocab=50257, seq_len=512)
        step = simulate(model, DEEPSPEED_DEFAULTS, True)
        regathered = (2.0, 2.0, 1.0, 1.0) if hidden == 10240 else (1.0,) * 4
        # less the last blocks' parameters, which the prefetch kept from forward into backward
        assert step.backward == pytest.approx(regathered, abs=0.06), step
        ours, theirs = (predict(model, cluster, s, calibration=c) for c in (export, defaults))
        assert theirs["breakdown"]["compute_s"] == ours["breakdown"]["compute_s"]
        comm[hidden] = theirs["breakdown"]["comm_s"] / ours["breakdown"]["comm_s"]
    # gathering a third of every block a third time in backward: about a ninth more collective seconds
    assert comm[6144] == pytest.approx(1.0, abs=0.03) and 1.08 < comm[10240] < 1.2, comm


def test_a_fused_loss_moves_and_keeps_16_bit_logits_only():
    """A run whose loss is one fused kernel (``Calibration.loss_kernel = "fused"``: flash-attn's xentropy) moves the
    logits twice forward (its two row passes) and reads them and writes their gradient backward, 8 bytes a vocabulary
    entry a token in bf16 where torch's loss on fp32 logits moves 36; it keeps the bf16 logits where torch's keeps
    the fp32 log-softmax, and its backward allocates only their bf16 gradient. Everything but the loss is as it was."""
    from zerotune.costmodel.memory import activation_memory, head_backward_transient
    from zerotune.costmodel.traffic import loss_bytes, traffic

    model, cluster = parse_model("gpt-125m"), parse_cluster("dgx-h100:1")
    v, t = model.vocab, 4 * model.seq_len
    assert loss_bytes(v, 2, "fused") == (2 * v * 2 + 16, 2 * v * 2 + 16)
    assert sum(loss_bytes(v, 2)) - 20 == 36 * v and sum(loss_bytes(v, 4)) - 20 == 24 * v
    torch_t, fused_t = traffic(model, 2), traffic(model, 2, "fused")
    assert (torch_t.block_fwd, torch_t.block_bwd) == (fused_t.block_fwd, fused_t.block_bwd)
    assert torch_t.root_fwd - fused_t.root_fwd == loss_bytes(v, 2)[0] - loss_bytes(v, 2, "fused")[0]
    s = build_strategy("zero3", cluster, micro_batch_size=4)
    assert activation_memory(model, s, 2) - activation_memory(model, s, 2, "fused") == t * v * (4 - 2) + 4 - 8 * t
    assert head_backward_transient(model, s, 2, "fused") == t * v * 2 == head_backward_transient(model, s, 2) // 3
    base = calibration_for(cluster)
    torch_p, fused_p = (predict(model, cluster, s, calibration=dataclasses.replace(base, loss_kernel=k))
                        for k in ("torch", "fused"))
    assert fused_p["step_time_s"] < torch_p["step_time_s"]
    assert fused_p["memory_bytes"]["peak"] < torch_p["memory_bytes"]["peak"]
    with pytest.raises(ValueError, match="loss_kernel='liger': must be one of"):
        dataclasses.replace(base, loss_kernel="liger")


def test_an_unfused_attention_pays_its_scores_passes_in_memory_bound_bytes():
    """An eager unfused attention (minGPT's, Hugging Face GPT-2's: ``attention = "eager"``) writes every head's T x T
    scores to HBM and runs its scale, mask and softmax over them: 6 element passes a score forward, 7 backward, at
    the memory-bound rate; Megatron's fused softmax (``fused-softmax``) 2 and 3; a flash kernel (``flash2``, ``sdpa``)
    and the plain ``matmul`` charge none. On a 175B at 2,048 tokens the eager passes are several times the rest of a
    block's memory-bound bytes."""
    from zerotune.core.spec import ModelSpec
    from zerotune.costmodel.attention import SCORE_PASSES, with_attention
    from zerotune.costmodel.profiles import profile_calibration
    from zerotune.costmodel.traffic import traffic

    model = ModelSpec("gpt-175b", layers=96, hidden=12288, heads=96, vocab=50000, seq_len=2048)
    plain, eager = traffic(model, 2), traffic(model, 2, "torch", SCORE_PASSES["eager"])
    per_pass = model.heads * model.seq_len * 2
    assert (eager.block_fwd - plain.block_fwd, eager.block_bwd - plain.block_bwd) == (6 * per_pass, 7 * per_pass)
    assert (eager.root_fwd, eager.root_bwd) == (plain.root_fwd, plain.root_bwd)
    assert eager.block_fwd > 5 * plain.block_fwd
    calib = profile_calibration("a100", "A100", ("nvlink3-nvswitch", "ib-hdr-200"), "pytorch", "flat", "backward")
    assert calib.score_passes == (0, 0)
    for kernel, passes in (("eager", (6, 7)), ("fused-softmax", (2, 3)), ("matmul", (0, 0)), ("flash2", (0, 0))):
        assert with_attention(calib, kernel, "A100").score_passes == passes
    # a Megatron-class stack runs its fused softmax where a run names no kernel, and its figure's re-base takes the
    # softmax's passes out of the source run (DeepSpeed's BERT-Large on a V100: 16 heads over 512 tokens, a large
    # share of its memory-bound bytes), so the V100's matmuls are faster than they are without them
    from zerotune.costmodel.hardware import BERT_LARGE_512, DEVICES, STREAM_FRACTION, gemm_efficiency

    megatron = profile_calibration("v100", "V100", ("nvlink2-nvswitch",), "megatron", "flat", "backward")
    assert megatron.score_passes == (2, 3)
    v100 = DEVICES["V100"]
    rates = (v100.megatron_efficiency, BERT_LARGE_512, v100.peak_tflops, STREAM_FRACTION * v100.hbm_gbps * 1e9)
    assert gemm_efficiency(*rates, 0.0, (2, 3)) > gemm_efficiency(*rates) > v100.megatron_efficiency
    cluster = parse_cluster("dgx-a100:16")
    s = build_strategy("zero3", cluster, activation_checkpointing=True)
    fused, unfused = (predict(model, cluster, s, calibration=with_attention(calibration_for(cluster), k, "A100"))
                      for k in ("matmul", "eager"))
    assert unfused["breakdown"]["memory_bound_s"] > 2 * fused["breakdown"]["memory_bound_s"]
    assert unfused["step_time_s"] > fused["step_time_s"]
    assert Calibration.from_dict(with_attention(calib, "eager", "A100").to_dict()).score_passes == (6, 7)


def test_infeasible_strategy_names_the_overflowing_category():
    one_node = parse_cluster("frontier:1")
    p = predict(NEOX, one_node, build_strategy("zero1", one_node))
    assert not p["feasible"] and p["headroom_bytes"] < 0
    assert p["overflow"]["category"] in {"params", "grads"}  # 2Ψ each, unsharded under ZeRO-1
    assert "GiB of 64 GiB" in p["overflow"]["reason"]
    two_nodes = parse_cluster("frontier:2")
    assert predict(NEOX, two_nodes, build_strategy("zero3", two_nodes))["feasible"]


def test_more_overlap_and_bandwidth_never_slow_a_step_down():
    """A step that waits on its gathers (ZeRO-3 of a 20B on 48 Frontier nodes without prefetch: every gather is
    exposed) is strictly shorter when it gathers a bucket ahead, by no more than the time it waited; and strictly
    shorter on faster links, prefetching or not."""
    s = build_strategy("zero3", FRONTIER48, prefetch_buckets=0)
    serial = predict(NEOX, FRONTIER48, s)
    exposed = serial["breakdown"]["exposed_comm_s"]
    assert exposed > 0
    ahead = predict(NEOX, FRONTIER48, s.replace(prefetch_buckets=1))
    assert 0 < serial["step_time_s"] - ahead["step_time_s"] <= exposed
    assert ahead["breakdown"]["exposed_comm_s"] < exposed
    calib = calibration_for(FRONTIER48)
    assert min(calib.bandwidth_efficiency) < 1.0
    fast_net = dataclasses.replace(calib, bandwidth_efficiency=(1.0,) * FRONTIER48.num_levels)
    for strategy, step in ((s, serial), (s.replace(prefetch_buckets=1), ahead)):
        assert predict(NEOX, FRONTIER48, strategy, calibration=fast_net)["step_time_s"] < step["step_time_s"]
