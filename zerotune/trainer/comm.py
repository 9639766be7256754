"""Hierarchical and flat collectives over level ranges, optionally quantized, with a byte counter.

Layout contract: a buffer partitioned over a level range (lo..hi) of S ranks is padded to a
multiple of S and split into S equal chunks; the rank with *chunk index* j owns chunk j, where the
chunk index counts the innermost level slowest (``Communicator.chunk_index``: j = i_lo·S_(lo+1..hi)
+ … + i_hi). That is the order the hierarchical collectives produce with no local copy, so a
gather lands straight in its destination and a reduce-scatter reads its input in place. Every
function below keeps that contract, so hierarchical and flat versions return identical tensors
(exactly, unquantized) and tests compare them.

- hierarchical all-gather: outermost level first on the smallest pieces, innermost last (MiCS
  §3.3); each level prepends its index as the slowest dimension, which is the chunk order;
- hierarchical reduce-scatter: the mirror — innermost level first on the whole buffer, whose
  slowest dimension is that level's index;
- all-reduce: reduce-scatter then all-gather over the same range;
- flat: one primitive over the whole range (the reference and the "flat" algorithm); its group
  orders ranks innermost level fastest, so one local permutation maps between the two orders.

Quantized levels (level ≥ ``quantize_above`` and bits < 16): all-gathers move the block-quantized
payload of each original shard (quantized once, dequantized once after the quantized levels);
reduce-scatters become an all-to-all of quantized chunks per level, dequantized and summed in fp32
before the next level (qgZ, ZeRO++ §3.3) — no reduction ever runs on quantized data.

On gloo, an all-gather of 1 MiB or more and an in-place reduce-scatter of 1 MiB or more run as one
broadcast / reduce per rank of the group, in place: gloo's own primitives copy the whole buffer
into temporaries, which on the CPU ranks of a short run cost more resident memory than the
strategy's buffers (``_by_roots``). NCCL runs its own, which are in place already.

Every primitive goes through ``_primitive``, which books the bytes this rank sends on the level the
group spans (flat: the outermost level crossed) into a :class:`ByteCounter`; ``volume.py`` has the
closed forms these counts must equal.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from zerotune.core.topology import LevelRange, Topology
from zerotune.core.volume import QUANT_BLOCK, Volume, pad_to
from zerotune.trainer import quant

BY_ROOTS_MIN_BYTES = 1 << 20
"""From this buffer size on, a gloo all-gather or in-place reduce-scatter runs as s broadcasts / reduces."""

# torch >= 2.13 names them *_single; older releases only have *_tensor / *_into_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ByteCounter:
    """Bytes sent by this rank, by level name and collective kind, and the seconds its calls took.

    Seconds are wall time of the call where it is issued: on gloo (CPU) a collective returns when it is
    done, so they are the time spent in it; NCCL queues a collective on a stream and returns, so on GPU
    they are the host's issue time only."""

    def __init__(self) -> None:
        self.bytes: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.calls: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.seconds: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.quant_elements = 0
        """Elements block-quantized plus elements dequantized (as ``costmodel`` counts them)."""
        self.quant_seconds = 0.0
        """Wall seconds in those (de)quantization calls (on GPU, their issue time only)."""

    def add(self, level: str, kind: str, nbytes: int, seconds: float = 0.0) -> None:
        self.bytes[level][kind] += nbytes
        self.calls[level][kind] += 1
        self.seconds[level][kind] += seconds

    def add_quant(self, elements: int, seconds: float) -> None:
        self.quant_elements += elements
        self.quant_seconds += seconds

    def quant_dict(self) -> dict[str, float]:
        return {"elements": self.quant_elements, "seconds": self.quant_seconds}

    def seconds_dict(self) -> dict[str, dict[str, float]]:
        return {lv: dict(kinds) for lv, kinds in self.seconds.items() if any(kinds.values())}

    def as_dict(self) -> Volume:
        return {lv: {k: n for k, n in kinds.items() if n} for lv, kinds in self.bytes.items() if any(kinds.values())}

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self.seconds.clear()
        self.quant_elements, self.quant_seconds = 0, 0.0


class Communicator:
    """Collectives of one rank over level ranges of its :class:`Topology`."""

    def __init__(self, topo: Topology, counter: ByteCounter | None = None, block: int = QUANT_BLOCK) -> None:
        self.topo = topo
        self.counter = counter if counter is not None else ByteCounter()
        self.block = block
        self._gloo: dict[int, bool] = {}
        self._global: dict[int, list[int]] = {}

    # -- the one place bytes are sent -------------------------------------------------------
    def _primitive(self, kind: str, levels: LevelRange, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Run one collective on the group of ``levels`` and book the bytes this rank sends and the seconds it took."""
        start = time.perf_counter()
        s = self.topo.size(levels)
        group = self.topo.group(levels)
        nbytes = inp.numel() * inp.element_size()
        if kind == "all_gather":
            if self._by_roots(group, out):
                self._gather_by_broadcasts(out, inp, group, s)
            else:
                _ALL_GATHER(out, inp, group=group)
            sent = (s - 1) * nbytes
        elif kind == "reduce_scatter":
            if self._by_roots(group, inp) and self._own_chunk(out, inp, group, s):
                self._reduce_by_reduces(inp, group, s)
            else:
                _REDUCE_SCATTER(out, inp, group=group)
            sent = (s - 1) * nbytes // s
        elif kind == "all_to_all":
            dist.all_to_all_single(out, inp, group=group)
            sent = (s - 1) * nbytes // s
        elif kind == "all_reduce":
            dist.all_reduce(out, group=group)
            sent = 2 * (s - 1) * nbytes // s
        else:
            raise AssertionError(kind)
        self.counter.add(self.topo.level_name(levels[1]), kind, sent, time.perf_counter() - start)

    def _quantize(self, x: torch.Tensor, bits: int) -> torch.Tensor:
        """``quant.quantize`` of ``x`` (rows of its last dim), booking its elements and seconds."""
        start = time.perf_counter()
        payload = quant.quantize(x, bits, self.block)
        self.counter.add_quant(x.numel(), time.perf_counter() - start)
        return payload

    def _dequantize(self, payload: torch.Tensor, numel: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
        """``quant.dequantize`` of each payload row to ``numel`` elements, booking them and its seconds."""
        start = time.perf_counter()
        out = quant.dequantize(payload, numel, bits, dtype, self.block)
        self.counter.add_quant(out.numel(), time.perf_counter() - start)
        return out

    # -- gloo: the same collectives without gloo's full-size temporaries ----------------------
    def _by_roots(self, group: Any, full: torch.Tensor) -> bool:
        """Whether to run a large gloo all-gather / in-place reduce-scatter as one broadcast / reduce
        per rank. gloo's own all_gather_single and reduce_scatter_single copy the whole buffer into
        temporaries (measured on 2-4 ranks with a 12 MiB buffer: +20-38 MiB peak RSS each, and slower
        than s broadcasts / reduces of the chunks, which run in place with none). Below 1 MiB the
        native call is faster (one call's latency, not s). NCCL keeps its own in-place collectives."""
        if full.numel() * full.element_size() < BY_ROOTS_MIN_BYTES:
            return False
        key = id(group)
        if key not in self._gloo:
            self._gloo[key] = dist.get_backend(group) == "gloo"
        return self._gloo[key]

    def _roots(self, group: Any, s: int) -> list[int]:
        key = id(group)
        if key not in self._global:
            self._global[key] = [dist.get_global_rank(group, k) for k in range(s)]
        return self._global[key]

    @staticmethod
    def _own_chunk(out: torch.Tensor, inp: torch.Tensor, group: Any, s: int) -> bool:
        """Whether ``out`` is this rank's chunk of ``inp`` itself (an in-place reduce-scatter)."""
        m = inp.numel() // s
        return out.data_ptr() == inp.data_ptr() + dist.get_rank(group) * m * inp.element_size()

    def _gather_by_broadcasts(self, out: torch.Tensor, inp: torch.Tensor, group: Any, s: int) -> None:
        m, me = inp.numel(), dist.get_rank(group)
        if inp.data_ptr() != out[me * m:].data_ptr():
            out[me * m:(me + 1) * m].copy_(inp)
        for k, root in enumerate(self._roots(group, s)):
            dist.broadcast(out[k * m:(k + 1) * m], src=root, group=group)

    def _reduce_by_reduces(self, inp: torch.Tensor, group: Any, s: int) -> None:
        """Chunk k summed onto rank k; gloo uses the other ranks' chunk k as scratch, which an in-place
        reduce-scatter allows (its input is consumed)."""
        m = inp.numel() // s
        for k, root in enumerate(self._roots(group, s)):
            dist.reduce(inp[k * m:(k + 1) * m], dst=root, group=group)

    def _quantized(self, levels: LevelRange, bits: int, quantize_above: int) -> bool:
        """Whether data crossing ``levels`` is quantized: some level >= quantize_above has 2+ ranks."""
        return bits < 16 and any(self.topo.level_size(lv) > 1 for lv in range(max(levels[0], quantize_above),
                                                                               levels[1] + 1))

    # -- partitioning -------------------------------------------------------------------------
    def chunk_index(self, levels: LevelRange) -> int:
        """Which chunk of a buffer partitioned over ``levels`` this rank owns (innermost level slowest)."""
        j = 0
        for level in range(levels[0], levels[1] + 1):
            j = j * self.topo.level_size(level) + self.topo.index((level, level))
        return j

    def shard(self, full: torch.Tensor, levels: LevelRange) -> torch.Tensor:
        """This rank's chunk of a 1-D buffer partitioned over ``levels`` (padded with zeros)."""
        s = self.topo.size(levels)
        chunk = pad_to(full.numel(), s) // s
        padded = _padded(full.reshape(-1), chunk * s)
        j = self.chunk_index(levels)
        return padded[j * chunk:(j + 1) * chunk].clone()

    def _sizes(self, levels: LevelRange) -> list[int]:
        return [self.topo.level_size(level) for level in range(levels[0], levels[1] + 1)]

    # -- all-gather ---------------------------------------------------------------------------
    def all_gather(self, shard: torch.Tensor, levels: LevelRange, *, numel: int | None = None, bits: int = 16,
                   quantize_above: int = 1, flat: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
        """Gather equal 1-D shards over ``levels`` into the full buffer (trimmed to ``numel``).

        ``out``: a 1-D buffer of the full size to gather into (the last collective writes straight
        into it, no temporary of the full size); the returned tensor is then ``out``."""
        lo, hi = levels
        s = self.topo.size(levels)
        if s == 1:
            full = shard.reshape(-1)
        elif flat:
            sizes = self._sizes(levels)
            gathered = self._gather_levels(shard, [levels], bits, quantize_above)  # group order (s_hi, …, s_lo, c)
            k = len(sizes)
            full = gathered.view(*reversed(sizes), -1).permute(*reversed(range(k)), k).reshape(-1)
        else:
            # outermost first; levels of one rank move nothing and leave the layout unchanged
            order = [(level, level) for level in range(hi, lo - 1, -1) if self.topo.level_size(level) > 1]
            full = self._gather_levels(shard, order, bits, quantize_above, out=out).reshape(-1)
        if out is not None and full.data_ptr() != out.data_ptr():
            out.copy_(full[:out.numel()])
            full = out
        return full[:numel] if numel is not None else full

    def _gather_levels(self, shard: torch.Tensor, order: list[LevelRange], bits: int,
                       quantize_above: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Gather over each range of ``order`` in turn; each prepends one dim of its size. With ``out``
        of exactly the full size, unquantized gathers run in place in it (no temporary); a quantized
        one writes its last gather there."""
        c, dtype = shard.numel(), shard.dtype
        quantized = [r for r in order if self._quantized(r, bits, quantize_above)]
        total = c * math.prod(self.topo.size(r) for r in order)
        if out is not None and not quantized and out.numel() == total and out.dtype == dtype and order:
            return self._gather_in_place(shard, order, out)
        buf = self._quantize(shard.reshape(1, c), bits) if quantized else shard.reshape(1, c)
        for i, levels in enumerate(order):
            if i == len(quantized) and quantized:  # leaving the quantized (outer) levels
                buf = self._dequantize(buf, c, bits, dtype)
            total = self.topo.size(levels) * buf.numel()
            last = i == len(order) - 1 and len(quantized) < len(order)
            dest = out if last and out is not None and out.numel() == total and out.dtype == buf.dtype \
                else buf.new_empty(total)
            self._primitive("all_gather", levels, dest, buf.contiguous().view(-1))
            buf = dest.view(self.topo.size(levels), *buf.shape)
        if len(quantized) == len(order):
            buf = self._dequantize(buf, c, bits, dtype)
        return buf.reshape(*buf.shape[:-2], c)  # drop the leading 1

    def _gather_in_place(self, shard: torch.Tensor, order: list[LevelRange], out: torch.Tensor) -> torch.Tensor:
        """The unquantized hierarchical gather with every step in place in ``out`` (NCCL's and gloo's
        in-place all-gather: the input is this rank's slot of the output). In chunk order the block
        gathered over the outer levels k..hi sits at this rank's index over the inner levels lo..k-1,
        so each level's input is its own slot of the next level's output."""
        lo, c = order[-1][0], shard.numel()
        out = out.view(-1)
        m = c  # the block gathered so far: levels above the current one
        start = self.chunk_index((lo, order[0][1])) * c
        if shard.data_ptr() != out[start:].data_ptr():
            out[start:start + c].copy_(shard.view(-1))
        for levels in order:  # outermost first
            k = levels[0]
            s = self.topo.size(levels)
            base = self.chunk_index((lo, k - 1)) * s * m if k > lo else 0
            i = self.topo.index(levels)
            self._primitive("all_gather", levels, out[base:base + s * m], out[base + i * m:base + (i + 1) * m])
            m *= s
        return out

    # -- reduce-scatter -----------------------------------------------------------------------
    def reduce_scatter(self, full: torch.Tensor, levels: LevelRange, *, bits: int = 16, quantize_above: int = 1,
                       flat: bool = False, in_place: bool = False) -> torch.Tensor:
        """Sum 1-D buffers over ``levels``; return this rank's chunk (buffer padded to the range size).

        ``in_place``: unquantized hierarchical levels reduce in place (NCCL's and gloo's in-place
        reduce-scatter: the output is this rank's slot of the input), so no temporary is made; the
        input is overwritten and the result is a view of it."""
        lo, hi = levels
        s_all = self.topo.size(levels)
        if s_all == 1:
            return full.reshape(-1) if in_place else full.reshape(-1).clone()
        padded = _padded(full.reshape(-1), pad_to(full.numel(), s_all))
        if flat:  # the group's order (s_hi, …, s_lo, m) from the chunk order (s_lo, …, s_hi, m)
            sizes = self._sizes(levels)
            k = len(sizes)
            grouped = padded.view(*sizes, -1).permute(*reversed(range(k)), k).reshape(-1)
            return self._reduce_level(grouped, levels, bits, quantize_above)
        # chunk order is (s_lo, …, s_hi, m): the innermost level, reduced first, is already the slowest dim
        buf = padded
        for level in range(lo, hi + 1):
            buf = self._reduce_level(buf, (level, level), bits, quantize_above, in_place)
        return buf

    def _reduce_level(self, buf: torch.Tensor, levels: LevelRange, bits: int, quantize_above: int,
                      in_place: bool = False) -> torch.Tensor:
        """Reduce-scatter ``buf`` (this range's index as the slowest dim) over one group."""
        s = self.topo.size(levels)
        if s == 1:
            return buf
        m = buf.numel() // s
        if not self._quantized(levels, bits, quantize_above):
            i = self.topo.index(levels)
            out = buf[i * m:(i + 1) * m] if in_place else buf.new_empty(m)
            self._primitive("reduce_scatter", levels, out, buf)
            return out
        payload = self._quantize(buf.view(s, m), bits)  # (s, bytes): one payload per peer
        received = torch.empty_like(payload)
        self._primitive("all_to_all", levels, received, payload)
        parts = self._dequantize(received, m, bits, torch.float32)  # (s, m)
        return parts.sum(dim=0).to(buf.dtype)

    # -- all-reduce ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, levels: LevelRange, *, bits: int = 16, quantize_above: int = 1,
                   flat: bool = False, in_place: bool = False) -> torch.Tensor:
        """Sum a 1-D buffer over ``levels``: reduce-scatter then all-gather (flat + unquantized:
        one all_reduce primitive). ``in_place``: the sum may be written into ``x`` and returned
        (always, unquantized, when ``x`` splits evenly over the range)."""
        s = self.topo.size(levels)
        if s == 1:
            return x.reshape(-1) if in_place else x.reshape(-1).clone()
        if in_place and not flat and not self._quantized(levels, bits, quantize_above) and x.numel() % s == 0:
            part = self.reduce_scatter(x, levels, in_place=True)
            return self.all_gather(part, levels, out=x.view(-1))
        if flat and not self._quantized(levels, bits, quantize_above):
            out = _padded(x.reshape(-1), pad_to(x.numel(), s)).clone()
            self._primitive("all_reduce", levels, out, out)
            return out[:x.numel()]
        part = self.reduce_scatter(x, levels, bits=bits, quantize_above=quantize_above, flat=flat)
        return self.all_gather(part, levels, numel=x.numel(), bits=bits, quantize_above=quantize_above, flat=flat)


def _padded(x: torch.Tensor, numel: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, numel - x.numel())) if numel > x.numel() else x
