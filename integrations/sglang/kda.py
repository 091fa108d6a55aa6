"""KDA routing at SGLang's kernel seam (sglang 0.5.17 and 0.5.23, ``layers/attention/linear/kernels/kda_triton.py``):
``TritonKDAKernel.packed_decode`` and the unpacked ``TritonKDAKernel.decode`` (taken for layers with a
safe gate), which ``KDAAttnBackend.forward_decode`` calls once per layer and decode step, and
``TritonKDAKernel.target_verify``, which its chain verify calls (the hooks turn SGLang's fused
verify variants off so that the verify reaches this seam).

They run ``replayssm.decode`` / ``replayssm.verify`` on the layer's ``ReplayMambaPool`` state in
place of SGLang's kernels; the commit is ``mamba2.commit_after_verify`` (family-independent).
The gating SGLang fuses into its kernels is formed by ``replayssm.gating`` (one launch on the triton
backend) with SGLang's formulas: q, k L2-normalised (``x / sqrt(sum x^2 + 1e-6)``), per-channel ``x = a
+ dt_bias``, ``g = -exp(A_log) * softplus(x)`` (threshold 20) or, with a safe gate, ``g = lower_bound *
sigmoid(exp(A_log) * x)``; ``beta = sigmoid(b)`` in fp32.
"""

from __future__ import annotations

import torch

import replayssm

from . import pool as replay_pool
from .gdn import unpack_qkv


def _owner(ssm_states: torch.Tensor):
    found = replay_pool.lookup(ssm_states)
    if found is None or found[0].replay.spec.family != "kda":
        raise ValueError("ssm_states: not a layer of a KDA ReplayMambaPool's temporal tensor")
    return found


def _gating(pool, q, k, a, b, A_log, dt_bias, lower_bound, n: int) -> dict:
    """``replayssm.gating`` of SGLang's KDA inputs: a ``[n, HV*K]`` / ``[n, HV, K]``, b ``[n, HV]`` /
    ``[1, n, HV]``, A_log with HV and dt_bias with HV*K elements (viewed, never copied)."""
    HV, K = pool.spec.num_v_heads, pool.spec.head_k_dim
    if not isinstance(a, torch.Tensor) or tuple(a.shape) not in ((n, HV * K), (n, HV, K)):
        raise ValueError(f"a: expected [{n}, {HV * K}] or [{n}, {HV}, {K}], got {getattr(a, 'shape', None)}")
    if not isinstance(b, torch.Tensor) or tuple(b.shape) not in ((n, HV), (1, n, HV)):
        raise ValueError(f"b: expected [{n}, {HV}] or [1, {n}, {HV}], got {getattr(b, 'shape', None)}")
    if A_log.numel() != HV or dt_bias.numel() != HV * K:
        raise ValueError(f"A_log, dt_bias: expected {HV} and {HV * K} elements, got {A_log.numel()} and "
                         f"{dt_bias.numel()}")
    return replayssm.gating(pool, q=q, k=k, a=a.view(n, HV, K), b=b.view(n, HV), A_log=A_log.view(HV),
                            dt_bias=dt_bias.view(HV, K), lower_bound=lower_bound)


def _step(ssm_states, q, k, v, a, b, A_log, dt_bias, lower_bound, scale, cache_indices) -> torch.Tensor:
    """Shared tail: ``q, k [n, HK, K]``, ``v [n, HV, V]`` (views of SGLang's tensors); returns ``[1, n, HV, V]``."""
    owner, layer = _owner(ssm_states)
    spec = owner.replay.spec
    n = q.shape[0]
    made = _gating(owner.replay, q, k, a, b, A_log, dt_bias, lower_bound, n)
    slots = replay_pool.replay_slots(owner.replay, cache_indices)
    out = torch.empty(n, spec.num_v_heads, spec.head_v_dim, dtype=v.dtype, device=v.device)
    replayssm.decode(owner.replay, layer, slots, out=out, checked=replay_pool.checked(owner.replay), q=q, v=v,
                     scale=scale if scale is not None else spec.head_k_dim ** -0.5, **made)
    return out.unsqueeze(0)


def replay_packed_decode(kernel, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *,
                         A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float, ssm_states: torch.Tensor,
                         cache_indices: torch.Tensor, num_v_heads: int, head_v_dim: int, lower_bound=None,
                         **kwargs) -> torch.Tensor:
    """One KDA decode step of a replay layer, with ``TritonKDAKernel.packed_decode``'s arguments.

    Args:
        kernel: the ``TritonKDAKernel`` (unused: the replay op replaces its kernel).
        mixed_qkv: ``[B, 2*HK*K + HV*V]`` after the conv, q | k | v per row; v in the ring dtype.
        a: ``[B, HV*K]`` or ``[B, HV, K]``; b: ``[B, HV]`` or ``[1, B, HV]``. A_log: HV elements;
            dt_bias: HV*K elements. scale: q scale. lower_bound: the safe gate's bound, or None.
        ssm_states: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, HV, V, K]``: the
            replay checkpoint, read and (at a flush) written in place.
        cache_indices: int32/int64 ``[B]`` pool slots, -1 = padding.
        num_v_heads, head_v_dim: HV and V, checked against the pool.
        kwargs: SGLang's own replay buffers (``replayssm_d`` ...), which must be None.
    Returns:
        A fresh ``[1, B, HV, V]`` tensor in mixed_qkv's dtype.
    """
    owner, _ = _owner(ssm_states)
    q, k, v = unpack_qkv(owner.replay.spec, mixed_qkv, num_v_heads, head_v_dim, kwargs)
    return _step(ssm_states, q, k, v, a, b, A_log, dt_bias, lower_bound, scale, cache_indices)


def replay_decode(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *,
                  A_log: torch.Tensor, dt_bias: torch.Tensor, ssm_states: torch.Tensor, cache_indices: torch.Tensor,
                  query_start_loc: torch.Tensor, lower_bound=None, **kwargs) -> torch.Tensor:
    """One KDA decode step of a replay layer, with ``TritonKDAKernel.decode``'s arguments.

    Args:
        kernel: the ``TritonKDAKernel`` (unused).
        q, k: ``[1, B, HK, K]``; v: ``[1, B, HV, V]`` in the ring dtype (one token per sequence).
        a, b, A_log, dt_bias, lower_bound, ssm_states, cache_indices: as ``replay_packed_decode``.
        query_start_loc: int ``[B + 1]``; one token per sequence is required (not checked on the
            device: the decode batch SGLang builds has it).
        kwargs: ``scale`` if given (default ``K ** -0.5``, as SGLang's kernel).
    Returns:
        A fresh ``[1, B, HV, V]`` tensor in v's dtype.
    """
    owner, _ = _owner(ssm_states)
    spec = owner.replay.spec
    n = cache_indices.shape[0]
    for name, t, heads, dim in (("q", q, spec.num_k_heads, spec.head_k_dim), ("k", k, spec.num_k_heads,
                                spec.head_k_dim), ("v", v, spec.num_v_heads, spec.head_v_dim)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (1, n, heads, dim):
            raise ValueError(f"{name}: expected [1, {n}, {heads}, {dim}] (one token per sequence), "
                             f"got {getattr(t, 'shape', None)}")
    if query_start_loc.shape != (n + 1,):
        raise ValueError(f"query_start_loc: expected [{n + 1}], got {list(query_start_loc.shape)}")
    return _step(ssm_states, q[0], k[0], v[0], a, b, A_log, dt_bias, lower_bound, kwargs.get("scale"), cache_indices)


def replay_target_verify(kernel, A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, ssm_states: torch.Tensor,
                         cache_indices: torch.Tensor, cache_steps: int, lower_bound=None, **kwargs) -> torch.Tensor:
    """T draft tokens of a replay KDA layer, with ``TritonKDAKernel.target_verify``'s arguments.

    Args:
        kernel: the ``TritonKDAKernel`` (unused: the replay op replaces its kernel).
        A_log: HV elements; dt_bias: HV*K elements. lower_bound: the safe gate's bound, or None.
        q, k: ``[1, n*T, HK, K]``; v: ``[1, n*T, HV, V]`` in the ring dtype (a dense chain layout:
            the tokens of a row are consecutive).
        a: ``[n*T, HV*K]``; b: ``[1, n*T, HV]``.
        ssm_states: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, HV, V, K]``:
            read, and at an early flush (RING.md) written, in place.
        cache_indices: int32/int64 ``[n]`` pool slots, -1 = padding. cache_steps: T.
        kwargs: SGLang's per-draft snapshot buffers and fused-accept indices: replay keeps no
            snapshots, so they are not read; tree links (``retrieve_parent_token``) are refused, replay
            verifies a chain; ``scale`` if given
            (default ``K ** -0.5``, as SGLang's kernel). SGLang's own ring must be off.
    Returns:
        A fresh ``[1, n*T, HV, V]`` tensor in v's dtype; the drafts stay pending until the commit.
    """
    owner, layer = _owner(ssm_states)
    if kwargs.get("cache_ring"):
        raise ValueError("cache_ring: SGLang's own replay ring cannot run beside replayssm")
    replay_pool.chain_only(kwargs.get("retrieve_parent_token"))
    spec = owner.replay.spec
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    n, T = cache_indices.shape[0], cache_steps
    for name, t, heads, dim in (("q", q, HK, K), ("k", k, HK, K), ("v", v, HV, V)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (1, n * T, heads, dim):
            raise ValueError(f"{name}: expected [1, {n * T}, {heads}, {dim}] (n = {n} rows of T = {T} tokens, "
                             f"a dense chain), got {getattr(t, 'shape', None)}")
    made = _gating(owner.replay, q[0], k[0], a, b, A_log, dt_bias, lower_bound, n * T)
    slots = replay_pool.replay_slots(owner.replay, cache_indices)
    out = torch.empty(n, T, HV, V, dtype=v.dtype, device=v.device)
    scale = kwargs.get("scale")
    replayssm.verify(owner.replay, layer, slots, out=out, checked=replay_pool.checked(owner.replay),
                     q=q[0].unflatten(0, (n, T)), v=v[0].unflatten(0, (n, T)),
                     scale=scale if scale is not None else K ** -0.5,
                     **{name: t.unflatten(0, (n, T)) for name, t in made.items()})
    return out.view(1, n * T, HV, V)
