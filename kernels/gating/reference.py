"""The GDN / KDA step inputs a host's raw projections give, in plain PyTorch: the canonical formulas
the Triton kernel (``triton.py``) reproduces bit for bit. See README.md beside this file.

    q_scale = 1 / sqrt(f32(sum q^2) + 1e-6)              per token and key head
    k       = ring(f32(k) / sqrt(f32(sum k^2) + 1e-6))   L2-normalised key, rounded to the ring dtype
    g       = f32(-exp(A_log) * softplus(a + dt_bias))   (softplus threshold 20), or with a safe gate
              f32(lower_bound * sigmoid(exp(A_log) * (a + dt_bias)))
    beta    = f32(sigmoid(b)), optionally rounded through b's 16-bit dtype

Sums of squares, the gate and beta are computed in fp64 and rounded once to fp32; the fp32 steps
after the rounding are single correctly rounded IEEE operations. Imports no Triton.
"""

from __future__ import annotations

import torch


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root of fp32 ``x`` (through fp64, which rounds it right; some
    CPU builds of ``torch.sqrt`` on fp32 are not correctly rounded)."""
    return torch.sqrt(x.double()).float()


def gating_ref(q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor, *, ring_dtype: torch.dtype, lower_bound: float | None = None,
               beta_dtype: torch.dtype | None = None) -> dict:
    """Step inputs from raw projections.

    Args:
        q, k: ``[N, HK, K]`` (any float dtype). a: ``[N, HV]`` (GDN) or ``[N, HV, K]`` (KDA).
        b: ``[N, HV]``. A_log: ``[HV]``. dt_bias: ``[HV]`` (GDN) or ``[HV, K]`` (KDA). ``N`` may be
        any leading dims (``n, T`` for a verify), the same for every input.
        ring_dtype: dtype of the returned k. lower_bound: a safe gate's bound (taken as fp32), or None
            (softplus gate).
        beta_dtype: if given, beta is rounded to it and back (SGLang's GDN packed decode rounds
            ``sigmoid(b)`` to b's dtype).
    Returns:
        ``dict(q_scale [N, HK] fp32, k [N, HK, K] ring_dtype, g [N, HV] or [N, HV, K] fp32,
        beta [N, HV] fp32)``.
    """
    q_ss = q.double().square().sum(-1).float()
    k_ss = k.double().square().sum(-1, keepdim=True).float()
    q_scale = 1.0 / sqrt_rn(q_ss + 1e-6)
    k_n = (k.float() / sqrt_rn(k_ss + 1e-6)).to(ring_dtype)
    x = a.double() + dt_bias.double()
    rate = torch.exp(A_log.double())
    if dt_bias.dim() == 2:                      # KDA: a gate per key channel
        rate = rate[:, None]
    if lower_bound is None:
        g = -rate * torch.nn.functional.softplus(x, threshold=20.0)
    else:
        g = torch.tensor(lower_bound, dtype=torch.float32).double() * torch.sigmoid(rate * x)
    beta = torch.sigmoid(b.double()).float()
    if beta_dtype is not None:
        beta = beta.to(beta_dtype).float()
    return dict(q_scale=q_scale, k=k_n, g=g.float(), beta=beta)
