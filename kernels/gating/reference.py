"""The GDN / KDA step inputs a host's raw projections give, in plain PyTorch: the canonical formulas
the Triton kernel (``triton.py``) reproduces bit for bit. See README.md beside this file.

    q_scale = 1 / sqrt(f32(sum q^2) + 1e-6)              per token and key head
    k       = ring(f32(k) / sqrt(f32(sum k^2) + 1e-6))   L2-normalised key, rounded to the ring dtype
              (or fla's and TensorRT-LLM's x / (sqrt(sum x^2) + 1e-6), or no normalisation)
    g       = f32(-exp(A_log) * softplus(a + dt_bias))   (softplus beta 1, threshold 20 unless given), or
              f32(lower_bound * sigmoid(exp(A_log) * (a + dt_bias)))
    beta    = f32(sigmoid(b)), optionally rounded through b's 16-bit dtype

Sums of squares, the gate and beta are computed in fp64 and rounded once to fp32; the fp32 steps
after the rounding are single correctly rounded IEEE operations. Imports no Triton.
"""

from __future__ import annotations

import torch

from replayssm.validate import L2NORMS


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root of fp32 ``x`` (through fp64, which rounds it right; some
    CPU builds of ``torch.sqrt`` on fp32 are not correctly rounded)."""
    return torch.sqrt(x.double()).float()


def fp32(x: float) -> float:
    """``x`` rounded to fp32 (how the kernel receives a float scalar), as a Python float."""
    return float(torch.tensor(x, dtype=torch.float32))


def gating_ref(q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor, *, ring_dtype: torch.dtype, lower_bound: float | None = None,
               beta_dtype: torch.dtype | None = None, l2norm: str | None = "sglang", softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0) -> dict:
    """Step inputs from raw projections.

    Args:
        q, k: ``[N, HK, K]`` (any float dtype). a: ``[N, HV]`` (GDN) or ``[N, HV, K]`` (KDA).
        b: ``[N, HV]``. A_log: ``[HV]``. dt_bias: ``[HV]`` (GDN) or ``[HV, K]`` (KDA). ``N`` may be
        any leading dims (``n, T`` for a verify), the same for every input.
        ring_dtype: dtype of the returned k. lower_bound: a safe gate's bound (taken as fp32), or None
            (softplus gate).
        beta_dtype: if given, beta is rounded to it and back (SGLang's GDN packed decode rounds
            ``sigmoid(b)`` to b's dtype).
        l2norm: "sglang" ``x / sqrt(sum x^2 + 1e-6)``, "fla" ``x / (sqrt(sum x^2) + 1e-6)`` (fla's
            and TensorRT-LLM's kernels), or None: k only rounded to the ring dtype, no q_scale.
        softplus_beta, softplus_threshold: ``softplus(x) = log1p(exp(beta x)) / beta``, x where
            ``beta x > threshold`` (both taken as fp32).
    Returns:
        ``dict(q_scale [N, HK] fp32, k [N, HK, K] ring_dtype, g [N, HV] or [N, HV, K] fp32,
        beta [N, HV] fp32)``, without q_scale when ``l2norm`` is None.
    """
    if l2norm not in L2NORMS:
        raise ValueError(f"l2norm: expected one of {L2NORMS}, got {l2norm!r}")
    made = {}
    if l2norm is None:
        k_n = k.float().to(ring_dtype)
    else:
        q_ss = q.double().square().sum(-1).float()
        k_ss = k.double().square().sum(-1, keepdim=True).float()
        if l2norm == "sglang":
            q_norm, k_norm = sqrt_rn(q_ss + 1e-6), sqrt_rn(k_ss + 1e-6)
        else:
            q_norm, k_norm = sqrt_rn(q_ss) + 1e-6, sqrt_rn(k_ss) + 1e-6
        made["q_scale"] = 1.0 / q_norm
        k_n = (k.float() / k_norm).to(ring_dtype)
    x = a.double() + dt_bias.double()
    rate = torch.exp(A_log.double())
    if dt_bias.dim() == 2:                      # KDA: a gate per key channel
        rate = rate[:, None]
    if lower_bound is None:
        g = -rate * torch.nn.functional.softplus(x, beta=fp32(softplus_beta), threshold=fp32(softplus_threshold))
    else:
        g = fp32(lower_bound) * torch.sigmoid(rate * x)
    beta = torch.sigmoid(b.double()).float()
    if beta_dtype is not None:
        beta = beta.to(beta_dtype).float()
    return dict(made, k=k_n, g=g.float(), beta=beta)
