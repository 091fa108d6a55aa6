"""Precision formats: checkpoint rounding and the block-scaled read copy (PyTorch reference).

Read copy of a state viewed as ``[..., rows, cols]`` (cols = contraction axis: N for Mamba-2,
K for GDN/KDA), blocks of 16 consecutive cols:

| format | element                          | block scale (per 16) | row scale | bytes / element     |
|--------|----------------------------------|----------------------|-----------|---------------------|
| fp8    | e4m3, 1 B                        | e4m3                 | fp32      | 1 + 1/16 + 4/cols   |
| nvfp4  | e2m1, two per byte, low = even   | e4m3                 | fp32      | 0.5 + 1/16 + 4/cols |

Encode per row r: ``g_r = amax_r * fp32(1 / (E * 448))`` (E = 448 for fp8, 6 for nvfp4),
``s_b = e4m3(amax_b / (E * g_r))``, ``q = round(x * fp32(1 / (s_b * g_r)))`` saturated to ``±E``
(one division per block, not per element); decode ``x ≈ q * s_b * g_r``. A row of zeros encodes
to zeros; a row holding a NaN gets a NaN row scale, so it decodes as NaNs (its codes and block
scales are not specified). Divisions are IEEE (round to nearest) and ``g_r`` a product, so every device produces
the same bytes.

Checkpoint formats: float32 (4 B), bfloat16 (2 B, round to nearest even), float16_sr (2 B,
stochastic rounding with counter-based random bits, reproducible from
``(seed, layer, epoch, element index)``).
"""

from __future__ import annotations

import torch

from .spec import BLOCK

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP16_MAX = 65504.0
ELEMENT_MAX = {"fp8": E4M3_MAX, "nvfp4": E2M1_MAX}
# magnitudes of the e2m1 codes 0..7
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MASK32 = 0xFFFFFFFF


def bytes_per_element(fmt: str, cols: int) -> float:
    """Storage bytes per state element of a checkpoint dtype or read format."""
    table = {"float32": 4.0, "bfloat16": 2.0, "float16_sr": 2.0}
    if fmt in table:
        return table[fmt]
    if fmt == "fp8":
        return 1.0 + 1.0 / BLOCK + 4.0 / cols
    if fmt == "nvfp4":
        return 0.5 + 1.0 / BLOCK + 4.0 / cols
    raise ValueError(f"fmt: expected a checkpoint dtype or read format, got {fmt!r}")


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to e2m1 codes (uint8 0..15, bit 3 = sign), nearest, ties to even code."""
    m = q.abs()
    code = ((m > 0.25).to(torch.uint8) + (m >= 0.75).to(torch.uint8) + (m > 1.25).to(torch.uint8)
            + (m >= 1.75).to(torch.uint8) + (m > 2.5).to(torch.uint8) + (m >= 3.5).to(torch.uint8)
            + (m > 5.0).to(torch.uint8))
    return code | ((q < 0).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15) to fp32."""
    code = code.to(torch.int32)
    s = (code >> 3) & 1
    e = (code >> 1) & 3
    m = (code & 1).to(torch.float32)
    mag = torch.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * torch.exp2((e - 1).to(torch.float32)))
    return torch.where(s == 1, -mag, mag)


def read_copy_shapes(fmt: str, rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-head buffers of a read copy: name -> (shape, dtype)."""
    if fmt == "fp8":
        codes = ((rows, cols), torch.float8_e4m3fn)
    elif fmt == "nvfp4":
        codes = ((rows, cols // 2), torch.uint8)
    else:
        raise ValueError(f"fmt: expected 'fp8' or 'nvfp4', got {fmt!r}")
    return {
        "codes": codes,
        "block_scale": ((rows, cols // BLOCK), torch.float8_e4m3fn),
        "row_scale": ((rows,), torch.float32),
    }


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode ``x [..., rows, cols]`` (fp32) into ``(codes, block_scale, row_scale)``."""
    emax = ELEMENT_MAX[fmt]
    x = x.float()
    *lead, rows, cols = x.shape
    xb = x.reshape(*lead, rows, cols // BLOCK, BLOCK)
    amax_b = xb.abs().amax(-1)                                    # [..., rows, cols/16]
    amax_r = amax_b.amax(-1)                                      # [..., rows]
    # a product with the fp32 reciprocal, not a division: PyTorch on CUDA divides by a scalar that
    # way, and every device (and the kernels) must produce the same bits
    row_scale = amax_r * (1.0 / (emax * E4M3_MAX))
    safe_row = torch.where(row_scale > 0, row_scale, torch.ones_like(row_scale))
    block_scale = (amax_b / (emax * safe_row[..., None])).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = block_scale.float() * row_scale[..., None]
    inv = torch.where(denom > 0, 1.0 / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(denom))
    q = xb * inv[..., None]
    q = q.clamp(-emax, emax).reshape(*lead, rows, cols)
    if fmt == "fp8":
        codes = q.to(torch.float8_e4m3fn)
    else:
        c = e2m1_encode(q)
        codes = c[..., 0::2] | (c[..., 1::2] << 4)
    return codes, block_scale, row_scale


def dequantize(codes: torch.Tensor, block_scale: torch.Tensor, row_scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """Decode a read copy to fp32 ``[..., rows, cols]``."""
    if fmt == "fp8":
        q = codes.float()
    elif fmt == "nvfp4":
        lo = e2m1_decode(codes & 0xF)
        hi = e2m1_decode(codes >> 4)
        q = torch.stack((lo, hi), -1).flatten(-2)
    else:
        raise ValueError(f"fmt: expected 'fp8' or 'nvfp4', got {fmt!r}")
    *lead, rows, cols = q.shape
    qb = q.reshape(*lead, rows, cols // BLOCK, BLOCK)
    x = qb * block_scale.float()[..., None] * row_scale[..., None, None]
    return x.reshape(*lead, rows, cols)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32), on int64 tensors holding uint32 values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def sr_uniform(seed: int, layer: int, epoch: torch.Tensor, numel: int) -> torch.Tensor:
    """Uniform [0, 1) draws for stochastic rounding: ``[n, numel]`` fp32 for ``epoch [n]``.

    Bits = mix32(mix32(mix32(seed + 0x9E3779B9 * (layer + 1)) ^ epoch) ^ index); the top 24
    bits scaled by 2**-24. The Triton kernels compute the same bits.
    """
    base = mix32(torch.tensor((seed + 0x9E3779B9 * (layer + 1)) & _MASK32, dtype=torch.int64))
    h = mix32(base ^ epoch.to(torch.int64).reshape(-1, 1))
    idx = torch.arange(numel, dtype=torch.int64, device=epoch.device)
    bits = mix32(h ^ idx)
    return (bits >> 8).to(torch.float32) * (2.0 ** -24)


def fp16_stochastic_round(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to fp16 up or down (away from / toward zero) with P(up) = fraction.

    ``u`` holds uniform [0, 1) draws of the same shape. Magnitudes above 65504 saturate;
    subnormals round stochastically like normals; NaN stays NaN.
    """
    a = x.float().abs().clamp(max=FP16_MAX)
    h = a.to(torch.float16)
    hb = h.view(torch.int16).to(torch.int32)
    hb = torch.where(h.float() > a, hb - 1, hb)                 # round toward zero
    lo = hb.to(torch.int16).view(torch.float16).float()
    up = (hb + 1).clamp(max=0x7BFF)
    hi = up.to(torch.int16).view(torch.float16).float()
    gap = hi - lo
    p = torch.where(gap > 0, (a - lo) / torch.where(gap > 0, gap, torch.ones_like(gap)), torch.zeros_like(a))
    hb = torch.where(u < p, up, hb)
    hb = torch.where(x < 0, hb | 0x8000, hb)
    out = hb.to(torch.int16).view(torch.float16)
    return torch.where(torch.isnan(x), x.to(torch.float16), out)
