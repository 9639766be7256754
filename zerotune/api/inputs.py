"""What clients send: the request bodies (pydantic v2), each ``XCreate``, built from the value it describes.

A body's fields are its value's own (``core.fields.about``: type, default, description and rule), so each field is
written once: ``LevelCreate``, ``ClusterCreate``, ``ModelCreate`` and ``StrategyCreate`` take the fields of
``Level``, ``ClusterSpec``, ``ModelSpec`` and ``Strategy``; ``RecommendationCreate`` those of a tuning request
(``core.fields.Options``, placed where ``About.body`` says) beside its model and cluster. Input bounds are the
service's, not the science's (``About.api_max`` and the lengths): they keep every stored number finite and every id
inside the database's integer range, so no input can reach a 500.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator

from zerotune.core.cluster import ClusterSpec, Level
from zerotune.core.fields import MAX_ID, Described, Options, described
from zerotune.core.spec import ModelSpec
from zerotune.core.strategy import Strategy


class _In(BaseModel):
    """Every request body: no unknown fields, no NaN or infinity, and no coercion (``"5"`` or ``true``
    is not the integer a field asks for). Subclasses that set ``model_config`` (for examples) keep these:
    pydantic merges a subclass's config into its parent's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


def _annotation(d: Described, nested: dict[type, type[BaseModel]]) -> Any:
    """The pydantic type of field ``d``: its choices as a Literal, a tuple of values as a list of their bodies."""
    if d.about.choices:
        kind: Any = Literal[d.about.choices]
    elif typing.get_origin(d.kind) is tuple:
        kind = list[nested[typing.get_args(d.kind)[0]]]  # type: ignore[misc]  # a body model built at import
    else:
        kind = d.kind
    return kind | None if d.nullable else kind


def _field(d: Described) -> Any:
    """The pydantic ``Field`` of ``d``: its default (the API's own where the value requires it), its description
    and its rule."""
    rule = d.about
    default = d.default if d.default is not dataclasses.MISSING else (rule.api_default or ...)
    bounds: dict[str, Any] = {"ge": rule.minimum, "gt": rule.above, "le": rule.api_max, "min_length": rule.min_length,
              "max_length": rule.max_length}
    if d.kind is float:
        bounds["allow_inf_nan"] = False
    return Field(default, description=rule.doc, **{k: v for k, v in bounds.items() if v is not None})


def body_of(cls: type, nested: dict[type, type[BaseModel]] | None = None) -> type[BaseModel]:
    """A body model with the fields of dataclass ``cls`` that a body carries (``About.body``; a dotted place, such
    as ``budget.trials``, inside an object of its own: ``Budget``). ``nested``: the body model of each value type
    a field holds a tuple of."""
    fields: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for d in described(cls):
        if d.about.body is None:
            continue
        *path, name = d.label.split(".")
        assert len(path) <= 1, f"{cls.__name__}.{d.name}: a body nests one object deep ({d.label})"
        if path:
            fields.setdefault(path[0], None)  # the object takes the place of its first field
            groups.setdefault(path[0], {})[name] = (_annotation(d, nested or {}), _field(d))
        else:
            fields[name] = (_annotation(d, nested or {}), _field(d))
    for group, members in groups.items():
        model = create_model(group.capitalize(), __base__=_In, __module__=__name__, **members)
        fields[group] = (model, Field(default_factory=model))
    return create_model(f"{cls.__name__}Fields", __base__=_In, __module__=__name__, **fields)


MAX_DEPTH = 32
"""How deep an uploaded run.json may nest (lists and objects) before it is refused."""


def check_plain_json(value: Any, field: str, depth: int = 0) -> None:
    """Refuse what a stored trial could not serve back: NaN or infinite numbers, or nesting deeper
    than ``MAX_DEPTH`` (JSON has neither, and a deep value fails to render later)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{field.split('.')[0].split('[')[0]}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: {value!r} is not a finite number (JSON has no NaN or Infinity)")
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain_json(item, f"{field}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_plain_json(item, f"{field}[{i}]", depth + 1)


class LevelCreate(body_of(Level)):  # type: ignore[misc]  # the fields of a Level
    """One tier of the interconnect, innermost first."""


class ClusterCreate(body_of(ClusterSpec, {Level: LevelCreate})):  # type: ignore[misc]  # a ClusterSpec's fields
    """An explicit ClusterSpec (``zerotune validate --json`` prints one to start from)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "my-cluster", "device": "NVIDIA H100 80GB", "device_memory_gib": 80, "peak_tflops": 989,
        "levels": [{"name": "node", "size": 8, "bandwidth_gbps": 450, "latency_us": 3},
                   {"name": "inter-node", "size": 16, "bandwidth_gbps": 50, "latency_us": 8}]}]})


class ModelCreate(body_of(ModelSpec)):  # type: ignore[misc]  # the fields of a ModelSpec
    """An explicit ModelSpec: a decoder-only GPT-2 (``arch`` "gpt") or Llama (``arch`` "llama": RMSNorm, rotary
    positions, SwiGLU of width ffn_hidden, no biases; kv_heads and tied_head false as the model has them)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "name": "my-gpt", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "seq_len": 2048}]})


class StrategyCreate(body_of(Strategy)):  # type: ignore[misc]  # the fields of a Strategy
    """An explicit Strategy (spans count the cluster's levels, innermost first)."""


class HfConfigCreate(BaseModel):
    """A Hugging Face ``config.json``'s object (``core.hf_config``: Llama, Mistral, Qwen2/3, OLMo 2, GPT-NeoX, GPT-2),
    with an optional ``seq_len`` beside its keys (the training sequence length)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, json_schema_extra={"examples": [{
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
        "seq_len": 8192}]})

    model_type: str = Field(min_length=1, max_length=64, description="the model family (transformers' model_type)")

    @model_validator(mode="after")
    def _plain_extra(self) -> HfConfigCreate:
        for key, value in (self.model_extra or {}).items():
            check_plain_json(value, key)
        return self


PresetName = Annotated[str, Field(min_length=1)]
"""A preset's name: never empty (``GET /v1/catalog`` lists them)."""

ModelField = Annotated[PresetName | ModelCreate | HfConfigCreate, Field(
    description="a preset name (GET /v1/catalog), an explicit ModelSpec or a Hugging Face config.json's object",
    examples=["gpt-neox-20b"])]
ClusterField = Annotated[PresetName | ClusterCreate, Field(
    description="a preset (frontier:48, dgx-h100:4, local:2x2) or an explicit ClusterSpec", examples=["frontier:48"])]


class RecommendationCreate(body_of(Options)):  # type: ignore[misc]  # a request's fields (core.fields.Options)
    """What to tune. Equivalent requests (after presets are expanded and defaults filled) share one answer."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"model": "gpt-neox-20b", "cluster": "frontier:48", "executor": "model", "budget": {"trials": 40}},
        {"model": "gpt-tiny", "cluster": "local:2x2", "executor": "local", "budget": {"trials": 4}},
    ]})

    model: ModelField
    cluster: ClusterField


class TrialCreate(BaseModel):
    """A run.json measured elsewhere (``zerotune train --out run.json`` on a real cluster).

    Its ``model``, ``cluster`` and ``strategy`` say what ran; every other field is stored as the
    trial's metrics. It counts as measured evidence for later studies (warm starts, calibration).
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True, json_schema_extra={"examples": [{
        "status": "ok", "model": "gpt-tiny", "cluster": "local:2x2", "strategy": "zero3",
        "step_time_s": 0.05, "tokens_per_s": 41000, "tflops_per_rank": 0.012}],
        # the schema says what _measured_when_ok checks: status "ok" (or none, its default) needs a number
        "if": {"properties": {"status": {"const": "ok"}}},
        "then": {"required": ["tflops_per_rank"], "properties": {"tflops_per_rank": {"type": "number"}}}})

    status: Literal["ok", "failed"] = "ok"
    model: ModelField
    cluster: ClusterField
    strategy: Annotated[PresetName | StrategyCreate, Field(description="a preset name or the Strategy that ran")]
    tflops_per_rank: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False, validate_default=True,
                                          description="required when status is ok")
    global_batch: int | None = Field(default=None, ge=1, le=MAX_ID)
    device: str | None = Field(default=None, max_length=255,
                               description="the device the run ran on (run.json's device); must be the cluster's")
    error: str | None = Field(default=None, max_length=10000)
    logs: str | None = Field(default=None, max_length=1_000_000)

    @field_validator("tflops_per_rank")
    @classmethod
    def _measured_when_ok(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None and info.data.get("status") == "ok":
            raise ValueError("required when status is 'ok' (a run that measured nothing uploads status 'failed')")
        return value

    @model_validator(mode="after")
    def _plain_extra(self) -> TrialCreate:
        for key, value in (self.model_extra or {}).items():
            check_plain_json(value, key)
        return self


class CutOff(BaseModel):
    """A shortlisted strategy the job's time budget left unmeasured (or cut off while it ran)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    strategy: Annotated[PresetName | StrategyCreate, Field(description="a preset name or the Strategy")]
    reason: str = Field(max_length=2000)


class JobMeasurementsCreate(BaseModel):
    """The shortlist of a recommendation measured by a training job on its own allocation
    (``zerotune recommend --measure``): each candidate's run.json (``status`` failed for a run that broke), and
    the candidates its budget cut off."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    job: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.+-]+$",
                     description="the Slurm job id whose allocation measured them")
    budget_s: float = Field(gt=0, le=1e7, description="the job's --measure budget, seconds")
    runs: list[TrialCreate] = Field(min_length=1, max_length=16)
    cut_off: list[CutOff] = Field(default_factory=list, max_length=16)
