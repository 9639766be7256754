"""FLOPs and memory traffic of one token through the model: what sets the compute time.

A step's compute is two kinds of kernel. The matmuls and the attention are compute-bound: their
FLOPs at the device's achievable rate (``Calibration.compute_efficiency``; a fused attention kernel's
at its own published rate where the run names it, ``Calibration.attention_efficiency``). Everything else the
model runs — LayerNorms, the GELU, residual adds, bias gradients, the qkv split's backward, the
embedding gathers and the loss over the vocabulary — is memory-bound: it moves bytes through HBM
and does next to no arithmetic, so it costs its bytes at the device's streaming rate
(``Calibration.memory_bytes_per_s``). Their share is what makes a small model slower per FLOP than
a large one: a block's matmul FLOPs grow as h² per token and its memory-bound bytes as h, and the
loss reads and writes V values per token whatever the model's width (at h = 768 and V = 50,368 the
loss moves as many bytes per token as all twelve blocks' LayerNorms, GELUs and adds together).

The byte counts are the engine's model (``trainer.gpt``: pre-LN GPT-2 blocks, GELU MLP, multi-head
or grouped-query attention, tied or untied head, ``F.cross_entropy`` on fp32 logits) run eagerly, one
kernel per op, each reading its inputs and writing its outputs once; views move nothing, index kernels
(embedding, NLL) read only the rows they index. ``tests/costmodel/test_traffic.py`` counts them off the
model's own op stream (a ``TorchDispatchMode`` over a forward and backward) and holds these formulas to
that count.
With ``e`` bytes per activation element (2 in bf16/fp16, 4 in fp32), per token:

- block forward: LayerNorm ×2 (read and write h, fp32 mean and rstd: 2·(2he + 8)), residual add ×2
  (read 2h, write h: 6he), GELU (read and write f: 2fe) — ``10he + 2fe + 16``;
- block backward: the residual stream's two gradient sums (6he), LayerNorm ×2 (read gradient and
  input, write gradient, read mean and rstd: 2·(3he + 8)), GELU's (read gradient and input, write:
  3fe), the qkv split's (a concatenation: read and write h + 2k, k = ``ModelSpec.kv``, the keys' width:
  2(h + 2k)e), bias gradients (read each linear's output gradient: (h + 2k) + h + f + h) —
  ``17he + 6ke + 4fe + 16`` (``23he + 4fe + 16`` without grouped-query attention); a recomputed forward
  (activation checkpointing) moves the forward's bytes again;
- root forward: the token gather (read and write h, and the token id: 2he + 8; the position gather
  is per position, shared by a micro-batch's sequences), the sum of both (2he), the final LayerNorm
  (2he + 8), then the loss: the logits cast to fp32 (read Ve, write 4V; none in fp32), log-softmax
  (read 4V, write 4V), NLL (reads the target and its row's one value: 8 + 4) —
  ``6he + 8V + (4V + Ve)·[e<4] + 28``;
- root backward: NLL's (writes the 4V gradient, reads the target), log-softmax's (read gradient and
  output, write: 12V), the cast's (read 4V, write Ve), the final LayerNorm's (3he + 8), the position
  gradient summed over the micro-batch (read h), the token embedding's gradient (read h and the
  token id) — ``5he + 16V + (4V + Ve)·[e<4] + 24``.

A Llama (``ModelSpec.arch = "llama"``; ``trainer.gpt.LlamaBlock``) runs other kernels. Its RMSNorm
(Hugging Face's) computes in fp32 whatever the run's dtype: pow (read and write 4h), mean (read 4h, write 4),
+ε and rsqrt (4 + 4 each), the product with rstd (read 4h + 4, write 4h), then the weight's product in the run
dtype (2he): ``20h + 2he + 24`` per norm, and below fp32 the casts to fp32 and back (2(4 + e)h). Rotary
positions on a query or key width w (h, k): x·cos, the rotated half's negation and concatenation, ·sin and the
sum, ``10we``; the SwiGLU's silu and product, ``5fe``. Per token:

- block forward: two norms, two residual adds, rotary on q and k, SwiGLU —
  ``20he + 40h + 10ke + 5fe + 48 + 4(4 + e)h·[e<4]``;
- block backward (autograd's kernels for the same ops: the norms' products, pow, mean's expanded division
  and rsqrt; the rotary slices' and concatenation's; silu's and the product's; the residual stream's and the
  three projections' input gradient sums) — ``43he + 144h + 16ke + 9fe + 72 + 4(4 + e)h·[e<4]``;
- root forward: the token gather (2he + 8), the final norm, the loss as GPT's (8V + 12) —
  ``4he + 20h + 8V + 44 + (4 + e)(V + 2h)·[e<4]``;
- root backward — ``7he + 72h + 16V + 52 + (4 + e)(V + 2h)·[e<4]``.

A run whose loss is one fused kernel (``LOSS_KERNELS``, ``Calibration.loss_kernel = "fused"``) moves, in place of
the loss terms above, 2·V·e + 16 forward and backward (``loss_bytes``). An unfused attention
(``attention.SCORE_PASSES``) adds its passes over the heads x T scores of each token to the block's bytes.

What is per parameter or per position rather than per token (the embedding tables' gradient writes,
the LayerNorms' and biases' parameter gradients, the position gather) is left out: the optimizer
step's passes carry the per-parameter bytes.

``compute_seconds`` is the compute stage of ``predict``'s pipeline: a micro-step's seconds per block and for the
head, as ``pipeline.time_step`` lays them beside the collectives.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from zerotune.core.plan import block_numel, root_numel
from zerotune.core.spec import ModelSpec


@dataclass(frozen=True)
class Traffic:
    """Bytes of memory-bound kernels per token, by pass."""

    block_fwd: int
    block_bwd: int
    root_fwd: int
    """Embeddings, final LayerNorm and the loss (the LM head's matmul is compute: ``flops``)."""
    root_bwd: int


LOSS_KERNELS = ("torch", "fused", "vocab-parallel")
"""The loss a run computes over the vocabulary (``Calibration.loss_kernel``): ``torch`` (``F.cross_entropy`` on fp32
logits, the engine's), ``fused`` (one kernel that reads the logits in the run's dtype and keeps their
log-sum-exp, and one that writes their gradient: flash-attn's ``CrossEntropyLoss``, which llm-foundry's MPT
calls by default) or ``vocab-parallel`` (Megatron's vocabulary-parallel cross-entropy on fp32 logits, op by op, as
nanotron runs it on one tensor-parallel rank; ``loss_bytes``)."""

BLOCK_KERNELS = ("eager", "nanotron")
"""The memory-bound kernels of a run's blocks (``Calibration.block_kernels``): ``eager`` (the engine's GPT block and
a Hugging Face Llama's, op by op: the module docstring's formulas) or ``nanotron`` (nanotron's ``LlamaDecoderLayer``:
flash-attn's Triton RMSNorm and rotary kernels, a fused gate-up projection, the rest eager; ``nanotron_block_bytes``).
A GPT block is the same under both."""


def nanotron_block_bytes(model: ModelSpec, elem_bytes: int) -> tuple[int, int]:
    """Bytes per token of nanotron's Llama block (huggingface/nanotron ``src/nanotron/models/llama.py`` at 67c5ebb, the
    Ultra-Scale Playbook's benchmark branch), forward and backward. Counted, not derived: ``bench/nanotron_kernels.py``
    runs its ``LlamaDecoderLayer`` on one CPU rank (a tensor-parallel group of 1) under a byte counter (every kernel
    reads its inputs and writes its outputs once, in-place ones too), with flash-attn's kernels stood in by one
    kernel each (``layer_norm_fn`` with ``is_rms_norm``: x and the weight in, y and the fp32 rstd out; backward dy, x,
    the weight and rstd in, dx out; the rotary embedding in place on q and k; the attention as compute), at hidden
    2,048 and 3,072, SwiGLU 4,096 and 8,192, and 8, 16 and 32 key/value heads of 32
    (``bench/data/nanotron-kernels/report.txt``, which ``tests/costmodel/test_traffic.py`` holds this formula to).
    The counts are linear in
    each width: forward 17·h·e + 14·k·e + 5·f·e + 10 (the norms' 4·h·e, the residual adds' 6·h·e, rotary's in-place
    2(h + k)·e, the key/value concatenation and layout copies, silu and the product over the fused gate-up output);
    backward 19·h·e + 10·k·e + 13·f·e + 8, and 6·h·e more with as many key/value heads as query heads (the backward of
    the key/value split stacks the two gradients there). The Hugging Face block's RMSNorm alone moves about 36·h bytes
    a norm forward where flash-attn's moves 2·h·e."""
    h, k, f, e = model.hidden, model.kv, model.ffn, elem_bytes
    forward = 17 * h * e + 14 * k * e + 5 * f * e + 10
    backward = 19 * h * e + 10 * k * e + 13 * f * e + 8 + (6 * h * e if k == h else 0)
    return forward, backward


def loss_bytes(vocab: int, elem_bytes: int, loss: str = "torch") -> tuple[int, int]:
    """Bytes per token of the loss over the vocabulary, forward and backward. ``torch``: the logits' cast to fp32
    (below fp32), log-softmax and NLL, and their backward (module docstring). ``fused``: flash-attn's xentropy kernels
    (Dao-AILab/flash-attention ``csrc/xentropy/xentropy_kernel.cu`` at 383caa67, one thread block a row): the forward
    reads each row of logits twice (``ilpReduce`` for its max and sum, then again for the sum of exponentials) and
    writes the loss and the log-sum-exp (2·V·e + 8, and 8 for the target); the backward reads the logits, the
    log-sum-exp, the loss's gradient and the target and writes the logits' gradient (2·V·e + 16)."""
    v, e = vocab, elem_bytes
    if loss == "fused":
        return 2 * v * e + 16, 2 * v * e + 16
    if loss == "vocab-parallel":  # the cast to fp32 (Ve + 4V); max 4V, subtract 8V, exp in place 8V, sum 4V, divide in
        # place 8V; backward: the softmax times the loss's gradient in place (8V), the cast's backward (4V + Ve)
        return v * e + 36 * v + 8, v * e + 12 * v + 8
    if loss != "torch":
        raise ValueError(f"loss={loss!r}: must be one of {list(LOSS_KERNELS)}")
    cast = 4 * v + v * e if e < 4 else 0  # F.cross_entropy(logits.float()): a cast only below fp32
    return 8 * v + 12 + cast, 16 * v + 8 + cast


@functools.lru_cache(maxsize=1024)
def traffic(model: ModelSpec, elem_bytes: int, loss: str = "torch", score_passes: tuple[int, int] = (0, 0),
            kernels: str = "eager") -> Traffic:
    """Bytes per token the memory-bound kernels of ``model`` move in HBM (formulas: module docstring), the loss
    computed by ``loss`` (``LOSS_KERNELS``), ``score_passes`` passes, forward and backward, over the attention
    scores an unfused attention materializes (heads x T elements a token: ``Calibration.score_passes``), and a Llama's
    blocks and final norm run by ``kernels`` (``BLOCK_KERNELS``)."""
    if kernels not in BLOCK_KERNELS:
        raise ValueError(f"kernels={kernels!r}: must be one of {list(BLOCK_KERNELS)}")
    h, f, e, k = model.hidden, model.ffn, elem_bytes, model.kv
    loss_fwd, loss_bwd = loss_bytes(model.vocab, e, loss)
    scores = model.heads * model.seq_len * e  # bytes of one pass over a token's scores, every head's
    scores_fwd, scores_bwd = score_passes[0] * scores, score_passes[1] * scores
    if model.llama and kernels == "nanotron":  # flash-attn's RMSNorm on the final norm too: 2he + 4 and 3he + 4
        fwd, bwd = nanotron_block_bytes(model, e)
        return Traffic(block_fwd=fwd + scores_fwd, block_bwd=bwd + scores_bwd,
                       root_fwd=4 * h * e + 12 + loss_fwd, root_bwd=4 * h * e + 12 + loss_bwd)
    if model.llama:  # an RMSNorm's casts to fp32 and back below fp32: (4 + e) bytes an element
        cast = (4 + e) * h if e < 4 else 0
        return Traffic(block_fwd=20 * h * e + 40 * h + 10 * k * e + 5 * f * e + 48 + 4 * cast + scores_fwd,
                       block_bwd=43 * h * e + 144 * h + 16 * k * e + 9 * f * e + 72 + 4 * cast + scores_bwd,
                       root_fwd=4 * h * e + 20 * h + 32 + 2 * cast + loss_fwd,
                       root_bwd=7 * h * e + 72 * h + 44 + 2 * cast + loss_bwd)
    return Traffic(block_fwd=10 * h * e + 2 * f * e + 16 + scores_fwd,
                   block_bwd=17 * h * e + 6 * k * e + 4 * f * e + 16 + scores_bwd,
                   root_fwd=6 * h * e + 16 + loss_fwd,
                   root_bwd=5 * h * e + 16 + loss_bwd)


def block_flops(model: ModelSpec) -> int:
    """Forward FLOPs of one block per token: its matmuls (2 per weight) and the attention's scores
    and weighted sum (``attention_flops``); the backward is twice that."""
    return 2 * block_numel(model) + attention_flops(model)


def attention_flops(model: ModelSpec) -> int:
    """Forward FLOPs of one block's attention per token, as MFU counts them: the scores and the weighted sum
    over the whole T x T square (4·h·T), not halved for the causal mask; the backward is twice that."""
    return 4 * model.hidden * model.seq_len


def head_flops(model: ModelSpec) -> int:
    """Forward FLOPs of the root per token: the LM head's matmul, 2 per embedding element (the position
    table included, as ``root_numel`` counts it; an untied head's, not the token embedding it does not
    multiply: ``ModelSpec.flops_per_token``); the backward is twice that."""
    return 2 * (root_numel(model) - model.untied_head_numel)


@dataclass(frozen=True)
class PassSeconds:
    """Seconds per token of each compute pass (``pass_seconds``), and the memory-bound part of them."""

    block_fwd: float
    block_bwd: float
    """A block's backward, what it recomputes of the forward included under activation checkpointing."""
    head_fwd: float
    head_bwd: float
    block_memory: float
    """The memory-bound kernels' part of ``block_fwd + block_bwd``."""
    head_memory: float
    """The memory-bound kernels' part of ``head_fwd + head_bwd``."""
    block_attention: float
    """The attention kernel's part of ``block_fwd + block_bwd`` (its recomputed forward included)."""

    def step(self, layers: int) -> float:
        """A forward and backward pass over ``layers`` blocks and the head."""
        return layers * (self.block_fwd + self.block_bwd) + self.head_fwd + self.head_bwd

    def blend(self, other: PassSeconds, share: float) -> PassSeconds:
        """The mean block of a model whose blocks are ``share`` like ``other`` and the rest like this one (some
        blocks checkpointed, ``Strategy.checkpoint_every``); the head is the same in both."""
        return dataclasses.replace(self, **{f: (1 - share) * getattr(self, f) + share * getattr(other, f)
                                            for f in ("block_fwd", "block_bwd", "block_memory", "block_attention")})


def block_matmuls(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """A block's matmuls as the engine's block runs them, in forward order: (input width, output width) of
    each, per token (2 · in · out FLOPs). GPT: qkv, proj, fc, out. Llama: wq, wk, wv, wo, w1, w3, w2 (the
    SwiGLU's w1 before w3, as ``w2(silu(w1 n) · w3 n)`` evaluates, and as torchtitan's ``FeedForward``)."""
    h, f, k = model.hidden, model.ffn, model.kv
    if model.llama:
        return ((h, h), (h, k), (h, k), (h, h), (h, f), (h, f), (f, h))
    return ((h, h + 2 * k), (h, h), (h, f), (f, h))


def kept_matmuls(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """The matmuls whose outputs selective checkpointing keeps (``Strategy.checkpoint_policy``): the first,
    third, ... of ``block_matmuls`` (torchtitan's op policy saves every ``mm`` but each second one)."""
    return block_matmuls(model)[0::2]


def recomputed_matmul_flops(model: ModelSpec) -> int:
    """Forward FLOPs per token of the matmuls a selectively checkpointed block runs again in its backward: the
    second, fourth, ... of ``block_matmuls`` but the block's last (the attention kernel's outputs are kept: it
    does not run again). The last matmul's output only feeds the residual add, whose backward needs no input:
    torch's non-reentrant checkpoint stops recomputing once every tensor the backward needs is back
    (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default), before it (GPT's ``out``)."""
    mms = block_matmuls(model)
    return sum(2 * i * o for i, o in mms[1:-1:2])


def last_matmul_flops(model: ModelSpec) -> int:
    """Forward FLOPs per token of a block's last matmul (GPT's ``out``, a Llama's ``w2``): what a fully checkpointed
    block's backward does not run again where the checkpoint stops early (``Calibration.recompute_early_stop``)."""
    i, o = block_matmuls(model)[-1]
    return 2 * i * o


RECOMPUTE = ("none", "full", "full-early-stop", "selective")
"""What a block's backward runs again (``Strategy.recompute``; ``"full-early-stop"``: all of its forward but the
last matmul, ``Calibration.recompute_early_stop``)."""


@functools.lru_cache(maxsize=4096)
def pass_seconds(model: ModelSpec, elem_bytes: int, flops_per_s: float, bytes_per_s: float,
                 recompute: str = "none", attention_flops_per_s: float = 0.0,
                 attention_forward_share: float = 0.0, loss: str = "torch",
                 score_passes: tuple[int, int] = (0, 0), kernels: str = "eager") -> PassSeconds:
    """Seconds per token of a block's and the head's forward and backward: FLOPs (``block_flops``,
    ``head_flops``; the backward twice the forward) at ``flops_per_s``, the attention's part of them
    (``attention_flops``) at ``attention_flops_per_s`` where its kernel has its own rate (0: at
    ``flops_per_s``), its forward taking ``attention_forward_share`` of that kernel's forward-and-backward
    time (0: a third, as its FLOPs), bytes (``traffic``) at ``bytes_per_s`` (0: not charged), and with
    ``recompute`` (``RECOMPUTE``) the backward rerunning the block's forward: all of it (``"full"``), all of it but
    its last matmul (``"full-early-stop"``), or, with selective checkpointing, the matmuls whose outputs were not
    kept (``recomputed_matmul_flops``) and every memory-bound kernel of the forward (``"selective"``; the attention
    kernel's outputs are kept). ``loss``, ``score_passes`` and ``kernels`` name the memory-bound kernels (``traffic``).
    The residual add after the last matmul, which early stop skips too, is left in
    the memory-bound bytes (h elements of the block's 20-40 per token)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {list(RECOMPUTE)}, not {recompute!r}")
    t, per_byte = traffic(model, elem_bytes, loss, score_passes, kernels), (1 / bytes_per_s if bytes_per_s else 0.0)
    attention = attention_flops(model)
    matmuls = (block_flops(model) - attention) / flops_per_s
    kernel = 3 * attention / (attention_flops_per_s or flops_per_s)  # the attention's forward and backward
    share = attention_forward_share if attention_flops_per_s and attention_forward_share else 1 / 3
    block = matmuls + share * kernel
    head, full = head_flops(model) / flops_per_s, int(recompute.startswith("full"))
    redo = {"none": 0.0, "full": block, "full-early-stop": block - last_matmul_flops(model) / flops_per_s,
            "selective": recomputed_matmul_flops(model) / flops_per_s}[recompute]
    mem_fwd = t.block_fwd * per_byte
    mem_bwd = (t.block_bwd + (recompute != "none") * t.block_fwd) * per_byte
    head_mem_fwd, head_mem_bwd = t.root_fwd * per_byte, t.root_bwd * per_byte
    return PassSeconds(block_fwd=block + mem_fwd, block_bwd=2 * matmuls + (1 - share) * kernel + redo + mem_bwd,
                       head_fwd=head + head_mem_fwd, head_bwd=2 * head + head_mem_bwd,
                       block_memory=mem_fwd + mem_bwd, head_memory=head_mem_fwd + head_mem_bwd,
                       block_attention=kernel * (1 + full * share))


def step_seconds(model: ModelSpec, elem_bytes: int, flops_per_s: float, bytes_per_s: float,
                 attention_flops_per_s: float = 0.0, score_passes: tuple[int, int] = (0, 0)) -> float:
    """Seconds per token of one forward and backward pass (no recomputation), at ``flops_per_s`` on
    the compute-bound kernels (the attention's at ``attention_flops_per_s``, 0: the same) and ``bytes_per_s``
    on the memory-bound ones (0: not charged), ``score_passes`` over materialized attention scores among them."""
    return pass_seconds(model, elem_bytes, flops_per_s, bytes_per_s, attention_flops_per_s=attention_flops_per_s,
                        score_passes=score_passes).step(model.layers)
