"""What DeepSpeed's ZeRO-3 holds gathered and staged for reduction when it runs a strategy (``Calibration.gathers =
"module"``): the bytes ``memory.memory_per_rank`` books for its communication buffers in place of the engine's.

DeepSpeed does not hold whole buckets. Its parameter coordinator
(``deepspeed/runtime/zero/partitioned_param_coordinator.py`` at edaa72212, the rules unchanged since 0.10) fetches
the parameters of each sub-module about to run, and after it:

- **prefetches** from the step's recorded parameter trace while the elements it has launched are fewer than
  ``min(stage3_max_live_parameters - elements held, stage3_prefetch_bucket_size)`` (``fetch_sub_module``: at least
  one parameter whenever that bound is positive, none when what it holds already reaches the live cap);
- **releases** a sub-module's parameters after its forward or backward, except those it prefetched past and those
  used again within the next ``stage3_max_reuse_distance`` elements of the trace (``__params_to_release``), and
  never while a module that uses them is still running (``__release_param``: ``ds_active_sub_modules``).

A model's root module holds the tied embedding its head reads (an external parameter of the root, fetched when the
root's forward starts and released when it ends, and again for the whole backward) or its untied head (a direct
parameter of the root), so the root's elements count against the live cap all step, and so do those of the
sub-module running: the export's cap (``export_settings``) holds both and the prefetch window, so that DeepSpeed
prefetches what the window asks (a cap of a bucket and the window alone, below the root, let it prefetch nothing).
Parameters under ``stage3_param_persistence_threshold`` stay whole on every rank and are not counted here.
Under activation checkpointing the block's recompute fires the forward hooks again between its last sub-module's
backward fetch and its backward (torch's non-reentrant checkpoint recomputes when that backward unpacks its input).

The trace holds every module DeepSpeed fetches, in the order its hooks fire: the root, the embeddings, each block
(and the checkpoint wrapper around it), its norms and its matmuls, the final norm. Blocks and norms gather nothing
(a norm's parameters stay whole), but every fetch prefetches, so under a live cap above what a step holds the
prefetch runs ahead of the forward by a few parameters a block until the cap is full.

``simulate`` runs these rules over one step's trace: the most elements held at once (``gathered_peak``) and what is
gathered, pass by pass and sub-module by sub-module, which ``predict`` times for a run by DeepSpeed. Measured on
DeepSpeed 0.19.8 (4 gloo ranks, gpt-mini and a Llama of its size, with and without checkpointing, with the export's
settings and DeepSpeed's defaults: eleven configs), both are what DeepSpeed held and all-gathered, exactly
(``tests/tuner/test_exports.py``).

Gradients (``stage3.py``): each gradient autograd produces whole is copied into the reduce bucket
(``reduce_bucket_size`` elements of the communication dtype, allocated once) when it fits, else reduced from its
own tensor; a bucket of several gradients is interleaved into one more buffer of its size for the reduce-scatter
(``coalesced_collectives.reduce_scatter_coalesced``). Staged at once: the bucket, plus the larger of a full bucket's
interleaved copy and the largest gradient that is reduced from its own tensor.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, NamedTuple

from zerotune.core.plan import BYTES_PER_16BIT, block_numel
from zerotune.core.records import DeepSpeedStep
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import wire_elem_bytes
from zerotune.costmodel.runners import Timer
from zerotune.costmodel.schedule import Coll, Schedule, Setup
from zerotune.costmodel.timing import Costs, Seconds
from zerotune.costmodel.traffic import block_matmuls


@dataclass(frozen=True)
class Stage3Settings:
    """The ``zero_optimization`` keys that decide what DeepSpeed's ZeRO-3 holds gathered, in elements."""

    prefetch: int
    """``stage3_prefetch_bucket_size``."""
    max_live: int
    """``stage3_max_live_parameters``."""
    reuse: int
    """``stage3_max_reuse_distance``."""
    persistence: int
    """``stage3_param_persistence_threshold``: parameters of fewer elements stay whole on every rank."""

    def config(self) -> dict[str, int]:
        """The four ``zero_optimization`` keys, as a DeepSpeed config writes them."""
        return {key: getattr(self, field) for key, field in CONFIG_KEYS}

    @classmethod
    def from_config(cls, zero_optimization: dict[str, Any]) -> Stage3Settings:
        """The settings a ``zero_optimization`` section runs under: DeepSpeed's own where it leaves a key out."""
        return cls(**{field: zero_optimization.get(key, getattr(DEEPSPEED_DEFAULTS, field))
                      for key, field in CONFIG_KEYS})


CONFIG_KEYS = (("stage3_prefetch_bucket_size", "prefetch"), ("stage3_max_live_parameters", "max_live"),
               ("stage3_max_reuse_distance", "reuse"), ("stage3_param_persistence_threshold", "persistence"))
"""(DeepSpeed's key, ``Stage3Settings`` field) of the four settings."""


DEEPSPEED_DEFAULTS = Stage3Settings(prefetch=50_000_000, max_live=1_000_000_000, reuse=1_000_000_000,
                                    persistence=100_000)
"""DeepSpeed's own values for the four keys (``deepspeed/runtime/zero/config.py``: 5e7, 1e9, 1e9, 1e5): what a run
with a config that leaves them out holds (the published DeepSpeed runs)."""


def bucket_elements(mb: float) -> int:
    """A bucket of ``mb`` MB of 16-bit values as an element count (>= 1: DeepSpeed wants > 0)."""
    return max(1, round(mb * 1e6 / BYTES_PER_16BIT))


def export_settings(model: ModelSpec, allgather_bucket_mb: float, prefetch_buckets: int,
                    activation_checkpointing: bool, keep_all: bool) -> Stage3Settings:
    """What zerotune's DeepSpeed export writes for a strategy (``zerotune/tuner/exports/deepspeed.py``'s mapping table):
    a prefetch window of ``prefetch_buckets`` buckets, and a live cap of what it holds while it runs a sub-module
    (the root, held all pass: module docstring; the largest sub-module or a bucket, if larger) and that window, so
    that it prefetches what the window asks; parameters released after each use (reuse distance 0), but for a
    checkpointed block's recompute, which its backward follows within 2 x a block's elements; with ``keep_all``
    (a 1-rank secondary group) every parameter kept from forward into backward."""
    bucket = bucket_elements(allgather_bucket_mb)
    prefetch = bucket * prefetch_buckets
    if keep_all:  # a parameter is next used at most 2 x the model's elements later: forward, then backward
        live, reuse = model.num_params() + prefetch, 2 * model.num_params()
    else:
        root_params, block = _modules(model)
        root = sum(n for _, n in root_params)
        running = max(bucket, *(sum(n for _, n in m) for m in block))  # the largest sub-module (plan.block_modules)
        live, reuse = root + running + prefetch, 2 * block_numel(model) if activation_checkpointing else 0
    return Stage3Settings(prefetch=prefetch, max_live=live, reuse=reuse, persistence=10 * model.hidden)


def settings_for(model: ModelSpec, cluster: ClusterSpec, s: Strategy, which: str) -> Stage3Settings:
    """The settings a DeepSpeed run of ``s`` holds its parameters under: the export's, or DeepSpeed's own
    (``Calibration.stage3_settings``)."""
    if which == "defaults":
        return DEEPSPEED_DEFAULTS
    keep_all = s.secondary_span is not None and math.prod(cluster.sizes[:s.secondary_span]) == 1
    return export_settings(model, s.allgather_bucket_mb, s.prefetch_buckets, s.activation_checkpointing, keep_all)


def _modules(model: ModelSpec) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[tuple[str, int], ...], ...]]:
    """(the root's own parameters, each block's sub-modules in forward order) as (name, elements) per parameter:
    the engine's model (``zerotune/trainer/gpt.py``), a sub-module per matmul of ``traffic.block_matmuls`` (its weight,
    and GPT's bias, or a Llama's q, k and v biases where it has them; its q and k norms stay whole, below the
    persistence threshold)."""
    biased = not model.llama, model.llama and model.qkv_bias  # GPT's every matmul; a Llama's wq, wk and wv (Qwen2)
    block = tuple(((f"mm{i}", n_in * n_out),) + (((f"mm{i}.bias", n_out),) if biased[0] or biased[1] and i < 3 else ())
                  for i, (n_in, n_out) in enumerate(block_matmuls(model)))
    embedding = model.vocab * model.hidden
    root = (("lm_head", model.untied_head_numel),) if model.untied_head_numel else (("wte", embedding),)
    return root, block


@dataclass(frozen=True)
class Stage3Step:
    """One training step of DeepSpeed's ZeRO-3 by its coordinator's rules (``simulate``), in elements of
    partitioned parameters."""

    peak: int
    """The most held gathered at once."""
    forward: tuple[float, ...]
    """Per block sub-module (``traffic.block_matmuls``' order): the elements gathered for its forward uses, over
    every block, as a multiple of its elements over every block (1.0: once each; prefetched ones count for the pass
    of the use they were fetched for; a sub-module whose parameters all stay whole counts 1.0 too, so that the time
    model charges it as the schedule has it, never less)."""
    backward: tuple[float, ...]
    """The same for its backward uses, the recompute's included: 1.0 where each is gathered once in backward, more
    where a checkpointed block's recompute released what its backward then gathers again (beyond
    ``stage3_max_reuse_distance``), less where a parameter is kept from forward into backward."""
    root: tuple[float, float]
    """The root's parameters (and the embeddings'), gathered in forward and in backward, as multiples of their
    elements."""
    elements: tuple[int, int]
    """Elements gathered in all for forward uses and for backward uses."""
    partitioned: int
    """Elements of the parameters it partitions (all but those under ``stage3_param_persistence_threshold``)."""


@functools.lru_cache(maxsize=512)
def simulate(model: ModelSpec, settings: Stage3Settings, checkpointed: bool) -> Stage3Step:
    """A training step of ``model`` under ``settings`` (every block checkpointed or none) by DeepSpeed's
    coordinator's rules (module docstring): what it holds at its fullest and what it gathers."""
    root_params, block = _modules(model)
    size: dict[str, int] = {}  # the partitioned parameters' elements
    module_of: dict[str, int] = {}  # a block parameter's sub-module index; the root's are absent
    Module = tuple[tuple[str, ...], int]  # a fetched module: its partitioned parameters, and all its elements

    def params(module: tuple[tuple[str, int], ...], tag: str, index: int | None = None) -> Module:
        out = []
        for name, n in module:
            if n >= settings.persistence:
                size[f"{tag}{name}"] = n
                out.append(f"{tag}{name}")
                if index is not None:
                    module_of[f"{tag}{name}"] = index
        return tuple(out), sum(n for _, n in module)

    h, empty = model.hidden, ((), 0)
    norm = (("w", h),) if model.llama else (("w", h), ("b", h))
    attention = 4 if model.llama else 2  # the matmuls before the second norm
    root = params(root_params, "")
    wte = params((("wte", model.vocab * h),), "")  # the embedding module: the root's own when tied
    wpe = [params((("wpe", model.position_numel),), "")] if model.position_numel else []
    final_norm = params(norm, "ln_f.")
    # every module DeepSpeed fetches, in forward order: a block (and, checkpointed, the wrapper around it: the
    # harness's checkpoint_wrapper) fetches nothing, its norms' parameters stay whole; each fetch still prefetches
    blocks = []
    for layer in range(model.layers):
        mats = [params(m, f"{layer}.", i) for i, m in enumerate(block)]
        blocks.append([params(norm, f"{layer}.n1.")] + mats[:attention] + [params(norm, f"{layer}.n2.")]
                      + mats[attention:])
    # the step's fetches (modules, and when their parameters are released: "next" after their own use, "pass" at
    # the pass's end, "hold" by a later "release" event)
    fwd = [(root, "pass"), (wte, "next")] + [(m, "next") for m in wpe]
    for b in blocks:
        fwd += [(empty, "next")] * (1 + checkpointed) + [(m, "next") for m in b]
    fwd += [(final_norm, "next")]
    bwd: list[tuple[Module, str]] = [(root, "pass"), (final_norm, "next")]
    for b in reversed(blocks):
        if checkpointed:  # the last matmul's backward fetch, then the recompute, then the block's backward
            bwd += [(empty, "next")] * 2 + [(b[-1], "hold"), (empty, "next")] + [(m, "next") for m in b]
            bwd += [(b[-1], "release")] + [(m, "next") for m in reversed(b[:-1])]
        else:
            bwd += [(empty, "next")] + [(m, "next") for m in reversed(b)]
    bwd += [(m, "next") for m in wpe] + [(wte, "next")]
    trace = [m for m, how in fwd + bwd if how != "release"]  # the coordinator's trace: one entry per fetch
    order = [ps for ps, _ in trace]
    backward_from = len(fwd)  # the trace's first backward entry
    queue = deque((p, step) for step, ps in enumerate(order) for p in ps)
    fetched_for: dict[str, int] = defaultdict(lambda: -1)
    held: set[str] = set()
    active: dict[str, int] = defaultdict(int)
    gathered: dict[tuple[bool, int], int] = defaultdict(int)  # (for a backward use, sub-module or -1) -> elements
    n = peak = step = 0

    def gather(p: str, used_at: int) -> None:
        gathered[used_at >= backward_from, module_of.get(p, -1)] += size[p]

    # the reuse window: an entry j of the trace is within it from entry i while the elements of entries i..j-1
    # (every parameter of those modules, the whole ones too) are fewer than the reuse distance
    before = list(itertools.accumulate((numel for _, numel in trace), initial=0))
    uses: dict[str, list[int]] = defaultdict(list)
    for i, ps in enumerate(order):
        for p in ps:
            uses[p].append(i)

    def reused(p: str, at: int) -> bool:
        """Whether ``p`` is used again within the reuse distance from entry ``at`` (``__params_to_release``)."""
        k = bisect.bisect_left(uses[p], at)
        return k < len(uses[p]) and before[uses[p][k]] - before[at] < settings.reuse

    def release(ps: tuple[str, ...], at: int) -> None:
        nonlocal n
        for p in ps:
            active[p] -= 1
            if p in held and not active[p] and fetched_for[p] <= at and not reused(p, at):
                held.discard(p)
                n -= size[p]

    for (ps, _), how in fwd + [(root, "release")] + bwd:  # the root's forward ends: its parameters may go
        if how == "release":
            release(ps, step)
            continue
        for p in ps:
            active[p] += 1
            if p not in held:
                held.add(p)
                n += size[p]
                gather(p, step)
        wanted = {p for p in ps if fetched_for[p] < step}
        popped: set[str] = set()
        while queue and len(popped) < len(wanted):
            p, used_at = queue.popleft()
            fetched_for[p] = used_at
            popped.add(p)
        if settings.prefetch > 0:
            room, launched, ahead = min(settings.max_live - n, settings.prefetch), 0, set()
            while queue and launched < room:
                p, used_at = queue.popleft()
                if p not in held and p not in ahead:
                    ahead.add(p)
                    launched += size[p]
                    gather(p, used_at)
                fetched_for[p] = max(fetched_for[p], used_at)
            held.update(ahead)
            n += launched
        peak = max(peak, n)
        step += 1
        if how == "next":
            release(ps, step)
    per_module = [sum(n for _, n in m if n >= settings.persistence) * model.layers for m in block]
    outer = sum(size[p] for p in {*root[0], *wte[0], *(p for m in wpe for p in m[0])})

    def share(phase: bool, index: int, whole: int) -> float:
        return gathered[phase, index] / whole if whole else 1.0

    return Stage3Step(peak,
                      tuple(share(False, i, w) for i, w in enumerate(per_module)),
                      tuple(share(True, i, w) for i, w in enumerate(per_module)),
                      (share(False, -1, outer), share(True, -1, outer)),
                      (sum(n for (backward, _), n in gathered.items() if not backward),
                       sum(n for (backward, _), n in gathered.items() if backward)),
                      sum(size.values()))


def gathered_peak(model: ModelSpec, settings: Stage3Settings, checkpointed: bool) -> int:
    """The most elements of partitioned parameters DeepSpeed's ZeRO-3 holds gathered at once in a training step of
    ``model`` under ``settings`` (every block checkpointed or none), by its coordinator's rules (module docstring)."""
    return simulate(model, settings, checkpointed).peak


def staged_gradients(model: ModelSpec, reduce_bucket: int) -> int:
    """Elements of gradients DeepSpeed's ZeRO-3 stages for reduction at once (module docstring): the reduce bucket,
    and the larger of its interleaved copy and the largest gradient reduced from its own tensor."""
    root_params, block = _modules(model)
    largest = max(n for module in (*block, root_params) for _, n in module)
    return reduce_bucket + max(largest, reduce_bucket)


def deepspeed_step(ds: Stage3Step, settings: Stage3Settings, which: str, elem_bytes: int) -> DeepSpeedStep:
    """What a DeepSpeed ZeRO-3 run of the prediction does by its coordinator's rules (``simulate``): the
    stage-3 settings it runs under (``which``: zerotune's export or DeepSpeed's defaults), the times it gathers its
    partitioned parameters in a step, forward and backward, and the most bytes of them it holds gathered."""
    forward, backward = (n / ds.partitioned if ds.partitioned else 0.0 for n in ds.elements)
    return {"stage3_settings": which, "stage3": settings.config(),
            "gathered_per_step": forward + backward, "gathered_forward": forward, "gathered_backward": backward,
            "held_peak_bytes": ds.peak * elem_bytes}

def held_bytes(model: ModelSpec, settings: Stage3Settings, s: Strategy, elem_bytes: int) -> int:
    """Bytes DeepSpeed's ZeRO-3 holds for its communication under ``settings`` (module docstring): what its
    coordinator holds gathered at its fullest, in the run's dtype, and the gradients it stages for reduction in its
    buckets' dtype (the communication dtype: fp32 reductions with ``grad_bits`` 32, else the run's)."""
    bucket_bytes = wire_elem_bytes(elem_bytes, s.grad_bits) if s.grad_bits >= 16 else elem_bytes
    return (gathered_peak(model, settings, s.activation_checkpointing) * elem_bytes
            + staged_gradients(model, bucket_elements(s.reduce_bucket_mb)) * bucket_bytes)


def by_module(ct: Timer, gathers: dict[int, Coll], lengths: tuple[int, ...], units: tuple[int, ...],
               model: ModelSpec, times: tuple[float, ...] | None = None) -> dict[int, float]:
    """Seconds of each block bucket's gather issued as one all-gather per sub-module
    (``Calibration.gathers = "module"``): the bucket's shard split in the sub-modules' proportions
    (``plan.block_modules``, its LayerNorms shared among them), one collective per block and module, each
    sub-module gathered ``times`` times in the pass (``Stage3Step``: more than once where a recompute's
    gathers were released before its backward, less where what the pass before gathered is kept; None: once)."""
    modules = tuple(sum(n for _, n in m) for m in _modules(model)[1])
    times = times or (1.0,) * len(modules)
    total = sum(modules)
    out = {}
    for n, u in dict(zip(lengths, units, strict=True)).items():
        op, rng, numel, bits = gathers[n]
        out[n] = u * sum(k * ct((op, rng, max(1, round(numel * m / total / u)), bits))
                         for m, k in zip(modules, times, strict=True))
    return out


class Gathers(NamedTuple):
    """The gathers of one strategy's micro-step as its runner issues them: the schedule's (``Seconds``), or
    DeepSpeed's ZeRO-3's, sub-module by sub-module as often as its coordinator gathers each."""

    fwd: dict[int, float]
    """Forward gather by bucket length."""
    bwd: dict[int, float]
    """Backward gather by bucket length."""
    root_fwd: float
    """The root's gather, exposed before the forward pass."""
    root_bwd: float
    """The root's second gather at the turn to backward (0: it stays gathered, as zerotune's engine keeps it)."""
    prefetch: int
    """Buckets gathered ahead of the one computing (``Strategy.prefetch_buckets``; 0 for DeepSpeed: none credited)."""
    passes: dict[tuple, tuple[float, float, float]] | None
    """Where the pipeline's passes are memoized (``Seconds.passes``); None where the gathers are the strategy's own."""
    deepspeed: DeepSpeedStep | None
    """What a DeepSpeed ZeRO-3 run gathers and holds, where it shards parameters (None: another runner or stage)."""
    held: int | None
    """The bytes such a run holds for its communication (``held_bytes``: ``memory.memory_per_rank`` books them);
    None where the runner holds the schedule's buckets."""


def gathers_of(setup: Setup, sched: Schedule, costs: Costs, seconds: Seconds) -> Gathers:
    """The gathers of ``setup``'s micro-step (``Gathers``): a runner that gathers per sub-module (DeepSpeed's ZeRO-3,
    ``Calibration.gathers = "module"``) gathers each as often as its parameter coordinator does
    (``simulate``): the root a second time at the turn to backward where its reuse distance does not keep
    it, and a checkpointed block's sub-modules a third time where the recompute released them beyond that distance."""
    model, s, calib = setup.model, setup.strategy, setup.calib
    if calib.gathers != "module":
        return Gathers(seconds.fwd, seconds.bwd, seconds.fwd[sched.root], 0.0, s.prefetch_buckets, seconds.passes,
                       None, None)
    ct = costs.time
    stage3 = settings_for(model, setup.cluster, s, calib.stage3_settings)
    root_f, root_b, deepspeed, held = seconds.fwd[sched.root], 0.0, None, None
    fwd_times = bwd_times = None
    if s.param_span:  # ZeRO-3: each sub-module as often as its coordinator gathers it
        ds = simulate(model, stage3, s.activation_checkpointing)
        deepspeed = deepspeed_step(ds, stage3, calib.stage3_settings, setup.elem_bytes)
        held = held_bytes(model, stage3, s, setup.elem_bytes)
        fwd_times, bwd_times = ds.forward, ds.backward
        # the root's parameters (embeddings, final LayerNorm) are released after forward like every other
        # module's and gathered again for the head's backward where the reuse distance does not keep them
        # (counted on DeepSpeed 0.19.8 under the export: every parameter gathered twice a step,
        # tests/tuner/test_exports.py); zerotune's engine keeps the root
        root_f, root_b = root_f * ds.root[0], ct(sched.bwd[sched.root]) * ds.root[1]
    fwd = {**seconds.fwd, **by_module(ct, sched.fwd, sched.lengths, sched.units, model, fwd_times)}
    bwd = {**seconds.bwd, **by_module(ct, sched.bwd, sched.lengths, sched.units, model, bwd_times)}
    return Gathers(fwd, bwd, root_f, root_b, 0, None, deepspeed, held)
