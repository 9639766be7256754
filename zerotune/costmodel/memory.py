"""Bytes per rank by category, from the schedule's bucket lengths (the accountant's categories).

With e = bytes per element of the run's dtype and S_k the ranks of span k, summed over buckets of
padded length n: P = n·e/S_P, G = n·e/S_G (4·n/S_G with fp32 reductions, ``grad_bits`` 32),
OS = 12·n/S_O (fp32 master, exp_avg, exp_avg_sq), hpZ = n·e/S_H per block bucket — for ZeRO-3,
(2 + 2 + 12)·Ψ/N with 16-bit e (ZeRO, Rajbhandari et al. 2020, §5).

Activations per micro-batch of t = B·T tokens, per block: (6h + 2k)·t·e + 2·t·f·e saved tensors (two LN
inputs and outputs, the QKV output (h + 2k, k = ``ModelSpec.kv``: 3h without grouped-query attention, so
8·t·h·e), the attention output, the GELU input and output; cf.
Korthikanti et al. 2022 §4, without dropout) plus fp32 LayerNorm statistics and attention
log-sum-exp; only the block input t·h·e with checkpointing (on every ``checkpoint_every``-th block, the others
keeping all of theirs); with selective checkpointing the block input, the
outputs of the matmuls it keeps (``traffic.kept_matmuls``: GPT's qkv and fc, a Llama's wq, wv, w1 and w2), the
attention's output and its log-sum-exp — what torch's selective-checkpoint cache holds; the head keeps the final LN's
input and output and the fp32 log-softmax (t·V·4); the embedding keeps the token and position ids.
A Llama block keeps 8·t·h + (6h + 2k)·t·e + 4·t·f·e: each RMSNorm's input in fp32 (its own cast: the run's
input itself in fp32), normalized value, output and fp32 rstd, the rotated q and k, v, the attention output, and
the SwiGLU's two projections, silu and product; its head the final RMSNorm's four and the log-softmax; the
rotary cos and sin tables once per run.
The predicted ``activations`` add the head's backward transient, t·V·(4 + e): when backward starts,
every activation is still held, and the cross-entropy's backward allocates the fp32 gradient of the
log-probabilities and then the run-dtype gradient of the logits beside them — the step's largest
temporary, which the accountant (saved tensors only) does not book. Measured on one H200 (gpt-1.3b,
bf16, micro-batches of 1-8 sequences of 2,048 tokens: bench/data/h200-1gpu/report.txt), the
prediction without it was 3.6-10.6% under ``torch.cuda.max_memory_allocated``, the gap growing as t·V.
A run whose loss is one fused kernel (``Calibration.loss_kernel = "fused"``: flash-attn's ``CrossEntropyLoss``,
which saves its run-dtype input and the rows' log-sum-exp) keeps t·V·e + 8·t for the head's loss in place of the
log-softmax, and its backward allocates only the logits' gradient, t·V·e. Megatron's vocabulary-parallel loss
(``vocab-parallel``, nanotron's) keeps its fp32 softmax, t·V·4 as the log-softmax, and works its backward in place on
it: only the cast back to the run's dtype is new, t·V·e.
Communication buffers: the root and (1 + prefetch) gathered buckets, and two reduce groups of full
gradients (the one staged for reduction in fp32 with ``grad_bits`` 32). A run by DeepSpeed's ZeRO-3
(``Calibration.gathers = "module"``) holds instead what its coordinator gathers at its fullest under the run's
stage-3 settings, and the gradients it stages in and beside its reduce bucket (``coordinator.held_bytes``).
Peak = their sum (an upper bound).
"""

from __future__ import annotations

import math

from zerotune.core.records import MEMORY_CATEGORIES, MemoryBytes, MemoryCategory, Overflow
from zerotune.core.spec import ClusterSpec, ModelSpec, Strategy
from zerotune.core.volume import wire_elem_bytes
from zerotune.costmodel.schedule import Schedule, Setup, build_schedule
from zerotune.costmodel.traffic import kept_matmuls

GIB = 2**30
CATEGORIES = MEMORY_CATEGORIES


def schedule_state_memory(sched: Schedule, sizes: tuple[int, ...], s: Strategy, elem_bytes: int) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    prefix = [math.prod(sizes[:k]) for k in range(len(sizes) + 1)]
    s_p, s_g, s_o = prefix[s.param_span], prefix[s.grad_span], prefix[s.optim_span]
    out = {"params": 0, "secondary_params": 0, "grads": 0, "optim_states": 0}
    grad_bytes = wire_elem_bytes(elem_bytes, s.grad_bits)  # fp32 reductions keep fp32 grad shards
    for n, k in sched.bucket_counts:
        out["params"] += k * (n // s_p * elem_bytes)
        out["grads"] += k * (n // s_g * grad_bytes)
        out["optim_states"] += k * 12 * (n // s_o)
    if s.secondary_span is not None:  # block buckets only: the root stays gathered
        out["secondary_params"] = sum(k * (n // prefix[s.secondary_span] * elem_bytes) for n, k in sched.block_counts)
    return out


def state_memory(model: ModelSpec, cluster: ClusterSpec, s: Strategy, *, elem_bytes: int) -> dict[str, int]:
    """Bytes per rank of parameters, secondary parameters, gradients and optimizer states."""
    return schedule_state_memory(build_schedule(model, cluster, s), cluster.sizes, s, elem_bytes)


def activation_memory(model: ModelSpec, s: Strategy, elem_bytes: int, loss: str = "torch") -> int:
    """Bytes autograd keeps for one micro-batch (see the module docstring), the loss computed by ``loss``
    (``traffic.LOSS_KERNELS``)."""
    t, h, f, e = s.micro_batch_size * model.seq_len, model.hidden, model.ffn, elem_bytes
    lse = t * model.heads * 4  # fp32 attention log-sum-exp
    if model.llama:
        # per RMSNorm its fp32 input, normalized value, output and fp32 rstd; q, k, v, the attention output; SwiGLU
        saved = 2 * (4 * t * h + 2 * t * h * e + t * 4) + ((2 * h + 2 * model.kv) * t + 4 * t * f) * e + lse
        head = 4 * t * h + 2 * t * h * e + t * 4  # the final RMSNorm's four
        # the rotary cos and sin tables (T x head size, one pair per run, saved by its first block's products)
        # (saved once any block keeps its activations)
        positions = 0 if s.checkpointed_blocks(model.layers) == model.layers else 2 * model.seq_len * model.head_dim * e
    else:
        # (6h + 2k)·t + 2·t·f in the run dtype, fp32 LayerNorm mean and rstd
        saved = ((6 * h + 2 * model.kv) * t + 2 * t * f) * e + 2 * 2 * t * 4 + lse
        head = 2 * t * h * e + 2 * t * 4  # the final LayerNorm's input and output, its statistics
        positions = model.seq_len * 8  # the position ids
    if s.recompute == "full":  # the block's input only
        checkpointed = t * h * e
    elif s.recompute == "selective":  # its input, the kept matmuls' outputs, the attention's output and lse
        checkpointed = t * e * (h + sum(out for _, out in kept_matmuls(model)) + h) + lse
    else:
        checkpointed = saved
    n = s.checkpointed_blocks(model.layers)  # the others keep every activation
    # the fp32 log-softmax and the loss; a fused loss keeps the run-dtype logits, their log-sum-exp and the losses
    head += t * model.vocab * 4 + 4 if loss in ("torch", "vocab-parallel") else t * model.vocab * e + 8 * t
    # ids are views of (B, T+1) token rows; flattening B > 1 rows of targets copies them
    embed = s.micro_batch_size * (model.seq_len + 1) * 8 + (t * 8 if s.micro_batch_size > 1 else 0) + positions
    return n * checkpointed + (model.layers - n) * saved + head + embed


def head_backward_transient(model: ModelSpec, s: Strategy, elem_bytes: int, loss: str = "torch") -> int:
    """Bytes the cross-entropy's backward allocates while every activation is held (module docstring); a fused
    loss writes only the logits' gradient, in the run's dtype."""
    return s.micro_batch_size * model.seq_len * model.vocab * ((4 if loss == "torch" else 0) + elem_bytes)


def memory_per_rank(model: ModelSpec, sched: Schedule, sizes: tuple[int, ...], s: Strategy,
                    elem_bytes: int, held: int | None = None, loss: str = "torch") -> MemoryBytes:
    """Every category and their sum ``peak`` (see the module docstring); ``held``: the communication buffers of a
    run by DeepSpeed's ZeRO-3, which are its own (``coordinator.held_bytes``; None: zerotune's engine, or a runner
    that holds whole buckets); ``loss``: the run's loss kernel (``traffic.LOSS_KERNELS``). The memory stage of
    ``predict``'s pipeline."""
    state = schedule_state_memory(sched, sizes, s, elem_bytes)
    if held is not None:
        comm_buffers = held
    else:
        staged = wire_elem_bytes(elem_bytes, s.grad_bits)
        gathered = (sched.root + (1 + s.prefetch_buckets) * max(sched.lengths, default=0)) if s.param_span else 0
        # two reduce groups: one autograd fills (run dtype), one staged for its reduction (the wire's width)
        comm_buffers = (gathered + sched.largest_group) * elem_bytes + sched.largest_group * staged
    activations = (activation_memory(model, s, elem_bytes, loss) + head_backward_transient(model, s, elem_bytes, loss))
    return {"params": state["params"], "secondary_params": state["secondary_params"], "grads": state["grads"],
            "optim_states": state["optim_states"], "comm_buffers": comm_buffers, "activations": activations,
            "peak": sum(state.values()) + comm_buffers + activations}


_MEMORY: dict[tuple, MemoryBytes] = {}
"""``memory_of`` by what it reads beside the schedule."""


def memory_of(setup: Setup, sched: Schedule, held: int | None) -> MemoryBytes:
    """``memory_per_rank`` of ``setup``'s strategy on ``sched`` (``held``: ``coordinator.Gathers.held``), memoized by
    schedule and what else it reads (the strategy's prefetch, micro-batch and recompute, the dtype and the loss
    kernel): the strategies of a search share them. A fresh dict per call."""
    s = setup.strategy
    key = (sched.key, setup.elem_bytes, s.prefetch_buckets, s.micro_batch_size, setup.recompute, setup.checkpointed,
           held, setup.calib.loss_kernel)
    known = _MEMORY.get(key)
    if known is None:
        if len(_MEMORY) > 65_536:
            _MEMORY.clear()
        known = _MEMORY[key] = memory_per_rank(setup.model, sched, setup.cluster.sizes, s, setup.elem_bytes, held,
                                               setup.calib.loss_kernel)
    return known.copy()


def clear() -> None:
    _MEMORY.clear()


def overflow(memory: MemoryBytes, capacity_gib: float) -> Overflow:
    """What to report when ``memory`` does not fit ``capacity_gib``: the largest category and by how much."""
    def size_of(category: MemoryCategory) -> int:
        return memory[category]

    category = max(CATEGORIES, key=size_of)
    over = memory["peak"] - int(capacity_gib * GIB)
    size = size_of(category)
    return {"category": category, "bytes": size, "over_by_bytes": over,
            "reason": f"needs {memory['peak'] / GIB:.1f} GiB of {capacity_gib:g} GiB; "
                      f"largest: {category} {size / GIB:.1f} GiB"}
