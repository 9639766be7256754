"""Presets: clusters, models and named strategies, and the parsers that accept them.

A cluster string is ``NAME`` or ``NAME:N`` (N = size of the outermost level, e.g. nodes:
``frontier:48`` is 48 nodes = 384 GCDs), ``local:AxBxC`` for this machine (levels of the given
sizes, innermost first, nominal figures), or the path of a JSON file holding a ClusterSpec.
Strategy presets are resolved *against* a cluster, because spans count that cluster's levels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from zerotune.core.hf_config import is_hf_config, model_from_hf
from zerotune.core.spec import MAX_LEVEL_SIZE, MAX_LEVELS, ClusterSpec, Level, ModelSpec, Strategy, check_spans
from zerotune.costmodel.hardware import IBM_FSDP_7B
from zerotune.costmodel.profiles import PROFILES, profile_cluster
from zerotune.errors import SpecError, UnknownPresetError

# Figures from DESIGN.md §7, each level built from its link's profile (costmodel/hardware.py: bandwidth,
# achievable fraction and per-step latency, with their sources); the outermost size is set by NAME:N.
CLUSTERS: dict[str, ClusterSpec] = {name: profile_cluster(name, device, levels)
                                    for name, (device, levels) in PROFILES.items()}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt-tiny", layers=2, hidden=64, heads=4, vocab=512, seq_len=64),  # trains in seconds
        ModelSpec("gpt-mini", layers=4, hidden=256, heads=8, vocab=4096, seq_len=128),  # bench size
        ModelSpec("gpt-125m", layers=12, hidden=768, heads=12, vocab=50304, seq_len=2048),
        ModelSpec("gpt-1.3b", layers=24, hidden=2048, heads=16, vocab=50304, seq_len=2048),
        ModelSpec("gpt-7b", layers=32, hidden=4096, heads=32, vocab=50304, seq_len=2048),
        ModelSpec("gpt-13b", layers=40, hidden=5120, heads=40, vocab=50304, seq_len=2048),
        ModelSpec("gpt-neox-20b", layers=44, hidden=6144, heads=64, vocab=50432, seq_len=2048),
        # Llama 2 and 3 (Llama blocks: RMSNorm, rotary positions, SwiGLU; key/value heads; an untied head)
        IBM_FSDP_7B,  # llama2-7b: the model of the eager PyTorch efficiencies' source run
        ModelSpec("llama3-8b", layers=32, hidden=4096, heads=32, vocab=128256, seq_len=8192, ffn_hidden=14336,
                  kv_heads=8, tied_head=False, arch="llama"),
        ModelSpec("llama3-70b", layers=80, hidden=8192, heads=64, vocab=128256, seq_len=8192, ffn_hidden=28672,
                  kv_heads=8, tied_head=False, arch="llama"),
    )
}


def _local_cluster(sizes: list[int]) -> ClusterSpec:
    """This machine pretending to be a cluster: level i is 10/i GB/s (nominal, calibrated later)."""
    n = len(sizes)
    names = [f"level{i + 1}" for i in range(n)]
    if n >= 2:
        names[-2:] = ["node", "inter-node"]
    elif n == 1:
        names = ["node"]
    levels = tuple(Level(nm, s, 10.0 / (i + 1), 5.0 * (i + 1))
                   for i, (nm, s) in enumerate(zip(names, sizes, strict=True)))
    label = "local:" + "x".join(str(s) for s in sizes)
    return ClusterSpec(name=label, levels=levels, device="cpu", device_memory_gib=4.0, peak_tflops=0.1)


def parse_cluster(text: str | dict[str, Any] | ClusterSpec) -> ClusterSpec:
    """A ClusterSpec from a preset string (``frontier:48``, ``local:2x2``), a dict or a ClusterSpec; never a
    file (``costmodel.files`` reads those, for the command lines)."""
    if isinstance(text, ClusterSpec):
        return text
    if isinstance(text, dict):
        return ClusterSpec.from_dict(text)
    if not isinstance(text, str) or not text.strip():
        raise SpecError("cluster", text, "must be a preset like 'frontier:48' or 'local:2x2x2'")
    text = text.strip()
    name, _, count = text.partition(":")
    if name == "local":
        parts = count.split("x") if count else []
        if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise SpecError("cluster", text[:80], "local clusters are written local:AxBxC with sizes >= 1, "
                                                  "innermost first")
        if len(parts) > MAX_LEVELS or any(len(p) > 6 or int(p) > MAX_LEVEL_SIZE for p in parts):
            raise SpecError("cluster", text[:80], f"local clusters have at most {MAX_LEVELS} levels of at most "
                                                  f"{MAX_LEVEL_SIZE} ranks each")
        return _local_cluster([int(p) for p in parts])
    if name not in CLUSTERS:
        known = sorted(CLUSTERS) + ["local:AxB..."]
        raise UnknownPresetError("cluster", text, f"unknown cluster preset; known: {known}")
    base = CLUSTERS[name]
    if not count:
        return base
    if not count.isdigit() or int(count) < 1:
        raise SpecError("cluster", text,
                        f"the size after ':' must be a whole number of {base.levels[-1].name} groups >= 1")
    return dataclasses.replace(base.with_outer_size(int(count)), name=f"{name}:{int(count)}")


def parse_model(text: str | dict[str, Any] | ModelSpec) -> ModelSpec:
    """A ModelSpec from a preset name, a dict (a ModelSpec's fields, or a Hugging Face config: ``core.hf_config``) or
    a ModelSpec; never a file."""
    if isinstance(text, ModelSpec):
        return text
    if is_hf_config(text):
        return model_from_hf(text)  # type: ignore[arg-type]  # a dict with a model_type
    if isinstance(text, dict):
        return ModelSpec.from_dict(text)
    if text not in MODELS:
        raise UnknownPresetError("model", text, f"unknown model preset; known: {sorted(MODELS)}")
    return MODELS[text]


# Each preset maps a cluster to span/bits fields; L = num_levels, node = node_span.
STRATEGY_PRESETS: dict[str, tuple[str, Callable[[ClusterSpec], dict[str, Any]]]] = {
    "ddp": ("plain data parallel: everything replicated, gradients all-reduced (PyTorch DDP, DeepSpeed stage 0)",
            lambda c: {"param_span": 0, "grad_span": 0, "optim_span": 0}),
    "zero1": ("optimizer states sharded over the world", lambda c: {
        "param_span": 0, "grad_span": 0, "optim_span": c.num_levels}),
    "zero2": ("gradients and optimizer states sharded over the world", lambda c: {
        "param_span": 0, "grad_span": c.num_levels, "optim_span": c.num_levels}),
    "zero3": ("everything sharded over the world (DeepSpeed stage 3, FSDP FULL_SHARD)", lambda c: {
        "param_span": c.num_levels, "grad_span": c.num_levels, "optim_span": c.num_levels}),
    "mics": ("everything sharded inside a node, replicated across nodes (MiCS, FSDP HYBRID_SHARD)", lambda c: {
        "param_span": c.node_span, "grad_span": c.node_span, "optim_span": c.node_span}),
    "zeropp": ("ZeRO-3 + hpZ secondary inside the node + int8 weights + int4 gradients (ZeRO++)", lambda c: {
        "param_span": c.num_levels, "grad_span": c.num_levels, "optim_span": c.num_levels,
        "secondary_span": c.node_span, "weight_bits": 8, "grad_bits": 4, "quantize_above": 1}),
    "3level-a": ("AMSP-like: P over the innermost level, G over the node, OS over the world", lambda c: {
        "param_span": 1, "grad_span": c.node_span, "optim_span": c.num_levels}),
    "3level-b": ("ZeRO++ with hpZ on the innermost level; the innermost links stay 16-bit", lambda c: {
        "param_span": c.num_levels, "grad_span": c.num_levels, "optim_span": c.num_levels,
        "secondary_span": 1, "weight_bits": 8, "grad_bits": 4, "quantize_above": min(2, c.num_levels)}),
}


def build_strategy(spec: str | dict[str, Any] | Strategy, cluster: ClusterSpec, **overrides: Any) -> Strategy:
    """Resolve a preset name, dict or Strategy against ``cluster`` and validate it.

    Args:
        spec: ``"zeropp"``, a dict of Strategy fields (a dict may name a ``"preset"`` to start from), or a
            Strategy.
        cluster: the cluster the spans refer to.
        overrides: Strategy fields to change after the preset is expanded (``weight_bits=16``).
    """
    if isinstance(spec, Strategy):
        fields: dict[str, Any] = spec.to_dict()
    elif isinstance(spec, dict):
        fields = dict(spec)
        preset = fields.pop("preset", None)
        if preset is not None:
            fields = {**_preset_fields(preset, cluster), **fields}
    else:
        fields = _preset_fields(spec, cluster)
    fields.update(overrides)
    check_spans(fields, cluster)
    return Strategy.from_dict(fields).validate_for(cluster)


def _preset_fields(name: Any, cluster: ClusterSpec) -> dict[str, Any]:
    if name not in STRATEGY_PRESETS:
        raise UnknownPresetError("strategy", name, f"unknown strategy preset; known: {sorted(STRATEGY_PRESETS)}")
    fields = STRATEGY_PRESETS[name][1](cluster)
    if fields.get("secondary_span") is not None and fields["secondary_span"] >= fields["param_span"]:
        raise SpecError("strategy", name, f"needs a cluster with an hpZ level inside the param span; "
                        f"{cluster.name!r} has {cluster.num_levels} level(s)")
    return {**fields, "name": name}




def catalog() -> dict[str, Any]:
    """Everything the catalog holds, as JSON-friendly data (for the CLI and, later, the API)."""
    return {
        "clusters": {k: v.to_dict() for k, v in CLUSTERS.items()},
        "models": {k: {**v.to_dict(), "num_params": v.num_params()} for k, v in MODELS.items()},
        "strategies": {k: doc for k, (doc, _) in STRATEGY_PRESETS.items()},
    }


def device_matches(cluster_device: str, actual: str) -> bool:
    """Whether a run on ``actual`` (``torch.cuda.get_device_name``, or ``cpu (arch)``) ran on the cluster's
    device: the model token of the cluster's name (the first word with a digit: ``H100``, ``MI250X``)
    appears in the actual name; a ``cpu`` cluster matches any CPU."""
    want, got = cluster_device.lower(), actual.lower()
    if want == "cpu" or got.startswith("cpu"):
        return want == "cpu" and got.startswith("cpu")
    tokens = [t for t in want.replace("-", " ").split() if any(c.isdigit() for c in t)]
    return bool(tokens) and tokens[0] in got.replace("-", " ")
