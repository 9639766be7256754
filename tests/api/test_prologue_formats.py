"""The prologue's formats for other tools (``--format torchtitan|accelerate|hf-trainer``) and its ``-o`` files:
``write_outputs`` on the built-in answer (built by the same exporters as the service's), each file read back by
its tool where the tool is installed (the ``dev`` extra)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.support import require_module
from zerotune.api.prologue import default_recommendation
from zerotune.api.prologue.outputs import write_outputs
from zerotune.errors import UsageError

BODY = {"model": "gpt-125m", "cluster": "frontier:2"}


def test_each_tool_format_to_stdout_and_to_a_file(tmp_path: Path) -> None:
    rec = default_recommendation(BODY)
    ex = rec["exports"]
    text, notes = write_outputs(rec, "torchtitan", None, None, "default", str(tmp_path))
    assert tomllib.loads(text) == ex["torchtitan"]["sections"]
    assert any(n.startswith("torchtitan: ") for n in notes)  # e.g. its fp32 gradient reductions
    text, _ = write_outputs(rec, "hf-trainer", None, None, "default", str(tmp_path))
    assert json.loads(text) == ex["hf-trainer"]["config"]
    out, notes = write_outputs(rec, "hf-trainer", str(tmp_path / "hf.json"), None, "default", str(tmp_path))
    assert out == "" and json.loads((tmp_path / "hf.training_args.json").read_text()) == \
        ex["hf-trainer"]["training_arguments"]
    assert (tmp_path / "hf.notes.txt").read_text().splitlines() == notes
    assert notes[0].startswith("HF Trainer: TrainingArguments(per_device_train_batch_size=")


def test_accelerate_writes_both_plugins_and_the_deepspeed_config_they_read(tmp_path: Path) -> None:
    require_module("accelerate", "pip install accelerate (the dev extra)")
    from accelerate.commands.config.config_args import load_config_from_file

    rec = default_recommendation(BODY)
    base = {"gradient_clipping": 0.5, "optimizer": {"type": "AdamW"}}
    write_outputs(rec, "accelerate", str(tmp_path / "acc.yaml"), base, "default", str(tmp_path))
    fsdp = load_config_from_file(str(tmp_path / "acc.yaml"))
    assert fsdp.fsdp_config["fsdp_version"] == 2 and fsdp.num_processes == 16
    ds = load_config_from_file(str(tmp_path / "acc.deepspeed.yaml"))
    path = Path(ds.deepspeed_config["deepspeed_config_file"])
    assert path == tmp_path / "acc.ds_config.json"
    merged = json.loads(path.read_text())  # the DeepSpeed export, merged into --base
    assert merged["optimizer"] == {"type": "AdamW"} and merged["gradient_clipping"] == 0.5
    assert merged["zero_optimization"] == rec["exports"]["deepspeed"]["zero_optimization"]


def test_env_writes_the_tool_files_and_names_them(tmp_path: Path) -> None:
    rec = default_recommendation(BODY)
    lines, _ = write_outputs(rec, "env", str(tmp_path / "job"), None, "default", str(tmp_path))
    exports = dict(line.removeprefix("export ").split("=", 1) for line in lines.splitlines())
    assert Path(exports["ZEROTUNE_TORCHTITAN_CONFIG"]).read_text() == rec["exports"]["torchtitan"]["toml"]
    assert Path(exports["ZEROTUNE_ACCELERATE_CONFIG"]).read_text() == rec["exports"]["accelerate"]["fsdp_yaml"]
    assert json.loads(Path(exports["ZEROTUNE_HF_TRAINER_CONFIG"]).read_text()) == rec["exports"]["hf-trainer"]["config"]
    ds_yaml = Path(exports["ZEROTUNE_ACCELERATE_DEEPSPEED_CONFIG"]).read_text()
    assert f"deepspeed_config_file: {json.dumps(exports['ZEROTUNE_DEEPSPEED_CONFIG'])}" in ds_yaml


def test_recommendations_written_into_one_folder_keep_their_own_files(tmp_path: Path) -> None:
    a = default_recommendation(BODY)
    b = default_recommendation({"model": "gpt-1.3b", "cluster": "frontier:4"})
    for name, rec in (("a.zt.json", a), ("b.zt.json", b)):
        write_outputs(rec, "zerotune", str(tmp_path / name), None, "default", str(tmp_path))
    for stem, rec in (("a.zt", a), ("b.zt", b)):
        written = json.loads((tmp_path / f"{stem}.json").read_text())
        assert f"--strategy {stem}.strategy.json" in written["command"]
        assert json.loads((tmp_path / f"{stem}.strategy.json").read_text()) == rec["exports"]["zerotune"]["strategy"]
    assert not (tmp_path / "strategy.json").exists()


def test_an_answer_stored_without_a_format_is_refused_by_name(tmp_path: Path) -> None:
    rec = default_recommendation(BODY)
    old = {**rec, "exports": {k: v for k, v in rec["exports"].items() if k in ("zerotune", "deepspeed", "fsdp")}}
    for fmt in ("torchtitan", "accelerate", "hf-trainer"):
        with pytest.raises(UsageError, match="no such export"):
            write_outputs(old, fmt, None, None, "default", str(tmp_path))
