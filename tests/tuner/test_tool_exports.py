"""The torchtitan, Accelerate and HF Trainer exports, each read by its tool's own code: torchtitan's
``ConfigManager``, accelerate's ``load_config_from_file`` and plugin, transformers' ``HfTrainerDeepSpeedConfig``.
The tools are test dependencies only (the ``dev`` extra); under CI=true a missing one fails."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from tests.support import require_module
from zerotune.costmodel.catalog import build_strategy, parse_cluster, parse_model
from zerotune.tuner.exports import accelerate_config, deepspeed_config, hf_trainer_config, torchtitan_config

CASES = [  # (model, cluster, strategy): ZeRO-3 with hpZ, HSDP with full checkpointing, ZeRO-2, selective
    ("gpt-neox-20b", "dgx-h100:4", {"preset": "zero3", "secondary_span": 1}),
    ("gpt-neox-20b", "dgx-h100:4", {"preset": "zero3", "optim_span": 1, "grad_span": 1, "param_span": 1,
                                    "activation_checkpointing": True}),
    ("gpt-neox-20b", "frontier:48", {"preset": "zero2", "micro_batch_size": 2}),
    ("gpt-125m", "local:2x2", {"preset": "zero3", "activation_checkpointing": True, "checkpoint_policy": "selective"}),
]


def _case(i: int) -> tuple[Any, Any, Any]:
    model, cluster, spec = CASES[i]
    c = parse_cluster(cluster)
    return parse_model(model), c, build_strategy(spec, c)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_torchtitan_config_manager_reads_the_export(i: int) -> None:
    config_mod = require_module("torchtitan.config", "pip install torchtitan (the dev extra)")
    model, cluster, strategy = _case(i)
    gb = cluster.world_size * strategy.micro_batch_size * 2
    out = torchtitan_config(model, cluster, strategy, global_batch=gb)
    base = ["--module", "tests.tuner.torchtitan_job", "--config", "job"]
    job = config_mod.ConfigManager().parse_args(base + out["args"])
    p, t = job.parallelism, job.training
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == cluster.world_size
    assert (t.local_batch_size, t.global_batch_size) == (strategy.micro_batch_size, gb)
    assert p.fsdp_reshard_after_forward == ("never" if strategy.param_span == 0 else "always")
    mode = strategy.recompute if strategy.recompute in ("full", "selective") else "none"
    ac = job.activation_checkpoint
    assert (ac is None) if mode == "none" else type(ac).__qualname__.startswith({"full": "FullAC",
                                                                                 "selective": "SelectiveAC"}[mode])
    # the TOML holds the same keys and values: each [section] key is the override --section.key
    sections = tomllib.loads(out["toml"])
    assert sections == out["sections"]
    flags = [x for sec in ("parallelism", "training") for k, v in sections[sec].items()
             for x in (f"--{sec}.{k}", str(v))] + [f"activation-checkpoint:{sections['activation_checkpoint']['mode']}"]
    assert config_mod.ConfigManager().parse_args(base + flags) == job
    if strategy.secondary_span is not None and strategy.param_span:
        assert any("partial reshard" in n for n in out["notes"])


def test_torchtitan_config_manager_refuses_a_key_it_lacks() -> None:
    config_mod = require_module("torchtitan.config", "pip install torchtitan (the dev extra)")
    with pytest.raises(SystemExit):  # the test module is a real loader: a misspelt key does not pass
        config_mod.ConfigManager().parse_args(["--module", "tests.tuner.torchtitan_job", "--config", "job",
                                               "--parallelism.data_parallel_shard_degre", "4"])


@pytest.mark.parametrize("i", range(len(CASES)))
def test_accelerate_loads_both_plugins(i: int, tmp_path, monkeypatch) -> None:
    require_module("accelerate", "pip install accelerate (the dev extra)")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    model, cluster, strategy = _case(i)
    out = accelerate_config(model, cluster, strategy)
    (tmp_path / "fsdp.yaml").write_text(out["fsdp_yaml"])
    (tmp_path / "ds.yaml").write_text(out["deepspeed_yaml"])
    fsdp = load_config_from_file(str(tmp_path / "fsdp.yaml"))
    assert fsdp.distributed_type == DistributedType.FSDP
    assert fsdp.num_processes == cluster.world_size and fsdp.mixed_precision == "bf16"
    assert fsdp.fsdp_config["fsdp_version"] == 2
    assert fsdp.fsdp_config["fsdp_reshard_after_forward"] is (strategy.param_span > 0)
    assert fsdp.fsdp_config["fsdp_activation_checkpointing"] is strategy.activation_checkpointing
    par = fsdp.parallelism_config or {}
    replicate = par.get("parallelism_config_dp_replicate_size", 1)
    shard = par.get("parallelism_config_dp_shard_size", cluster.world_size)
    assert replicate * shard == cluster.world_size
    # the FSDP plugin accelerate builds in each rank from the variables its launcher sets from these keys
    # (accelerate/utils/launch.py prepare_multi_gpu_env)
    c = fsdp.fsdp_config
    for name, value in (("ACCELERATE_USE_FSDP", "true"), ("FSDP_VERSION", str(c["fsdp_version"])),
                        ("FSDP_RESHARD_AFTER_FORWARD", str(c["fsdp_reshard_after_forward"]).lower()),
                        ("FSDP_AUTO_WRAP_POLICY", str(c["fsdp_auto_wrap_policy"])),
                        ("FSDP_STATE_DICT_TYPE", str(c["fsdp_state_dict_type"])),
                        ("FSDP_ACTIVATION_CHECKPOINTING", str(c["fsdp_activation_checkpointing"]).lower())):
        monkeypatch.setenv(name, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is (strategy.param_span > 0)
    assert plugin.activation_checkpointing is strategy.activation_checkpointing
    ds = load_config_from_file(str(tmp_path / "ds.yaml"))
    assert ds.distributed_type == DistributedType.DEEPSPEED
    assert ds.deepspeed_config["deepspeed_config_file"] == out["deepspeed_config_file"]
    assert ds.deepspeed_config["zero3_init_flag"] is (strategy.param_span > 0)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_hf_trainer_fills_only_its_own_keys_and_matches_the_measured_config(i: int) -> None:
    require_module("transformers", "pip install transformers (the dev extra)")
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    model, cluster, strategy = _case(i)
    gb = cluster.world_size * strategy.micro_batch_size * 2
    out = hf_trainer_config(model, cluster, strategy, global_batch=gb)
    measured = deepspeed_config(model, cluster, strategy, global_batch=gb)
    autos = {k for k, v in out["config"].items() if v == "auto"}
    assert autos == {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                     "gradient_clipping"}
    hf = HfTrainerDeepSpeedConfig(out["config"])
    args = TrainingArguments(output_dir="unused", report_to=[], use_cpu=True, **out["training_arguments"])
    # trainer_config_process multiplies by TrainingArguments.world_size, this process's (1): the check scales by
    # the cluster's ranks
    hf.trainer_config_process(args)
    hf.trainer_config_finalize(args, None, 100)
    cfg = hf.config
    assert cfg["train_micro_batch_size_per_gpu"] == measured["train_micro_batch_size_per_gpu"]
    assert cfg["gradient_accumulation_steps"] == measured["gradient_accumulation_steps"]
    assert cfg["train_batch_size"] * cluster.world_size == measured["train_batch_size"]
    assert cfg["gradient_clipping"] == measured["gradient_clipping"]
    assert cfg["bf16"]["enabled"] is True
    assert cfg["zero_optimization"] == measured["zero_optimization"]
    # the Trainer's defaults with the plain export: a mismatch it refuses; with the hf-trainer export it cannot
    plain = HfTrainerDeepSpeedConfig({**measured, "train_micro_batch_size_per_gpu": measured[
        "train_micro_batch_size_per_gpu"] + 7})
    defaults = TrainingArguments(output_dir="unused", report_to=[], use_cpu=True)
    plain.trainer_config_process(defaults)
    with pytest.raises(ValueError, match="mismatch"):
        plain.trainer_config_finalize(defaults, None, 100)


@pytest.mark.parametrize("layout", ["hf-causal-lm", "hf-base", "gpt2", "neox", "blocks"])
def test_the_fsdp_snippet_finds_the_blocks_of_common_model_classes(layout: str, monkeypatch) -> None:
    """The FSDP2 snippet, run as written with ``fully_shard`` and the mesh recorded instead of run (the snippet's
    training under torchrun is tests/tuner/fsdp_snippet_check.py), wraps each block of each layout and the root,
    and clips gradients in code."""
    import torch
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp_mod

    from zerotune.tuner.exports import fsdp_config

    sharded: list[Any] = []
    monkeypatch.setattr(fsdp_mod, "fully_shard", lambda module, **kw: sharded.append(module))
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **kw: "mesh")
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    holder = {"hf-causal-lm": ("model", "layers"), "hf-base": ("layers",), "gpt2": ("transformer", "h"),
              "neox": ("gpt_neox", "layers"), "blocks": ("blocks",)}[layout]
    model = torch.nn.Module()
    parent = model
    for name in holder[:-1]:
        parent.add_module(name, torch.nn.Module())
        parent = getattr(parent, name)
    parent.add_module(holder[-1], layers)
    model.add_module("norm", torch.nn.LayerNorm(4))
    cluster = parse_cluster("local:2x2")
    code = fsdp_config(parse_model("gpt-125m"), cluster, build_strategy("zero3", cluster))["code"]
    scope: dict[str, Any] = {"model": model}
    exec(compile(code, "<fsdp export>", "exec"), scope)
    assert sharded == [*layers, model]
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    norm = scope["clip_gradients"](model)
    assert float(norm) > 1.0
    total = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))
    assert float(total) == pytest.approx(1.0, rel=1e-4)
    with pytest.raises(ValueError, match="no transformer blocks"):
        scope["transformer_blocks"](torch.nn.Linear(2, 2))
