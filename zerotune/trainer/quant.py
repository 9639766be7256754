"""Block-wise symmetric quantization to int8 / int4 with one fp32 scale per block.

A 1-D tensor of n elements is padded to whole blocks of B elements; block b gets
``scale_b = max|x_b| / qmax`` (qmax = 127 for int8, 7 for int4) and codes
``q = round(x / scale_b)`` in [-qmax, qmax]. int4 codes are stored offset by 8 and packed two per
byte, the even element in the low nibble. The payload is one uint8 tensor: codes, then the scales'
bytes, so a single collective moves both (``volume.quantized_nbytes`` gives its size).

Error bound (documented and tested): for every element, ``|x - dequantize(quantize(x))| <=
scale_b / 2 = max|x_b| / (2·qmax)``. A reduction that dequantizes before every sum adds at most
that bound once per quantized summand, so a sum over R ranks crossing Q quantized levels is off by
at most ``Σ_levels Σ_senders max|partial_b| / (2·qmax)``.
"""

from __future__ import annotations

import torch

from zerotune.core.volume import QUANT_BLOCK, SCALE_BYTES, quantized_nbytes

QMAX = {8: 127, 4: 7}


def error_bound(x: torch.Tensor, bits: int, block: int = QUANT_BLOCK) -> torch.Tensor:
    """Per-element worst-case round-trip error of ``x`` (same shape as ``x``)."""
    n = x.numel()
    blocks = _pad(x.reshape(-1).float(), block).view(-1, block)
    half_step = blocks.abs().amax(dim=1, keepdim=True) / (2 * QMAX[bits])
    return half_step.expand_as(blocks).reshape(-1)[:n].view_as(x)


def _pad(x: torch.Tensor, block: int) -> torch.Tensor:
    """Zero-pad the last dim of ``x`` to whole blocks."""
    pad = (-x.shape[-1]) % block
    return torch.nn.functional.pad(x, (0, pad)) if pad else x


def quantize(x: torch.Tensor, bits: int, block: int = QUANT_BLOCK) -> torch.Tensor:
    """Quantize the last dim of a float tensor (…, n) into uint8 payloads (…, quantized_nbytes(n)).

    Leading dims are independent rows (the chunks of an all-to-all), each padded to whole blocks.
    """
    if bits not in QMAX:
        raise ValueError(f"bits={bits!r}: quantization supports {sorted(QMAX)}")
    if block % 2:
        raise ValueError(f"block={block}: must be even (int4 packs two codes per byte)")
    qmax, lead, n = QMAX[bits], x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, n)
    blocks = _pad(rows.float(), block).view(rows.shape[0], -1, block)  # (k, nblocks, B)
    scale = blocks.abs().amax(dim=2) / qmax  # (k, nblocks)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(blocks / safe[..., None]).clamp_(-qmax, qmax).to(torch.int8)
    if bits == 8:
        data = codes.view(torch.uint8).reshape(rows.shape[0], -1)
    else:
        nibbles = (codes + 8).view(torch.uint8)  # 1..15
        data = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).reshape(rows.shape[0], -1)
    payload = torch.cat([data, scale.contiguous().view(torch.uint8)], dim=1)
    assert payload.shape[1] == quantized_nbytes(n, bits, block)
    return payload.reshape(*lead, payload.shape[1])


def dequantize(payload: torch.Tensor, numel: int, bits: int, dtype: torch.dtype = torch.float32,
               block: int = QUANT_BLOCK) -> torch.Tensor:
    """Inverse of :func:`quantize` for a (..., payload_bytes) uint8 tensor → (..., numel)."""
    lead = payload.shape[:-1]
    nbytes = quantized_nbytes(numel, bits, block)
    assert payload.shape[-1] == nbytes, (payload.shape, nbytes)
    flat = payload.reshape(-1, nbytes)
    nblocks = -(-numel // block)
    data_bytes = nblocks * block * bits // 8
    scale = flat[:, data_bytes:].contiguous().view(torch.float32).view(-1, nblocks, 1)  # (k, nblocks, 1)
    data = flat[:, :data_bytes]
    if bits == 8:
        codes = data.contiguous().view(torch.int8).float()
    else:
        low = (data & 0x0F).to(torch.int16) - 8
        high = (data >> 4).to(torch.int16) - 8
        codes = torch.stack([low, high], dim=-1).reshape(flat.shape[0], -1).float()
    values = codes.view(-1, nblocks, block) * scale  # (k, nblocks, B)
    return values.reshape(flat.shape[0], -1)[:, :numel].to(dtype).reshape(*lead, numel)


__all__ = ["QMAX", "QUANT_BLOCK", "SCALE_BYTES", "dequantize", "error_bound", "quantize"]
