"""The runtime's reserve beside the predicted peak (``costmodel.memory.runtime_reserve``): its parts computed by hand
from the sourced constants, what it refuses, and a request's own reserve."""

from __future__ import annotations

import math

import pytest

from zerotune.core.records import MemoryBytes
from zerotune.costmodel import predict
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.costmodel.memory import (
    CHANNELS,
    CONNECTION_BYTES,
    CUBLAS_WORKSPACE_BYTES,
    DEVICE_CONTEXT_BYTES,
    FRAGMENTATION,
    FRAGMENTATION_RUNS,
    memory_note,
)
from zerotune.costmodel.profiles import calibration_for
from zerotune.costmodel.rates import run_by
from zerotune.errors import SpecError

GIB, MIB = 2**30, 2**20
NEOX = parse_model("gpt-neox-20b")


def test_a_connection_holds_the_three_protocols_buffers_in_whole_allocation_granules():
    """Simple 4 MiB (NCCL_BUFFSIZE), LL 8·512·8·16 and LL128 120·640·8·8 bytes: 9,633,792 bytes, five 2 MiB granules:
    the 10,485,760-byte allocations NCCL's ALLOC log shows per channel and peer on H100s (NVIDIA/nccl#1685)."""
    assert 4 * MIB + 524_288 + 4_915_200 == 9_633_792
    assert CONNECTION_BYTES == 5 * 2 * MIB == 10_485_760
    assert CUBLAS_WORKSPACE_BYTES == 8_519_680  # the fixed allocation a matmul adds (discuss.pytorch.org/t/178671)


@pytest.mark.parametrize(("cluster", "strategy", "runner", "comms", "blaslt"), [
    # zerotune's engine: one communicator per level of two ranks or more its collectives cross (frontier: the GCD
    # pair, the node, the 48 nodes; a DGX H100: the node, the 4 nodes), and the default group
    ("frontier:48", "zero3", None, 3 + 1, 1 * MIB),
    ("dgx-h100:4", "zero3", None, 2 + 1, 32 * MIB),
    # DeepSpeed: one flat group over the whole data-parallel range, a second over hpZ's span, and the default group
    ("frontier:48", "zero3", "deepspeed", 1 + 1, 1 * MIB),
    ("frontier:48", "zeropp", "deepspeed", 2 + 1, 1 * MIB),
    ("dgx-h100:4", "zeropp", "deepspeed", 2 + 1, 32 * MIB),
])
def test_the_reserve_is_its_three_parts_computed_by_hand(cluster, strategy, runner, comms, blaslt):
    c = parse_cluster(cluster)
    calib = calibration_for(c) if runner is None else run_by(calibration_for(c), runner)
    p = predict(NEOX, c, build_strategy(strategy, c), calibration=calib)
    r, peak = p["memory_reserve"], p["memory_bytes"]["peak"]
    assert r["context_bytes"] == 400 * MIB + 8_519_680 + blaslt  # CUDA context, cuBLAS, cuBLASLt (hipBLASLt 1 MiB)
    assert r["communicators"] == comms
    assert r["collective_bytes"] == comms * 32 * 10 * MIB  # 32 channels x one 10 MiB ring connection each
    # the median of the published runs' reserved over allocated: Mixtral's and the DeepSeek-V3 proxy's, the middle two
    assert r["fragmentation_bytes"] == int(peak * FRAGMENTATION)
    assert r["total_bytes"] == r["context_bytes"] + r["collective_bytes"] + r["fragmentation_bytes"]
    assert r["source"] == "computed"
    capacity = int(c.device_memory_gib * GIB)
    assert p["headroom_bytes"] == capacity - r["total_bytes"] - peak
    assert p["feasible"] == (peak + r["total_bytes"] <= capacity)
    assert (DEVICE_CONTEXT_BYTES, CHANNELS) == (400 * MIB, 32)


def test_fragmentation_is_the_median_of_the_published_runs_reserved_over_allocated():
    """Six counted runs, by hand: Qwen3-30B-A3B +6.9%, Nemotron 12B +9.8%, Mixtral +13.3%, DeepSeek-V3 proxy +14.0%,
    Llama 2 7B +30.7%, Llama 2 70B +50%; the median is the mean of the middle two. The runs left out (expandable
    segments, a run whose optimizer never stepped) say why."""
    counted = {r.run.split(",")[0].split(" (")[0]: round(r.excess, 3) for r in FRAGMENTATION_RUNS if r.counted}
    assert counted == {"Mixtral 8x7B": 0.133, "Qwen3-30B-A3B pretraining": 0.069, "Nemotron 12B DPO": 0.098,
                       "DeepSeek-V3 proxy": 0.14, "Llama 2 70B": 0.5, "Llama 2 7B": 0.307}
    middle = (61480 / 54250.98583984375 - 1, 74306 / 65203.93359375 - 1)
    assert FRAGMENTATION == pytest.approx(sum(middle) / 2) == pytest.approx(0.1364, abs=1e-4)
    assert all(r.note for r in FRAGMENTATION_RUNS if not r.counted)
    assert all(r.source.startswith("https://github.com/") for r in FRAGMENTATION_RUNS)
    assert all(r.reserved >= r.allocated for r in FRAGMENTATION_RUNS)


def test_a_cpu_cluster_keeps_no_reserve():
    """gloo's buffers and the process live in host memory, which a CPU run's own figures hold."""
    c = parse_cluster("local:2x2")
    p = predict(parse_model("gpt-tiny"), c, build_strategy("zero3", c))
    r = p["memory_reserve"]
    assert (r["context_bytes"], r["collective_bytes"], r["fragmentation_bytes"], r["total_bytes"]) == (0, 0, 0, 0)
    assert p["headroom_bytes"] == int(c.device_memory_gib * GIB) - p["memory_bytes"]["peak"]


def test_a_strategy_that_fits_the_raw_memory_but_not_beside_the_reserve_is_over():
    """ZeRO-3 of gpt-neox-20b on one Frontier node: 59.2 GiB of the 64 a GCD has, with 9.4 GiB due to the runtime."""
    c = parse_cluster("frontier:1")
    p = predict(NEOX, c, build_strategy("zero3", c))
    peak, reserve = p["memory_bytes"]["peak"], p["memory_reserve"]["total_bytes"]
    assert peak <= 64 * GIB < peak + reserve
    assert not p["feasible"] and p["headroom_bytes"] == 64 * GIB - reserve - peak < 0
    assert p["overflow"]["over_by_bytes"] == peak + reserve - 64 * GIB
    assert f"of 64 GiB less a {reserve / GIB:.1f} GiB reserve" in p["overflow"]["reason"]
    note = memory_note(p, 64.0)
    assert note["headroom_gib"] < 0 and "over" in note["reason"] and note["reserve_gib"] == reserve / GIB
    # without the reserve (a request's 0) the same strategy fits
    bare = predict(NEOX, c, build_strategy("zero3", c), memory_reserve_gib=0)
    assert bare["feasible"] and bare["headroom_bytes"] == 64 * GIB - peak
    assert bare["memory_reserve"]["source"] == "request" and bare["memory_reserve"]["total_bytes"] == 0
    assert bare["memory_reserve"]["fragmentation_bytes"] == p["memory_reserve"]["fragmentation_bytes"]  # still shown
    assert "as the request set" in memory_note(bare, 64.0)["reason"]


def test_a_requested_reserve_replaces_the_computed_one_and_is_checked():
    c = parse_cluster("frontier:2")
    s = build_strategy("zero3", c)
    p = predict(NEOX, c, s, memory_reserve_gib=2.5)
    assert p["memory_reserve"]["total_bytes"] == int(2.5 * GIB)
    assert p["headroom_bytes"] == 64 * GIB - int(2.5 * GIB) - p["memory_bytes"]["peak"]
    big = predict(NEOX, c, s, memory_reserve_gib=63.9)  # under the device's memory, but no room left for the peak
    assert not big["feasible"] and "less a 63.9 GiB reserve" in big["overflow"]["reason"]
    for bad, rule in [(-1.0, "must be >= 0"), (64.0, "under the device's memory (64 GiB)"), (100, "under"),
                      (math.nan, "finite"), (True, "finite")]:
        with pytest.raises(SpecError, match="memory_reserve_gib") as err:
            predict(NEOX, c, s, memory_reserve_gib=bad)
        assert rule in str(err.value)


def test_run_json_records_what_the_allocator_reserved_beside_what_it_allocated():
    """The trainer's run.json on a GPU has both of torch's peaks (``torch.cuda.max_memory_allocated`` and
    ``max_memory_reserved``, only reachable on a GPU); the record's type names both, measured-only."""
    assert MemoryBytes.__optional_keys__ == {"cuda_max_allocated", "cuda_max_reserved"}
    assert "cuda_max_reserved" not in MemoryBytes.__required_keys__
