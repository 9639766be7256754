"""What a user asks for: a model, a cluster and how to search (``TuneRequest``), and what makes two
requests the same (``key``) or two strategies the same (``strategy_key``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from zerotune.core.fields import ALWAYS, OPTIONS, WHEN_SET, Options, check_fields, from_dict
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.costmodel.memory import check_reserve
from zerotune.errors import SpecError
from zerotune.tuner.baseline import parse_baseline
from zerotune.tuner.executors.local import runs_as_is
from zerotune.tuner.space import resolve_global_batch


@dataclass(frozen=True, kw_only=True)
class TuneRequest(Options):
    """What a user asks for: a model on a cluster, and how to search (every other field: ``core.fields.Options``);
    ``key()`` identifies equivalent requests. ``to_dict`` / ``from_dict`` are its stored form."""

    model: ModelSpec
    cluster: ClusterSpec

    def __post_init__(self) -> None:
        check_fields(self)
        if self.measure is not None:
            if self.executor != "model":
                raise SpecError("measure_shortlist", self.measure, f"only a model study has a shortlist to measure; "
                                f"executor {self.executor!r} measures every trial already")
            if self.measure == "local" and not runs_as_is(self.cluster):
                raise SpecError("measure_shortlist", self.measure, f"this machine can only emulate {self.cluster.name} "
                                "(fewer ranks, a proxy model), which cannot settle a choice the model's error leaves "
                                "open there; measure it with 'slurm', or ask about a local: cluster")
        if self.emulate and self.executor != "local":
            raise SpecError("emulate", self.emulate, f"only the local executor's runs can be emulated, not "
                            f"{self.executor!r}")
        if self.runner != "zerotune" and (self.executor != "model" or self.measure is not None):
            what = f"executor {self.executor!r}" if self.executor != "model" else f"measure_shortlist {self.measure!r}"
            raise SpecError("runner", self.runner, f"short runs train with zerotune's own engine, so {what} cannot "
                            f"measure how {self.runner} runs a strategy; use executor 'model' without "
                            "measure_shortlist, or runner 'zerotune'")
        if self.memory_reserve_gib is not None:  # >= 0 by its rule; under this cluster's devices' memory here
            check_reserve(self.memory_reserve_gib, self.cluster.device_memory_gib)
        if self.emulate and self.cluster.num_levels < 2:
            raise SpecError("emulate", self.emulate, f"{self.cluster.name} has one level: nothing to emulate")
        batch = resolve_global_batch(self.cluster, self.model, self.global_batch, self.tokens_per_step)
        object.__setattr__(self, "global_batch", batch)  # frozen: the resolved batch is what the request means
        object.__setattr__(self, "tokens_per_step", batch * self.model.seq_len)
        if self.baseline is not None:  # refused now, by key, if no strategy expresses it
            parse_baseline(self.baseline, self.model, self.cluster, batch)

    def normalized(self) -> dict[str, Any]:
        """What makes two requests equivalent: the model, the cluster and each field that is part of the key
        (``core.fields.About.key``: a field keyed ``WHEN_SET`` only where it is not its default, so older keys hold)."""
        fields = {"model": self.model.to_dict(), "cluster": self.cluster.to_dict()}
        for d in OPTIONS:
            value = getattr(self, d.name)
            if d.about.key == ALWAYS or (d.about.key == WHEN_SET and value != d.default):
                fields[d.name] = value
        return fields

    def to_dict(self) -> dict[str, Any]:
        """The request as it is stored (``db.models.Request.spec``): the model, the cluster and every field."""
        return {"model": self.model.to_dict(), "cluster": self.cluster.to_dict(),
                **{d.name: getattr(self, d.name) for d in OPTIONS}}

    @classmethod
    def from_dict(cls, data: Any) -> TuneRequest:
        """The request ``to_dict`` stored (a field it lacks, stored before the field existed, takes its default)."""
        if not isinstance(data, dict):
            raise SpecError("request", data, "must be a JSON object with a model, a cluster and the request's fields")
        fields = {**data, "model": ModelSpec.from_dict(data.get("model")),
                  "cluster": ClusterSpec.from_dict(data.get("cluster"))}
        return from_dict(cls, fields, "request")

    def fit(self, s: Strategy) -> Strategy:
        """``s`` as this request trains it: with ``grad_reduce_in_fp32``, its gradients reduced in fp32; without,
        an fp32 reduction (a warm start from such a request) reduced in the run's dtype, which its search offers."""
        want = 32 if self.grad_reduce_in_fp32 else 16 if s.grad_bits == 32 else s.grad_bits
        return s if s.grad_bits == want else s.replace(grad_bits=want)

    def key(self) -> str:
        return key_of(self.normalized())


def key_of(normalized: dict[str, Any]) -> str:
    """The hash of a normalized request (``TuneRequest.normalized``): equal for equivalent requests."""
    return hashlib.sha256(json.dumps(normalized, sort_keys=True).encode()).hexdigest()


KEYLESS_DEFAULTS = {"checkpoint_policy": "full", "checkpoint_every": 1}
"""Strategy fields added after trials were first stored: at these values a strategy's key is the one it had before
the field existed, so a stored trial and the same strategy today share a key."""


def strategy_key(s: Strategy) -> str:
    """The hash that says two trials ran the same strategy (the label left out)."""
    fields = s.to_dict()
    fields.pop("name", None)
    for field, default in KEYLESS_DEFAULTS.items():
        if fields[field] == default:
            del fields[field]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
