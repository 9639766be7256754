"""The single-process reference every strategy must reproduce (the naive path beside the engine).

The same GPT (same seed), the same global batch each step (every rank's micro-batches, in
``data.sequence_ids`` order), mean loss over it (accumulated slice by slice), plain
``torch.optim.AdamW``. With unquantized
communication the engine must match it to rounding (tests/trainer/test_engine.py).
"""

from __future__ import annotations

import torch

from zerotune.core.spec import ModelSpec
from zerotune.trainer.data import TokenSource, sequence_ids
from zerotune.trainer.gpt import build_gpt


def train_reference(spec: ModelSpec, *, steps: int, world: int, micro_batch_size: int, accum: int = 1,
                    lr: float = 3e-3, weight_decay: float = 0.0, seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final parameters of plain single-process training."""
    model = build_gpt(spec, seed=seed, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, foreach=False)
    data = TokenSource(spec.vocab, spec.seq_len, seed=seed)
    losses = []
    scale = 1.0 / (world * accum)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        # one backward per (micro-batch, rank) slice, as the ranks compute them: same kernels,
        # same shapes; only the order of the gradient sum differs from a distributed run
        for micro in range(accum):
            for rank in range(world):
                ids = sequence_ids(step, micro, rank, accum=accum, world=world, batch=micro_batch_size)
                loss = model(*data.batch(ids))
                (loss * scale).backward()
                total += float(loss.detach())
        opt.step()
        losses.append(total * scale)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}
