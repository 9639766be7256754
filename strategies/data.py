"""Deterministic training data: a learnable synthetic stream, or windows of a token file.

Sequence number ``i`` is always the same tokens, whoever asks: rank r's micro-batch a of step s
holds sequences ``((s·A + a)·W + r)·B + 0..B-1`` (A accumulation steps, W ranks, B micro-batch
size), so a single-process reference can rebuild the global batch exactly.

Synthetic sequences are arithmetic progressions modulo the vocabulary, ``x_t = (x_0 + k·t) mod V``
with a per-sequence start and stride k ∈ 1..4, and 10% of positions replaced by random tokens: a
model can learn them (loss falls well below log V), and random noise keeps the loss off zero.
A token file is a flat array of uint16 token ids (nanoGPT's ``train.bin`` format).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def sequence_ids(step: int, micro: int, rank: int, *, accum: int, world: int, batch: int) -> list[int]:
    first = ((step * accum + micro) * world + rank) * batch
    return list(range(first, first + batch))


class TokenSource:
    """Sequences of ``seq_len + 1`` tokens by global sequence number."""

    def __init__(self, vocab: int, seq_len: int, seed: int = 0, token_file: str | None = None,
                 noise: float = 0.1) -> None:
        self.vocab, self.seq_len, self.seed, self.noise = vocab, seq_len, seed, noise
        self.tokens: np.ndarray | None = None
        if token_file:
            path = Path(token_file)
            if not path.is_file():
                raise FileNotFoundError(f"token file {token_file!r} not found")
            self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
            if len(self.tokens) < seq_len + 2:
                raise ValueError(f"token file {token_file!r} holds {len(self.tokens)} tokens; "
                                 f"need at least seq_len + 2 = {seq_len + 2}")
            top = int(self.tokens.max())
            if top >= vocab:
                raise ValueError(f"token file {token_file!r} has token id {top} >= the model's vocab {vocab}")

    def sequence(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        t = self.seq_len + 1
        if self.tokens is not None:
            start = int(torch.randint(0, len(self.tokens) - t, (1,), generator=g))
            return torch.from_numpy(self.tokens[start:start + t].astype(np.int64))
        x0 = torch.randint(0, self.vocab, (1,), generator=g)
        stride = torch.randint(1, 5, (1,), generator=g)
        seq = (x0 + stride * torch.arange(t)) % self.vocab
        noise = torch.rand(t, generator=g) < self.noise
        return torch.where(noise, torch.randint(0, self.vocab, (t,), generator=g), seq)

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (len(ids), seq_len)."""
        seqs = torch.stack([self.sequence(i) for i in ids])
        return seqs[:, :-1], seqs[:, 1:]
