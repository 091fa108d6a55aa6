"""Gated DeltaNet and Kimi Delta Attention in plain PyTorch: step recurrence and replay algebra.

State S ∈ R^{K×V} per value head (fla layout ``[.., HV, K, V]``); value head h reads key head
h // (HV // HK). GDN decays the whole state by a scalar, KDA each key channel:
    S'_t = Diag(exp(g_t)) S_{t-1}          g_t: scalar (GDN, broadcast over K) or [K] (KDA)
    d_t  = beta_t (v_t - S'_tᵀ k_t)
    S_t  = S'_t + k_t d_tᵀ
    o_t  = S_tᵀ (scale q_t)
Runs on the CPU; imports no Triton. See README.md beside this file for the derivation.
"""

from __future__ import annotations

import torch


def expand_heads(t: torch.Tensor, num_v_heads: int, dim: int) -> torch.Tensor:
    """Repeat key heads to value heads along ``dim`` (grouped value heads)."""
    return t.repeat_interleave(num_v_heads // t.shape[dim], dim=dim)


def delta_step_ref(state, q, k, v, g, beta, scale):
    """One conventional decode step; computes in ``state.dtype``.

    Args:
        state: ``[n, HV, K, V]`` state before the token (not modified).
        q, k: ``[n, HK, K]``. v: ``[n, HV, V]``. g: ``[n, HV]`` (GDN) or ``[n, HV, K]`` (KDA),
        log decay <= 0. beta: ``[n, HV]``. scale: float.
    Returns:
        ``(o [n, HV, V], state [n, HV, K, V])`` in ``state.dtype``.
    """
    cd = state.dtype
    HV = state.shape[1]
    qh = expand_heads(q.to(cd), HV, 1) * scale
    kh = expand_heads(k.to(cd), HV, 1)
    g = g.to(cd)
    decay = torch.exp(g)[..., None, None] if g.dim() == 2 else torch.exp(g)[..., None]
    state = decay * state
    u = torch.einsum("nhkv,nhk->nhv", state, kh)
    d = beta.to(cd)[..., None] * (v.to(cd) - u)
    state = state + kh[..., :, None] * d[..., None, :]
    return torch.einsum("nhkv,nhk->nhv", state, qh), state


def delta_window(k: torch.Tensor, g: torch.Tensor, num_v_heads: int, head_k_dim: int):
    """Window key expansion and decay cumsum in fp32.

    Args:
        k: ``[n, HK, m, K]``; g: ``[n, HV, m]`` (GDN) or ``[n, HV, m, K]`` (KDA); an unused
        entry has g = 0 and beta = 0.
    Returns:
        ``(k [n, HV, m, K], gam [n, HV, m, K])`` with ``gam_j = Σ_{i<=j} g_i``.
    """
    kh = expand_heads(k.float(), num_v_heads, 1)
    g = g.float()
    if g.dim() == 3:
        g = g[..., None].expand(*g.shape, head_k_dim)
    return kh, torch.cumsum(g, dim=2)


def _pair_decay(gam_a: torch.Tensor, gam_b: torch.Tensor, strict: bool) -> torch.Tensor:
    """exp(gam_a[j] - gam_b[r]) for r < j (strict) or r <= j, else 0: ``[n, HV, ja, rb, K]``."""
    ja, rb = gam_a.shape[2], gam_b.shape[2]
    off = rb - ja  # gam_a are the last ja entries of the window
    j = torch.arange(ja, device=gam_a.device)[:, None] + off
    r = torch.arange(rb, device=gam_a.device)[None, :]
    mask = (r < j) if strict else (r <= j)
    diff = gam_a[:, :, :, None, :] - gam_b[:, :, None, :, :]
    return torch.exp(torch.where(mask[..., None], diff, torch.full_like(diff, -torch.inf)))


def delta_window_d(S0, k, v, beta, gam):
    """Solve the window's delta vectors d (UT transform): ``[n, HV, m, V]`` fp32.

    (I + A) D = R with A[j, r] = beta_j Σ_c k_{r,c} k_{j,c} exp(gam_{j,c} - gam_{r,c}) (r < j)
    and R_j = beta_j (v_j - S0ᵀ (exp(gam_j) ⊙ k_j)).

    Args:
        S0: ``[n, HV, K, V]`` fp32. k, gam: from :func:`delta_window`. v: ``[n, HV, m, V]``.
        beta: ``[n, HV, m]``.
    """
    beta = beta.float()
    pair = _pair_decay(gam, gam, strict=True)                                     # [n,HV,m,m,K]
    A = beta[..., None] * torch.einsum("nhjrc,nhrc,nhjc->nhjr", pair, k, k)
    R = beta[..., None] * (v.float() - torch.einsum("nhkv,nhjk->nhjv", S0, torch.exp(gam) * k))
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.solve_triangular(eye + A, R, upper=False, unitriangular=True)


def delta_window_outputs(S0, k, d, gam, q, scale):
    """Outputs of the last T window entries: ``[n, HV, T, V]`` fp32.

    o_j = scale [S0ᵀ (exp(gam_j) ⊙ q_j) + Σ_{r<=j} ((exp(gam_j - gam_r) ⊙ k_r)·q_j) d_r]

    Args:
        q: ``[n, HV, T, K]`` fp32 (expanded to value heads).
    """
    T = q.shape[2]
    gam_j = gam[:, :, -T:]
    pair = _pair_decay(gam_j, gam, strict=False)                                  # [n,HV,T,m,K]
    w = torch.einsum("nhjrc,nhrc,nhjc->nhjr", pair, k, q)
    o = torch.einsum("nhkv,nhjk->nhjv", S0, torch.exp(gam_j) * q) + torch.einsum("nhjr,nhrv->nhjv", w, d)
    return scale * o


def delta_window_fold(S0, k, d, gam, upto: int):
    """State after the first ``upto`` window entries: ``[n, HV, K, V]`` fp32.

    S = Diag(exp(gam_e)) S0 + Σ_{r<upto} (exp(gam_e - gam_r) ⊙ k_r) d_rᵀ,  e = upto - 1.
    """
    if upto == 0:
        return S0.clone()
    gam_e = gam[:, :, upto - 1]                                                   # [n, HV, K]
    kt = torch.exp(gam_e[:, :, None, :] - gam[:, :, :upto]) * k[:, :, :upto]       # [n,HV,upto,K]
    return torch.exp(gam_e)[..., None] * S0 + torch.einsum("nhrk,nhrv->nhkv", kt, d[:, :, :upto])
