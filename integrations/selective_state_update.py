"""The ``selective_state_update`` call convention (mamba_ssm's, which SGLang's ``MambaMixer2`` and
TensorRT-LLM's ``Mamba2Mixer`` both follow), turned into ``replayssm.decode`` / ``verify`` inputs.

Both hosts call, per Mamba-2 layer:

- decode: ``f(ssm_state, x [n, H, P], dt [n, H, P], A [H, P, N], B [n, G, N], C [n, G, N], D [H, P],
  z=None, dt_bias=[H, P], dt_softplus=True, state_batch_indices=[n], out=[n, H, P])`` with dt, A, D
  and dt_bias per-head values broadcast (stride 0) over P, N;
- verify: the same with a token axis (``x [n, T, H, P]``, ``out [n, T, H, P]``, ...) and
  ``disable_state_update=True, intermediate_states_buffer, cache_steps=T, ...``.

The host adapters find the replay layer of ``ssm_state`` and pass the result of :func:`step_inputs`
to it; the host-specific keywords (snapshot buffers, stochastic rounding) are theirs to check.
"""

from __future__ import annotations

import torch


def per_head(name: str, t: torch.Tensor, keep: int) -> torch.Tensor:
    """``t`` without its trailing broadcast axes: the view of its first ``keep`` axes at index 0 of
    the rest, which must have stride 0 (per-head values expanded over P / N, as both hosts pass)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() <= keep or any(s != 0 and n > 1 for s, n in zip(t.stride()[keep:], t.shape[keep:])):
        raise ValueError(f"{name}: expected per-head values broadcast (stride 0) over the trailing axes, as "
                         f"Mamba-2 mixers pass them; got shape {list(t.shape)} strides {list(t.stride())}")
    return t[(slice(None),) * keep + (0,) * (t.dim() - keep)]


def step_inputs(x, dt, A, B, C, D, z, dt_bias, *, dt_softplus, state_batch_indices, out, disable_state_update,
                cache_steps) -> tuple[bool, dict]:
    """Check a call's shared arguments; return (is it a verify, the step's keyword inputs).

    Args as ``selective_state_update`` (module docs). ``out`` is required (written in place);
    ``dt_softplus`` must be True (the ring keeps ``dt + dt_bias`` and the kernels apply softplus);
    ``disable_state_update`` must be True exactly when ``x`` has a token axis.
    """
    if dt_softplus is not True:
        raise ValueError(f"dt_softplus: replay applies softplus to dt + dt_bias; expected True, got {dt_softplus!r}")
    if out is None:
        raise ValueError("out: expected an output buffer like x (Mamba-2 mixers always pass one)")
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        raise ValueError(f"x: expected [n, H, P] or [n, T, H, P], got {getattr(x, 'shape', type(x).__name__)}")
    is_verify = x.dim() == 4
    if is_verify != bool(disable_state_update):
        raise ValueError(f"disable_state_update: expected {is_verify} for x of shape {list(x.shape)} (a verify "
                         "takes a token axis and writes no state; a decode has no token axis)")
    if is_verify and cache_steps is not None and cache_steps != x.shape[1]:
        raise ValueError(f"cache_steps: expected T = {x.shape[1]}, got {cache_steps!r}")
    if state_batch_indices is None:
        raise ValueError("state_batch_indices: expected int32/int64 [n] pool slots, got None")
    return is_verify, dict(x=x, dt=per_head("dt", dt, x.dim() - 1), A=per_head("A", A, 1), B=B, C=C, z=z,
                           D=None if D is None else per_head("D", D, 1),
                           dt_bias=None if dt_bias is None else per_head("dt_bias", dt_bias, 1))
