"""A ModelSpec from a Hugging Face ``config.json``: the dense decoder families whose blocks zerotune models.

Pure Python, no transformers: the keys are read as transformers' config classes define them (their defaults where a
file leaves a key out), and the parameter count of the ModelSpec is that of the model transformers builds from the
same config (``tests/core/test_hf_config.py`` instantiates each family on the meta device and counts).

- ``llama``, ``mistral``: Llama blocks (RMSNorm, rotary positions, SwiGLU), grouped-query attention, tied or untied
  head (``tie_word_embeddings``).
- ``qwen2``: Llama blocks with biases on the query, key and value projections (``Qwen2Attention``).
- ``qwen3``: Llama blocks with an RMSNorm of each head's queries and keys (``q_norm`` / ``k_norm``).
- ``olmo2``: Llama blocks with the norms after attention and MLP (as many weights) and an RMSNorm over all the heads'
  queries and keys.
- ``gpt_neox``: GPT blocks (LayerNorm, biases, GELU MLP) with rotary positions and an untied head (Pythia).
- ``gpt2``: GPT blocks with a learned table of ``n_positions`` rows and a tied head.

What the model cannot express is refused with one :class:`SpecError` naming the key: mixture of experts, another
``model_type``, a head width other than hidden / heads, biases the blocks do not have, a sliding window shorter than
the sequence (it would change the attention FLOPs).
"""

from __future__ import annotations

from typing import Any

from zerotune.core.fields import described
from zerotune.core.spec import ModelSpec
from zerotune.errors import SpecError

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "olmo2")
"""The ``model_type`` values of Llama-shaped blocks."""
GPT_TYPES = ("gpt_neox", "gpt2")
"""The ``model_type`` values of GPT-shaped blocks."""
MODEL_TYPES = LLAMA_TYPES + GPT_TYPES

DEFAULT_SEQ_LEN = 4096
"""The training sequence length when the object names none (``seq_len``): the model's longest
(``max_position_embeddings``, ``n_positions``) where that is shorter. A config says how long a model *can* read, not
how long the user trains: 4,096 is Llama 2's pretraining context length (Touvron et al. 2023, arXiv:2307.09288,
§2.2 and Table 1) and OLMo 2's (``max_position_embeddings`` of allenai/OLMo-2-1124-7B's config.json); a request
names its own with ``seq_len`` beside the config's keys."""

EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
"""Keys of mixture-of-experts configs (Mixtral, Qwen2-MoE / Qwen3-MoE, DeepSeek, OLMoE)."""

TIED_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "olmo2": False,
                "gpt_neox": False, "gpt2": True}
"""``tie_word_embeddings`` where a config leaves it out: each config class's default in transformers."""


def is_hf_config(data: Any) -> bool:
    """Whether ``data`` is a Hugging Face config (it has a ``model_type``), not a ModelSpec's fields."""
    return isinstance(data, dict) and "model_type" in data


def _int(cfg: dict[str, Any], key: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"model.{key}", value, "must be a whole number >= 1 (a Hugging Face config key)")
    return value


def _refuse(cfg: dict[str, Any], key: str, rule: str, ok: Any) -> None:
    if key in cfg and cfg[key] not in ok:
        raise SpecError(f"model.{key}", cfg[key], rule)


def model_from_hf(cfg: dict[str, Any], name: str | None = None, seq_len: int | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face config ``cfg`` (the dict of its ``config.json``).

    Args:
        cfg: the config's keys; a ``seq_len`` key beside them is the training sequence length.
        name: the model's name (a file's folder); else the config's ``_name_or_path``' last part or its type.
        seq_len: the training sequence length, over ``cfg["seq_len"]`` and ``DEFAULT_SEQ_LEN``.
    """
    kind = cfg.get("model_type")
    for key in EXPERT_KEYS:
        if cfg.get(key) not in (None, 0, 1):
            raise SpecError(f"model.{key}", cfg[key], "mixture-of-experts models are not modelled (dense decoders "
                            f"only: {', '.join(MODEL_TYPES)})")
    if kind not in MODEL_TYPES:
        raise SpecError("model.model_type", kind, f"not a modelled family; known: {', '.join(MODEL_TYPES)}")
    gpt2 = kind == "gpt2"
    hidden = _int(cfg, "n_embd" if gpt2 else "hidden_size", 768 if gpt2 else None)
    heads = _int(cfg, "n_head" if gpt2 else "num_attention_heads", 12 if gpt2 else None)
    layers = _int(cfg, "n_layer" if gpt2 else "num_hidden_layers", 12 if gpt2 else None)
    vocab = _int(cfg, "vocab_size", 50257 if gpt2 else None)
    longest = _int(cfg, "n_positions" if gpt2 else "max_position_embeddings", 1024 if gpt2 else 2048)
    seq = seq_len if seq_len is not None else cfg.get("seq_len", min(longest, DEFAULT_SEQ_LEN))
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise SpecError("model.seq_len", seq, "must be a whole number >= 1")
    if hidden % heads:
        raise SpecError("model.num_attention_heads", heads, f"must divide hidden_size={hidden}")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise SpecError("model.head_dim", head_dim, f"heads of another width than hidden_size / num_attention_heads "
                        f"= {hidden // heads} are not modelled")
    tied = cfg.get("tie_word_embeddings", TIED_DEFAULT[kind])
    if not isinstance(tied, bool):
        raise SpecError("model.tie_word_embeddings", tied, "must be true or false")
    label = name or str(cfg.get("_name_or_path") or kind).rstrip("/").rsplit("/", 1)[-1] or str(kind)
    common: dict[str, Any] = {"name": label[:64], "layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab,
                              "seq_len": seq, "tied_head": tied}
    if kind in GPT_TYPES:
        if gpt2:
            ffn = 4 * hidden if cfg.get("n_inner") is None else _int(cfg, "n_inner")
            return _bounded(ModelSpec(**common, ffn_hidden=ffn, positions=longest))
        _refuse(cfg, "attention_bias", "GPT-NeoX without attention biases is not modelled", (True,))
        ffn = _int(cfg, "intermediate_size")
        return _bounded(ModelSpec(**common, ffn_hidden=ffn, positions=0))
    _refuse(cfg, "hidden_act", "Llama-shaped blocks are modelled with SwiGLU (silu) only", ("silu",))
    _refuse(cfg, "mlp_bias", "MLP biases are not modelled for Llama-shaped blocks", (False, None))
    if kind != "qwen2":  # Qwen2's q, k and v always have biases (and o none); elsewhere the key adds o's too
        _refuse(cfg, "attention_bias", "attention biases on every projection are not modelled", (False, None))
    windowed = cfg.get("use_sliding_window", True) if kind in ("qwen2", "qwen3") else True
    window = cfg.get("sliding_window")
    if windowed and window is not None and window < seq:
        raise SpecError("model.sliding_window", window, f"a window shorter than seq_len={seq} changes the "
                        "attention's FLOPs and is not modelled (train at most that long)")
    kv = _int(cfg, "num_key_value_heads", heads) if cfg.get("num_key_value_heads") is not None else heads
    if heads % kv:
        raise SpecError("model.num_key_value_heads", kv, f"must divide num_attention_heads={heads}")
    return _bounded(ModelSpec(**common, ffn_hidden=_int(cfg, "intermediate_size"), kv_heads=None if kv == heads else kv,
                              arch="llama", qkv_bias=kind == "qwen2",
                              qk_norm={"qwen3": "head", "olmo2": "full"}.get(str(kind), "none")))


def _bounded(model: ModelSpec) -> ModelSpec:
    """``model``, within the bounds the service takes for a ModelSpec's fields (``About.api_max``)."""
    for d in described(ModelSpec):
        value = getattr(model, d.name)
        if d.about.api_max is not None and isinstance(value, int) and value > d.about.api_max:
            raise SpecError(f"model.{d.name}", value, f"must be <= {d.about.api_max:g}")
    return model
