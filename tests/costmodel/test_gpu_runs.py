"""The cost model against kept runs of the engine on one H100 and one H200: the allocator's peak, the kernel
rates, fp32 reductions, the host floor of each runner and the memory passes a GPU profile shows."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from tests.costmodel.common import BENCH_DATA
from zerotune.core.spec import Strategy
from zerotune.costmodel import (
    Calibration,
    calibration_for,
    predict,
)
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model

GPU_RUNS = sorted(p for d in ("h200-1gpu", "h100-1gpu", "h100-1gpu-fused", "h100-kernels")
                  for p in (BENCH_DATA / d).rglob("train-*mbs*.json"))


def preset_profile_of(device_name: str) -> tuple[Calibration, str]:
    """The preset profile of the device ``device_name`` names (as torch names it: ``hardware.device_key_of``)
    and that device's key in ``DEVICES``."""
    from zerotune.costmodel.hardware import device_key_of
    from zerotune.costmodel.profiles import PRESET_CALIBRATIONS, PROFILES

    key = device_key_of(device_name)
    base = next(base for base, (k, _) in PROFILES.items() if k == key)
    return PRESET_CALIBRATIONS[base], key


@pytest.mark.parametrize("path", GPU_RUNS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}")
def test_predicted_peak_memory_is_within_5_percent_of_a_gpu_allocators_peak(path):
    """Kept short runs on one H200 and one H100 (bf16, micro-batches of 1-8 sequences of 2,048 tokens;
    the engine's unfused and fused AdamW): the model's peak against ``torch.cuda.max_memory_allocated``,
    which also holds what the accountant does not book (the cross-entropy's backward transient,
    allocator rounding)."""
    from zerotune.core.spec import ClusterSpec, ModelSpec
    from zerotune.costmodel.memory import activation_memory, head_backward_transient

    run = json.loads(path.read_text())
    model, cluster = ModelSpec.from_dict(run["model"]), ClusterSpec.from_dict(run["cluster"])
    s = Strategy.from_dict(run["strategy"])
    p = predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"])
    assert p["memory_bytes"]["activations"] == activation_memory(model, s, 2) + head_backward_transient(model, s, 2)
    measured = run["memory_bytes"]["cuda_max_allocated"]
    assert abs(p["memory_bytes"]["peak"] / measured - 1) <= 0.05, (p["memory_bytes"]["peak"], measured)
    # without the transient the model was 3.2-10.6% under: the term is what brings it within 5%
    without = p["memory_bytes"]["peak"] - head_backward_transient(model, s, 2)
    assert without < measured


def test_the_engines_kept_gpu_sweeps_are_predicted_from_its_measured_kernel_rates():
    """The kept micro-batch sweeps of the engine (gpt-1.3b, zero3, 8 sequences a step, 2-8 per micro-step,
    on one H100 or H200: ``bench/one_gpu.sh``) against its device's profile (``dgx-h100``, ``dgx-h200``), whose
    compute and memory-bound rates are the engine's kernels' own on that part (``H100_ENGINE_EFFICIENCY``,
    ``H100_EAGER_MEMORY_FRACTION`` and the H200's: read off ``bench/kernel_split.py``'s profiles of a bare forward
    and backward on each part, other runs than these, with no optimizer, no sharding and no host in them).
    A step of one micro-step (8 sequences) comes within 8% (7% while the memory-bound kernels were charged at
    the profiles' median fraction, which over-charged their 8-sequence passes by 5%: ``gemm.memory_line`` now
    gives each profiled pass its memory-bound time back within 6%, so what the loop adds shows); with more
    micro-steps the model falls short by
    more (2: 9-12%, 4: 14-18%, median of all 10%, 9.9% before the memory-bound kernels' line): ``zerotune
    train``'s step grows with its micro-steps at the
    same device work (8 -> 4 sequences per micro-step: +11.9 ms on the H100, +9.5 ms on the H200), which the
    model does not charge (it predicts both alike). The engine's own second micro-step costs its kernels'
    time within 3% (the next test), so what is left is outside it: ``zerotune train``'s loop (not profiled)
    and, at 2 sequences per micro-step, the host (a block's kernels take about as long to run as to issue).
    The eager PyTorch figure the profile took before (IBM's FSDP 7B on 96 H100s, 0.37 MFU, re-based on that
    run, a Llama with its fp32 RMSNorms' memory-bound kernels) puts every one of them long, those of one
    micro-step by 18-23%."""
    from zerotune.core.spec import ClusterSpec, ModelSpec
    from zerotune.costmodel.profiles import profile_calibration
    from zerotune.costmodel.rates import run_by

    runs = [r for r in (json.loads(p.read_text()) for p in GPU_RUNS) if r["strategy"]["micro_batch_size"] >= 2]
    assert len(runs) >= 8 and {r["device"] for r in runs} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    errors, before, eager = [], [], {}
    for run in runs:
        model, cluster = ModelSpec.from_dict(run["model"]), ClusterSpec.from_dict(run["cluster"])
        s = Strategy.from_dict(run["strategy"])
        engine, device = preset_profile_of(run["device"])
        if device not in eager:
            eager[device] = run_by(profile_calibration("fsdp", device, ("nvlink4-nvswitch",), stack="pytorch"),
                                   "zerotune")
        for calib, out in ((engine, errors), (eager[device], before)):
            p = predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"], calibration=calib)
            out.append(p["step_time_s"] / run["step_time_s"] - 1)
    accums = [r["grad_accum_steps"] for r in runs]
    assert max(abs(e) for e, a in zip(errors, accums, strict=True) if a == 1) <= 0.08, errors
    assert max(abs(e) for e in errors) <= 0.20 and statistics.median(abs(e) for e in errors) <= 0.11, errors
    # the miss grows with the micro-steps, on each part: a cost per micro-step the model leaves out
    for a_few, more in ((1, 2), (2, 4)):
        assert max(e for e, a in zip(errors, accums, strict=True) if a == more) < \
            min(e for e, a in zip(errors, accums, strict=True) if a == a_few), errors
    assert min(before) > 0, before
    assert min(e for e, a in zip(before, accums, strict=True) if a == 1) > 0.15, before
    # each run's own cluster file (one level of one rank, a device as torch names it, its peak: what
    # bench/one_gpu.sh writes; the H200 runs' file named the H100) is predicted with the rates of the
    # device it names, as that device's preset is, not at the nominal 45% of peak
    for run in runs:
        cluster = ClusterSpec.from_dict(run["cluster"])
        own, named = calibration_for(cluster), preset_profile_of(cluster.device)[0]
        assert own.name.endswith("-device") and own.compute_efficiency == named.compute_efficiency
        assert own.attention_efficiency == named.attention_efficiency > 0  # its SDPA (cuDNN) at its measured rate
        assert own.attention_forward_share == named.attention_forward_share > 0  # and its forward's measured share
        model, s = ModelSpec.from_dict(run["model"]), Strategy.from_dict(run["strategy"])
        assert predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"])["step_time_s"] == \
            pytest.approx(predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"],
                                  calibration=named)["step_time_s"], rel=1e-9)


def test_the_engines_second_micro_step_on_an_h100_costs_what_its_kernel_rates_charge():
    """Our engine alone on one H100 (``bench/trainer_vs_fsdp.py --batch 4 --accum 1`` and ``--accum 2``,
    profiled; ``bench/data/h100-accum``): the second micro-step added 137.1 ms of device time, the model's
    compute per micro-step from the H100's kernel rates is 131.9 ms (within 4%; 132.7 at the kernels' median
    memory fraction; 134.1 with the matmuls and the
    attention at one rate, their median together, where each at its own median is 1.8% short at 4 sequences,
    whose matmuls run below the matmuls' median and attention above its own), and both whole steps are
    predicted within 6.5% (164.1 and 308.4 ms measured; 6% while the memory-bound kernels were charged at the
    profiles' median fraction, 6.3% short at two micro-steps since they are charged on their line,
    ``gemm.memory_line``; the bench reads each micro-step's loss, so the device
    also waits for the host 7 ms more in the second)."""
    from zerotune.core.spec import ClusterSpec

    kept = BENCH_DATA / "h100-accum"
    runs = {a: json.loads((kept / f"tvf-b4x{a}.json").read_text())["1"]["zero3"] for a in (1, 2)}
    cluster_file = kept.parent / "h100-kernels" / "one-gpu.json"
    cluster = ClusterSpec.from_dict(json.loads(cluster_file.read_text()))
    assert {r["device"] for r in runs.values()} == {cluster.device} == {"NVIDIA H100 80GB HBM3"}
    model = parse_model("gpt-1.3b")
    predicted = {}
    for accum, run in runs.items():
        s = dataclasses.replace(Strategy.from_dict(run["strategy"]), micro_batch_size=4)
        p = predict(model, cluster, s, elem_bytes=2, global_batch=4 * accum)
        assert p["calibration"] == "H100-device" and p["grad_accum_steps"] == accum
        assert abs(p["step_time_s"] / (run["step_ms"] / 1e3) - 1) <= 0.065, (accum, p["step_time_s"], run["step_ms"])
        predicted[accum] = p["breakdown"]["compute_s"] / accum
    second = (runs[2]["profile"]["busy_ms"] - runs[1]["profile"]["busy_ms"]) / 1e3
    assert predicted[1] == pytest.approx(predicted[2], rel=1e-9)
    assert abs(predicted[1] / second - 1) <= 0.04, (predicted[1], second)


FP32_REDUCE = BENCH_DATA / "h200-fp32-reduce"


def test_fp32_gradient_reductions_on_a_gpu_cost_what_the_accountant_and_the_model_book():
    """Our engine and FSDP2 on one H200 (gpt-1.3b, 4 sequences, bf16; ``bench/data/h200-fp32-reduce``),
    with gradients reduced in bf16 and in fp32 (``--set grad_bits=32``), run back to back: fp32 gradient
    shards hold 2 more bytes per parameter, which ``torch.cuda.max_memory_allocated`` and the engine's
    accountant both show to the byte, and the model's peak is within 2% of both runs' measured one.
    Nothing is reduced on one rank: the model charges no time for it (the engine's casts measured 2%),
    and both runs, and FSDP2's, are predicted within 5% with the device's own rates, on the cluster
    file that names it. The loss is the same training either way."""
    from zerotune.core.spec import ClusterSpec

    runs = {bits: json.loads((FP32_REDUCE / f"tvf-b4-{bits}.json").read_text())["1"] for bits in ("fp32", "bf16")}
    fp32, bf16 = runs["fp32"]["zero3"], runs["bf16"]["zero3"]
    assert fp32["device"] == bf16["device"] == "NVIDIA H200" and runs["fp32"]["fsdp2"]["reduce_dtype"] == "float32"
    model = parse_model("gpt-1.3b")
    params = model.num_params()
    assert fp32["mem_bytes"] - bf16["mem_bytes"] == fp32["accountant_peak"] - bf16["accountant_peak"] == 2 * params
    cluster = ClusterSpec(name="one-h200", levels=({"name": "node", "size": 1, "bandwidth_gbps": 450.0},),
                          device=fp32["device"], device_memory_gib=141.0, peak_tflops=989.0)
    for bits, run in (("fp32", fp32), ("bf16", bf16)):
        assert Strategy.from_dict(run["strategy"]).grad_bits == (32 if bits == "fp32" else 16)
        s = dataclasses.replace(Strategy.from_dict(run["strategy"]), micro_batch_size=4)  # --batch 4: one micro-step
        p = predict(model, cluster, s, elem_bytes=2, global_batch=4)
        assert p["calibration"] == "H200-device"
        assert abs(p["memory_bytes"]["peak"] / run["mem_bytes"] - 1) <= 0.02, (bits, p["memory_bytes"]["peak"])
        for measured in (run, runs[bits]["fsdp2"]):
            assert abs(p["step_time_s"] / (measured["step_ms"] / 1e3) - 1) <= 0.05, (bits, p["step_time_s"], measured)
    assert abs(fp32["losses"][-1] - bf16["losses"][-1]) < 1e-3


def test_fsdp2s_reduce_scatter_copy_in_runs_near_the_memory_rate_its_copies_are_charged():
    """FSDP2 copies each reduce group's gradients into one reduce-dtype buffer on the compute stream
    (``foreach_reduce_scatter_copy_in``, a ``_chunk_cat``: ``Calibration.copies``), charged as a memory-bound
    pass at the profile's rate (``H200_EAGER_MEMORY_FRACTION`` of HBM). In the kept profile of one FSDP2
    step on an H200 (fp32 reductions, ``bench/data/h200-fp32-reduce/trace``) the 25 ``chunk_cat`` kernels,
    one per reduce group, read every bf16 gradient and wrote it in fp32 (6 bytes per parameter) at 0.43 of
    HBM: within 25% of the 0.55 charged (within 15% of the 0.50 charged while the eager fraction was the profiles'
    median over whole passes; it is now their slope, ``gemm.memory_line``, which the block kernels' fixed cost
    completes and a copy of this size does not: the copies run 22% slower than charged)."""
    import gzip

    from zerotune.costmodel.hardware import DEVICES, H200_EAGER_MEMORY_FRACTION

    with gzip.open(FP32_REDUCE / "trace" / "fsdp2-w1-b4.json.gz", "rt") as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    copy_in = [e for e in kernels if "chunk_cat" in e["name"]]
    assert len(copy_in) == parse_model("gpt-1.3b").layers + 1  # a group per block and the root's
    seconds = sum(e["dur"] for e in copy_in) * 1e-6
    fraction = parse_model("gpt-1.3b").num_params() * (2 + 4) / seconds / (DEVICES["H200"].hbm_gbps * 1e9)
    assert 0.40 < fraction < H200_EAGER_MEMORY_FRACTION and abs(fraction / H200_EAGER_MEMORY_FRACTION - 1) < 0.25


def test_one_sequence_micro_steps_wait_for_the_host_as_every_kept_gpu_sweep_measured():
    """The kept micro-batch sweeps (gpt-1.3b, zero3, 8 sequences a step on one H100 or H200, run by
    ``bench/one_gpu.sh``) all ran one sequence per micro-step 1.3-1.6x slower than two, where the
    device's work alone is the same per sequence: the host issues a block's kernels slower than the
    device runs them. The Hopper profiles' host floor (``RUNNER_HOST_S_PER_LAYER``, read off a
    one-sequence ``trainer_vs_fsdp`` profile, not off these sweeps) puts every sweep's one-sequence step
    within 20% (median 5%, with the engine's measured Hopper rates); without it the model is under on
    every sweep (34-50%, median 40%: at one sequence a step is the host's, not the device's), and calls
    micro-batch 1 as fast as 8."""
    from zerotune.core.spec import ClusterSpec, ModelSpec
    from zerotune.costmodel.rates import RUNNER_HOST_S_PER_LAYER

    ones = [p for p in GPU_RUNS if Strategy.from_dict(json.loads(p.read_text())["strategy"]).micro_batch_size == 1]
    assert len(ones) >= 5
    errors, free_errors = [], []
    for path in ones:
        run = json.loads(path.read_text())
        profile, _ = preset_profile_of(run["device"])
        assert profile.host_s_per_layer == RUNNER_HOST_S_PER_LAYER["zerotune"] > 0
        model, cluster = ModelSpec.from_dict(run["model"]), ClusterSpec.from_dict(run["cluster"])
        s = Strategy.from_dict(run["strategy"])
        p = predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"], calibration=profile)
        errors.append(p["step_time_s"] / run["step_time_s"] - 1)
        assert p["breakdown"]["host_wait_s"] > 0 and p["breakdown"]["host_wait_s"] < p["breakdown"]["compute_s"]
        free = predict(model, cluster, s, elem_bytes=2, global_batch=run["global_batch"],
                       calibration=dataclasses.replace(profile, host_s_per_layer=0.0))
        free_errors.append(free["step_time_s"] / run["step_time_s"] - 1)
        assert free["step_time_s"] < run["step_time_s"], path
        # the model now ranks the sweep's micro-batches as measured: one sequence the slowest. At two the
        # forward (its attention at the kernel's forward share) is about as long as the host's third of the
        # floor: a wait of at most 1% of the step (the sweeps ran two sequences 7-13% slower than four)
        for mbs in (2, 4, 8):
            other = predict(model, cluster, dataclasses.replace(s, micro_batch_size=mbs), elem_bytes=2,
                            global_batch=run["global_batch"], calibration=profile)
            assert other["step_time_s"] < p["step_time_s"] / 1.15
            wait = other["breakdown"]["host_wait_s"]
            assert wait == 0 if mbs > 2 else 0 <= wait <= 0.01 * other["step_time_s"]
            # the same device work per sequence, but for the blocks' memory-bound fixed cost, paid per micro-step
            steps = p["grad_accum_steps"] - other["grad_accum_steps"]
            floors = steps * model.layers * profile.memory_floor_s_per_block
            assert free["step_time_s"] - floors == pytest.approx(other["step_time_s"] - wait, rel=1e-9)
    assert max(abs(e) for e in errors) <= 0.20 and statistics.median(abs(e) for e in errors) <= 0.07, errors
    assert statistics.median(free_errors) < -0.10, free_errors


def test_the_host_floor_is_the_runners_and_leaves_large_blocks_alone():
    """A device profile carries the floor of the runner that runs it (``run_by``); a fitted calibration
    keeps its own (0: its compute efficiency already holds its host). A 20B model's blocks on 48 Frontier
    nodes run far longer on the device than any host floor: no wait."""
    from zerotune.costmodel.profiles import calibration_for
    from zerotune.costmodel.rates import RUNNER_HOST_S_PER_LAYER, run_by

    cluster = parse_cluster("frontier:48")
    profile = calibration_for(cluster)
    for runner, floor in RUNNER_HOST_S_PER_LAYER.items():
        assert run_by(profile, runner).host_s_per_layer == floor
        assert run_by(Calibration(), runner).host_s_per_layer == 0.0
    assert RUNNER_HOST_S_PER_LAYER["fsdp"] > RUNNER_HOST_S_PER_LAYER["zerotune"]
    p = predict(parse_model("gpt-neox-20b"), cluster, build_strategy("zero3", cluster))
    assert p["breakdown"]["host_wait_s"] == 0.0


RUNNER_PEERS = BENCH_DATA / "h200-runner-peers"


PEER_RUNNERS = {"zero3": "zerotune", "fsdp2": "fsdp", "ds3": "deepspeed"}


def test_each_runners_host_floor_against_one_h200_hosts_profiled_steps():
    """bench/data/h200-runner-peers (``bench/runner_peers.sh``: gpt-1.3b on one H200, our engine, FSDP2,
    DeepSpeed ZeRO-3 running zerotune's export and DDP at 1 and 4 sequences, each profiled). DeepSpeed's floor
    is read off its one-sequence step there; ours and FSDP2's were read off an H100's host, and this other host
    puts them within 30%. Then every runner's step at both batches is predicted within 15%: at 4 sequences
    DeepSpeed's step is still the host's (383.5 ms, device busy 160) and ours and FSDP2's the device's; without
    the floor DeepSpeed's is predicted at the device's pace, under half of what it took. DeepSpeed's ZeRO-1 and -2
    are not charged its ZeRO-3's floor."""
    from zerotune.core.spec import ClusterSpec
    from zerotune.costmodel.rates import RUNNER_HOST_S_PER_LAYER, run_by

    model = parse_model("gpt-1.3b")
    cluster = ClusterSpec.from_dict(json.loads((RUNNER_PEERS / "one-gpu.json").read_text()))
    profile = calibration_for(cluster)
    assert profile.name == "H200-device"
    for batch in (1, 4):
        rows = json.loads((RUNNER_PEERS / f"peers-b{batch}.json").read_text())["1"]
        assert {r["device"] for r in rows.values()} == {"NVIDIA H200"} and rows["ds3"]["what"].startswith("DeepSpeed")
        for config, runner in PEER_RUNNERS.items():
            row = rows[config]
            optimizer_ms = row["profile"]["phases"]["phases"]["optimizer"]["busy_ms"]
            host_per_block = (row["step_ms"] - optimizer_ms) / model.layers * 1e-3
            if batch == 1 and runner == "deepspeed":  # its source: the constant is this run's figure
                assert RUNNER_HOST_S_PER_LAYER[runner] == pytest.approx(host_per_block, rel=0.01)
            elif batch == 1:  # another host's reading of the same floor
                assert abs(RUNNER_HOST_S_PER_LAYER[runner] / host_per_block - 1) < 0.30, (runner, host_per_block)
            s = dataclasses.replace(build_strategy("zero3", cluster), micro_batch_size=batch)
            calib = run_by(profile, runner)
            p = predict(model, cluster, s, elem_bytes=2, global_batch=batch, calibration=calib)
            assert abs(p["step_time_s"] * 1e3 / row["step_ms"] - 1) < 0.15, (config, batch, p["step_time_s"])
            host_bound = p["breakdown"]["host_wait_s"] > 0
            assert host_bound == (runner == "deepspeed" or batch == 1), (config, batch)
            if runner == "deepspeed":
                free = predict(model, cluster, s, elem_bytes=2, global_batch=batch,
                               calibration=dataclasses.replace(calib, host_s_per_layer=0.0))
                assert free["step_time_s"] * 1e3 < row["step_ms"] / 2
                assert row["profile"]["device_busy_ms"] < row["step_ms"] / 2  # measured: the host's step
    assert RUNNER_HOST_S_PER_LAYER["deepspeed"] > 3 * RUNNER_HOST_S_PER_LAYER["fsdp"]
    # the floor is DeepSpeed ZeRO-3's (hooks on every module and parameter): its stages that keep the
    # parameters whole were not measured and pay none
    ds = run_by(profile, "deepspeed")
    for preset, bound in (("zero3", True), ("zero2", False), ("zero1", False)):
        s = dataclasses.replace(build_strategy(preset, cluster), micro_batch_size=1)
        p = predict(model, cluster, s, elem_bytes=2, global_batch=1, calibration=ds)
        assert (p["breakdown"]["host_wait_s"] > 0) == bound, preset


def test_zerotune_trains_loop_adds_what_the_model_leaves_out_no_more():
    """``zerotune train`` at 4 sequences per micro-step and 2 micro-steps, on one H200 before and after its loop
    drew the next step's batch while the step ran (bench/data/h200-1gpu, then h200-runner-peers, profiled):
    0.311 s, then 0.290 s, with the same engine. The model (which charges the engine's step, not the loop) was
    8.7% under the first and is within 3.5% of the second (3% while the memory-bound kernels were charged at the
    profiles' median fraction; 3.2% under since they are charged on their line, ``gemm.memory_line``), and the
    device was busy for 98% of the second's step
    (283 ms of kernels in one profiled step)."""
    from zerotune.core.spec import ClusterSpec, ModelSpec

    before = json.loads((BENCH_DATA / "h200-1gpu" / "train-gpt-1.3b-zero3-mbs4.json").read_text())
    after = json.loads((RUNNER_PEERS / "train-gpt-1.3b-zero3-mbs4.json").read_text())
    errors = []
    for run in (before, after):
        assert run["device"] == "NVIDIA H200" and run["grad_accum_steps"] == 2
        model, cluster = ModelSpec.from_dict(run["model"]), ClusterSpec.from_dict(run["cluster"])
        p = predict(model, cluster, Strategy.from_dict(run["strategy"]), elem_bytes=2,
                    global_batch=run["global_batch"], calibration=preset_profile_of(run["device"])[0])
        errors.append(p["step_time_s"] / run["step_time_s"] - 1)
    assert after["step_time_s"] < before["step_time_s"] * 0.95
    assert errors[0] < -0.05 and abs(errors[1]) < 0.035, errors
    profile = after["profile"]
    assert profile["unit"] == "device kernels" and profile["device_busy_ms"] > 0.97 * after["step_time_s"] * 1e3


def test_the_step_is_charged_the_memory_passes_a_gpu_profile_of_the_engine_shows():
    """One profiled step of the engine on one H200 (gpt-1.3b, bf16, torch's fused AdamW, no clipping;
    ``bench/data/h200-1gpu/fused-adamw/b1.json``): its AdamW kernel and the passes around it (the
    gradient's upcast and norm, the gradient shard zeroed, the new weights cast to bf16) against the
    bytes ``hardware`` charges, at ``STREAM_FRACTION`` of the H200's datasheet 4.8 TB/s."""
    from zerotune.costmodel.hardware import (
        ADAMW_BYTES_PER_ELEM,
        STEP_BYTES_PER_ELEM,
        STREAM_FRACTION,
        step_pass_bytes,
    )

    path = BENCH_DATA / "h200-1gpu" / "fused-adamw" / "b1.json"
    run = json.loads(path.read_text())["1"]["zero3"]
    assert run["device"] == "NVIDIA H200" and run["dtype"] == "bfloat16" and run["world"] == 1
    top = run["profile"]["top"]

    def kernel_ms(*needles: str) -> float:
        found = [t for t in top if any(n in t["name"] for n in needles)]
        assert found, needles
        return sum(t["ms"] for t in found)

    adamw = kernel_ms("FusedOpti")
    passes = kernel_ms("NormTwoOps", "direct_copy_kernel", "bfloat16_copy_kernel", "FillFunctor<c10::BFloat16>")
    elems = parse_model("gpt-1.3b").num_params()
    rate = STREAM_FRACTION * 4800e9  # bytes/s
    assert abs(elems * ADAMW_BYTES_PER_ELEM / rate / 1e-3 / adamw - 1) <= 0.15, adamw
    charged = elems * (ADAMW_BYTES_PER_ELEM + step_pass_bytes(2, clip=False)) / rate / 1e-3
    assert abs(charged / (adamw + passes) - 1) <= 0.25, (charged, adamw + passes)
    # the AdamW update alone (the model's charge before the passes were counted) is 40% or more under
    assert elems * 30 / rate / 1e-3 < 0.6 * (adamw + passes)
    assert step_pass_bytes(2) == 26 and step_pass_bytes(4, clip=False) == 16 and STEP_BYTES_PER_ELEM == 54
