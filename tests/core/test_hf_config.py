"""Hugging Face configs as models: parameter counts equal transformers' own, unsupported configs refused by key."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from zerotune.core.hf_config import DEFAULT_SEQ_LEN, model_from_hf
from zerotune.costmodel.catalog import parse_model
from zerotune.costmodel.files import load_model
from zerotune.errors import SpecError

DATA = Path(__file__).parent.parent / "data" / "hf"
DENSE = sorted(p.name for p in DATA.iterdir() if p.name != "Qwen3-30B-A3B")


def config(name: str) -> dict:
    return json.loads((DATA / name / "config.json").read_text())


@pytest.mark.parametrize("name", DENSE)
def test_parameter_count_equals_transformers(name: str) -> None:
    torch = pytest.importorskip("torch")
    from tests.support import require_module
    transformers = require_module("transformers", "pip install -e '.[dev]'")
    cfg = transformers.AutoConfig.from_pretrained(DATA / name)
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(cfg)
    expected = sum(p.numel() for p in built.parameters())  # a tied head's weight is one parameter, counted once
    model = load_model(str(DATA / name))
    assert model.num_params() == expected, (name, model.num_params() - expected)
    lookup = model.untied_head_numel
    assert model.flops_per_token() == 6 * (expected - lookup) + 12 * model.layers * model.hidden * model.seq_len


def test_families_map_to_their_blocks() -> None:
    qwen2, qwen3, olmo = (load_model(str(DATA / n)) for n in ("Qwen2.5-7B", "Qwen3-8B", "OLMo-2-1124-7B"))
    assert (qwen2.arch, qwen2.qkv_bias, qwen2.qk_norm, qwen2.kv_heads) == ("llama", True, "none", 4)
    assert (qwen3.qk_norm, olmo.qk_norm, olmo.kv_heads) == ("head", "full", None)
    neox, gpt2 = load_model(str(DATA / "pythia-1b")), load_model(str(DATA / "gpt2" / "config.json"))
    assert (neox.arch, neox.positions, neox.tied_head, neox.ffn) == ("gpt", 0, False, 8192)
    assert (gpt2.arch, gpt2.positions, gpt2.tied_head, gpt2.seq_len) == ("gpt", 1024, True, 1024)
    assert gpt2.num_params() == 124_439_808  # GPT-2 small
    llama = load_model(str(DATA / "Llama-3.1-8B"))
    assert llama.name == "Llama-3.1-8B" and llama.seq_len == DEFAULT_SEQ_LEN
    assert llama.num_params() == parse_model("llama3-8b").num_params()
    assert load_model(f"{DATA / 'Llama-3.1-8B'}:8192").seq_len == 8192


def test_inline_object_and_its_seq_len() -> None:
    cfg = {**config("Qwen2.5-0.5B"), "seq_len": 2048}
    model = parse_model(cfg)
    assert model.seq_len == 2048 and model.tied_head and model.qkv_bias
    again = type(model).from_dict(model.to_dict())
    assert again == model  # the ModelSpec it becomes round-trips through its own JSON


@pytest.mark.parametrize(("change", "field"), [
    ({"num_experts": 8}, "model.num_experts"),
    ({"model_type": "falcon"}, "model.model_type"),
    ({"head_dim": 256}, "model.head_dim"),
    ({"mlp_bias": True}, "model.mlp_bias"),
    ({"attention_bias": True}, "model.attention_bias"),
    ({"hidden_act": "gelu"}, "model.hidden_act"),
    ({"num_key_value_heads": 5}, "model.num_key_value_heads"),
    ({"sliding_window": 1024}, "model.sliding_window"),
])
def test_unsupported_configs_are_refused_by_key(change: dict, field: str) -> None:
    cfg = {**copy.deepcopy(config("Mistral-7B-v0.1")), **change}
    with pytest.raises(SpecError) as err:
        model_from_hf(cfg)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_mixture_of_experts_file_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        load_model(str(DATA / "Qwen3-30B-A3B"))
    assert err.value.field == "model.num_local_experts"  # transformers 5 writes Qwen3-MoE's experts so


@pytest.mark.parametrize("change", [{"qkv_bias": True}, {"qk_norm": "head"}, {"qk_norm": "full", "kv_heads": 2},
                                    {"arch": "gpt", "positions": 0}, {"arch": "gpt", "positions": 96}])
def test_engine_builds_each_variant_with_its_parameter_count(change: dict) -> None:
    torch = pytest.importorskip("torch")
    from zerotune.core.spec import ModelSpec
    from zerotune.trainer.gpt import build_gpt
    fields: dict[str, Any] = {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32,
                              "arch": "llama", "tied_head": False, **change}
    spec = ModelSpec(**fields)
    gpt = build_gpt(spec)
    assert sum(p.numel() for p in gpt.parameters()) == spec.num_params()
    idx = torch.randint(0, 128, (2, 32))
    loss = gpt(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)


def test_spec_rules_of_the_new_fields() -> None:
    from zerotune.core.spec import ModelSpec
    base: dict[str, Any] = {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32}
    with pytest.raises(SpecError, match="model.qkv_bias"):
        ModelSpec(**base, qkv_bias=True)  # a GPT block
    with pytest.raises(SpecError, match="model.positions"):
        ModelSpec(**base, arch="llama", positions=64)
    with pytest.raises(SpecError, match="model.seq_len"):
        ModelSpec(**base, positions=16)
    # the new fields at their defaults leave the JSON (and a request's key) as it was
    assert ModelSpec(**base).to_dict() == {**base, "ffn_hidden": None}


def test_sliding_window_longer_than_the_sequence_is_fine() -> None:
    assert load_model(str(DATA / "Mistral-7B-v0.1")).seq_len == 4096  # window 4096: every token sees them all
    with pytest.raises(SpecError, match="sliding_window"):
        load_model(f"{DATA / 'Mistral-7B-v0.1'}:8192")


@pytest.mark.parametrize("name", DENSE)
def test_the_cost_model_books_every_parameter_of_each_family(name: str) -> None:
    """DeepSpeed's whole-kept vectors (``persistent_params``: norms, biases, q/k norms) and the block's matmuls, the
    embeddings, an untied head and a position table add up to the ModelSpec's count: what the cost model gathers
    and keeps is the model's."""
    from zerotune.costmodel.runners import persistent_params
    from zerotune.costmodel.traffic import block_matmuls
    m = load_model(str(DATA / name))
    matrices = m.layers * sum(n_in * n_out for n_in, n_out in block_matmuls(m))
    root = m.vocab * m.hidden + m.untied_head_numel + m.position_numel
    assert sum(persistent_params(m)) + matrices + root == m.num_params()


def test_a_config_beyond_the_services_bounds_is_refused_by_field() -> None:
    with pytest.raises(SpecError) as err:
        model_from_hf({**config("Llama-2-7b"), "num_hidden_layers": 10**9})
    assert err.value.field == "model.layers"
