"""Each field once: what a field of a frozen value means and may hold, and every field of a tuning request.

Standard library only (of zerotune it imports the errors alone): the prologue client, which runs in training
environments, reads the request's fields here as the service does.

- :func:`about` puts a field's meaning and rule into its dataclass ``metadata``
  (``field(default=40, metadata=about("trials to finish", minimum=1))``), so a dataclass is the one definition of
  its fields: its values check themselves (:func:`check_fields`), come back from JSON (:func:`from_dict`), and the
  API builds its body models from it (``api.inputs``: each field's type, default, description and rule).
- :class:`Options` is every field of a tuning request but its model and cluster, which
  ``tuner.request.TuneRequest`` adds. The POST body (``api.inputs.RecommendationCreate``), the stored request (one
  JSON column, ``db.models.Request.spec``), the worker's copy (``TuneRequest.from_dict``), the request's key and
  the prologue client's body (``api.prologue.body.build_request``) are all read off it.

A new request field is one attribute of :class:`Options`: the API accepts it (a 422 naming field, value and rule
when it breaks its rule), the stored request keeps it without a migration, the worker gets it back, a request that
leaves it at its default keeps the key it had before the field existed, ``zerotune tune`` takes it as a flag and the
prologue client can send it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zerotune.errors import SpecError

MAX_ID = 2**31 - 1
"""The largest integer the API takes for an id or a count it stores (PostgreSQL INTEGER)."""

EXECUTORS = ("model", "local", "slurm")
"""How a trial is evaluated: ``model`` predicts, ``local`` and ``slurm`` run short trainings
(``tuner.executors.make_executor`` builds each)."""
RUNNERS = ("zerotune", "deepspeed", "fsdp")
"""Who trains with the answer: zerotune's engine, DeepSpeed (ZeRO / ZeRO++) or PyTorch FSDP2 (the cost model
times the collectives of each as it issues them: ``costmodel.rates.RUNNERS``)."""
OBJECTIVES = ("throughput", "pareto")
SAMPLERS = ("tpe", "nsga2", "random")
MEASURERS = ("local", "slurm")
"""The executors that can measure a model study's shortlist."""

ALWAYS, WHEN_SET, NEVER = "always", "when set", "never"
"""Whether a request field is part of the request's key: always, only where it is not its default (so that the
requests made before the field existed keep their keys), or never (it does not change the question)."""

T = TypeVar("T")


@dataclass(frozen=True)
class About:
    """What one field means and what a value of it may be; its type and default are the dataclass field's own."""

    doc: str
    """The meaning, as the API's schema and the command lines show it."""
    choices: tuple[Any, ...] = ()
    """The values it may take (any value of its type when empty)."""
    minimum: float | None = None
    """The least value (a number)."""
    above: float | None = None
    """What a value must exceed (a number)."""
    api_max: float | None = None
    """The largest value the API takes: the service's bound, not the science's (it keeps every stored number finite
    and every id inside the database's integers); values built elsewhere are not held to it."""
    min_length: int | None = None
    """The shortest text (or list) the API takes."""
    max_length: int | None = None
    """The longest text (or list) the API takes."""
    api_default: str | None = None
    """The API's default for a field the value itself requires (a model's name); None: the API requires it too."""
    body: str | None = ""
    """Where a request's POST body carries it: "" under its own name, a dotted path (``budget.trials``) inside an
    object, None not at all (set by the command line or by zerotune itself)."""
    key: str = WHEN_SET
    """Whether it is part of a request's key (``ALWAYS``, ``WHEN_SET``, ``NEVER``)."""
    flag: str | None = ""
    """Its flag of ``zerotune tune`` (without the dashes): "" named after its place in the body (``trials``,
    ``measure_shortlist``: ``--measure-shortlist``), None none (zerotune sets it itself)."""


def about(doc: str, **rule: Any) -> dict[str, About]:
    """A field's ``metadata``: its meaning and rule (the keywords of :class:`About`)."""
    return {"about": About(doc, **rule)}


@dataclass(frozen=True)
class Described:
    """One field of a dataclass as its checks and the API read it."""

    name: str
    kind: type
    """``bool``, ``int``, ``float``, ``str``, or another type that is checked elsewhere."""
    nullable: bool
    """None is a value (the field's type is ``X | None``)."""
    default: Any
    """The default (``dataclasses.MISSING`` for a required field)."""
    about: About

    @property
    def label(self) -> str:
        """The name a user knows it by: its place in the POST body where it has one."""
        return self.about.body or self.name


def described(cls: type) -> tuple[Described, ...]:
    """The fields of dataclass ``cls`` that carry an :func:`about`, in order (computed once per class: a value
    checks itself with them on every construction)."""
    found = _DESCRIBED.get(cls)
    if found is None:
        found = _DESCRIBED[cls] = _describe(cls)
    return found


_DESCRIBED: dict[type, tuple[Described, ...]] = {}


def _describe(cls: type) -> tuple[Described, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "about" not in f.metadata:
            continue
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        kinds = [a for a in args if a is not type(None)]
        assert len(kinds) == 1, f"{cls.__name__}.{f.name}: one type, or one type or None ({hint})"
        out.append(Described(f.name, kinds[0], type(None) in args, f.default, f.metadata["about"]))
    return tuple(out)


def check(d: Described, value: Any, label: str) -> None:
    """Raise :class:`SpecError` naming ``label``, ``value`` and the rule when ``value`` breaks ``d``'s rule."""
    if value is None and d.nullable:
        return
    rule = d.about
    if rule.choices:
        if value not in rule.choices or isinstance(value, bool):  # True == 1: no choice here is a boolean
            raise SpecError(label, value, f"must be one of {list(rule.choices)}")
        return
    if d.kind is bool:
        if not isinstance(value, bool):
            raise SpecError(label, value, "must be true or false")
    elif d.kind is int:
        check_int(label, value)
    elif d.kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise SpecError(label, value, "must be a finite number")
    elif d.kind is str and not isinstance(value, str):
        raise SpecError(label, value, "must be a string")
    elif d.kind is dict:
        if not isinstance(value, dict):
            raise SpecError(label, value, "must be a JSON object")
        return
    if rule.minimum is not None and value < rule.minimum:
        raise SpecError(label, value, f"must be >= {rule.minimum}")
    if rule.above is not None and value <= rule.above:
        raise SpecError(label, value, f"must be > {rule.above}")


def check_int(label: str, value: Any, minimum: int | None = None) -> None:
    """Raise :class:`SpecError` unless ``value`` is an integer (not a boolean), at least ``minimum`` when given."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(label, value, "must be an integer")
    if minimum is not None and value < minimum:
        raise SpecError(label, value, f"must be >= {minimum}")


def check_fields(value: Any, where: str = "") -> None:
    """Check every described field of dataclass instance ``value`` against its rule (errors name ``where.field``,
    or the field's place in the POST body without ``where``)."""
    for d in described(type(value)):
        check(d, getattr(value, d.name), f"{where}.{d.name}" if where else d.label)


def from_dict(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from a dict, refusing unknown keys by name."""
    if not isinstance(data, dict):
        raise SpecError(where, data, f"must be a JSON object with the fields of {cls.__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", data[unknown[0]], f"unknown field; known: {sorted(names)}")
    try:
        return cls(**data)
    except TypeError as exc:  # a missing required field
        raise SpecError(where, data, f"incomplete {cls.__name__}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to search for a model on a cluster: every field of a tuning request but those two
    (``tuner.request.TuneRequest`` adds them, and the rules between fields)."""

    objective: str = field(default="throughput", metadata=about(
        "max TFLOPS per rank, or the TFLOPS-vs-memory Pareto front (NSGA-II)", choices=OBJECTIVES, key=ALWAYS))
    trials: int = field(default=40, metadata=about(
        "trials to finish (invalid points do not count)", minimum=1, api_max=10000, body="budget.trials", key=ALWAYS))
    time_budget_s: float | None = field(default=None, metadata=about(
        "stop starting trials after this many seconds", above=0, api_max=604800, body="budget.time_s", key=NEVER,
        flag="time-budget"))
    executor: str = field(default="model", metadata=about(
        "model: cost model only; local: short runs here; slurm: short runs via Slurm", choices=EXECUTORS, key=ALWAYS))
    global_batch: int | None = field(default=None, metadata=about(
        "sequences per optimizer step, held fixed for every trial (a multiple of the world size); default: world "
        "size x 4", minimum=1, api_max=MAX_ID, key=ALWAYS))
    tokens_per_step: int | None = field(default=None, metadata=about(
        "the same batch in tokens (a whole number of sequences)", minimum=1, api_max=MAX_ID, key=NEVER))
    calibration: str | None = field(default=None, metadata=about(
        "a stored calibration to predict with (GET /v1/calibrations); default: the newest stored for the cluster, "
        "else the cluster's own profile", min_length=1, max_length=128))
    measure: str | None = field(default=None, metadata=about(
        "after a model study whose leaders lie within the model's error, measure that shortlist with this executor "
        "and answer with the measured fastest", choices=MEASURERS, body="measure_shortlist"))
    emulate: bool = field(default=False, metadata=about(
        "local executor only: run the short runs on an emulated cluster (network namespaces per innermost group, "
        "links shaped to this cluster's levels); needs CAP_NET_ADMIN on the workers"))
    runner: str = field(default="zerotune", metadata=about(
        "who trains with the answer: the study searches only what that runner runs exactly and predicts its "
        "collectives as it issues them (DeepSpeed and FSDP2: flat NCCL rings over the whole group, gradients reduced "
        "during backward); deepspeed and fsdp need executor model", choices=RUNNERS))
    grad_reduce_in_fp32: bool = field(default=False, metadata=about(
        "the training reduces gradients in fp32 (torchtitan's default, FSDP2 reduce_dtype=float32, Megatron's "
        "grad_reduce_in_fp32): every strategy searched reduces them in fp32 (grad_bits 32, twice the bytes of bf16; "
        "no quantized gradients), and the exports keep it"))
    memory_reserve_gib: float | None = field(default=None, metadata=about(
        "GiB per rank kept free beside the predicted peak for the runtime: the device context, the collective "
        "library's buffers and the allocator's fragmentation; a strategy fits where its peak is within the device's "
        "memory less this (>= 0, under the device's memory); default: computed for each strategy "
        "(costmodel.memory.runtime_reserve)", minimum=0, api_max=1e6))
    sampler: str = field(default="tpe", metadata=about(
        "Optuna's sampler: TPE, NSGA-II (the pareto objective uses it whatever is named) or random search",
        choices=SAMPLERS,
        body=None, key=ALWAYS))
    seed: int | None = field(default=None, metadata=about("the sampler's seed", body=None, key=NEVER))
    baseline: dict | None = field(default=None, metadata=about(
        "the config trained today, as one JSON object: a DeepSpeed ds_config, FSDP settings (zerotune's FSDP2 export "
        "or Accelerate's fsdp_config keys) or a torchtitan TOML's tables; the answer states the recommendation's gain "
        "over the strategy it runs, and a key no strategy expresses is refused by name", flag=None))
    shortlist_of: str | None = field(default=None, metadata=about(
        "set on the measured study of another request's shortlist: that request's key", body=None, flag=None))


OPTIONS = described(Options)
DEFAULTS: dict[str, Any] = {d.name: d.default for d in OPTIONS}
"""Every request field's default, by name."""


def to_body(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (request fields by name) placed as a POST body carries them (``budget.trials`` inside
    ``budget``); fields the body does not carry are left out."""
    body: dict[str, Any] = {}
    for d in OPTIONS:
        if d.name in options and d.about.body is not None:
            *path, last = d.label.split(".")
            place = body
            for part in path:
                place = place.setdefault(part, {})
            place[last] = options[d.name]
    return body


def from_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request fields by name that a POST body's values hold (the inverse of :func:`to_body`)."""
    out = {}
    for d in OPTIONS:
        if d.about.body is None:
            continue
        place: Any = body
        for part in d.label.split("."):
            place = place.get(part, _ABSENT) if isinstance(place, dict) else _ABSENT
        if place is not _ABSENT:
            out[d.name] = place
    return out


_ABSENT = object()
