"""The hierarchical ZeRO engine: flat buckets, gathers, reductions and the AdamW step (DESIGN.md §3).

Shard layout (nested, so every step is one range collective): a bucket's padded flat buffer is
split into S_P chunks by the rank's index over levels 1..P (its *param shard*); each of those into
S_{P+1..G} pieces by the index over levels P+1..G (its *grad shard*); each of those by G+1..O (its
*optimizer shard*). Hence:

- forward: all-gather the param shard over span P (``weight_bits`` above ``quantize_above``);
  prefetch the next ``prefetch_buckets`` buckets; keep the span-``secondary_span`` chunk (hpZ);
  release the full buffer after the bucket's forward;
- backward, bucket by bucket in reverse: all-gather again (from the secondary shard, 16-bit, or the
  param shard), backward through the bucket, reduce-scatter its gradients over levels 1..P then
  P+1..G (``grad_bits``; at 32 cast up to fp32 first), in reduce groups of about ``reduce_bucket_mb``;
  accumulate into the grad shard (fp32 at ``grad_bits`` 32) over micro-batches. On the step's last
  micro-step (``final``) each group's grad shards are then reduce-scattered over G+1..O and all-reduced
  across replicas (O+1..L) in the same queued job, while backward runs on, as DeepSpeed's
  ``overlap_comm`` and DDP's buckets reduce on their accumulation boundary;
- step: AdamW on the fp32 optimizer shard, all-gather the new weights over P+1..O (16-bit: the
  authoritative shard is never quantized), drop secondary shards.

The root unit (embeddings, final LayerNorm and the head, tied or its own) stays gathered from the start of
forward to the end of backward. All collectives run in order on one communication thread, so every
rank issues the same sequence and, on CPU (gloo, whose collectives block their caller), prefetches
overlap compute. On a GPU that thread is the caller's own (``InlineExecutor``): NCCL queues a
collective and returns, so a thread adds nothing but the hand-offs between two threads that share the
GIL. NCCL also makes the issuing stream wait for each collective, and the engine issues them on the
compute stream, so on a GPU its prefetches and reductions do not yet overlap compute (no side stream).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zerotune.core.plan import Bucket, plan_buckets
from zerotune.core.spec import ModelSpec, Strategy
from zerotune.core.topology import Topology
from zerotune.core.volume import QUANT_BLOCK
from zerotune.trainer.accountant import MemoryAccountant
from zerotune.trainer.checkpointing import run_checkpointed
from zerotune.trainer.comm import ByteCounter, Communicator
from zerotune.trainer.flat import FlatBucket, flatten, module_name
from zerotune.trainer.gpt import build_gpt, unit_params


class InlineExecutor:
    """The communication "thread" on a GPU: runs each submitted call at once, on the caller's thread,
    and returns its finished ``Future`` (its exception, if it raised), as ``ThreadPoolExecutor`` would.

    With NCCL a collective's call only queues it on the device and returns, and so do the quantization
    kernels around it: a second thread overlaps no host work, while every gather costs two hand-offs
    of the GIL. The main thread holds the GIL while it launches a block's kernels, so a prefetch
    submitted to the thread runs only once the main thread blocks on it. On one H100 (gpt-1.3b, one
    sequence, 25 buckets; bench/trainer_vs_fsdp.py --profile --trace-dir) the device waited 17 ms of an
    86 ms step for the host, and the forward's Python took 14.6 ms of its host time under the profiler
    against DDP's 4.7 (``python bench/trace_phases.py bench/data/h100-1gpu-fused/trace/*.json.gz``).
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as exc:  # handed to whoever waits, as a pool does (Ctrl-C still stops the caller)
            fut.set_exception(exc)
        return fut

    def shutdown(self, wait: bool = True) -> None:
        """Nothing runs in the background: nothing to wait for."""


def adamw_options(device: torch.device) -> dict[str, bool]:
    """How ``torch.optim.AdamW`` runs on ``device``: fused on a GPU (a multi-tensor kernel reads master,
    gradient and both moments once and writes them once, ~28 bytes an element), unfused elsewhere. The
    unfused update runs a kernel per operation (lerp, mul, addcmul, sqrt, div, add, addcdiv), each a pass
    over the fp32 shards: on an H200, 22 of the 72 ms of device time of a gpt-1.3b step at one sequence,
    10.3 ms fused (bench/data/h200-1gpu/profile, fused-adamw)."""
    return {"fused": True} if device.type == "cuda" else {"foreach": False}


class ZeroEngine:
    """Trains a GPT from ``ModelSpec`` with ``Strategy`` on the ranks of ``topo``."""

    def __init__(self, spec: ModelSpec, strategy: Strategy, topo: Topology, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", lr: float = 1e-3, weight_decay: float = 0.0, seed: int = 0,
                 quant_block: int = QUANT_BLOCK, betas: tuple[float, float] = (0.9, 0.999),
                 grad_clip: float | None = None, inline_comm: bool | None = None) -> None:
        """``inline_comm``: run collectives on the caller's thread (``InlineExecutor``) instead of the
        communication thread; None chooses by device, inline on a GPU, a thread elsewhere."""
        strategy.validate_for(topo.cluster)
        self.spec, self.s, self.topo, self.dtype = spec, strategy, topo, dtype
        self.device = torch.device(device)
        self.counter = ByteCounter()
        self.comm = Communicator(topo, self.counter, quant_block)
        self.mem = MemoryAccountant()
        self.elem = torch.empty((), dtype=dtype).element_size()
        # grad_bits 32: gradients are cast up to fp32 before their first reduction and accumulate in fp32
        self.grad_dtype = torch.float32 if strategy.grad_bits == 32 else dtype
        self.grad_elem = torch.empty((), dtype=self.grad_dtype).element_size()
        s, L = strategy, topo.num_levels
        self.p_range, self.pg_range, self.go_range = (1, s.param_span), (s.param_span + 1, s.grad_span), \
            (s.grad_span + 1, s.optim_span)
        self.replica_range = (s.optim_span + 1, L)
        self.plan = plan_buckets(spec, topo.world_size, s.allgather_bucket_mb, s.reduce_bucket_mb)
        self.model = build_gpt(spec, seed=seed, dtype=dtype).to(self.device)
        units = dict(unit_params(self.model))
        self.buckets = [self._build_bucket(b, [p for u in b.units for p in units[u]]) for b in self.plan.buckets]
        self.optimizer = torch.optim.AdamW([b.master for b in self.buckets], lr=lr, weight_decay=weight_decay,
                                           betas=betas, **adamw_options(self.device))
        self.grad_clip = grad_clip
        self._comm_thread: ThreadPoolExecutor | InlineExecutor = (
            InlineExecutor() if (self.device.type == "cuda" if inline_comm is None else inline_comm)
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerotune-comm"))
        self._inflight: list[Future] = []
        self._final_done = False

    # -- construction ---------------------------------------------------------------------------
    def _build_bucket(self, plan: Bucket, params: list[tuple[str, torch.Tensor]]) -> FlatBucket:
        full, views = flatten(self.model, plan, params, self.dtype, self.device)
        param_shard = self.comm.shard(full, self.p_range)
        opt_shard = self.comm.shard(self.comm.shard(param_shard, self.pg_range), self.go_range)
        grad_numel = plan.padded // self.topo.size((1, self.s.grad_span))
        grad_shard = torch.zeros(grad_numel, dtype=self.grad_dtype, device=self.device)
        b = FlatBucket(plan=plan, flat=nn.Parameter(full), views=views, param_shard=param_shard,
                       grad_shard=grad_shard, master=nn.Parameter(opt_shard.float()))
        if self.s.param_span == 0:
            b.param_shard = b.flat.data  # replicated: the full buffer is the shard, always resident
            b.gathered = True
        else:
            b.flat.data.untyped_storage().resize_(0)
        self.mem.exclude(b.flat)
        self.mem.alloc("params", b.param_shard.numel() * self.elem)
        self.mem.alloc("grads", grad_numel * self.grad_elem)
        self.mem.alloc("optim_states", 3 * b.master.numel() * 4)  # fp32 master + AdamW exp_avg, exp_avg_sq
        return b

    # -- gathers ---------------------------------------------------------------------------------
    def _submit_gather(self, b: FlatBucket, backward: bool) -> None:
        if b.gathered or b.pending is not None:
            return
        s = self.s
        if backward and b.secondary is not None:
            src, rng, bits = b.secondary, (1, s.secondary_span or 0), 16
        else:
            src, rng, bits = b.param_shard, self.p_range, s.weight_bits
        nbytes = b.plan.padded * self.elem
        self.mem.alloc("comm_buffers", nbytes)
        b.flat.data.untyped_storage().resize_(nbytes)  # the gather lands in the bucket's own buffer
        b.pending = self._comm_thread.submit(self.comm.all_gather, src, rng, bits=bits,
                                             quantize_above=s.quantize_above, out=b.flat.data)

    def _materialize(self, b: FlatBucket, backward: bool) -> None:
        """Wait for the bucket's gather, fill its flat buffer and point the modules at it."""
        if not b.gathered:
            self._submit_gather(b, backward)
            assert b.pending is not None
            b.pending.result()  # written into b.flat's storage through .data: autograd's saved views of
            b.pending = None    # the bucket see the new values, with no version bump
            b.gathered = True
            if not backward and self.s.secondary_span is not None and b.secondary is None and not b.plan.is_root:
                b.secondary = self.comm.shard(b.flat.data, (1, self.s.secondary_span))
                self.mem.alloc("secondary_params", b.secondary.numel() * self.elem)
        # one split, not one slice per parameter: autograd then builds the bucket's gradient in a
        # single pass instead of zero-filling a full-bucket tensor per slice and summing them
        sizes = [shape.numel() for _, _, shape, _ in b.views]
        parts = b.flat.split([*sizes, b.plan.padded - sum(sizes)])
        for (module, attr, shape, _), part in zip(b.views, parts, strict=False):
            # straight into the instance's dict: flatten() took the name off module._parameters, so
            # nn.Module.__setattr__'s checks (Parameter? buffer? submodule?) would end there anyway
            vars(module)[attr] = part.view(shape)

    def _release(self, b: FlatBucket) -> None:
        if self.s.param_span == 0 or not b.gathered:
            return
        b.flat.data.untyped_storage().resize_(0)
        b.gathered = False
        self.mem.free("comm_buffers", b.plan.padded * self.elem)

    def _prefetch(self, order: list[FlatBucket], i: int, backward: bool) -> None:
        for b in order[i + 1:i + 1 + self.s.prefetch_buckets]:
            self._submit_gather(b, backward)

    # -- reductions ------------------------------------------------------------------------------
    def _reduce_group(self, group: list[FlatBucket], grads: list[torch.Tensor], final: bool) -> None:
        """Reduce-scatter a group's full gradients to grad shards (levels 1..P, then P+1..G); with
        ``final`` (the step's last micro-step), reduce each accumulated grad shard on to its optimizer
        shard too (``_reduce_outer``)."""
        s_p, s_pg = self.topo.size(self.p_range), self.topo.size(self.pg_range)
        # one bucket is reduced in place; several are interleaved so each rank's part is one range
        staged = grads[0] if len(grads) == 1 else torch.cat([g.view(s_p, s_pg, -1) for g in grads], dim=2).reshape(-1)
        staged = staged.to(self.grad_dtype)  # grad_bits 32: the fp32 copy is what travels (no copy otherwise)
        nbytes = staged.numel() * self.grad_elem
        self.mem.alloc("comm_buffers", nbytes)
        for g in grads:
            self.mem.free("comm_buffers", g.numel() * self.elem)
        bits, qa = self.s.grad_bits, self.s.quantize_above

        def run() -> None:
            part = self.comm.reduce_scatter(staged, self.p_range, bits=bits, quantize_above=qa, in_place=True)
            part = self.comm.reduce_scatter(part, self.pg_range, bits=bits, quantize_above=qa, in_place=True)
            offset = 0
            for b in group:
                n = b.grad_shard.numel()
                b.grad_shard.add_(part[offset:offset + n])
                offset += n
            self.mem.free("comm_buffers", nbytes)
            if final:
                for b in group:
                    self._reduce_outer(b)
        self._inflight.append(self._comm_thread.submit(run))

    def _reduce_outer(self, b: FlatBucket) -> None:
        """Reduce a bucket's accumulated grad shard beyond the grad span: reduce-scatter over G+1..O,
        all-reduce across replicas (O+1..L), in place; the optimizer shard's gradient is kept as
        ``b.reduced`` for the step."""
        bits, qa = self.s.grad_bits, self.s.quantize_above
        g = self.comm.reduce_scatter(b.grad_shard, self.go_range, bits=bits, quantize_above=qa, in_place=True)
        b.reduced = self.comm.all_reduce(g, self.replica_range, bits=bits, quantize_above=qa, in_place=True)

    def _wait_inflight(self) -> None:
        for fut in self._inflight:
            fut.result()
        self._inflight.clear()

    # -- one micro-step --------------------------------------------------------------------------
    def forward_backward(self, idx: torch.Tensor, targets: torch.Tensor, loss_scale: float, *,
                         final: bool = True) -> torch.Tensor:
        """Forward and backward of one micro-batch; gradients land in the grad shards.

        Args:
            idx, targets: (B, T) token ids.
            loss_scale: multiplies the loss before backward (1 / (world · accumulation steps)).
            final: this is the step's last micro-step: its backward also reduces the accumulated
                gradients beyond the grad span (every rank must pass the same). Pass False for the
                others; a micro-step after a final one, before ``step``, is refused.
        Returns:
            the unscaled loss, a 0-dim tensor on the device: reading it (``float``) waits for the device,
            so a caller sums the micro-steps' losses and reads them once a step. On a GPU a read per
            micro-step stops the host from queueing the next one while this one runs (gpt-1.3b on one
            H200, 2 sequences per micro-step: 0.394 s per step with a read per micro-step, 0.332 without).
        """
        if self._final_done:
            raise RuntimeError("forward_backward after the step's final micro-step: call step() first, or pass "
                               "final=False to every micro-step but the last")
        self._final_done = final
        root, blocks = self.buckets[0], self.buckets[1:]
        seen: set[int] = set()
        self._submit_gather(root, backward=False)
        self._prefetch([root, *blocks], 0, backward=False)
        self._materialize(root, backward=False)
        with self.mem.saved_activations(seen, root.activations):
            x0 = self.model.embed(idx)
        x, boundaries = x0, []
        for i, b in enumerate(blocks):
            self._prefetch(blocks, i, backward=False)
            self._materialize(b, backward=False)
            x_in = x.detach().requires_grad_()
            with self.mem.saved_activations(seen, b.activations):
                x = x_in
                for unit in b.plan.units:
                    x = self._run_block(int(unit[5:]), x, seen, b.activations)
            boundaries.append((x_in, x))
            self._release(b)
        h_in = x.detach().requires_grad_()
        with self.mem.saved_activations(seen, root.activations):
            loss = self.model.head_loss(h_in, targets)
        self.mem.alloc("comm_buffers", root.plan.padded * self.elem)  # the root's full gradient, filled from here
        (loss * loss_scale).backward()
        grad, rev = h_in.grad, list(reversed(blocks))
        pending: list[FlatBucket] = []
        groups = {i: list(g) for g in self.plan.reduce_groups for i in g}
        for i, b in enumerate(rev):
            self._prefetch(rev, i, backward=True)
            self._materialize(b, backward=True)
            x_in, x_out = boundaries[-1 - i]
            self.mem.alloc("comm_buffers", b.plan.padded * self.elem)  # the full gradient autograd fills
            torch.autograd.backward(x_out, grad)
            grad = x_in.grad
            self.mem.free("activations", b.activations[0])
            b.activations[0] = 0
            self._release(b)
            pending.append(b)
            if {p.plan.index for p in pending} == set(groups[b.plan.index]):
                self._reduce_group(pending, [self._take_grad(p) for p in pending], final)
                pending = []
        torch.autograd.backward(x0, grad)
        self.mem.free("activations", root.activations[0])
        root.activations[0] = 0
        self._reduce_group([root], [self._take_grad(root)], final)
        self._release(root)
        return loss.detach()

    def _run_block(self, i: int, x: torch.Tensor, seen: set[int], counted: list[int]) -> torch.Tensor:
        block = self.model.blocks[i]
        if not self.s.checkpointed(i):
            return block(x)
        # checkpoint keeps the block's input for backward, and with the selective policy the outputs it keeps:
        # book them as the block's activations
        def book(out: Any) -> None:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.mem.book_activation(t, seen, counted)

        book(x)
        return run_checkpointed(block, x, self.s.checkpoint_policy, book)

    @staticmethod
    def _take_grad(b: FlatBucket) -> torch.Tensor:
        g = b.flat.grad
        assert g is not None
        b.flat.grad = None
        return g.reshape(-1)

    # -- the step --------------------------------------------------------------------------------
    def step(self, lr: float | None = None) -> float:
        """Reduce grad shards to optimizer shards, AdamW, gather new weights; returns the grad norm.

        ``lr`` sets this step's learning rate (a schedule's value); ``grad_clip`` (constructor) scales
        the gradients down to that global norm when they exceed it, as Megatron and DeepSpeed do."""
        self._wait_inflight()
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for b in self.buckets:  # in place: the optimizer's gradient may be a view of the grad shard
            if b.reduced is None:  # no final micro-step reduced it (a caller that passed final=False throughout)
                self._reduce_outer(b)
            assert b.reduced is not None
            b.master.grad = b.reduced.float()
            b.reduced = None
            sq += torch.linalg.vector_norm(b.master.grad).double() ** 2
        group = self.topo.group((1, self.s.optim_span))
        if group is not None:  # a logging scalar, not counted in the strategy's bytes
            dist.all_reduce(sq, group=group)
        norm = sq.sqrt()
        if self.grad_clip is not None:  # on the device: no wait for the norm before the optimizer is queued
            coef = (self.grad_clip / (norm + 1e-6)).clamp(max=1.0).float()
            for b in self.buckets:
                assert b.master.grad is not None
                b.master.grad.mul_(coef)
        if lr is not None:
            for group_ in self.optimizer.param_groups:
                group_["lr"] = lr
        self.optimizer.step()
        for b in self.buckets:
            b.master.grad = None
            b.grad_shard.zero_()
        self._final_done = False
        for b in self.buckets:  # nested layout: optimizer shard -> grad-span piece -> param shard
            new = self.comm.all_gather(b.master.detach().to(self.dtype), self.go_range)
            self.comm.all_gather(new, self.pg_range, out=b.param_shard)
            if b.secondary is not None:
                self.mem.free("secondary_params", b.secondary.numel() * self.elem)
                b.secondary = None
        return float(norm)  # the step's one wait for the device, after everything is queued

    # -- inspection ------------------------------------------------------------------------------
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, gathered unquantized over span P (a collective: call on all ranks)."""
        out = {}
        for b in self.buckets:
            full = self.comm.all_gather(b.param_shard, self.p_range) if self.s.param_span else b.param_shard
            for module, attr, shape, offset in b.views:
                name = f"{module_name(self.model, module)}.{attr}".lstrip(".")
                out[name] = full[offset:offset + shape.numel()].view(shape).clone()
        return out

    def close(self) -> None:
        self._comm_thread.shutdown(wait=True)
