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

Every primitive goes through ``_primitive``, which books the bytes this rank sends on the level the
group spans (flat: the outermost level crossed) into a :class:`ByteCounter`; ``volume.py`` has the
closed forms these counts must equal.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from strategies import quant
from strategies.topology import LevelRange, Topology
from strategies.volume import QUANT_BLOCK, Volume, pad_to

# torch >= 2.13 names them *_single; older releases only have *_tensor / *_into_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ByteCounter:
    """Bytes sent by this rank, by level name and collective kind."""

    def __init__(self) -> None:
        self.bytes: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.calls: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, level: str, kind: str, nbytes: int) -> None:
        self.bytes[level][kind] += nbytes
        self.calls[level][kind] += 1

    def as_dict(self) -> Volume:
        return {lv: {k: n for k, n in kinds.items() if n} for lv, kinds in self.bytes.items() if any(kinds.values())}

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()


class Communicator:
    """Collectives of one rank over level ranges of its :class:`Topology`."""

    def __init__(self, topo: Topology, counter: ByteCounter | None = None, block: int = QUANT_BLOCK) -> None:
        self.topo = topo
        self.counter = counter if counter is not None else ByteCounter()
        self.block = block

    # -- the one place bytes are sent -------------------------------------------------------
    def _primitive(self, kind: str, levels: LevelRange, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Run one collective on the group of ``levels`` and book the bytes this rank sends."""
        s = self.topo.size(levels)
        group = self.topo.group(levels)
        nbytes = inp.numel() * inp.element_size()
        if kind == "all_gather":
            _ALL_GATHER(out, inp, group=group)
            sent = (s - 1) * nbytes
        elif kind == "reduce_scatter":
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
        self.counter.add(self.topo.level_name(levels[1]), kind, sent)

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
        """Gather over each range of ``order`` in turn; each prepends one dim of its size. The last
        gather writes into ``out`` when it has exactly the full size and nothing follows it."""
        c, dtype = shard.numel(), shard.dtype
        quantized = [r for r in order if self._quantized(r, bits, quantize_above)]
        buf = quant.quantize(shard.reshape(1, c), bits, self.block) if quantized else shard.reshape(1, c)
        for i, levels in enumerate(order):
            if i == len(quantized) and quantized:  # leaving the quantized (outer) levels
                buf = quant.dequantize(buf, c, bits, dtype, self.block)
            total = self.topo.size(levels) * buf.numel()
            last = i == len(order) - 1 and len(quantized) < len(order)
            dest = out if last and out is not None and out.numel() == total and out.dtype == buf.dtype \
                else buf.new_empty(total)
            self._primitive("all_gather", levels, dest, buf.contiguous().view(-1))
            buf = dest.view(self.topo.size(levels), *buf.shape)
        if len(quantized) == len(order):
            buf = quant.dequantize(buf, c, bits, dtype, self.block)
        return buf.reshape(*buf.shape[:-2], c)  # drop the leading 1

    # -- reduce-scatter -----------------------------------------------------------------------
    def reduce_scatter(self, full: torch.Tensor, levels: LevelRange, *, bits: int = 16, quantize_above: int = 1,
                       flat: bool = False) -> torch.Tensor:
        """Sum 1-D buffers over ``levels``; return this rank's chunk (buffer padded to the range size)."""
        lo, hi = levels
        s_all = self.topo.size(levels)
        if s_all == 1:
            return full.reshape(-1).clone()
        padded = _padded(full.reshape(-1), pad_to(full.numel(), s_all))
        if flat:  # the group's order (s_hi, …, s_lo, m) from the chunk order (s_lo, …, s_hi, m)
            sizes = self._sizes(levels)
            k = len(sizes)
            grouped = padded.view(*sizes, -1).permute(*reversed(range(k)), k).reshape(-1)
            return self._reduce_level(grouped, levels, bits, quantize_above)
        # chunk order is (s_lo, …, s_hi, m): the innermost level, reduced first, is already the slowest dim
        buf = padded
        for level in range(lo, hi + 1):
            buf = self._reduce_level(buf, (level, level), bits, quantize_above)
        return buf

    def _reduce_level(self, buf: torch.Tensor, levels: LevelRange, bits: int, quantize_above: int) -> torch.Tensor:
        """Reduce-scatter ``buf`` (this range's index as the slowest dim) over one group."""
        s = self.topo.size(levels)
        if s == 1:
            return buf
        m = buf.numel() // s
        if not self._quantized(levels, bits, quantize_above):
            out = buf.new_empty(m)
            self._primitive("reduce_scatter", levels, out, buf)
            return out
        payload = quant.quantize(buf.view(s, m), bits, self.block)  # (s, bytes): one payload per peer
        received = torch.empty_like(payload)
        self._primitive("all_to_all", levels, received, payload)
        parts = quant.dequantize(received, m, bits, torch.float32, self.block)  # (s, m)
        return parts.sum(dim=0).to(buf.dtype)

    # -- all-reduce ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, levels: LevelRange, *, bits: int = 16, quantize_above: int = 1,
                   flat: bool = False) -> torch.Tensor:
        """Sum a 1-D buffer over ``levels``: reduce-scatter then all-gather (flat + unquantized:
        one all_reduce primitive)."""
        s = self.topo.size(levels)
        if s == 1:
            return x.reshape(-1).clone()
        if flat and not self._quantized(levels, bits, quantize_above):
            out = _padded(x.reshape(-1), pad_to(x.numel(), s)).clone()
            self._primitive("all_reduce", levels, out, out)
            return out[:x.numel()]
        part = self.reduce_scatter(x, levels, bits=bits, quantize_above=quantize_above, flat=flat)
        return self.all_gather(part, levels, numel=x.numel(), bits=bits, quantize_above=quantize_above, flat=flat)


def _padded(x: torch.Tensor, numel: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, numel - x.numel())) if numel > x.numel() else x
