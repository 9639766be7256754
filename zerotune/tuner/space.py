"""The search space: every Strategy dimension, restricted to values valid on the cluster.

Encoded for Optuna's define-by-run API (works with ask/tell): ``spans`` is one categorical over the
valid (param, grad, optim) span triples (P ≤ G ≤ O ≤ L), the hpZ span is a categorical whose name
carries P (``secondary_span_p3``: its choices depend on P, and Optuna needs one distribution per
name), weight bits are only asked when a gathered level can be quantized. Every dimension is
categorical and finite, so the whole space can also be enumerated (``enumerate_space``) to find
the true optimum of a cost model. ``strategy_params`` maps a Strategy back to parameters, which is
how presets, warm-start strategies and a best trial's ``neighbours`` are enqueued (``strategy_of`` the reverse).

A space belongs to a *runner*: the program that will train with the answer. zerotune's own engine
runs every Strategy; DeepSpeed and FSDP2 run only part of the space exactly (``runner_rule``), so a
study for them searches that part alone and never recommends a strategy whose export would have to
approximate it (``tuner.exports`` notes what the approximations are).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from zerotune.core import batch
from zerotune.core.fields import RUNNERS
from zerotune.core.spec import BITS, CHECKPOINT_POLICIES, ClusterSpec, ModelSpec, Strategy
from zerotune.errors import SpecError

NONE = "none"
MICRO_BATCH_SIZES = (1, 2, 4)


def params_key(params: dict[str, Any]) -> str:
    """One string per point of a space, from a trial's (or an enqueued trial's) Optuna parameters: how a study tells
    the points it has tried or queued from new ones."""
    return json.dumps(params, sort_keys=True)


def runner_rule(runner: str, cluster: ClusterSpec, s: Strategy) -> str | None:
    """None when ``runner`` runs ``s`` on ``cluster`` exactly as the cost model times it (same groups,
    same bytes per level); else why not, in words.

    DeepSpeed (``deepspeed/runtime/zero``, newest releases, no MiCS): stage 1-2 partition over the whole
    data-parallel world and stage 3 partitions P, G and OS over it together; hpZ
    (``zero_hpz_partition_size``) is a secondary group of more than one rank inside the world; qwZ is
    int8 and qgZ int4 only, stage 3 only, qgZ across nodes only, and both quantize every link of the
    collective (``quantize_above`` 1), and neither exists on CPU (its quantizer op has no CPU build).
    FSDP2 (``fully_shard``): P, G and OS share one shard mesh dim
    (HSDP replicates above it), ``reshard_after_forward`` is the hpZ group (False: one rank), and
    nothing is quantized."""
    if runner == "zerotune":
        return None
    if runner not in RUNNERS:
        raise SpecError("runner", runner, f"must be one of {list(RUNNERS)}")
    world = cluster.world_size
    spans = (s.param_span, s.grad_span, s.optim_span)
    secondary = None if s.secondary_span is None else cluster.span_size(s.secondary_span)
    if s.quantized and s.quantize_above > 1:
        return f"{runner} quantizes every link of a collective (quantize_above 1), not from level {s.quantize_above}"
    if runner == "deepspeed":
        if any(span and cluster.span_size(span) < world for span in spans):
            return "DeepSpeed partitions over the whole data-parallel world, not a narrower span (MiCS is removed)"
        if s.param_span and (s.grad_span, s.optim_span) != (s.param_span, s.param_span):
            return "DeepSpeed stage 3 partitions P, G and OS together"
        if secondary is not None and not 1 < secondary < world:
            return f"DeepSpeed's hpZ group must hold more than one rank and fewer than the world, not {secondary}"
        if s.quantized and cluster.device == "cpu":
            return "DeepSpeed's quantizer (qwZ, qgZ) has no CPU build: deepspeed.initialize fails on gloo ranks"
        if s.weight_bits not in (16, 8):
            return f"DeepSpeed's qwZ is int8 only, not int{s.weight_bits}"
        if s.grad_bits not in (32, 16, 4):
            return f"DeepSpeed's qgZ is int4 only, not int{s.grad_bits}"
        if s.grad_bits < 16 and (not s.param_span or cluster.num_levels < 2
                                 or world <= cluster.span_size(cluster.node_span)):
            return "DeepSpeed quantizes gradients (qgZ) in stage 3 across nodes only"
        if s.recompute == "selective":
            return "DeepSpeed's activation checkpointing recomputes whole blocks: it has no per-op (selective) policy"
        return None
    if len(set(spans)) > 1:
        return "FSDP2 shards P, G and OS over one mesh dim"
    if secondary is not None and secondary != 1 and not secondary < cluster.span_size(s.param_span):
        return "FSDP2's reshard_after_forward group must be one rank or a divisor smaller than the shard dim"
    if s.quantized:
        return "FSDP2 has no quantized communication"
    return None


def default_global_batch(cluster: ClusterSpec, micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES) -> int:
    """The batch of a request that names none: the default training (``core.batch``: 4 sequences per rank,
    as ``zerotune train`` and ``zerotune predict`` train by default) in whole micro-batches of the largest
    micro-batch of the space (4), so every micro-batch choice divides it — smaller ones accumulate to it — and
    each strategy is compared on the same training. On frontier:48 with 2048-token sequences that is 1,536
    sequences, 3.1 M tokens per step, the order of the batches large GPT runs use."""
    return batch.default_global_batch(cluster.world_size, max(micro_batch_sizes))


def resolve_global_batch(cluster: ClusterSpec, model: ModelSpec, global_batch: int | None = None,
                         tokens_per_step: int | None = None,
                         micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES) -> int:
    """The one global batch (sequences per optimizer step) a study holds fixed.

    ``tokens_per_step`` names it in tokens (a whole number of ``model.seq_len`` sequences); with
    neither given, ``default_global_batch``. Refused (``SpecError`` naming field, value and rule)
    when no micro-batch of the space can run it on this cluster: every rank must train the same
    whole number of sequences, i.e. a multiple of the world size, split into micro-batches."""
    for name, value in (("global_batch", global_batch), ("tokens_per_step", tokens_per_step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise SpecError(name, value, "must be a whole number >= 1")
    if tokens_per_step is not None:
        if tokens_per_step % model.seq_len:
            raise SpecError("tokens_per_step", tokens_per_step,
                            f"must be a whole number of sequences of {model.seq_len} tokens ({model.name})")
        if global_batch is not None and global_batch * model.seq_len != tokens_per_step:
            raise SpecError("tokens_per_step", tokens_per_step,
                            f"names another batch than global_batch={global_batch} sequences of {model.seq_len} "
                            "tokens; give one of the two")
        global_batch = tokens_per_step // model.seq_len
    if global_batch is None:
        return default_global_batch(cluster, micro_batch_sizes)
    micro_batches_for(cluster, global_batch, micro_batch_sizes)  # refuses a batch none of them runs
    return global_batch


def micro_batches_for(cluster: ClusterSpec, global_batch: int,
                      micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES) -> tuple[int, ...]:
    """The micro-batches that split ``global_batch`` evenly over the cluster's ranks (``SpecError`` if none)."""
    world = cluster.world_size
    fits = () if global_batch % world else tuple(m for m in micro_batch_sizes if (global_batch // world) % m == 0)
    if not fits:
        raise SpecError("global_batch", global_batch,
                        f"no micro-batch in {list(micro_batch_sizes)} runs it on {cluster.name}: every one of its "
                        f"{world} ranks must train the same whole number of sequences, so it must be a multiple "
                        f"of {world}; nearest: {max(world, round(global_batch / world) * world)}")
    return fits


@dataclass(frozen=True)
class Space:
    """The finite choices of each dimension (defaults follow DeepSpeed's bucket sizes, DESIGN.md §7)."""

    cluster: ClusterSpec
    bucket_mb: tuple[float, ...] = (25.0, 50.0, 100.0, 250.0, 1000.0)
    prefetch: tuple[int, ...] = (0, 1, 2, 4)
    """Buckets gathered ahead. For the ``deepspeed`` runner only 1: the cost model credits none of
    DeepSpeed's prefetch (``Calibration.gathers``), so it cannot rank depths, and 0 would export a
    config with prefetching off (``stage3_prefetch_bucket_size`` 0) on no evidence."""
    micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES
    checkpointing: tuple[bool, ...] = (False, True)
    checkpoint_policies: tuple[str, ...] = CHECKPOINT_POLICIES
    """What a checkpointed block keeps (``Strategy.checkpoint_policy``). For the ``deepspeed`` runner only
    ``"full"``: DeepSpeed's checkpointing has no per-op policy. Checkpointing only some blocks
    (``Strategy.checkpoint_every``) is not searched: every searched strategy checkpoints all blocks or none."""
    bits: tuple[int, ...] = BITS
    """Widths offered for weight gathers and gradient reductions. fp32 reductions (``GRAD_BITS``' 32) are
    left out by default: they only ever cost time, so a search would never pick them on speed."""
    grad_widths: tuple[int, ...] | None = None
    """The only widths gradients may reduce in, when the training fixes them: ``(32,)`` for a request with
    ``grad_reduce_in_fp32``. None: ``bits``."""
    global_batch: int | None = None
    """The study's fixed batch: only micro-batches that divide each rank's share of it are offered."""
    runner: str = "zerotune"
    """Who trains with the answer: only the strategies it runs exactly are offered (``runner_rule``)."""

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise SpecError("runner", self.runner, f"must be one of {list(RUNNERS)}")
        if self.runner == "deepspeed":
            object.__setattr__(self, "prefetch", (1,))
            object.__setattr__(self, "checkpoint_policies", ("full",))
        if self.global_batch is not None:
            object.__setattr__(self, "micro_batch_sizes",
                               micro_batches_for(self.cluster, self.global_batch, self.micro_batch_sizes))

    def _runs(self, **fields: Any) -> bool:
        """Whether the runner runs some strategy with these fields (the others at their neutral values)."""
        try:
            return runner_rule(self.runner, self.cluster, Strategy.from_dict(fields)) is None
        except SpecError:
            return False

    @property
    def span_triples(self) -> list[str]:
        L = self.cluster.num_levels  # noqa: N806
        return [f"{p},{g},{o}" for p in range(L + 1) for g in range(p, L + 1) for o in range(g, L + 1)
                if self._runs(param_span=p, grad_span=g, optim_span=o)]

    def _secondaries(self, p: int) -> list[str]:
        return [NONE, *(str(s) for s in range(p)
                        if self._runs(param_span=p, grad_span=p, optim_span=p, secondary_span=s))]

    def _quantize_above(self) -> list[int]:
        return list(range(1, self.cluster.num_levels + 1)) if self.runner == "zerotune" else [1]

    def _bits(self, what: str) -> list[int]:
        """The widths some strategy of the runner moves ``what`` (``weight_bits`` or ``grad_bits``) in."""
        L = self.cluster.num_levels  # noqa: N806
        widths = self.grad_widths if what == "grad_bits" and self.grad_widths is not None else self.bits
        return [b for b in widths if self._runs(param_span=L, grad_span=L, optim_span=L, **{what: b})]

    def suggest(self, trial: Any) -> Strategy:
        """Ask ``trial`` (an optuna Trial) for one point and build the Strategy (raises SpecError if the
        combination is invalid for the cluster)."""
        p, g, o = (int(x) for x in trial.suggest_categorical("spans", self.span_triples).split(","))
        secondary = trial.suggest_categorical(f"secondary_span_p{p}", self._secondaries(p)) if p else NONE
        qa = trial.suggest_categorical("quantize_above", self._quantize_above())
        weight_bits = trial.suggest_categorical("weight_bits", self._bits("weight_bits")) if p >= qa else 16
        fields = {
            "param_span": p, "grad_span": g, "optim_span": o,
            "secondary_span": None if secondary == NONE else int(secondary),
            "quantize_above": qa, "weight_bits": weight_bits,
            "grad_bits": trial.suggest_categorical("grad_bits", self._bits("grad_bits")),
            "allgather_bucket_mb": trial.suggest_categorical("allgather_bucket_mb", list(self.bucket_mb)),
            "reduce_bucket_mb": trial.suggest_categorical("reduce_bucket_mb", list(self.bucket_mb)),
            "prefetch_buckets": trial.suggest_categorical("prefetch_buckets", list(self.prefetch)),
            "micro_batch_size": trial.suggest_categorical("micro_batch_size", list(self.micro_batch_sizes)),
            "activation_checkpointing": trial.suggest_categorical("activation_checkpointing", list(self.checkpointing)),
        }
        if fields["activation_checkpointing"]:  # asked only of a checkpointed trial (older studies never asked it)
            policies = list(self.checkpoint_policies)
            fields["checkpoint_policy"] = (trial.suggest_categorical("checkpoint_policy", policies)
                                           if len(policies) > 1 else policies[0])
        return self.admit(Strategy.from_dict(fields).validate_for(self.cluster))

    def ask(self, study: Any) -> tuple[Any, Strategy | None]:
        """Ask ``study`` (an optuna Study) for a trial and build its Strategy; a combination the rules exclude is
        told PRUNED, its reason kept as the trial's ``reason`` attribute, and comes back as None."""
        import optuna

        trial = study.ask()
        try:
            return trial, self.suggest(trial)
        except SpecError as exc:
            trial.set_user_attr("reason", str(exc))
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return trial, None

    def admit(self, s: Strategy) -> Strategy:
        """``s`` when the runner runs it exactly and its gradients reduce in a width the training allows, else
        ``SpecError`` saying why not."""
        if (why := runner_rule(self.runner, self.cluster, s)) is not None:
            raise SpecError("runner", self.runner, why)
        if self.grad_widths is not None and s.grad_bits not in self.grad_widths:
            raise SpecError("strategy.grad_bits", s.grad_bits,
                            f"must be one of {list(self.grad_widths)}: the training reduces gradients in that width")
        return s

    def strategy_params(self, s: Strategy) -> dict[str, Any]:
        """The parameters that make ``suggest`` return ``s`` (buckets snapped to the nearest choice)."""
        def near(value: float, choices: tuple) -> Any:
            return min(choices, key=lambda c: (abs(c - value), c))

        params: dict[str, Any] = {"spans": f"{s.param_span},{s.grad_span},{s.optim_span}",
                                  "quantize_above": s.quantize_above, "grad_bits": s.grad_bits,
                                  "allgather_bucket_mb": near(s.allgather_bucket_mb, self.bucket_mb),
                                  "reduce_bucket_mb": near(s.reduce_bucket_mb, self.bucket_mb),
                                  "prefetch_buckets": near(s.prefetch_buckets, self.prefetch),
                                  "micro_batch_size": near(s.micro_batch_size, self.micro_batch_sizes),
                                  "activation_checkpointing": s.activation_checkpointing}
        if s.param_span:
            params[f"secondary_span_p{s.param_span}"] = NONE if s.secondary_span is None else str(s.secondary_span)
        if s.param_span >= s.quantize_above:
            params["weight_bits"] = s.weight_bits
        if s.activation_checkpointing and len(self.checkpoint_policies) > 1:
            params["checkpoint_policy"] = s.checkpoint_policy
        return params

    def strategy_of(self, params: dict[str, Any]) -> Strategy:
        """The Strategy a trial with these parameters ran (``suggest`` on them, as Optuna replays a trial)."""
        import optuna

        return self.suggest(optuna.trial.FixedTrial(params))

    def neighbours(self, s: Strategy) -> list[Strategy]:
        """Every strategy of the space one knob away from ``s``, with its spans kept, in the order the knobs
        usually move a step's time most: the micro-batch, the widths gathers and reductions move, the
        checkpointing, the hpZ span and where quantization starts, then prefetch and the bucket sizes (the
        DeepSpeed autotuner's order of refinement: micro-batch first, then its other knobs one grid at a
        time, ``deepspeed/autotuning``). Each is valid on the cluster and run by the space's runner."""
        recompute = [{"activation_checkpointing": False, "checkpoint_policy": "full"}] + [
            {"activation_checkpointing": True, "checkpoint_policy": policy} for policy in self.checkpoint_policies]
        secondaries = [None if x == NONE else int(x) for x in self._secondaries(s.param_span)] if s.param_span else []
        knobs: list[list[dict[str, Any]]] = [
            [{"micro_batch_size": m} for m in self.micro_batch_sizes],
            [{"weight_bits": b} for b in self._bits("weight_bits")] if s.param_span >= s.quantize_above else [],
            [{"grad_bits": b} for b in self._bits("grad_bits")],
            recompute,
            [{"secondary_span": x} for x in secondaries],
            [{"quantize_above": q} for q in self._quantize_above()],
            [{"prefetch_buckets": n} for n in self.prefetch],
            [{"allgather_bucket_mb": mb} for mb in self.bucket_mb],
            [{"reduce_bucket_mb": mb} for mb in self.bucket_mb],
        ]
        seen, out = {self.key(s)}, []
        for changes in (c for knob in knobs for c in knob):
            try:
                variant = self.admit(s.replace(name=None, **changes).validate_for(self.cluster))
            except SpecError:
                continue
            if (key := self.key(variant)) not in seen:
                seen.add(key)
                out.append(variant)
        return out

    def key(self, s: Strategy) -> str:
        """One string per point of the space (``params_key`` of its Optuna parameters)."""
        return params_key(self.strategy_params(s))

    def enumerate_space(self) -> Iterator[Strategy]:
        """Every valid Strategy of the space (for exhaustive search on the cost model)."""
        recompute = [(ckpt, policy) for ckpt in self.checkpointing
                     for policy in (self.checkpoint_policies if ckpt else ("full",))]
        rest = list(itertools.product(self._bits("grad_bits"), self.bucket_mb, self.bucket_mb, self.prefetch,
                                      self.micro_batch_sizes, recompute))
        for triple in self.span_triples:
            p, g, o = (int(x) for x in triple.split(","))
            for secondary in self._secondaries(p) if p else [NONE]:
                for qa in self._quantize_above():
                    for wb in self._bits("weight_bits") if p >= qa else (16,):
                        for gb, ag, rs, pf, mbs, (ckpt, policy) in rest:
                            try:
                                yield self.admit(Strategy(p, g, o, None if secondary == NONE else int(secondary),
                                                          wb, gb, qa, ag, rs, pf, mbs, ckpt, policy))
                            except SpecError:
                                continue

    def size(self) -> int:
        return sum(1 for _ in self.enumerate_space())
