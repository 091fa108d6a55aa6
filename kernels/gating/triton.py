"""The GDN / KDA step inputs from a host's raw projections in one launch: a program per token and
block of ``HB`` heads (``[N, cdiv(HV, HB)]`` grid; value heads ``j HB ..`` and the key heads of the same
indices). Bit for bit the formulas of ``reference.py`` (README.md beside this file)."""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import bf16_round


@triton.jit
def _log1p_f64(e):
    """log(1 + e) for fp64 ``e >= 0`` to a few fp64 ulps: ``log(u) * e / (u - 1)`` with ``u = 1 + e``
    rounded (the rounding error of u cancels), e itself where u rounds to 1."""
    u = 1.0 + e
    return tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))


@triton.jit
def _round_to(x, dtype: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype``, nearest-even (bf16 with integer arithmetic: every target, the
    interpreter included, rounds alike)."""
    if dtype == tl.bfloat16:
        return bf16_round(x)
    else:
        return x.to(dtype)


@triton.jit
def _delta_gating_kernel(
    q, q_r, q_h,                    # [N, HK, K] any float, last dim contiguous
    k, k_r, k_h,                    # [N, HK, K]
    a, a_r, a_h,                    # [N, HV] or [N, HV, K]
    b, b_r,                         # [N, HV]
    A_log, dt_bias,                 # [HV]; [HV] or [HV, K] contiguous
    q_scale,                        # [N, HK] fp32 out, contiguous
    k_out,                          # [N, HK, K] ring dtype out, contiguous
    g,                              # [N, HV] or [N, HV, K] fp32 out, contiguous
    beta,                           # [N, HV] fp32 out, contiguous
    lower_bound,                    # fp32 scalar (a safe gate's bound), exact in the fp64 product
    softplus_beta, softplus_threshold,  # fp32 scalars
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, HB: tl.constexpr, BHK: tl.constexpr, BHV: tl.constexpr,
    BK: tl.constexpr, PER_CHANNEL: tl.constexpr, SAFE_GATE: tl.constexpr, BETA_ROUND: tl.constexpr,
    NORM: tl.constexpr,
):
    # NORM: 0 k only rounded to the ring dtype (no q_scale), 1 x / sqrt(sum x^2 + 1e-6) (SGLang's),
    # 2 x / (sqrt(sum x^2) + 1e-6) (fla's, TensorRT-LLM's). BHK, BHV = min(HB, next power of two of HK, HV)
    i = tl.program_id(0).to(tl.int64)
    h0 = tl.program_id(1) * HB
    hk = h0 + tl.arange(0, BHK)
    kk = tl.arange(0, BK)
    m_qk = (hk[:, None] < HK) & (kk[None, :] < K)
    kv = tl.load(k + i * k_r + hk[:, None] * k_h + kk[None, :], mask=m_qk, other=0.0)
    if NORM == 0:
        k_n = kv.to(tl.float32)
    else:
        # q_scale [HK], k [HK, K]: fp64 sums of squares (exact for 16-bit inputs), one rounding to fp32
        qv = tl.load(q + i * q_r + hk[:, None] * q_h + kk[None, :], mask=m_qk, other=0.0).to(tl.float64)
        q_ss = tl.sum(qv * qv, axis=1).to(tl.float32)
        k_ss = tl.sum(kv.to(tl.float64) * kv.to(tl.float64), axis=1).to(tl.float32)
        if NORM == 1:
            q_norm = tl.sqrt_rn(q_ss + 1e-6)
            k_norm = tl.sqrt_rn(k_ss + 1e-6)
        else:
            q_norm = tl.sqrt_rn(q_ss) + 1e-6
            k_norm = tl.sqrt_rn(k_ss) + 1e-6
        tl.store(q_scale + i * HK + hk, tl.div_rn(tl.full([BHK], 1.0, tl.float32), q_norm), mask=hk < HK)
        k_n = tl.div_rn(kv.to(tl.float32), k_norm[:, None])
    tl.store(k_out + i * HK * K + hk[:, None] * K + kk[None, :], _round_to(k_n, k_out.dtype.element_ty), mask=m_qk)
    # g: the gate in fp64, one rounding to fp32
    hv = h0 + tl.arange(0, BHV)
    rate = tl.exp(tl.load(A_log + hv, mask=hv < HV, other=0.0).to(tl.float64))
    if PER_CHANNEL:
        m_g = (hv[:, None] < HV) & (kk[None, :] < K)
        x = (tl.load(a + i * a_r + hv[:, None] * a_h + kk[None, :], mask=m_g, other=0.0).to(tl.float64)
             + tl.load(dt_bias + hv[:, None] * K + kk[None, :], mask=m_g, other=0.0).to(tl.float64))
        rate = rate[:, None]
        g_at = g + i * HV * K + hv[:, None] * K + kk[None, :]
    else:
        m_g = hv < HV
        x = (tl.load(a + i * a_r + hv, mask=m_g, other=0.0).to(tl.float64)
             + tl.load(dt_bias + hv, mask=m_g, other=0.0).to(tl.float64))
        g_at = g + i * HV + hv
    if SAFE_GATE:
        gate = (1.0 / (1.0 + tl.exp(-(rate * x)))) * lower_bound
    else:
        bx = x * softplus_beta
        gate = -rate * tl.where(bx > softplus_threshold, x,
                                _log1p_f64(tl.exp(tl.minimum(bx, softplus_threshold))) / softplus_beta)
    tl.store(g_at, gate.to(tl.float32), mask=m_g)
    # beta = sigmoid(b) in fp64, rounded to fp32 (and through b's dtype with BETA_ROUND)
    bb = tl.load(b + i * b_r + hv, mask=hv < HV, other=0.0).to(tl.float64)
    be = (1.0 / (1.0 + tl.exp(-bb))).to(tl.float32)
    if BETA_ROUND:
        be = _round_to(be, b.dtype.element_ty).to(tl.float32)
    tl.store(beta + i * HV + hv, be, mask=hv < HV)
