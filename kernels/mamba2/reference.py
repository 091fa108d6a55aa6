"""Mamba-2 in plain PyTorch: the step recurrence and the replay (checkpoint + ring) algebra.

Per head h with group g = h // (H // G):
    dt'_t = softplus(dt_t + dt_bias_h),  a_t = exp(A_h dt'_t)
    S_t   = a_t S_{t-1} + dt'_t x_t B_tᵀ                       S: [P, N]
    y_t   = S_t C_t + D_h x_t,  then y_t *= silu(z_t) if z is given
Runs on the CPU; imports no Triton. See README.md beside this file for the derivation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mamba2_dt_entry(dt: torch.Tensor, dt_bias: torch.Tensor | None) -> torch.Tensor:
    """The ring's dt entry: ``dt + dt_bias`` in fp32 (``dt [..., H]``, ``dt_bias [H]`` or None)."""
    dt = dt.float()
    return dt + dt_bias.float() if dt_bias is not None else dt


def mamba2_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None) -> torch.Tensor:
    """Post-softplus step size dt' in fp32 (identity above 20)."""
    return F.softplus(mamba2_dt_entry(dt, dt_bias), threshold=20.0)


def _expand_groups(t: torch.Tensor, num_heads: int, dim: int) -> torch.Tensor:
    return t.repeat_interleave(num_heads // t.shape[dim], dim=dim)


def _gate(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    if D is not None:
        y = y + D.to(y.dtype)[:, None] * x.to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def mamba2_step_ref(state, x, dt, A, B, C, D=None, dt_bias=None, z=None):
    """One conventional decode step; computes in ``state.dtype``.

    Args:
        state: ``[n, H, P, N]`` state before the token (not modified).
        x: ``[n, H, P]``. dt: ``[n, H]`` raw. A: ``[H]`` (negative). B, C: ``[n, G, N]``.
        D: ``[H]`` or None. dt_bias: ``[H]`` or None. z: ``[n, H, P]`` or None.
    Returns:
        ``(y [n, H, P], state [n, H, P, N])``, both in ``state.dtype``.
    """
    cd = state.dtype
    H = state.shape[1]
    dtp = mamba2_dt(dt, dt_bias).to(cd)                                  # [n, H]
    decay = torch.exp(A.to(cd)[None] * dtp)                               # [n, H]
    Bh = _expand_groups(B.to(cd), H, 1)                                   # [n, H, N]
    Ch = _expand_groups(C.to(cd), H, 1)
    xs = x.to(cd)
    state = decay[..., None, None] * state + (dtp[..., None] * xs)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("nhpk,nhk->nhp", state, Ch)
    return _gate(y, xs, D, z), state


def mamba2_window(x: torch.Tensor, dt: torch.Tensor, valid: torch.Tensor, B: torch.Tensor, A: torch.Tensor):
    """Per-head window quantities in fp32.

    Args:
        x: ``[n, H, m, P]``; dt: ``[n, H, m]`` ring entries ``dt + dt_bias`` (before softplus);
        valid: ``[n, m]`` bool, False for unused entries (they get dt' = 0: no input, no decay);
        B: ``[n, G, m, N]``; A: ``[H]``.
    Returns:
        ``(x, dtp, B expanded to [n, H, m, N], lam [n, H, m])``: dt' = softplus(dt) and
        ``lam_j = Σ_{i<=j} A dt'_i``.
    """
    H = x.shape[1]
    dtp = torch.where(valid[:, None, :], F.softplus(dt.float(), threshold=20.0), torch.zeros_like(dt.float()))
    lam = torch.cumsum(A.float()[None, :, None] * dtp, dim=-1)
    return x.float(), dtp, _expand_groups(B.float(), H, 1), lam


def mamba2_window_outputs(S0, x, dtp, B, lam, C, first):
    """Outputs of window entries ``first .. m-1`` from a checkpoint and the window.

    y_j = exp(lam_j) S0 C_j + Σ_{r<=j} exp(lam_j - lam_r) dt'_r (B_r·C_j) x_r   (before D, z)

    Args:
        S0: ``[n, H, P, N]`` fp32 checkpoint (or its decoded read copy).
        x, dtp, B, lam: from :func:`mamba2_window`, window length m.
        C: ``[n, H, T, N]`` fp32 (expanded) for the T = m - first output entries.
    Returns:
        ``[n, H, T, P]`` fp32.
    """
    m = x.shape[2]
    j = torch.arange(first, m, device=x.device)
    r = torch.arange(m, device=x.device)
    lam_j = lam[..., first:]                                             # [n, H, T]
    diff = lam_j[..., :, None] - lam[..., None, :]                        # [n, H, T, m]
    causal = r[None, :] <= j[:, None]
    w = torch.exp(torch.where(causal, diff, torch.full_like(diff, -torch.inf)))
    w = w * dtp[..., None, :] * torch.einsum("nhrk,nhtk->nhtr", B, C)
    y = torch.exp(lam_j)[..., None] * torch.einsum("nhpk,nhtk->nhtp", S0, C)
    return y + torch.einsum("nhtr,nhrp->nhtp", w, x)


def mamba2_window_fold(S0, x, dtp, B, lam, upto: int):
    """State after the first ``upto`` window entries: ``[n, H, P, N]`` fp32.

    S = exp(lam_e) S0 + Σ_{r<upto} exp(lam_e - lam_r) dt'_r x_r B_rᵀ,  e = upto - 1.
    """
    if upto == 0:
        return S0.clone()
    lam_e = lam[..., upto - 1]
    s = torch.exp(lam_e[..., None] - lam[..., :upto]) * dtp[..., :upto]     # [n, H, upto]
    fold = torch.einsum("nhr,nhrp,nhrk->nhpk", s, x[..., :upto, :], B[..., :upto, :])
    return torch.exp(lam_e)[..., None, None] * S0 + fold


def mamba2_gate(y, x, D, z):
    """Add ``D x`` and apply ``silu(z)``: y, x, z ``[n, T, H, P]`` (z may be None), D ``[H]``."""
    return _gate(y, x, D, z)
