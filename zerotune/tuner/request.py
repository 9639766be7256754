"""What a user asks for: a model, a cluster and how to search (``TuneRequest``), and what makes two
requests the same (``key``) or two strategies the same (``strategy_key``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.errors import SpecError
from zerotune.tuner.executors.local import runs_as_is
from zerotune.tuner.space import RUNNERS, resolve_global_batch

SAMPLERS = ("tpe", "nsga2", "random")


@dataclass(frozen=True)
class TuneRequest:
    """What a user asks for; ``key()`` identifies equivalent requests."""

    model: ModelSpec
    cluster: ClusterSpec
    executor: str = "model"
    trials: int = 40
    objective: str = "throughput"
    """``throughput`` (max TFLOPS per rank) or ``pareto`` (TFLOPS vs peak memory, NSGA-II)."""
    global_batch: int | None = None
    """Sequences per optimizer step, held fixed for every trial; None = ``space.default_global_batch``."""
    sampler: str = "tpe"
    seed: int | None = None
    time_budget_s: float | None = None
    tokens_per_step: int | None = None
    """The same batch in tokens (a whole number of sequences); filled in from ``global_batch``."""
    calibration: str | None = None
    """The stored calibration every prediction uses (``tuner.calibrating``); None = the cluster's profile."""
    measure: str | None = None
    """``local`` or ``slurm``: after a model study, measure the shortlist its decision names with that executor."""
    shortlist_of: str | None = None
    """Set on the measured study of another request's shortlist: that request's key."""
    emulate: bool = False
    """``local`` only: run the short runs on an emulated cluster (``tuner.executors.emulate``: a namespace per
    innermost group, links shaped to the requested cluster's levels)."""
    runner: str = "zerotune"
    """Who trains with the answer (``space.RUNNERS``): the study searches what that runner runs exactly and
    predicts its collectives as that runner issues them (``costmodel.rates.run_by``)."""
    grad_reduce_in_fp32: bool = False
    """The training reduces gradients in fp32 (torchtitan's default, FSDP2 ``reduce_dtype=float32``, Megatron's
    ``grad_reduce_in_fp32``): every strategy of the study has ``grad_bits`` 32 (``fit``), so none quantizes them."""

    def __post_init__(self) -> None:
        if self.objective not in ("throughput", "pareto"):
            raise SpecError("objective", self.objective, "must be 'throughput' or 'pareto'")
        if self.sampler not in SAMPLERS:
            raise SpecError("sampler", self.sampler, f"must be one of {list(SAMPLERS)}")
        if not isinstance(self.trials, int) or self.trials < 1:
            raise SpecError("budget.trials", self.trials, "must be an integer >= 1")
        if self.measure is not None:
            if self.measure not in ("local", "slurm"):
                raise SpecError("measure_shortlist", self.measure, "must be 'local' or 'slurm'")
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
        if self.runner not in RUNNERS:
            raise SpecError("runner", self.runner, f"must be one of {list(RUNNERS)}")
        if self.runner != "zerotune" and (self.executor != "model" or self.measure is not None):
            what = f"executor {self.executor!r}" if self.executor != "model" else f"measure_shortlist {self.measure!r}"
            raise SpecError("runner", self.runner, f"short runs train with zerotune's own engine, so {what} cannot "
                            f"measure how {self.runner} runs a strategy; use executor 'model' without "
                            "measure_shortlist, or runner 'zerotune'")
        if not isinstance(self.grad_reduce_in_fp32, bool):
            raise SpecError("grad_reduce_in_fp32", self.grad_reduce_in_fp32, "must be true or false")
        if self.emulate and self.cluster.num_levels < 2:
            raise SpecError("emulate", self.emulate, f"{self.cluster.name} has one level: nothing to emulate")
        batch = resolve_global_batch(self.cluster, self.model, self.global_batch, self.tokens_per_step)
        object.__setattr__(self, "global_batch", batch)  # frozen: the resolved batch is what the request means
        object.__setattr__(self, "tokens_per_step", batch * self.model.seq_len)

    def normalized(self) -> dict[str, Any]:
        """What makes two requests equivalent (the optional fields only where set, so older keys hold)."""
        fields = {"model": self.model.to_dict(), "cluster": self.cluster.to_dict(), "executor": self.executor,
                  "objective": self.objective, "global_batch": self.global_batch, "trials": self.trials,
                  "sampler": self.sampler}
        for name in ("calibration", "measure", "shortlist_of"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.emulate:
            fields["emulate"] = True
        if self.runner != "zerotune":
            fields["runner"] = self.runner
        if self.grad_reduce_in_fp32:
            fields["grad_reduce_in_fp32"] = True
        return fields

    def fit(self, s: Strategy) -> Strategy:
        """``s`` as this request trains it: with ``grad_reduce_in_fp32``, its gradients reduced in fp32; without,
        an fp32 reduction (a warm start from such a request) reduced in the run's dtype, which its search offers."""
        want = 32 if self.grad_reduce_in_fp32 else 16 if s.grad_bits == 32 else s.grad_bits
        return s if s.grad_bits == want else s.replace(grad_bits=want)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.normalized(), sort_keys=True).encode()).hexdigest()


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
