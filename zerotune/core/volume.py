"""Closed-form bytes sent per rank by zerotune's collectives, level by level (pure Python).

These are the formulas the byte counter in ``comm.py`` is checked against, and the ones the cost
model sums. Per primitive collective over a group of s ranks (bandwidth-optimal ring / pairwise
algorithms, as NCCL and gloo implement them; Thakur et al. 2005):

- all_gather of a p-byte piece per rank:          (s - 1) · p
- reduce_scatter of an n-byte buffer:             (s - 1) · n / s
- all_to_all of an n-byte buffer (s equal parts): (s - 1) · n / s
- all_reduce of an n-byte buffer:                 2 · (s - 1) · n / s

Hierarchical all-gather over levels lo..hi runs the outermost level first on the smallest piece
(MiCS, arXiv 2205.00119 §3.3), so level i sends (s_i - 1) · (piece of one rank) · Π_{l>i} s_l.
Reduce-scatter is the mirror: innermost first on the whole buffer, level i sees n / Π_{l<i} s_l.
All-reduce is reduce-scatter followed by all-gather. A flat collective is one primitive over the
whole range; its bytes are booked on the outermost level it crosses (the ring's bottleneck link).

Quantized data (levels ≥ ``quantize_above`` when bits < 16) travels as block-wise payloads: per
block of B elements, B·bits/8 bytes of codes plus one fp32 scale (``quantized_nbytes``); a buffer
is padded up to whole blocks. Weight gathers quantize each rank's shard once; gradient
reduce-scatters replace the level's reduce_scatter by an all_to_all of quantized chunks (qgZ,
ZeRO++ arXiv 2306.10209 §3.3), one payload per destination. At bits 32 (fp32 gradient reduction) an
unquantized collective moves 4-byte elements whatever the run's dtype (``wire_elem_bytes``).
"""

from __future__ import annotations

import math
from collections import defaultdict

from zerotune.core.plan import pad_to  # a buffer split among ranks is padded as a bucket is (and read from here)
from zerotune.core.spec import ClusterSpec

QUANT_BLOCK = 2048
"""Elements per quantization block (one fp32 scale each); DeepSpeed's qwZ uses blocks of this order."""
SCALE_BYTES = 4

Volume = dict[str, dict[str, int]]  # level name -> collective kind -> bytes sent per rank


def quantized_nbytes(numel: int, bits: int, block: int = QUANT_BLOCK) -> int:
    """Bytes of the block-quantized payload of ``numel`` elements: codes + one scale per block."""
    blocks = math.ceil(numel / block)
    return blocks * block * bits // 8 + blocks * SCALE_BYTES


def wire_elem_bytes(elem_bytes: int, bits: int) -> int:
    """Bytes per element of an unquantized collective at width ``bits``: 4 at 32 (an fp32 reduction of a
    16-bit run's gradients), else the run's own ``elem_bytes``."""
    return 4 if bits == 32 else elem_bytes


def _levels(lo: int, hi: int) -> range:
    return range(lo, hi + 1)


def _quantized(cluster: ClusterSpec, lo: int, hi: int, bits: int, quantize_above: int) -> bool:
    """Whether data crossing levels lo..hi is quantized: some level >= quantize_above has 2+ ranks."""
    return bits < 16 and any(cluster.sizes[lv - 1] > 1 for lv in range(max(lo, quantize_above), hi + 1))


def _add(vol: defaultdict[str, defaultdict[str, int]], name: str, kind: str, nbytes: int) -> None:
    if nbytes:
        vol[name][kind] += nbytes


def _freeze(vol: defaultdict[str, defaultdict[str, int]]) -> Volume:
    return {name: dict(kinds) for name, kinds in vol.items()}


def all_gather_volume(cluster: ClusterSpec, levels: tuple[int, int], shard_numel: int, elem_bytes: int,
                      bits: int = 16, quantize_above: int = 1, block: int = QUANT_BLOCK,
                      flat: bool = False) -> Volume:
    """Bytes sent per rank by an all-gather of ``shard_numel``-element shards over a level range."""
    elem_bytes = wire_elem_bytes(elem_bytes, bits)
    vol: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    lo, hi = levels
    if lo > hi:
        return {}
    sizes = cluster.sizes
    if flat:
        s = math.prod(sizes[lo - 1:hi])
        piece = quantized_nbytes(shard_numel, bits, block) if _quantized(cluster, lo, hi, bits, quantize_above) \
            else shard_numel * elem_bytes
        _add(vol, cluster.levels[hi - 1].name, "all_gather", (s - 1) * piece)
        return _freeze(vol)
    pieces = 1  # original shards held per rank before the current level
    for level in reversed(_levels(lo, hi)):
        per_shard = quantized_nbytes(shard_numel, bits, block) if _quantized(cluster, level, level, bits,
                                                                                   quantize_above) \
            else shard_numel * elem_bytes
        s = sizes[level - 1]
        _add(vol, cluster.levels[level - 1].name, "all_gather", (s - 1) * pieces * per_shard)
        pieces *= s
    return _freeze(vol)


def reduce_scatter_volume(cluster: ClusterSpec, levels: tuple[int, int], numel: int, elem_bytes: int,
                          bits: int = 16, quantize_above: int = 1, block: int = QUANT_BLOCK,
                          flat: bool = False) -> Volume:
    """Bytes sent per rank by a reduce-scatter of a ``numel``-element buffer over a level range.

    ``numel`` is padded up to a multiple of the range size first, as the collective does.
    """
    elem_bytes = wire_elem_bytes(elem_bytes, bits)
    vol: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    lo, hi = levels
    if lo > hi:
        return {}
    sizes = cluster.sizes
    total = math.prod(sizes[lo - 1:hi])
    m = pad_to(numel, total)
    steps = [(hi, total)] if flat else [(level, sizes[level - 1]) for level in _levels(lo, hi)]
    for level, s in steps:
        name = cluster.levels[level - 1].name
        if _quantized(cluster, lo if flat else level, level, bits, quantize_above):
            _add(vol, name, "all_to_all", (s - 1) * quantized_nbytes(m // s, bits, block))
        else:
            _add(vol, name, "reduce_scatter", (s - 1) * (m // s) * elem_bytes)
        m //= s
    return _freeze(vol)


def all_reduce_volume(cluster: ClusterSpec, levels: tuple[int, int], numel: int, elem_bytes: int,
                      bits: int = 16, quantize_above: int = 1, block: int = QUANT_BLOCK,
                      flat: bool = False) -> Volume:
    """Bytes of an all-reduce: hierarchical = reduce-scatter then all-gather over the range;
    flat unquantized = one all_reduce primitive (2(s-1)/s · n)."""
    elem_bytes = wire_elem_bytes(elem_bytes, bits)
    lo, hi = levels
    if lo > hi:
        return {}
    total = math.prod(cluster.sizes[lo - 1:hi])
    m = pad_to(numel, total)
    if flat and not _quantized(cluster, lo, hi, bits, quantize_above):
        name = cluster.levels[hi - 1].name
        return {name: {"all_reduce": 2 * (total - 1) * (m // total) * elem_bytes}} if total > 1 else {}
    rs = reduce_scatter_volume(cluster, levels, m, elem_bytes, bits, quantize_above, block, flat)
    ag = all_gather_volume(cluster, levels, m // total, elem_bytes, bits, quantize_above, block, flat)
    return merge(rs, ag)


def merge(*volumes: Volume) -> Volume:
    """Sum several volumes level by level and kind by kind."""
    vol: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for v in volumes:
        for name, kinds in v.items():
            for kind, nbytes in kinds.items():
                _add(vol, name, kind, nbytes)
    return _freeze(vol)


def scale(volume: Volume, factor: int) -> Volume:
    """A volume repeated ``factor`` times."""
    return {name: {kind: n * factor for kind, n in kinds.items()} for name, kinds in volume.items()}


def pairs(volume: Volume) -> tuple[tuple[tuple[str, str], int], ...]:
    """``volume`` as ((level, kind), bytes) pairs with bytes > 0 (cheap to accumulate)."""
    return tuple(((name, kind), n) for name, kinds in volume.items() for kind, n in kinds.items() if n)


def quant_elements(cluster: ClusterSpec, quantize_above: int, op: str, lo: int, hi: int, numel: int) -> int:
    """Elements quantized plus elements dequantized by a collective at bits < 16, as ``comm.py`` runs it.

    Quantized levels are those ≥ ``quantize_above`` with 2+ ranks. An all-gather of a
    ``numel``-element shard quantizes the shard once and dequantizes once, on leaving the
    quantized (outer) levels, the c · Π s_l elements gathered over them. A reduce-scatter of a
    ``numel``-element buffer quantizes and dequantizes, at each quantized level l, the buffer
    that level sees: numel / Π_{lo ≤ k < l} s_k. An all-reduce is a reduce-scatter, then an
    all-gather of its result."""
    sizes = cluster.sizes
    quantized = [lv for lv in range(max(lo, quantize_above), hi + 1) if sizes[lv - 1] > 1]
    if not quantized:
        return 0
    if op == "all_gather":
        return numel + numel * math.prod(sizes[lv - 1] for lv in quantized)
    total, seen = 0, numel
    for level in range(lo, hi + 1):
        if level in quantized:
            total += 2 * seen
        seen //= sizes[level - 1]
    if op == "all_reduce":  # seen is now the shard each rank keeps
        total += quant_elements(cluster, quantize_above, "all_gather", lo, hi, seen)
    return total
