"""Block-wise int8/int4 quantization: payload size, error bound, int4 packing."""

from __future__ import annotations

import pytest
import torch

from zerotune.core.volume import quantized_nbytes
from zerotune.trainer import quant


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n, block", [(1, 64), (1001, 64), (4096, 2048), (5000, 2048)])
def test_round_trip_meets_documented_bound(bits, n, block):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 2, n)  # blocks of very different scales
    payload = quant.quantize(x, bits, block)
    assert payload.dtype == torch.uint8 and payload.numel() == quantized_nbytes(n, bits, block)
    y = quant.dequantize(payload, n, bits, block=block)
    assert y.shape == x.shape
    assert torch.all((y - x).abs() <= quant.error_bound(x, bits, block) * (1 + 1e-6) + 1e-12)


@pytest.mark.parametrize("bits", [8, 4])
def test_values_on_the_grid_are_lossless(bits):
    qmax = quant.QMAX[bits]
    codes = torch.arange(-qmax, qmax + 1).repeat(10)[:128].float()  # every code, incl. odd/even nibbles
    codes[0] = codes[64] = qmax  # every block's scale is exactly 0.25
    x = codes * 0.25
    y = quant.dequantize(quant.quantize(x, bits, 64), x.numel(), bits, block=64)
    assert torch.equal(x, y)


def test_int4_packs_two_codes_per_byte():
    x = torch.randn(2048)
    assert quant.quantize(x, 4, 2048).numel() == 2048 // 2 + 4
    assert quant.quantize(x, 8, 2048).numel() == 2048 + 4


def test_rows_are_independent_payloads():
    x = torch.randn(3, 100)
    rows = quant.quantize(x, 8, 64)
    assert rows.shape == (3, quantized_nbytes(100, 8, 64))
    for i in range(3):
        assert torch.equal(rows[i], quant.quantize(x[i], 8, 64))
    assert torch.equal(quant.dequantize(rows, 100, 8, block=64)[1], quant.dequantize(rows[1], 100, 8, block=64))


def test_zero_blocks_and_dtypes():
    x = torch.zeros(130)
    assert torch.equal(quant.dequantize(quant.quantize(x, 4, 64), 130, 4, block=64), x)
    b = torch.randn(300).to(torch.bfloat16)
    out = quant.dequantize(quant.quantize(b, 8, 64), 300, 8, torch.bfloat16, block=64)
    assert out.dtype == torch.bfloat16


def test_bad_arguments():
    with pytest.raises(ValueError, match="bits=2"):
        quant.quantize(torch.ones(4), 2)
    with pytest.raises(ValueError, match="block=63"):
        quant.quantize(torch.ones(4), 8, 63)
