"""Hierarchical and flat collectives over level ranges, optionally quantized, with a byte counter.

Layout contract: a buffer partitioned over a level range (lo..hi) of S ranks is padded to a
multiple of S and split into S equal chunks; the rank with range index j (innermost level fastest,
``topology.range_index``) owns chunk j. Every function below keeps that contract, so hierarchical
and flat versions return identical tensors (exactly, unquantized) and tests compare them.

- hierarchical all-gather: outermost level first on the smallest pieces, innermost last, then one
  local permutation puts chunks in rank order (MiCS §3.3);
- hierarchical reduce-scatter: the mirror — innermost level first on the whole buffer;
- all-reduce: reduce-scatter then all-gather over the same range;
- flat: one primitive over the whole range (the reference and the "flat" algorithm).

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
    def shard(self, full: torch.Tensor, levels: LevelRange) -> torch.Tensor:
        """This rank's chunk of a 1-D buffer partitioned over ``levels`` (padded with zeros)."""
        s = self.topo.size(levels)
        chunk = pad_to(full.numel(), s) // s
        padded = _padded(full.reshape(-1), chunk * s)
        j = self.topo.index(levels)
        return padded[j * chunk:(j + 1) * chunk].clone()

    # -- all-gather ---------------------------------------------------------------------------
    def all_gather(self, shard: torch.Tensor, levels: LevelRange, *, numel: int | None = None, bits: int = 16,
                   quantize_above: int = 1, flat: bool = False) -> torch.Tensor:
        """Gather equal 1-D shards over ``levels`` into the full buffer (trimmed to ``numel``)."""
        lo, hi = levels
        if self.topo.size(levels) == 1:
            full = shard.reshape(-1)
        elif flat:
            full = self._gather_levels(shard, [levels], bits, quantize_above).reshape(-1)
        else:
            # outermost first; levels of one rank move nothing and leave the layout unchanged
            order = [(level, level) for level in range(hi, lo - 1, -1) if self.topo.level_size(level) > 1]
            gathered = self._gather_levels(shard, order, bits, quantize_above)  # (s_lo, …, s_hi, c)
            k = gathered.dim() - 1
            full = gathered.permute(*reversed(range(k)), k).reshape(-1)  # rank order: (s_hi, …, s_lo, c)
        return full[:numel] if numel is not None else full

    def _gather_levels(self, shard: torch.Tensor, order: list[LevelRange], bits: int,
                       quantize_above: int) -> torch.Tensor:
        """Gather over each range of ``order`` in turn; each prepends one dim of its size."""
        c, dtype = shard.numel(), shard.dtype
        quantized = [r for r in order if self._quantized(r, bits, quantize_above)]
        buf = quant.quantize(shard.reshape(1, c), bits, self.block) if quantized else shard.reshape(1, c)
        for i, levels in enumerate(order):
            if i == len(quantized) and quantized:  # leaving the quantized (outer) levels
                buf = quant.dequantize(buf, c, bits, dtype, self.block)
            out = buf.new_empty(self.topo.size(levels) * buf.numel())
            self._primitive("all_gather", levels, out, buf.contiguous().view(-1))
            buf = out.view(self.topo.size(levels), *buf.shape)
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
        if flat:
            return self._reduce_level(padded, levels, bits, quantize_above)
        sizes = [self.topo.level_size(level) for level in range(lo, hi + 1)]
        # rank order is (s_hi, …, s_lo, c); the innermost level goes first, so put it outermost
        k = len(sizes)
        buf = padded.view(*reversed(sizes), -1).permute(*reversed(range(k)), k).reshape(-1)
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
