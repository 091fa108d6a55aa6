"""GDN routing: SGLang's kernel seam ``TritonGDNKernel.packed_decode`` (sglang 0.5.23,
``layers/attention/linear/kernels/gdn_triton.py``), the call ``GDNAttnBackend.forward_decode`` makes
once per layer and decode step after the conv update.

``replay_packed_decode`` takes that call's arguments and runs ``replayssm.decode`` on the layer's
``ReplayMambaPool`` state, in place of SGLang's conventional packed kernel and of its own replay
kernel. The gating SGLang fuses into its kernel is formed here, with the same formulas:
q, k L2-normalised (``x / sqrt(sum x^2 + 1e-6)``), ``g = -exp(A_log) * softplus(a + dt_bias)``
(threshold 20), ``beta = sigmoid(b)`` rounded to b's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import replayssm

from . import pool as replay_pool


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


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
    slots = replay_pool._slots(owner.replay, cache_indices)
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), threshold=20.0)
    beta = torch.sigmoid(b.float()).to(b.dtype).float()
    out = torch.empty(n, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    replayssm.decode(owner.replay, layer, slots, out=out, q=_l2norm(q.view(n, HK, K)),
                     k=_l2norm(k.view(n, HK, K)).to(owner.replay.cfg.torch_ring_dtype), v=v.view(n, HV, V),
                     g=g, beta=beta, scale=scale)
    return out.unsqueeze(0)
