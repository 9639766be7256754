"""tuner.exports: zerotune trainer JSON, DeepSpeed config (checked by DeepSpeed's own parser), FSDP2 settings.

The DeepSpeed tests need the ``deepspeed`` extra (``pip install -e .[deepspeed]``) and skip without it
(``tests.support.unavailable``: under CI=true they fail); everything else runs on the bare install. Two tests
start real ranks: the FSDP2 snippet's, and DeepSpeed running the exports on gloo (``ds_collectives.py``), whose
collectives are counted.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, require_module
from zerotune.core.spec import BITS, ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, parse_cluster, parse_model
from zerotune.errors import SpecError
from zerotune.tuner.exports import (
    deepspeed_config,
    deepspeed_notes,
    fsdp_config,
    validate_deepspeed_config,
    zerotune_config,
)
from zerotune.tuner.space import runner_rule

CLUSTERS = ("frontier:48", "dgx-h100:4", "local:2x2x2")
MODEL = parse_model("gpt-neox-20b")


def _presets() -> list[tuple[str, str]]:
    return [(c, name) for c in CLUSTERS for name in STRATEGY_PRESETS]


def _random_strategies(count: int = 40, seed: int = 1234) -> list[tuple[str, Strategy, int]]:
    """``count`` valid random strategies (cluster, strategy, global batch); invalid draws are skipped."""
    rng = random.Random(seed)
    out: list[tuple[str, Strategy, int]] = []
    for _ in range(5000):
        if len(out) == count:
            break
        cname = rng.choice(CLUSTERS)
        cluster = parse_cluster(cname)
        levels = cluster.num_levels
        p, g, o = sorted(rng.randint(0, levels) for _ in range(3))
        fields: dict[str, Any] = {
            "param_span": p, "grad_span": g, "optim_span": o,
            "secondary_span": rng.choice([None, rng.randint(0, levels)]),
            "weight_bits": rng.choice(BITS), "grad_bits": rng.choice(BITS),
            "quantize_above": rng.randint(1, levels),
            "allgather_bucket_mb": round(rng.uniform(0.5, 500.0), 2),
            "reduce_bucket_mb": round(rng.uniform(0.5, 500.0), 2),
            "prefetch_buckets": rng.randint(0, 4),
            "micro_batch_size": rng.randint(1, 4),
            "activation_checkpointing": rng.random() < 0.5,
        }
        try:
            strategy = build_strategy(fields, cluster)
        except SpecError:
            continue
        out.append((cname, strategy, cluster.world_size * strategy.micro_batch_size * rng.randint(1, 4)))
    assert len(out) == count, f"only {len(out)} valid random strategies"
    return out


RANDOM = _random_strategies()


# --------------------------------------------------------------------------------------------------
# DeepSpeed's own parser


@pytest.fixture
def ds(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The installed DeepSpeed, with a helper that runs its config parsers on an export.

    ``DeepSpeedZeroConfig(**cfg["zero_optimization"])`` is a pydantic model with ``extra="forbid"``:
    every key and value type under ``zero_optimization`` is checked, and a typo fails.

    ``DeepSpeedConfig(cfg)`` parses the whole config. Its only distributed calls are
    ``deepspeed.comm.get_rank()`` / ``get_world_size()`` in ``__init__``; without a process group they
    raise and it falls back to world size 1, which fails the batch assertion
    (train_batch_size == micro x accumulation x world). So the test monkeypatches those two functions
    of ``deepspeed.comm`` to the cluster's world size and rank 0 — no process group, no mock of the
    parser itself. ``DeepSpeedConfig`` then runs the batch assertion, the bf16/fp16 pydantic models,
    the zero config, ``DeepSpeedActivationCheckpointingConfig`` and its sanity checks.

    ``DeepSpeedConfig`` reads known top-level keys and ignores unknown ones, and the activation
    checkpointing block is read key by key, so for those two the helper checks the names against
    DeepSpeed's own constants (``deepspeed.runtime.constants``, ``ACT_CHKPT_DEFAULT``).
    """
    deepspeed = require_module("deepspeed", "pip install -e .[deepspeed]")
    import deepspeed.comm as ds_comm
    from deepspeed.runtime import constants as C
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT, ACT_CHKPT_DEFAULT
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION, DeepSpeedZeroConfig

    top_level = {C.TRAIN_BATCH_SIZE, C.TRAIN_MICRO_BATCH_SIZE_PER_GPU, C.GRADIENT_ACCUMULATION_STEPS,
                 C.BFLOAT16, C.FP16, C.COMMUNICATION_DATA_TYPE, C.GRADIENT_CLIPPING, ZERO_OPTIMIZATION, ACT_CHKPT}

    class Parser:
        version = deepspeed.__version__

        @staticmethod
        def check(cfg: dict[str, Any], world: int) -> Any:
            unknown = set(cfg) - top_level
            assert not unknown, f"top-level keys DeepSpeed does not read: {unknown}"
            if ACT_CHKPT in cfg:
                assert set(cfg[ACT_CHKPT]) <= set(ACT_CHKPT_DEFAULT), cfg[ACT_CHKPT]
            DeepSpeedZeroConfig(**cfg["zero_optimization"])
            monkeypatch.setattr(ds_comm, "get_world_size", lambda *a, **k: world)
            monkeypatch.setattr(ds_comm, "get_rank", lambda *a, **k: 0)
            parsed = DeepSpeedConfig(json.loads(json.dumps(cfg)))
            assert parsed.world_size == world
            assert parsed.train_batch_size == cfg["train_batch_size"]
            assert parsed.zero_optimization_stage == cfg["zero_optimization"]["stage"]
            return parsed

    return Parser


@pytest.mark.parametrize(("cname", "preset"), _presets())
def test_every_preset_is_accepted_by_deepspeed(ds: Any, cname: str, preset: str) -> None:
    cluster = parse_cluster(cname)
    strategy = build_strategy(preset, cluster)
    for dtype in ("bf16", "fp16", "fp32"):
        cfg = deepspeed_config(MODEL, cluster, strategy, dtype=dtype, deepspeed_version=ds.version)
        parsed = ds.check(cfg, cluster.world_size)
        assert parsed.bfloat16_config.enabled == (dtype == "bf16")
        assert parsed.float16_config.enabled == (dtype == "fp16")
    # the default (newest DeepSpeed) export is accepted too
    ds.check(deepspeed_config(MODEL, cluster, strategy), cluster.world_size)


@pytest.mark.parametrize(("cname", "strategy", "global_batch"), RANDOM,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(RANDOM)])
def test_random_strategies_are_accepted_by_deepspeed(ds: Any, cname: str, strategy: Strategy,
                                                     global_batch: int) -> None:
    cluster = parse_cluster(cname)
    cfg = deepspeed_config(MODEL, cluster, strategy, global_batch=global_batch, deepspeed_version=ds.version)
    parsed = ds.check(cfg, cluster.world_size)
    assert parsed.gradient_accumulation_steps * strategy.micro_batch_size * cluster.world_size == global_batch
    assert parsed.zero_config.zero_hpz_partition_size == cfg["zero_optimization"].get("zero_hpz_partition_size", 1)
    assert (parsed.activation_checkpointing_config.number_checkpoints is not None) == strategy.activation_checkpointing
    notes = deepspeed_notes(MODEL, cluster, strategy, global_batch=global_batch, deepspeed_version=ds.version)
    assert all(isinstance(n, str) and n for n in notes)
    json.dumps(cfg)


@pytest.mark.parametrize("preset", ["zero1", "zero3"])
def test_fp32_reductions_are_deepspeeds_communication_data_type(ds: Any, preset: str) -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy(preset, cluster, grad_bits=32)
    parsed = ds.check(deepspeed_config(MODEL, cluster, s, deepspeed_version=ds.version), cluster.world_size)
    assert str(parsed.communication_data_type) == "torch.float32"
    assert "communication_data_type" not in deepspeed_config(MODEL, cluster, s, dtype="fp32")
    assert "communication_data_type" not in deepspeed_config(MODEL, cluster, build_strategy(preset, cluster))
    assert runner_rule("deepspeed", cluster, s) is None


def test_the_exports_clip_gradients_as_the_trials_did_whatever_deepspeeds_default(ds: Any) -> None:
    """DeepSpeed clips the global gradient norm at its ``gradient_clipping`` (0 = none); a config without the
    key gets the installed release's default, 0 in older ones and 1.0 in 0.19.8, so the export always writes
    what zerotune's trials clip to (``GRAD_CLIP``), and DeepSpeed's parser reads it back. The FSDP2 export
    carries the same figure and its snippet says where to apply it."""
    from zerotune.trainer.train import GRAD_CLIP

    cluster = parse_cluster("dgx-h100:4")
    for preset in ("zero1", "zero3", "zeropp"):
        cfg = deepspeed_config(MODEL, cluster, build_strategy(preset, cluster), deepspeed_version=ds.version)
        assert cfg["gradient_clipping"] == GRAD_CLIP == 1.0
        assert ds.check(cfg, cluster.world_size).gradient_clipping == GRAD_CLIP
    s = build_strategy("zero3", cluster)
    off = deepspeed_config(MODEL, cluster, s, gradient_clipping=0)
    assert off["gradient_clipping"] == 0.0 and ds.check(off, cluster.world_size).gradient_clipping == 0.0
    for bad in (-1.0, float("nan"), float("inf"), True, "1.0"):
        with pytest.raises(SpecError, match="gradient_clipping"):
            deepspeed_config(MODEL, cluster, s, gradient_clipping=bad)
        with pytest.raises(SpecError, match="gradient_clipping"):
            validate_deepspeed_config({**off, "gradient_clipping": bad}, cluster.world_size)
    f = fsdp_config(MODEL, cluster, s)
    assert f["grad_clip"] == GRAD_CLIP and f"clip_grad_norm_(model.parameters(), {GRAD_CLIP})" in f["code"]


def test_deepspeed_rejects_a_typo(ds: Any) -> None:
    """The check is not vacuous: a misspelt key fails at each level."""
    from pydantic import ValidationError

    cluster = parse_cluster("frontier:48")
    cfg = deepspeed_config(MODEL, cluster, build_strategy("zeropp", cluster))
    typo_zero = {**cfg, "zero_optimization": {**cfg["zero_optimization"], "zero_hpz_partiton_size": 8}}
    with pytest.raises(ValidationError, match="zero_hpz_partiton_size"):
        ds.check(typo_zero, cluster.world_size)
    typo_bf16 = {**cfg, "bf16": {"enable": True}}
    with pytest.raises(ValidationError, match="enable"):
        ds.check(typo_bf16, cluster.world_size)
    with pytest.raises(AssertionError, match="train_batch_sizee"):
        ds.check({**cfg, "train_batch_sizee": 1}, cluster.world_size)
    wrong_type = {**cfg, "zero_optimization": {**cfg["zero_optimization"], "reduce_bucket_size": "big"}}
    with pytest.raises(ValidationError):
        ds.check(wrong_type, cluster.world_size)


def test_installed_deepspeed_matches_the_mics_version_rule(ds: Any) -> None:
    """MiCS keys are written exactly when the target DeepSpeed still has them (removed in 0.19.7)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    cluster = parse_cluster("frontier:48")
    mics = deepspeed_config(MODEL, cluster, build_strategy("mics", cluster), deepspeed_version=ds.version)
    has_mics = "mics_shard_size" in DeepSpeedZeroConfig.model_fields
    assert ("mics_shard_size" in mics["zero_optimization"]) == has_mics


# --------------------------------------------------------------------------------------------------
# the mapping table and our own checks (no DeepSpeed needed)


def _zero(preset: str, cname: str = "frontier:48", **kw: Any) -> dict[str, Any]:
    cluster = parse_cluster(cname)
    return deepspeed_config(MODEL, cluster, build_strategy(preset, cluster), **kw)["zero_optimization"]


def test_mapping_zero3() -> None:
    z = _zero("zero3")
    assert z["stage"] == 3 and z["zero_hpz_partition_size"] == 1
    assert z["zero_quantized_weights"] is False and z["zero_quantized_gradients"] is False
    assert "mics_shard_size" not in z
    cluster = parse_cluster("frontier:48")
    assert deepspeed_notes(MODEL, cluster, build_strategy("zero3", cluster)) == []


@pytest.mark.parametrize("name", ["gpt-neox-20b", "llama3-8b", "gpt-1.3b"])
def test_the_live_cap_leaves_deepspeed_its_prefetch_window(name: str) -> None:
    """The export's stage3_max_live_parameters holds the root (the tied embedding or the untied head, which DeepSpeed
    keeps gathered all pass), the largest sub-module and the prefetch window, so DeepSpeed's coordinator (its rules:
    ``deepspeed.simulate``, measured on gpt-mini in the collectives test) prefetches on the preset models too: it
    holds more than without a window, and no more than the cap and the one parameter it may launch past it (and,
    beside an untied head, the embedding it fetches at the end of backward). A cap of a bucket and the window, below
    every preset root, would leave it none."""
    from zerotune.core.plan import block_modules
    from zerotune.costmodel.coordinator import Stage3Settings, bucket_elements, simulate

    model, cluster = parse_model(name), parse_cluster("frontier:48")
    held = {}
    for window in (0, 1):
        s = build_strategy("zero3", cluster, prefetch_buckets=window)
        z = deepspeed_config(model, cluster, s)["zero_optimization"]
        root = model.untied_head_numel or model.vocab * model.hidden
        bucket = bucket_elements(s.allgather_bucket_mb)
        assert z["stage3_max_live_parameters"] == root + max(bucket, *block_modules(model)) + bucket * window
        assert bucket * (1 + window) < root, z  # the old cap
        held[window] = simulate(model, Stage3Settings.from_config(z), False).peak
        # (the cap bounds the prefetch, not a fetch: an untied head's embedding is fetched beside it at the end)
        embedding = model.vocab * model.hidden if model.untied_head_numel else 0
        bound = z["stage3_max_live_parameters"] + max(block_modules(model)) + embedding
        assert held[window] <= bound, (name, held)
    assert held[1] > held[0], (name, held)


def test_mapping_zeropp_on_frontier() -> None:
    z = _zero("zeropp")
    assert z["stage"] == 3 and z["zero_hpz_partition_size"] == 8
    assert z["zero_quantized_weights"] is True and z["zero_quantized_gradients"] is True


def test_mapping_mics_on_frontier() -> None:
    z = _zero("mics", deepspeed_version="0.19.6")
    assert z["stage"] == 3 and z["mics_shard_size"] == 8
    assert z["mics_hierarchical_params_gather"] is False  # the shard lies inside one node
    assert z["zero_hpz_partition_size"] == 1
    # the newest DeepSpeed has no MiCS: stage 3 over the world, the node as hpZ group, and a note
    newest = _zero("mics")
    assert "mics_shard_size" not in newest and newest["zero_hpz_partition_size"] == 8
    cluster = parse_cluster("frontier:48")
    assert any("MiCS" in n for n in deepspeed_notes(MODEL, cluster, build_strategy("mics", cluster)))


def test_mapping_mics_drops_zeropp_features() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy({"preset": "mics", "secondary_span": 1, "weight_bits": 8, "grad_bits": 4}, cluster)
    cfg = deepspeed_config(MODEL, cluster, s, deepspeed_version="0.16.4")["zero_optimization"]
    assert cfg["mics_shard_size"] == 8 and cfg["zero_hpz_partition_size"] == 1
    assert cfg["zero_quantized_weights"] is False and cfg["zero_quantized_gradients"] is False
    notes = deepspeed_notes(MODEL, cluster, s, deepspeed_version="0.16.4")
    assert any("switched off" in n for n in notes)


@pytest.mark.parametrize(("preset", "stage"), [("zero1", 1), ("zero2", 2)])
def test_mapping_zero1_zero2(preset: str, stage: int) -> None:
    z = _zero(preset)
    assert z["stage"] == stage
    assert z["allgather_bucket_size"] == z["reduce_bucket_size"] == 12_500_000  # 25 MB of 16-bit values
    assert "zero_hpz_partition_size" not in z and "stage3_prefetch_bucket_size" not in z


def test_mapping_3level_a_has_notes() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy("3level-a", cluster)
    z = deepspeed_config(MODEL, cluster, s)["zero_optimization"]
    assert z["stage"] == 3 and z["zero_hpz_partition_size"] == 2  # P's gcd-pair span as the hpZ group
    notes = deepspeed_notes(MODEL, cluster, s)
    assert notes and any("gradients" in n for n in notes)


def test_mapping_buckets_and_bits() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy("zeropp", cluster, allgather_bucket_mb=50.0, reduce_bucket_mb=10.0, prefetch_buckets=3,
                       weight_bits=4, grad_bits=8, quantize_above=2)
    z = deepspeed_config(MODEL, cluster, s)["zero_optimization"]
    assert z["reduce_bucket_size"] == 5_000_000
    assert z["stage3_prefetch_bucket_size"] == 3 * 25_000_000
    assert z["stage3_param_persistence_threshold"] == 10 * MODEL.hidden
    assert z["zero_quantized_weights"] is True  # int4 → DeepSpeed's int8 qwZ
    assert z["zero_quantized_gradients"] is False  # int8 → no int4 qgZ
    notes = " ".join(deepspeed_notes(MODEL, cluster, s))
    assert "weight_bits=4" in notes and "grad_bits=8" in notes and "quantize_above=2" in notes


def test_batch_arithmetic() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy("zero3", cluster, micro_batch_size=2)
    cfg = deepspeed_config(MODEL, cluster, s)
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (
        768, 2, 1)
    cfg = deepspeed_config(MODEL, cluster, s, global_batch=3072)
    assert cfg["gradient_accumulation_steps"] == 4 and cfg["train_batch_size"] == 3072
    for bad in (1000, 0, -768):
        with pytest.raises(ValueError, match="global_batch"):
            deepspeed_config(MODEL, cluster, s, global_batch=bad)
    with pytest.raises(ValueError, match="train_batch_size"):
        validate_deepspeed_config({**cfg, "train_batch_size": 3000}, cluster.world_size)


def test_hpz_checks() -> None:
    cluster = parse_cluster("frontier:48")
    cfg = deepspeed_config(MODEL, cluster, build_strategy("zeropp", cluster))
    validate_deepspeed_config(cfg, cluster.world_size)

    def with_zero(**kw: Any) -> dict[str, Any]:
        return {**cfg, "zero_optimization": {**cfg["zero_optimization"], **kw}}

    with pytest.raises(ValueError, match=r"zero_hpz_partition_size=5.*divide the world size 384"):
        validate_deepspeed_config(with_zero(zero_hpz_partition_size=5), 384)
    with pytest.raises(ValueError, match=r"zero_hpz_partition_size=384.*smaller than"):
        validate_deepspeed_config(with_zero(zero_hpz_partition_size=384), 384)
    with pytest.raises(ValueError, match="mics_shard_size"):
        validate_deepspeed_config(with_zero(mics_shard_size=8), 384)
    with pytest.raises(ValueError, match="stage 3"):
        validate_deepspeed_config(with_zero(stage=2), 384)
    # a secondary group as wide as the whole ZeRO group (a one-node cluster) is dropped, with a note
    one_node = parse_cluster("frontier:1")
    s = build_strategy("zeropp", one_node)
    assert deepspeed_config(MODEL, one_node, s)["zero_optimization"]["zero_hpz_partition_size"] == 1
    assert any("saves nothing" in n for n in deepspeed_notes(MODEL, one_node, s))


def test_bad_arguments() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy("zero3", cluster)
    with pytest.raises(ValueError, match="dtype"):
        deepspeed_config(MODEL, cluster, s, dtype="float8")
    with pytest.raises(ValueError, match="deepspeed_version"):
        deepspeed_config(MODEL, cluster, s, deepspeed_version="0.9.0")
    with pytest.raises(ValueError, match="deepspeed_version"):
        deepspeed_config(MODEL, cluster, s, deepspeed_version="latest")
    with pytest.raises(ValueError, match="span=3: must be within 0..2"):  # spans of a 3-level cluster on a 2-level one
        deepspeed_config(MODEL, parse_cluster("dgx-h100:4"), s)
    cfg = deepspeed_config(MODEL, cluster, s, dtype="fp32")
    assert "bf16" not in cfg and "fp16" not in cfg


@pytest.mark.parametrize(("cname", "preset"), _presets())
def test_preset_outputs_are_json(cname: str, preset: str) -> None:
    cluster = parse_cluster(cname)
    s = build_strategy(preset, cluster)
    for out in (zerotune_config(MODEL, cluster, s), deepspeed_config(MODEL, cluster, s),
                deepspeed_config(MODEL, cluster, s, deepspeed_version="0.19.6"),
                deepspeed_notes(MODEL, cluster, s), fsdp_config(MODEL, cluster, s)):
        assert json.loads(json.dumps(out)) == out


# --------------------------------------------------------------------------------------------------
# FSDP2


def _fsdp(preset: str, cname: str = "frontier:48", **kw: Any) -> dict[str, Any]:
    cluster = parse_cluster(cname)
    return fsdp_config(MODEL, cluster, build_strategy(preset, cluster), **kw)


def test_fsdp_zero3() -> None:
    f = _fsdp("zero3")
    assert f["mesh_shape"] == [384] and f["mesh_dim_names"] == ["shard"]
    assert f["reshard_after_forward"] is True
    assert f["mixed_precision"] == {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}
    assert any(n.startswith("reduce_dtype=bfloat16") and "grad_bits=32" in n for n in f["notes"])


def test_fsdp_reduces_in_fp32_when_the_strategy_does() -> None:
    cluster = parse_cluster("frontier:48")
    f = fsdp_config(MODEL, cluster, build_strategy("zero3", cluster, grad_bits=32))
    assert f["mixed_precision"] == {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    assert "reduce_dtype=torch.float32" in f["code"]
    assert not any(n.startswith("reduce_dtype=") for n in f["notes"])


def test_fsdp_mics() -> None:
    f = _fsdp("mics")
    assert f["mesh_shape"] == [48, 8] and f["mesh_dim_names"] == ["replicate", "shard"]
    assert f["reshard_after_forward"] is True


def test_fsdp_zeropp() -> None:
    f = _fsdp("zeropp")
    assert f["mesh_shape"] == [384] and f["reshard_after_forward"] == 8
    assert type(f["reshard_after_forward"]) is int
    assert any("quantized" in n for n in f["notes"])


def test_fsdp_zero2_and_3level_a() -> None:
    f = _fsdp("zero2")
    assert f["mesh_shape"] == [384] and f["reshard_after_forward"] is False
    f = _fsdp("3level-a")
    assert f["mesh_shape"] == [384] and f["reshard_after_forward"] == 2 and f["notes"]


@pytest.mark.parametrize(("cname", "strategy", "global_batch"), RANDOM,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(RANDOM)])
def test_fsdp_random(cname: str, strategy: Strategy, global_batch: int) -> None:
    cluster = parse_cluster(cname)
    f = fsdp_config(MODEL, cluster, strategy, global_batch=global_batch)
    assert json.loads(json.dumps(f)) == f
    shape = f["mesh_shape"]
    assert len(shape) == len(f["mesh_dim_names"]) and shape[-1] * (shape[0] if len(shape) == 2 else 1) == \
        cluster.world_size
    reshard = f["reshard_after_forward"]
    if not isinstance(reshard, bool):  # fully_shard: an int must be a non-trivial divisor of the shard dim
        assert 1 < reshard < shape[-1] and shape[-1] % reshard == 0
    assert f["grad_accum_steps"] * strategy.micro_batch_size * cluster.world_size == global_batch
    compile(f["code"], "<fsdp snippet>", "exec")


def test_fsdp_code_snippet() -> None:
    code = _fsdp("mics")["code"]
    assert 'init_device_mesh("cuda", (48, 8), mesh_dim_names=("replicate", "shard"))' in code
    assert "fully_shard(block, mesh=mesh, reshard_after_forward=True" in code
    assert "reduce_dtype=torch.bfloat16" in code
    code = _fsdp("zeropp", dtype="fp16")["code"]
    assert 'mesh_dim_names=("shard",)' in code and "reshard_after_forward=8" in code
    assert "param_dtype=torch.float16" in code


# --------------------------------------------------------------------------------------------------
# zerotune's trainer


def test_zerotune_config_command() -> None:
    cluster = parse_cluster("frontier:48")
    s = build_strategy("zeropp", cluster)
    z = zerotune_config(MODEL, cluster, s, global_batch=768)
    assert Strategy.from_dict(z["strategy"]) == s and ModelSpec.from_dict(z["model"]) == MODEL
    assert ClusterSpec.from_dict(z["cluster"]) == cluster
    assert (z["global_batch"], z["grad_accum_steps"], z["dtype"]) == (768, 2, "bf16")
    cmd = z["command"]
    assert cmd.startswith("torchrun --nnodes 48 --nproc-per-node 8 ")
    assert "-m zerotune.trainer.train --model gpt-neox-20b --cluster frontier:48 --strategy strategy.json" in cmd
    assert "--global-batch 768 --dtype bf16" in cmd
    assert z["files"] == {"strategy.json": "strategy"}
    one_level = parse_cluster("local:4")
    z1 = zerotune_config(MODEL, one_level, build_strategy("zero3", one_level))
    assert z1["command"].startswith("torchrun --nnodes 1 --nproc-per-node 4 -m zerotune.trainer.train")
    with pytest.raises(ValueError, match="dtype"):
        zerotune_config(MODEL, cluster, s, dtype="fp16")


@pytest.mark.parametrize("cname", [*CLUSTERS, "custom"])
def test_zerotune_command_is_accepted_by_the_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     cname: str) -> None:
    """Write the files the config names, then parse the command with trainer.train's own parser."""
    from zerotune.trainer import train

    if cname == "custom":
        cluster = ClusterSpec.from_dict({**parse_cluster("dgx-h100:2").to_dict(), "name": "my-cluster"})
        model = ModelSpec("my-gpt", layers=2, hidden=64, heads=4, vocab=256, seq_len=32)
    else:
        cluster, model = parse_cluster(cname), MODEL
    s = build_strategy("3level-a", cluster, micro_batch_size=2)
    z = zerotune_config(model, cluster, s, global_batch=cluster.world_size * 4, dtype="fp32")
    monkeypatch.chdir(tmp_path)
    for name, key in z["files"].items():
        Path(name).write_text(json.dumps(z[key]))
    if cname == "custom":
        assert set(z["files"]) == {"strategy.json", "model.json", "cluster.json"}
    argv = shlex.split(z["command"])
    parser = train.argparse.ArgumentParser()
    train.add_run_args(parser)
    args = parser.parse_args(argv[argv.index("zerotune.trainer.train") + 1:])
    args.force = True  # the parse is checked here; gpt-neox-20b with this strategy does not fit (refused otherwise)
    got_model, got_cluster, got_strategy, accum = train.resolve(args)
    assert (got_model, got_cluster, got_strategy, accum) == (model, cluster, s, 2)


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, zerotune.tuner.exports; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@pytest.mark.parametrize("cname", ["dgx-h100:1", "frontier:1"])
@pytest.mark.parametrize("version", [None, "0.19.6"])
def test_one_node_notes_compare_group_sizes_not_span_numbers(cname: str, version: str | None) -> None:
    """On one node a span of 1 (node) is the whole world: plain stage 3 is exactly zero3 and mics there, so
    neither gets MiCS keys, nor a note claiming DeepSpeed shards wider than the strategy."""
    cluster = parse_cluster(cname)
    for preset in ("zero3", "mics", "zero1", "zero2"):
        s = build_strategy(preset, cluster)
        cfg = deepspeed_config(MODEL, cluster, s, deepspeed_version=version)
        notes = deepspeed_notes(MODEL, cluster, s, deepspeed_version=version)
        assert not any(k.startswith("mics") for k in cfg["zero_optimization"]), (preset, cfg)
        assert not any("whole world" in n or "whole data-parallel world" in n or "MiCS" in n for n in notes), \
            (preset, notes)
    # a real difference is still said: MiCS on two nodes shards inside the node and replicates across
    two = parse_cluster(cname.replace(":1", ":2"))
    cfg = deepspeed_config(MODEL, two, build_strategy("mics", two), deepspeed_version="0.19.6")
    assert cfg["zero_optimization"]["mics_shard_size"] == two.span_size(two.node_span)


def test_a_base_merged_by_the_prologue_is_accepted_by_deepspeed(ds: Any) -> None:
    """``zerotune recommend --base``: the merged file passes DeepSpeed's own parser, with the user's batch kept
    (and completed by DeepSpeed's rule) or the recommended one."""
    from zerotune.api.prologue import merge_deepspeed

    cluster = parse_cluster("frontier:4")
    recommended = deepspeed_config(MODEL, cluster, build_strategy("zeropp", cluster), deepspeed_version=ds.version)
    base = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True},
            "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}
    merged, warnings = merge_deepspeed(base, recommended, keep_base_batch=True)
    parsed = ds.check(merged, cluster.world_size)
    assert parsed.train_batch_size == 2 * cluster.world_size and parsed.float16_config.enabled
    assert parsed.zero_config.offload_optimizer is not None and len(warnings) == 3
    plain, _ = merge_deepspeed({"fp16": {"enabled": True}}, recommended)
    assert ds.check(plain, cluster.world_size).train_batch_size == recommended["train_batch_size"]


@pytest.mark.timeout(300)
def test_fsdp_exports_train_from_their_own_snippet(tmp_path: Path) -> None:
    """The FSDP2 export's code, as written, shards gpt-tiny on 4 gloo ranks (1-D, 2-D and integer reshard meshes)
    and trains 2 steps to finite losses; with full and with selective checkpointing (its policy written out in the
    snippet) and with every second block checkpointed, ZeRO-3's losses are the uncheckpointed run's."""
    from zerotune.trainer.launch import run_torchrun

    result = run_torchrun(4, [str(ROOT / "tests" / "tuner" / "fsdp_snippet_check.py"), "local:2x2", str(tmp_path)],
                          module=False, timeout_s=240, env={"PYTHONPATH": str(ROOT)})
    assert result.ok, result.output[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    seen = {preset: run["reshard_after_forward"] for preset, run in ranks[0].items()}
    assert seen == {"zero3": True, "zeropp": 2, "mics": True, "zero2": False, "zero3-full": True,
                    "zero3-selective": True, "zero3-every2": True}, seen
    for run in ranks:
        for checkpointed in ("zero3-full", "zero3-selective", "zero3-every2"):
            assert run[checkpointed]["losses"] == pytest.approx(run["zero3"]["losses"], rel=1e-5), checkpointed
    assert ranks[0]["mics"]["mesh"] == [2, 2]
    for run in ranks:
        for preset, r in run.items():
            assert all(math.isfinite(x) for x in r["losses"]), (preset, r)


def _ds_moves(cfgs: list[dict[str, Any]], world: int, models: list[str | dict[str, Any]], out: Path) -> list[tuple[
        dict[tuple[str, int], float], list, int]]:
    """For each config in ``cfgs`` and its model in ``models`` (run one after another in one launch of ``world``
    gloo ranks): by (collective, ranks in its group), the bytes DeepSpeed moved in one training step (an
    all-gather's output, a reduce-scatter's input; rank 0), in units of the model's fp32 parameters; rank 0's
    calls, (collective, bytes, ranks) each; and the most partitioned elements it held gathered at once (stage 3)."""
    from tests.support.ranks import run_ranks

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"ds_config{i}.json" for i in range(len(cfgs))]
    for path, cfg in zip(paths, cfgs, strict=True):
        path.write_text(json.dumps(cfg))
    rank0 = run_ranks(world, Path(__file__).with_name("ds_collectives.py"),
                      [",".join(map(str, paths)), json.dumps(models)],
                      out / "ranks", timeout_s=120.0 + 90.0 * len(cfgs))[0]
    found = []
    for run in rank0["runs"]:
        moved: dict[tuple[str, int], float] = {}
        for name, nbytes, ranks in run["calls"]:
            moved[name, ranks] = moved.get((name, ranks), 0.0) + nbytes / (run["params"] * run["elem_bytes"])
        found.append((moved, run["calls"], run["gathered_peak"]))
    return found


@pytest.mark.timeout(300)
def test_deepspeed_stages_1_and_2_all_reduce_their_gradient_buckets(ds: Any, tmp_path: Path) -> None:
    """Real DeepSpeed runs the zero1 and zero2 exports (CPU accelerator, 4 gloo ranks, gpt-mini in fp32): with its
    defaults for the keys the export leaves alone (reduce_scatter and use_multi_rank_bucket_allreduce, both true in
    0.19.8) it reduces each gradient bucket with one all-reduce of the whole bucket, every rank then keeping its
    partition's slice: twice the bytes on the wire of the reduce-scatter the strategy's schedule books, and no
    reduce per rank. The model charges the deepspeed runner so (``Calibration.grad_reduce``); after the step the
    updated partitions are all-gathered once, as the schedule has it."""
    model = parse_model("gpt-mini")
    cluster = parse_cluster("local:2x2")
    presets = ("zero1", "zero2")
    cfgs = [deepspeed_config(model, cluster, build_strategy(preset, cluster, reduce_bucket_mb=2.0), dtype="fp32")
            for preset in presets]
    found = _ds_moves(cfgs, cluster.world_size, ["gpt-mini"] * len(cfgs), tmp_path)
    for preset, (moved, calls, _) in zip(presets, found, strict=True):
        reduced = [n for op, n, ranks in calls if op == "all_reduce" and ranks == 4 and n > 4 * model.hidden * 4]
        assert len(reduced) > 1, calls  # bucket by bucket (1M elements each), not one all-reduce of everything
        assert moved["all_reduce", 4] == pytest.approx(1.0, abs=0.02), (preset, moved)
        assert not any(op in ("reduce", "reduce_scatter_tensor", "reduce_scatter") for op, _, _ in calls), calls
        assert 0.97 < moved["all_gather_into_tensor", 4] + moved.get(("all_gather", 4), 0.0) <= 1.02, moved


@pytest.mark.timeout(400)
def test_deepspeed_gathers_what_the_exported_strategy_gathers(ds: Any, tmp_path: Path) -> None:
    """Real DeepSpeed (CPU accelerator, 4 gloo ranks, gpt-mini in fp32) runs the exports, and every collective it
    calls during a step is counted. With the zero3 export it gathers each parameter twice a step (forward, then
    again in backward) and reduce-scatters each gradient once: the strategy's schedule, whose root unit (25% of
    gpt-mini: the tied embedding) alone stays gathered. With DeepSpeed's own defaults for the two keys the
    export sets (stage3_max_reuse_distance and stage3_max_live_parameters, 1e9 elements each) it keeps the whole
    4.2M-parameter model gathered from forward into backward and gathers once: what the strategy neither moves
    nor holds. A 1-rank secondary group (the whole P kept after forward) gathers once, as the model says, and
    ZeRO++'s hpZ (16-bit here: DeepSpeed's quantizers need a GPU) gathers over all 4 ranks in forward and inside
    its 2-rank node in backward, as the strategy does. DeepSpeed fetches sub-module by sub-module: each block's
    four weight matrices (qkv, proj, fc, out) in one all-gather each, in forward and again in backward, the
    gathers the model charges the deepspeed runner (``plan.block_modules``, ``Calibration.gathers``), and after
    each optimizer step it gathers every persistent parameter (LayerNorms, biases) in an all-gather of its own,
    which the model charges at the step boundary (``runners.persistent_params``). A Llama of the same size
    (``arch = "llama"``) is fetched as its seven weight matrices (wq, wk, wv, wo, w1, w2, w3) and keeps only its
    RMSNorms' weights whole.
    Buckets of 0.5 MB keep DeepSpeed's prefetch window (which it does not release at the turn from forward to
    backward) smaller than the model, as it is on models of billions of parameters. Under activation checkpointing
    (each block wrapped in torch's checkpoint, as the export's note asks) DeepSpeed gathers each block again for
    its recompute; the export's reuse distance keeps that for the block's backward, so it still gathers each block
    twice a step, and with hpZ the recompute's gathers stay inside the secondary group. In every run the most
    elements DeepSpeed held gathered at once are those its coordinator's rules give for that config
    (``costmodel.deepspeed.gathered_peak``, what the cost model books for a run by DeepSpeed): without a prefetch
    window the root and one weight; under the export's live cap, which leaves room for its window beside the root
    and the sub-module running, what it prefetched too, launched as fewer all-gathers; and with a cap above what it
    holds (``prefetching``: DeepSpeed's default cap) the whole model, since it releases nothing its prefetch has
    scanned past. And in every run the bytes it all-gathered, forward and backward (hpZ's backward
    in its 2-rank group) and the persistent parameters after the step, are what the same rules gather
    (``costmodel.deepspeed.simulate``, what predict times for a run by DeepSpeed): with the default cap its prefetch,
    run at every module's fetch (blocks and norms too), gets ahead of the forward and regathers only the first
    block's parameters for backward."""
    from zerotune.core.plan import block_modules, block_numel
    from zerotune.costmodel import step_volume
    from zerotune.costmodel.coordinator import Stage3Settings, gathered_peak, simulate
    from zerotune.costmodel.runners import persistent_params

    model = parse_model("gpt-mini")
    llama = ModelSpec.from_dict({**model.to_dict(), "name": "llama-mini", "kv_heads": 2, "tied_head": False,
                                 "arch": "llama"})
    modelled, cfgs, worlds = {}, [], set()
    small = {"allgather_bucket_mb": 0.5}  # a prefetch window smaller than the model, as on real ones
    # hpZ last: DeepSpeed 0.19.8 keeps its secondary group for the engines built after it in the same process
    # the keys each config leaves to DeepSpeed's defaults
    both, live = ("stage3_max_reuse_distance", "stage3_max_live_parameters"), ("stage3_max_live_parameters",)
    unprefetched = {"preset": "zero3", "prefetch_buckets": 0}  # a fetch per sub-module, as the model times it
    runs = (("zero3", "local:2x2", unprefetched, (), model),
            ("llama", "local:2x2", unprefetched, (), llama),
            ("export", "local:2x2", "zero3", (), model),
            ("defaults", "local:2x2", "zero3", both, model),
            ("prefetching", "local:2x2", "zero3", live, model),
            ("llama_prefetching", "local:2x2", "zero3", live, llama),
            ("ckpt_defaults", "local:2x2", {"preset": "zero3", "activation_checkpointing": True}, both, model),
            ("keep", "local:1x4", {"preset": "zero3", "secondary_span": 1}, (), model),
            ("ckpt", "local:2x2", {"preset": "zero3", "activation_checkpointing": True}, (), model),
            ("hpz", "local:2x2", {"preset": "zeropp", "weight_bits": 16, "grad_bits": 16}, (), model),
            ("hpz_ckpt", "local:2x2", {"preset": "zeropp", "weight_bits": 16, "grad_bits": 16,
                                       "activation_checkpointing": True}, (), model))
    for key, cname, spec, dropped, m in runs:
        cluster = parse_cluster(cname)
        worlds.add(cluster.world_size)
        strategy = build_strategy(spec, cluster, **small)
        cfgs.append(deepspeed_config(m, cluster, strategy, dtype="fp32"))
        for k in dropped:
            del cfgs[-1]["zero_optimization"][k]
        vol = step_volume(m, cluster, strategy, elem_bytes=4, accum=1)
        modelled[key] = (sum(k.get("all_gather", 0) for k in vol.values())
                         / sum(k.get("reduce_scatter", 0) for k in vol.values()))
    (world,) = worlds  # one launch runs every config: the clusters hold as many ranks
    found = _ds_moves(cfgs, world, [m.to_dict() for *_, m in runs], tmp_path)
    moved = {key: m for (key, *_), (m, _, _) in zip(runs, found, strict=True)}
    calls = {key: c for (key, *_), (_, c, _) in zip(runs, found, strict=True)}
    # what DeepSpeed held gathered at its fullest is what the cost model books for a run by it, under the settings
    # each config gave (DeepSpeed's own where a key is left out): costmodel.deepspeed.gathered_peak
    for (key, _, _, _, m, *_), cfg, (_, _, peak) in zip(runs, cfgs, found, strict=True):
        zero = cfg["zero_optimization"]
        held = Stage3Settings.from_config(zero)
        assert peak == gathered_peak(m, held, "activation_checkpointing" in cfg), (key, peak, held)
        # and what it gathered, pass by pass, is what the same rules give (deepspeed.simulate: what predict times
        # for a run by DeepSpeed), the persistent parameters once after the step; hpZ's backward in its 2-rank group
        ds = simulate(m, held, "activation_checkpointing" in cfg)
        fwd, bwd = ds.elements
        persistent = m.num_params() - ds.partitioned
        gathered = moved[key].get(("all_gather_into_tensor", 2), 0.0), moved[key]["all_gather_into_tensor", 4]
        expected = (bwd, fwd + persistent) if key.startswith("hpz") else (0, fwd + bwd + persistent)
        assert gathered == pytest.approx(tuple(x / m.num_params() for x in expected), abs=0.005), (key, ds)
    non_root = model.num_params() - model.vocab * model.hidden - sum(persistent_params(model))
    # without a prefetch window, one sub-module beside the root (held all pass); the export's live cap leaves room
    # for its window beside the root and the sub-module running, so DeepSpeed prefetches: it holds more, gathers a
    # little less (what it prefetched past at the turn to backward stays), and launches a prefetch of several small
    # parameters as one all-gather, fewer collectives than the one per sub-module the model times
    assert found[0][2] == model.vocab * model.hidden + max(block_modules(model)) - model.ffn
    assert found[0][2] < found[2][2] < model.num_params(), found
    assert 1.9 < moved["export"]["all_gather_into_tensor", 4] < moved["zero3"]["all_gather_into_tensor", 4], moved
    gathers = {key: sum(op == "all_gather_into_tensor" for op, _, _ in calls[key]) for key in ("zero3", "export")}
    assert gathers["export"] < gathers["zero3"], gathers
    # a cap above what a step holds lets DeepSpeed keep every parameter its prefetch scanned past: the whole model,
    # as its defaults do
    assert found[4][2] == found[3][2] == model.vocab * model.hidden + non_root, found
    for key, m in moved.items():
        assert m["reduce_scatter_tensor", 4] == pytest.approx(1.0, abs=0.01), (key, m)
        assert {op for op, _ in m} <= {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"}, m
    assert 1.97 < moved["zero3"]["all_gather_into_tensor", 4] <= 2.0, moved
    assert 0.97 < moved["defaults"]["all_gather_into_tensor", 4] <= 1.0, moved
    assert 0.97 < moved["keep"]["all_gather_into_tensor", 4] <= 1.0, moved
    hpz = moved["hpz"]
    assert 0.97 < hpz["all_gather_into_tensor", 4] <= 1.0 and 0.9 < hpz["all_gather_into_tensor", 2] <= 1.0, hpz
    fp32 = 4  # a sub-module's weight gathers: above the persistence threshold and not the embeddings (or head)
    for key, m, modules, kept in (("zero3", model, 4, 8 * model.layers + 2), ("llama", llama, 7, 2 * llama.layers + 1)):
        embeddings = {m.vocab * m.hidden * fp32, m.position_numel * fp32}
        fetched = [n for op, n, ranks in calls[key] if op == "all_gather_into_tensor" and ranks == 4
                   and n > 10 * m.hidden * fp32 and n not in embeddings]
        assert len(fetched) == 2 * len(block_modules(m)) * m.layers == 2 * modules * 4, (key, sorted(fetched))
        # and after each optimizer step, every persistent parameter (norms, biases) in an all-gather of its own
        persistent = sorted(n // fp32 for op, n, ranks in calls[key] if op == "all_gather_into_tensor"
                            and ranks == 4 and n <= 10 * m.hidden * fp32)
        assert persistent == sorted(persistent_params(m)) and len(persistent) == kept, (key, persistent)
    # the strategy's gathers per reduction: the keep-all strategy's once, zero3's all but the root unit again
    # (the bytes zerotune's engine moves; predict times the deepspeed runner's second root gather apart)
    assert modelled["keep"] == pytest.approx(1.0) and 1.7 < modelled["zero3"] < 1.8, modelled
    # checkpointed (the harness wraps each block as the export's note says): DeepSpeed's forward hooks fire again
    # in the recompute, and the export's reuse distance (2 x a block) keeps what they gathered for the block's
    # backward, so it gathers each block twice a step, as the strategy does (with a reuse distance of 0 it gathered
    # three times: 2.49 of the parameters); it may keep the last block from forward into its recompute, one block
    # less than the strategy moves
    block = block_numel(model) / model.num_params()
    assert modelled["ckpt"] == pytest.approx(modelled["zero3"]), modelled
    assert modelled["ckpt"] - block < moved["ckpt"]["all_gather_into_tensor", 4] <= modelled["ckpt"] + 0.01, moved
    # with hpZ the recompute gathers inside the secondary group, as the strategy's backward does: nothing more
    # crosses the 4 ranks than in the uncheckpointed run, and the 2-rank gathers are the blocks' (the strategy's
    # backward gathers; the root is not gathered again), less at most the last block's
    hpz_ckpt, blocks = moved["hpz_ckpt"], model.layers * block
    assert 0.97 < hpz_ckpt["all_gather_into_tensor", 4] <= 1.0, hpz_ckpt
    assert blocks - block < hpz_ckpt["all_gather_into_tensor", 2] <= blocks + 0.01, hpz_ckpt


def test_selective_checkpointing_exports_its_policy_and_deepspeed_says_it_has_none() -> None:
    """FSDP2's snippet wraps each block with torch's selective-checkpoint contexts and the policy written out;
    DeepSpeed's config can only recompute whole blocks, and its notes say how to run the chosen policy."""
    cluster = parse_cluster("dgx-h100:2")
    s = build_strategy("zero3", cluster).replace(activation_checkpointing=True, checkpoint_policy="selective")
    f = fsdp_config(MODEL, cluster, s)
    assert f["checkpoint_policy"] == "selective"
    assert "checkpoint_wrapper(block, context_fn=selective)" in f["code"]
    assert "create_selective_checkpoint_contexts(policy)" in f["code"]
    assert fsdp_config(MODEL, cluster, s.replace(checkpoint_policy="full"))["checkpoint_policy"] == "full"
    assert fsdp_config(MODEL, cluster, s.replace(activation_checkpointing=False, checkpoint_policy="full")
                       )["checkpoint_policy"] is None
    every = s.replace(checkpoint_policy="full", checkpoint_every=2)
    assert "if (i + 1) % 2 == 0:" in fsdp_config(MODEL, cluster, every)["code"]
    assert any("checkpoint_every 2" in n for n in deepspeed_notes(MODEL, cluster, every))
    config, notes = deepspeed_config(MODEL, cluster, s), deepspeed_notes(MODEL, cluster, s)
    assert config["activation_checkpointing"]["number_checkpoints"] == MODEL.layers
    assert any("checkpoint_policy selective" in n and "create_selective_checkpoint_contexts" in n for n in notes)


def test_a_cpu_cluster_never_gets_what_deepspeed_lacks_there() -> None:
    """On CPU (gloo) DeepSpeed has no quantizer op (qwZ, qgZ: "This op had not been implemented on CPU backend") and,
    up to 0.19.6, MiCS's coalesced all-gather fails ("Backend gloo does not implement startCoalescing"): the export
    switches them off and its notes say so, the deepspeed runner's search leaves quantized points out, and a GPU
    cluster keeps them."""
    cpu, gpu = parse_cluster("local:2x2x2"), parse_cluster("frontier:48")
    quantized = {"preset": "zeropp", "weight_bits": 8, "grad_bits": 4}
    s = build_strategy(quantized, cpu)
    z = deepspeed_config(MODEL, cpu, s)["zero_optimization"]
    assert not z["zero_quantized_weights"] and not z["zero_quantized_gradients"]
    assert any("no CPU build" in n for n in deepspeed_notes(MODEL, cpu, s))
    on_gpu = deepspeed_config(MODEL, gpu, build_strategy(quantized, gpu))["zero_optimization"]
    assert on_gpu["zero_quantized_weights"] and on_gpu["zero_quantized_gradients"]
    mics = build_strategy("mics", cpu)
    assert "mics_shard_size" not in deepspeed_config(MODEL, cpu, mics, deepspeed_version="0.19.6")["zero_optimization"]
    assert any("startCoalescing" in n for n in deepspeed_notes(MODEL, cpu, mics, deepspeed_version="0.19.6"))
    assert "mics_shard_size" in deepspeed_config(MODEL, gpu, build_strategy("mics", gpu),
                                                 deepspeed_version="0.19.6")["zero_optimization"]
    assert "no CPU build" in (runner_rule("deepspeed", cpu, s) or "")
    assert runner_rule("deepspeed", gpu, build_strategy(quantized, gpu)) is None
