"""The training of one optimizer step when nobody names its batch: how many sequences each rank trains.

One default for every place that trains or predicts a step: a request's global batch (and so every trial of its
study, ``tuner.space.default_global_batch``), ``zerotune train`` and ``zerotune predict``. A user who compares a
prediction with a run, or either with a study's answer, all with their defaults, compares the same training.
"""

from __future__ import annotations

SEQUENCES_PER_RANK = 4
"""A step's default sequences per rank. A study's default batch: its largest micro-batch (4) on every rank, so every
micro-batch it tries (1, 2, 4) divides it and accumulates to the same training. And enough that one step's loss
is not ruled by a single sequence: with one 128-token sequence per step on gpt-mini (local:1) the loss moves by
0.02–0.78 nats from one step to the next, 0.19 on average, as much as a short run learns in several steps."""


def default_accumulation(micro_batch_size: int) -> int:
    """Micro-batches per step of the default training: ``SEQUENCES_PER_RANK`` per rank, in whole micro-batches of
    ``micro_batch_size`` (rounded up where it does not divide them: 8 sequences per rank for a micro-batch of 8)."""
    return -(-SEQUENCES_PER_RANK // micro_batch_size)


def default_global_batch(world_size: int, micro_batch_size: int = 1) -> int:
    """Sequences per optimizer step of the default training on ``world_size`` ranks: ``SEQUENCES_PER_RANK`` per
    rank in whole micro-batches (world x micro-batch x :func:`default_accumulation`)."""
    return world_size * micro_batch_size * default_accumulation(micro_batch_size)
