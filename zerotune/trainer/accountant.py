"""The memory accountant: bytes per rank by category, current and peak, booked by the engine.

Categories (DESIGN.md §3): ``params`` (the 16-bit shards at param_span), ``secondary_params`` (hpZ
shards), ``grads`` (gradient shards at grad_span), ``optim_states`` (fp32 master weights and
AdamW moments at optim_span), ``comm_buffers`` (gathered full buckets, full gradients awaiting
reduction, reduction staging) and ``activations`` (every tensor autograd saves for backward,
counted once per storage through ``saved_tensors_hooks``; parameter storages are excluded).
The engine books each buffer when it creates it and releases it when it drops it, so the figures
are exact for those buffers, not estimates; allocator overhead and transient temporaries inside one
collective or one kernel are not included.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from zerotune.core.records import MEMORY_CATEGORIES

CATEGORIES = MEMORY_CATEGORIES


class MemoryAccountant:
    def __init__(self) -> None:
        self.current: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self._params: set[int] = set()

    def alloc(self, category: str, nbytes: int) -> None:
        self.current[category] += nbytes
        self.peak[category] = max(self.peak[category], self.current[category])
        self.peak_total = max(self.peak_total, sum(self.current.values()))

    def free(self, category: str, nbytes: int) -> None:
        self.current[category] -= nbytes
        assert self.current[category] >= 0, (category, self.current[category])

    def exclude(self, flat: torch.Tensor) -> None:
        """Never count ``flat`` or views of it as activations (a parameter buffer)."""
        self._params.add(id(flat))

    def book_activation(self, t: torch.Tensor, seen: set[int], counted: list[int]) -> torch.Tensor:
        """Book ``t``'s storage as activations into ``counted[0]``, once per storage (``seen``), parameters left out;
        returns ``t``."""
        if id(t) in self._params or id(t._base) in self._params:
            return t
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in seen and storage.nbytes():
            seen.add(ptr)
            counted[0] += storage.nbytes()
            self.alloc("activations", storage.nbytes())
        return t

    @contextmanager
    def saved_activations(self, seen: set[int], counted: list[int]) -> Iterator[None]:
        """Count the bytes autograd saves inside the block into ``counted[0]`` (once per storage)."""
        with torch.autograd.graph.saved_tensors_hooks(lambda t: self.book_activation(t, seen, counted), lambda t: t):
            yield

    def report(self) -> dict[str, int]:
        """Peak bytes per category and the peak of their sum (``peak``)."""
        return {**self.peak, "peak": self.peak_total}
