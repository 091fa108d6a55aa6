"""GDN routing at SGLang's kernel seam (sglang 0.5.17 and 0.5.23, ``layers/attention/linear/kernels/gdn_triton.py``):
``TritonGDNKernel.packed_decode``, which ``GDNAttnBackend.forward_decode`` calls once per layer and
decode step after the conv update, and ``TritonGDNKernel.target_verify``, which
``GDNAttnBackend.forward_extend`` calls for a speculative verify.

``replay_packed_decode`` / ``replay_target_verify`` take those calls' arguments and run
``replayssm.decode`` / ``replayssm.verify`` on the layer's ``ReplayMambaPool`` state, in place of
SGLang's conventional kernels and of its own replay kernels; the commit is ``mamba2.commit_after_verify``
(family-independent). The gating SGLang fuses into its kernels is formed by ``replayssm.gating`` (one
launch on the triton backend) with SGLang's formulas: q, k L2-normalised (``x / sqrt(sum x^2 + 1e-6)``;
q through ``q_scale``), ``g = -exp(A_log) * softplus(a + dt_bias)`` (threshold 20), ``beta = sigmoid(b)``
(rounded to b's dtype in the packed decode, as SGLang's).
"""

from __future__ import annotations

import torch

import replayssm

from . import pool as replay_pool


def unpack_qkv(spec, mixed_qkv: torch.Tensor, num_v_heads: int, head_v_dim: int, kwargs: dict):
    """Views ``q, k [n, HK, K]``, ``v [n, HV, V]`` of SGLang's packed ``mixed_qkv [n, 2*HK*K + HV*V]``
    (GDN and KDA packed decode), after refusing SGLang's own replay buffers in ``kwargs`` and
    checking ``num_v_heads`` / ``head_v_dim`` against the pool's ``spec``."""
    for name in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos", "replayssm_force_flush"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{name}: SGLang's own replay buffers cannot run beside replayssm")
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    if (num_v_heads, head_v_dim) != (HV, V):
        raise ValueError(f"num_v_heads, head_v_dim: the pool holds {HV} heads of {V}, got {num_v_heads}, {head_v_dim}")
    width = 2 * HK * K + HV * V
    if not isinstance(mixed_qkv, torch.Tensor) or mixed_qkv.dim() != 2 or mixed_qkv.shape[1] != width:
        raise ValueError(f"mixed_qkv: expected [B, {width}] (q | k | v), got {getattr(mixed_qkv, 'shape', None)}")
    n = mixed_qkv.shape[0]
    q, k, v = torch.split(mixed_qkv, [HK * K, HK * K, HV * V], dim=-1)
    return q.view(n, HK, K), k.view(n, HK, K), v.view(n, HV, V)


def replay_packed_decode(kernel, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *,
                         A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float, ssm_states: torch.Tensor,
                         cache_indices: torch.Tensor, num_v_heads: int, head_v_dim: int, **kwargs) -> torch.Tensor:
    """One GDN decode step of a replay layer, with ``TritonGDNKernel.packed_decode``'s arguments.

    Args:
        kernel: the ``TritonGDNKernel`` (unused: the replay op replaces its kernel).
        mixed_qkv: ``[B, 2*HK*K + HV*V]`` after the conv, q | k | v per row; v in the ring dtype.
        a, b: ``[B, HV]`` gating inputs. A_log, dt_bias: ``[HV]``. scale: q scale (``K ** -0.5``).
        ssm_states: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, HV, V, K]``: the
            replay checkpoint, read and (at a flush) written in place.
        cache_indices: int32/int64 ``[B]`` pool slots, -1 = padding.
        num_v_heads, head_v_dim: HV and V, checked against the pool.
        kwargs: SGLang's own replay buffers (``replayssm_d`` ...), which must be None.
    Returns:
        A fresh ``[1, B, HV, V]`` tensor in mixed_qkv's dtype (SGLang's packed output layout).
    """
    found = replay_pool.lookup(ssm_states)
    if found is None:
        raise ValueError("ssm_states: not a layer of a ReplayMambaPool's temporal tensor; with replay on every GDN "
                         "state must come from HybridReqToTokenPool.mamba_pool_cls")
    owner, layer = found
    spec = owner.replay.spec
    if spec.family != "gdn":
        raise ValueError(f"ssm_states: a {spec.family} pool reached the GDN kernel")
    q, k, v = unpack_qkv(spec, mixed_qkv, num_v_heads, head_v_dim, kwargs)
    slots = replay_pool.replay_slots(owner.replay, cache_indices)
    made = replayssm.gating(owner.replay, q=q, k=k, a=a, b=b, A_log=A_log, dt_bias=dt_bias, beta_round=True)
    out = torch.empty(v.shape, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    replayssm.decode(owner.replay, layer, slots, out=out, checked=replay_pool.checked(owner.replay), q=q, v=v,
                     scale=scale, **made)
    return out.unsqueeze(0)


def replay_target_verify(kernel, A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, ssm_states: torch.Tensor,
                         cache_indices: torch.Tensor, cache_steps: int, **kwargs) -> torch.Tensor:
    """T draft tokens of a replay GDN layer, with ``TritonGDNKernel.target_verify``'s arguments.

    Args:
        kernel: the ``TritonGDNKernel`` (unused: the replay op replaces its kernel).
        A_log, dt_bias: ``[HV]``. q, k: ``[1, n*T, HK, K]``; v: ``[1, n*T, HV, V]`` in the ring
            dtype (any strides with a contiguous last dim; tokens of a row are consecutive).
        a, b: ``[n*T, HV]`` gating inputs (beta = sigmoid(b) in fp32, as SGLang's verify kernel).
        ssm_states: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, HV, V, K]``:
            read, and at an early flush (RING.md) written, in place.
        cache_indices: int32/int64 ``[n]`` pool slots, -1 = padding. cache_steps: T.
        kwargs: SGLang's per-draft snapshot buffers (``intermediate_states_buffer``, ...): replay keeps
            no snapshots, so they are not read; tree links (``retrieve_parent_token``) are refused,
            replay verifies a chain; ``scale`` if given (default ``K ** -0.5``, as SGLang's kernel).
    Returns:
        A fresh ``[1, n*T, HV, V]`` tensor in v's dtype; the drafts stay pending until the commit.
    """
    found = replay_pool.lookup(ssm_states)
    if found is None or found[0].replay.spec.family != "gdn":
        raise ValueError("ssm_states: not a layer of a GDN ReplayMambaPool's temporal tensor")
    replay_pool.chain_only(kwargs.get("retrieve_parent_token"))
    owner, layer = found
    spec = owner.replay.spec
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    n, T = cache_indices.shape[0], cache_steps
    for name, t, heads, dim in (("q", q, HK, K), ("k", k, HK, K), ("v", v, HV, V)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (1, n * T, heads, dim):
            raise ValueError(f"{name}: expected [1, {n * T}, {heads}, {dim}] (n = {n} rows of T = {T} tokens), "
                             f"got {getattr(t, 'shape', None)}")
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (n * T, HV):
            raise ValueError(f"{name}: expected [{n * T}, {HV}], got {getattr(t, 'shape', None)}")
    slots = replay_pool.replay_slots(owner.replay, cache_indices)
    made = replayssm.gating(owner.replay, q=q[0], k=k[0], a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    out = torch.empty(n, T, HV, V, dtype=v.dtype, device=v.device)
    replayssm.verify(owner.replay, layer, slots, out=out, checked=replay_pool.checked(owner.replay),
                     q=q[0].unflatten(0, (n, T)), v=v[0].unflatten(0, (n, T)),
                     scale=kwargs.get("scale") or K ** -0.5, **{name: t.unflatten(0, (n, T)) for name, t in made.items()})
    return out.view(1, n * T, HV, V)
