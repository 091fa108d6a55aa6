"""Precision formats: e2m1 / e4m3 block-scaled read copies and fp16 stochastic rounding."""

import pytest
import torch

from replayssm import formats

E2M1 = torch.tensor(formats.E2M1_VALUES)


def test_e2m1_codes_round_trip():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = formats.e2m1_decode(codes)
    assert vals[:8].tolist() == list(formats.E2M1_VALUES)
    assert vals[8:].tolist() == [-v for v in formats.E2M1_VALUES]
    keep = torch.arange(16) != 8  # -0 encodes as +0
    assert torch.equal(formats.e2m1_encode(vals[keep]), codes[keep])


def test_e2m1_rounds_to_nearest_ties_to_even_code():
    x = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 100.0, -0.74, -2.49])
    got = formats.e2m1_decode(formats.e2m1_encode(x))
    assert got.tolist() == [0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -2.0]
    # nearest: no representable value is closer than the chosen one
    y = torch.randn(10000) * 3
    q = formats.e2m1_decode(formats.e2m1_encode(y))
    best = (y.clamp(-6, 6)[:, None] - torch.cat((E2M1, -E2M1))[None]).abs().min(1).values
    assert torch.allclose((y.clamp(-6, 6) - q).abs(), best)


@pytest.mark.parametrize("fmt,bound", [("fp8", 0.07), ("nvfp4", 0.35)])
def test_block_quantization_error(fmt, bound):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, 64, generator=gen) * torch.logspace(-3, 2, 7)[:, None]
    codes, bs, rs_ = formats.quantize(x, fmt)
    assert bs.dtype == torch.float8_e4m3fn and rs_.dtype == torch.float32
    assert rs_.shape == (3, 5, 7) and bs.shape == (3, 5, 7, 4)
    assert codes.shape == ((3, 5, 7, 64) if fmt == "fp8" else (3, 5, 7, 32))
    y = formats.dequantize(codes, bs, rs_, fmt)
    rel = (y - x).norm(dim=-1) / x.norm(dim=-1)
    assert rel.max() < bound, rel.max()
    # per-row scaling: tiny rows are as accurate as large ones
    assert rel[..., 0].mean() < 2 * rel[..., -1].mean() + 1e-3


def test_nvfp4_packing_low_nibble_is_even_element():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 6.0, -3.0
    codes, bs, rs_ = formats.quantize(x, "nvfp4")
    c0 = codes[0, 0].item()
    assert formats.e2m1_decode(torch.tensor([c0 & 0xF], dtype=torch.uint8)).item() == 6.0
    assert formats.e2m1_decode(torch.tensor([c0 >> 4], dtype=torch.uint8)).item() == -3.0


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_zero_rows_and_extremes(fmt):
    x = torch.zeros(2, 4, 32)
    x[1, 2] = torch.linspace(-1e30, 1e30, 32)
    x[1, 3, 5] = 1e-30
    y = formats.dequantize(*formats.quantize(x, fmt), fmt)
    assert torch.isfinite(y).all()
    assert torch.equal(y[0], x[0])
    assert ((y[1, 2] - x[1, 2]).double().norm() / x[1, 2].double().norm()).item() < 0.3
    assert y[1, 3, 5] > 0


def test_bytes_per_element_table():
    assert formats.bytes_per_element("float32", 128) == 4
    assert formats.bytes_per_element("fp8", 128) == pytest.approx(1 + 1 / 16 + 4 / 128)
    assert formats.bytes_per_element("nvfp4", 128) == pytest.approx(0.5 + 1 / 16 + 4 / 128)
    with pytest.raises(ValueError, match="fmt"):
        formats.bytes_per_element("int4", 128)


def _mix32_py(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_matches_scalar_definition():
    xs = [0, 1, 2, 0xDEADBEEF, 0xFFFFFFFF, 12345678]
    assert formats.mix32(torch.tensor(xs, dtype=torch.int64)).tolist() == [_mix32_py(x) for x in xs]


def test_sr_uniform_reproducible_and_keyed():
    e = torch.tensor([0, 1, 1], dtype=torch.int32)
    u = formats.sr_uniform(7, 2, e, 1000)
    assert u.shape == (3, 1000) and (u >= 0).all() and (u < 1).all()
    assert torch.equal(u, formats.sr_uniform(7, 2, e, 1000))
    assert torch.equal(u[1], u[2])
    assert not torch.equal(u[0], u[1])
    assert not torch.equal(u, formats.sr_uniform(8, 2, e, 1000))
    assert not torch.equal(u, formats.sr_uniform(7, 3, e, 1000))
    assert abs(u.mean().item() - 0.5) < 0.02


def test_fp16_stochastic_rounding_is_unbiased_between_neighbours():
    gen = torch.Generator().manual_seed(1)
    x = torch.tensor([1.0 + 2 ** -12, -3.3e-6, 0.1, 60000.0, -65504.0, 1e6, 2.0 ** -25])
    draws = 20000
    u = torch.rand(draws, x.numel(), generator=gen)
    r = formats.fp16_stochastic_round(x.expand(draws, -1), u).float()
    lo = x.to(torch.float16).float()
    for i in range(x.numel()):
        vals = r[:, i].unique()
        assert vals.numel() <= 2
    mean = r.mean(0)
    ok = torch.isclose(mean[:5], x[:5], rtol=2e-3, atol=0)
    assert ok.all(), (mean, x)
    assert r[:, 5].eq(65504.0).all()                       # saturates
    assert abs(mean[6].item() - 2.0 ** -25) < 2.0 ** -25 * 0.05  # subnormal range, unbiased
    assert torch.isnan(formats.fp16_stochastic_round(torch.tensor([float("nan")]), torch.zeros(1))).all()
    assert lo.numel() == x.numel()


def test_fp16_sr_exact_values_stay():
    x = torch.tensor([1.0, -2.5, 0.0, 65504.0])
    r = formats.fp16_stochastic_round(x, torch.full_like(x, 0.999))
    assert torch.equal(r.float(), x)
