"""The user's config as the baseline: every preset's export reads back as the strategy the tool runs."""

from __future__ import annotations

from typing import Any

import pytest

from zerotune.costmodel.catalog import STRATEGY_PRESETS, build_strategy, parse_cluster, parse_model
from zerotune.errors import SpecError
from zerotune.tuner.baseline import parse_baseline, read_baseline_file
from zerotune.tuner.baseline_gain import same_strategy
from zerotune.tuner.exports import deepspeed_config, deepspeed_notes, fsdp_config

MODEL = parse_model("llama3-8b")
CLUSTERS = ("dgx-h100:4", "frontier:8")


def _builds(preset: str, cluster_name: str) -> bool:
    try:
        build_strategy(preset, parse_cluster(cluster_name))
    except SpecError:  # a preset of more levels than the cluster has
        return False
    return True


PAIRS = [(preset, name) for name in CLUSTERS for preset in sorted(STRATEGY_PRESETS) if _builds(preset, name)]
"""Every preset on every cluster it builds on: a preset that needs more levels is not a case, not a skip."""


def _without_notes(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "notes"}


@pytest.mark.parametrize(("preset", "cluster_name"), PAIRS)
@pytest.mark.parametrize("version", [None, "0.19.6"])
def test_deepspeed_export_reads_back_as_the_strategy_it_runs(preset: str, cluster_name: str, version: str | None
                                                            ) -> None:
    cluster = parse_cluster(cluster_name)
    s = build_strategy(preset, cluster)
    config = deepspeed_config(MODEL, cluster, s, global_batch=512, deepspeed_version=version)
    base = parse_baseline(config, MODEL, cluster)
    assert base.runner == "deepspeed" and base.global_batch == 512
    if not deepspeed_notes(MODEL, cluster, s, global_batch=512, deepspeed_version=version):
        assert same_strategy(base.strategy, s)  # an exact export reads back as the strategy itself
    # what DeepSpeed runs exports to the same config again
    assert deepspeed_config(MODEL, cluster, base.strategy, global_batch=512, deepspeed_version=version) == config


@pytest.mark.parametrize(("preset", "cluster_name"), PAIRS)
def test_fsdp_export_reads_back_as_the_strategy_it_runs(preset: str, cluster_name: str) -> None:
    cluster = parse_cluster(cluster_name)
    s = build_strategy(preset, cluster)
    config = fsdp_config(MODEL, cluster, s, global_batch=512)
    base = parse_baseline(config, MODEL, cluster)
    assert base.runner == "fsdp" and base.global_batch == 512
    if not config["notes"] or all("reduce_dtype=" in n for n in config["notes"]):
        assert same_strategy(base.strategy, s)
    assert _without_notes(fsdp_config(MODEL, cluster, base.strategy, global_batch=512)) == _without_notes(config)


def test_hf_trainer_auto_values_and_refusals_by_key() -> None:
    cluster = parse_cluster("dgx-h100:4")
    auto = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "bf16": {"enabled": "auto"}, "zero_optimization": {
                "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto", "overlap_comm": True}}
    base = parse_baseline(auto, MODEL, cluster, global_batch=256)
    h2 = MODEL.hidden ** 2
    assert base.global_batch == 256 and base.strategy.param_span == cluster.num_levels
    assert base.strategy.reduce_bucket_mb == pytest.approx(h2 * 2 / 1e6)
    assert base.strategy.allgather_bucket_mb == pytest.approx(0.9 * h2 * 2 / 1e6)
    cases: list[tuple[dict[str, Any], str]] = [
        ({**auto, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
         "baseline.zero_optimization.offload_optimizer"),
        ({**auto, "pipeline": {"stages": 2}}, "baseline.pipeline"),
        ({**auto, "zero_optimization": {"stage": 3, "mics_shard_size": 12}},
         "baseline.zero_optimization.mics_shard_size"),
        ({"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 1_000_000},
         "baseline.fsdp_min_num_params"),
        ({"parallelism": {"tensor_parallel_degree": 2}}, "baseline.parallelism.tensor_parallel_degree"),
        ({"parallelism": {"data_parallel_shard_degree": 3, "data_parallel_replicate_degree": -1}},
         "baseline.parallelism.data_parallel_shard_degree"),
    ]
    for data, field in cases:
        with pytest.raises(SpecError) as err:
            parse_baseline(data, MODEL, cluster)
        assert err.value.field == field, (field, str(err.value))


def test_accelerate_and_torchtitan_settings(tmp_path) -> None:
    cluster = parse_cluster("dgx-h100:4")  # 8 ranks a node, 32 in all
    accelerate = tmp_path / "accelerate.yaml"
    accelerate.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
                          "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_activation_checkpointing: true\n")
    data = read_baseline_file(str(accelerate))
    base = parse_baseline(data["fsdp_config"], MODEL, cluster)
    assert (base.strategy.param_span, base.strategy.optim_span) == (cluster.node_span, cluster.node_span)
    assert base.strategy.activation_checkpointing
    titan = tmp_path / "train.toml"
    titan.write_text("[parallelism]\ndata_parallel_shard_degree = 8\ndata_parallel_replicate_degree = 4\n"
                     "fsdp_reshard_after_forward = \"never\"\n[activation_checkpoint]\nmode = \"selective\"\n"
                     "selective_ac_option = \"op\"\n[training]\nlocal_batch_size = 2\nglobal_batch_size = 256\n")
    base = parse_baseline(read_baseline_file(str(titan)), MODEL, cluster)
    s = base.strategy
    assert (s.param_span, s.secondary_span, s.checkpoint_policy, s.micro_batch_size, s.grad_bits) == (
        cluster.node_span, 0, "selective", 2, 32)
    assert (base.runner, base.source, base.global_batch) == ("fsdp", "torchtitan", 256)


def test_the_gain_over_a_baseline_is_predicted_with_the_comparison_error() -> None:
    from zerotune.tuner.baseline_gain import compare
    cluster = parse_cluster("dgx-h100:4")
    zero3 = build_strategy("zero3", cluster)
    same = parse_baseline(deepspeed_config(MODEL, cluster, zero3, global_batch=256), MODEL, cluster)
    c = compare(MODEL, cluster, same, zero3, "deepspeed", global_batch=256)
    assert c["predicted"]["gain"] == pytest.approx(0.0, abs=1e-9)  # the baseline itself: no gain
    assert c["predicted"]["comparison_p90"] is not None and "deepspeed baseline: predicted +0.0%" in c["sentence"]
    ddp = parse_baseline({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, MODEL, cluster)
    c = compare(MODEL, cluster, ddp, zero3, "deepspeed", global_batch=256)
    assert not c["feasible"] and "not to fit" in c["sentence"]  # 8B replicated: 16 bytes a parameter > 80 GiB
    c = compare(MODEL, cluster, same, zero3, "deepspeed", global_batch=256, measured=(300.0, 250.0))
    assert c["measured"]["gain"] == pytest.approx(0.2) and "measured +20.0%" in c["sentence"]


def test_predict_takes_a_baseline_and_refuses_an_inexpressible_key_with_exit_2(tmp_path, capsys) -> None:
    import json

    from zerotune.api.cli import ExitStatus, main
    ds = tmp_path / "ds_config.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    args = ["predict", "--model", "llama3-8b", "--cluster", "dgx-h100:4", "--strategy", "zero3", "--global-batch",
            "256", "--baseline", str(ds)]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["baseline"]["strategy"]["grad_span"] == 2 and row["baseline"]["strategy"]["param_span"] == 0
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}))
    assert main(args) == ExitStatus.USAGE_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "baseline.zero_optimization.offload_optimizer" in err[0]


@pytest.mark.parametrize(("preset", "cluster_name"), PAIRS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_torchtitan_export_reads_back_as_the_strategy_it_runs(preset: str, cluster_name: str,
                                                              checkpointing: bool) -> None:
    import tomllib

    from zerotune.tuner.exports import torchtitan_config as export

    cluster = parse_cluster(cluster_name)
    s = build_strategy(preset, cluster, activation_checkpointing=checkpointing)
    config = export(MODEL, cluster, s, global_batch=512)
    base = parse_baseline(tomllib.loads(config["toml"]), MODEL, cluster)
    assert (base.runner, base.source, base.global_batch) == ("fsdp", "torchtitan", 512)
    assert export(MODEL, cluster, base.strategy, global_batch=512)["sections"] == config["sections"]


def test_torchtitan_selective_checkpointing_is_torchtitan_s_default_unless_op() -> None:
    """torchtitan's ``selective_ac_option`` defaults to "2" (every second block fully checkpointed: its
    ``ActivationCheckpoint`` config); "op" is the per-op policy."""
    cluster = parse_cluster("dgx-h100:4")
    layer = parse_baseline({"activation_checkpoint": {"mode": "selective"}}, MODEL, cluster).strategy
    assert (layer.checkpoint_policy, layer.checkpoint_every) == ("full", 2)
    op = parse_baseline({"activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}}, MODEL,
                        cluster).strategy
    assert (op.checkpoint_policy, op.checkpoint_every) == ("selective", 1)
    none = parse_baseline({"activation_checkpoint": {"mode": "none"}}, MODEL, cluster).strategy
    assert not none.activation_checkpointing and none.grad_bits == 32  # torchtitan reduces in float32 by default


def test_a_baseline_the_model_cannot_predict_at_the_batch_is_said_not_fatal_and_bounds_hold() -> None:
    from zerotune.tuner.baseline_gain import compare
    cluster = parse_cluster("dgx-h100:4")
    odd = parse_baseline({"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 3}}, MODEL, cluster)
    c = compare(MODEL, cluster, odd, build_strategy("zero3", cluster), "deepspeed", global_batch=256)
    assert c["predicted"] is None and "no prediction at 256 sequences" in c["sentence"]
    with pytest.raises(SpecError, match="reduce_bucket_mb"):
        parse_baseline({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e300}}, MODEL, cluster)


def test_the_prologue_client_sends_a_hugging_face_folder_and_a_baseline_inline(tmp_path, capsys) -> None:
    import json
    from pathlib import Path

    from zerotune.api.cli import main
    titan = tmp_path / "train.toml"
    titan.write_text("[parallelism]\ndata_parallel_shard_degree = 8\ndata_parallel_replicate_degree = 4\n")
    folder = Path(__file__).parent.parent / "data" / "hf" / "Qwen3-8B"
    assert main(["recommend", "--model", str(folder), "--cluster", "dgx-h100:4", "--baseline", str(titan),
                 "--dry-run", "--no-slurm"]) == 0
    body = json.loads(capsys.readouterr().out)["body"]
    assert body["model"]["model_type"] == "qwen3" and body["baseline"] == {
        "parallelism": {"data_parallel_shard_degree": 8, "data_parallel_replicate_degree": 4}}
