"""decode and verify: one layer's step over a StatePool; gating: a GDN / KDA step's inputs from a
host's raw projections."""

from __future__ import annotations

import torch

from .pool import StatePool
from .validate import L2NORMS, LAYER_INPUTS, check_flag, check_inputs, check_number, check_slot_tensor, check_tensor


def _run(pool: StatePool, layer: int, slots, inputs: dict, out, *, is_verify: bool, checked: bool) -> torch.Tensor:
    if not isinstance(pool, StatePool):
        raise TypeError(f"pool: expected a StatePool, got {type(pool).__name__}")
    pool.check_layer(layer)
    check_flag("checked", checked)
    if checked:
        cpu_slots = pool.cpu_slots(slots)
    else:
        pool.require_unchecked()
        check_slot_tensor(slots, pool.device)
        cpu_slots = None
    n = slots.numel()
    T = None
    if is_verify:
        lead = inputs.get("x") if pool.spec.family == "mamba2" else inputs.get("v")
        T = lead.shape[1] if isinstance(lead, torch.Tensor) and lead.dim() > 1 else 0
        if not 1 <= T <= pool.cfg.max_tokens:
            raise ValueError(f"T: expected 1..{pool.cfg.max_tokens} tokens per verify "
                             f"(max_draft_tokens + 1), got {T}")
    inputs = check_inputs(pool.spec, pool.cfg, n, T, pool.device, inputs)
    act = inputs["x"] if pool.spec.family == "mamba2" else inputs["v"]
    heads, dim = (pool.spec.num_heads, pool.spec.head_dim) if pool.spec.family == "mamba2" \
        else (pool.spec.num_v_heads, pool.spec.head_v_dim)
    shape = (n, heads, dim) if T is None else (n, T, heads, dim)
    if out is None:
        out = torch.empty(shape, dtype=act.dtype, device=pool.device)
    else:
        check_tensor("out", out, shape, pool.device, act.dtype)
        shared = [name for name, t in inputs.items() if isinstance(t, torch.Tensor) and t.numel() and out.numel()
                  and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()]
        if shared:
            raise ValueError(f"out: expected a buffer of its own, it shares memory with {', '.join(shared)} (a step "
                             "reads its inputs after it starts writing out)")
    if checked:
        keep = cpu_slots >= 0
        busy = pool.pending[layer, cpu_slots[keep]]
        if bool((busy > 0).any()):
            raise ValueError("slots: a slot has an uncommitted verify in this layer; call pool.commit first")
        if pool.spec.family == "mamba2":
            _check_layer_A(pool, layer, inputs["A"])
    if T is None:  # decode: a token axis of one
        inputs = {k: (v if k in LAYER_INPUTS or v is None else v.unsqueeze(1)) for k, v in inputs.items()}
    pool.backend_ops.step(pool, layer, slots, cpu_slots, inputs, committed=T is None,
                          out=out if T is not None else out.unsqueeze(1))
    if checked and T is not None:
        pool.pending[layer, cpu_slots[keep]] = T
    return out


def _check_layer_A(pool: StatePool, layer: int, A: torch.Tensor) -> None:
    """A Mamba-2 layer's ``A`` is a layer constant: folding its ring outside a step (``flush``,
    ``read_state``, a later flush step) uses the ``A`` the layer was stepped with (``pool.layer_A``),
    so a step with other values is refused (reads ``A`` on the host)."""
    stored = pool.layer_A[layer]
    if stored is not None and stored is not A and not torch.equal(stored.float(), A.float()):
        diff = (stored.float() - A.float()).abs().max().item()
        raise ValueError(f"A: a layer constant; layer {layer} was stepped with another A (max difference "
                         f"{diff:.3g}), which its ring entries fold with; pass the layer's A every step")


def decode(pool: StatePool, layer: int, slots: torch.Tensor, *, out: torch.Tensor | None = None,
           checked: bool = True, **inputs) -> torch.Tensor:
    """One token per slot through one layer; appends to the ring, flushes when it is full.

    Args:
        pool: the layer's StatePool (updated in place).
        layer: layer index in ``[0, pool.num_layers)``.
        slots: int64 ``[n]``; -1 marks a padded row (output zero, nothing touched).
        out: optional output buffer, written in place.
        checked: True validates slot values on the host (allocated, distinct, no uncommitted
            verify) and, for Mamba-2, that ``A`` is the layer's, which synchronizes with the
            device. False (triton backend only) checks shapes, dtypes and devices only and never
            reads a device value, so a host can capture the step in a CUDA graph; the slots are
            then the host's responsibility (distinct; an index outside ``[0, num_slots)`` is taken
            as a padded row, never read or written), and the pool's host-side record of pending
            verifies is not kept (use ``commit(checked=False)`` too).
        inputs: Mamba-2 ``x [n, H, P]``, ``dt [n, H]`` (raw), ``A [H]``, ``B, C [n, G, N]``,
            ``D [H]``, ``dt_bias [H]``, ``z [n, H, P]`` (last three optional); ``A``, ``D`` and
            ``dt_bias`` are layer constants, the same values at every step of a layer (the ring
            folds with the layer's ``A``, ``pool.layer_A``: a checked step refuses another); GDN/KDA
            ``q, k [n, HK, K]``, ``v [n, HV, V]``, ``g [n, HV]`` (GDN) or ``[n, HV, K]`` (KDA),
            ``beta [n, HV]``, ``scale`` (default ``K ** -0.5``), ``q_scale [n, HK]`` fp32 (optional: a
            factor per token and key head on q, e.g. the reciprocal of a host's L2 norm, so that q
            can stay in 16 bits). x, B / k, v in the ring dtype.
    Returns:
        ``y [n, H, P]`` (Mamba-2) or ``o [n, HV, V]`` (GDN/KDA), in the dtype of x / v.
    """
    return _run(pool, layer, slots, inputs, out, is_verify=False, checked=checked)


def verify(pool: StatePool, layer: int, slots: torch.Tensor, *, out: torch.Tensor | None = None,
           checked: bool = True, **inputs) -> torch.Tensor:
    """T tokens per slot through one layer, not committed; ``pool.commit`` keeps a prefix.

    Takes the inputs of :func:`decode` with a token axis after n (``x [n, T, H, P]``, ...),
    ``1 <= T <= max_draft_tokens + 1``; returns ``[n, T, heads, dim]``. Writes no state unless
    the ring would overflow, in which case it first folds the committed history (RING.md).
    ``checked`` as in :func:`decode`.
    """
    return _run(pool, layer, slots, inputs, out, is_verify=True, checked=checked)


def gating(pool: StatePool, *, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
           A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None = None,
           beta_round: bool = False, l2norm: str | None = "sglang", softplus_beta: float = 1.0,
           softplus_threshold: float = 20.0) -> dict:
    """A GDN / KDA step's ``q_scale``, ``k``, ``g`` and ``beta`` from a host's raw projections, with
    the formulas of ``replayssm/kernels/gating/reference.py`` (one launch on the triton backend, the
    same bits on every backend).

    Args:
        pool: a GDN or KDA StatePool (its backend computes; its ring dtype is k's).
        q, k: ``[N, HK, K]`` raw (not normalised), any float dtype, contiguous last dim.
        a: ``[N, HV]`` (GDN) or ``[N, HV, K]`` (KDA); b: ``[N, HV]``; contiguous last dim.
        A_log: ``[HV]``; dt_bias: ``[HV]`` (GDN) or ``[HV, K]`` (KDA); contiguous.
        lower_bound: KDA's safe gate ``lower_bound * sigmoid(exp(A_log) * (a + dt_bias))`` (the
            bound taken as fp32); None for ``-exp(A_log) * softplus(a + dt_bias)``.
        beta_round: round ``sigmoid(b)`` through b's dtype (SGLang's GDN packed decode does).
        l2norm: "sglang" ``x / sqrt(sum x^2 + 1e-6)``; "fla" ``x / (sqrt(sum x^2) + 1e-6)`` (fla's and
            TensorRT-LLM's kernels); None: q and k are already normalised, k is only rounded to the
            ring dtype and no q_scale is formed.
        softplus_beta, softplus_threshold: ``softplus(x) = log1p(exp(beta x)) / beta``, x itself
            where ``beta x > threshold`` (both taken as fp32).
    Returns:
        Fresh ``dict(q_scale [N, HK] fp32, k [N, HK, K] ring dtype, g [N, HV] or [N, HV, K] fp32,
        beta [N, HV] fp32)`` (no q_scale with ``l2norm=None``), to pass to :func:`decode` (or, with
        a token axis, :func:`verify`) with q and v.
    """
    if not isinstance(pool, StatePool):
        raise TypeError(f"pool: expected a StatePool, got {type(pool).__name__}")
    spec = pool.spec
    if spec.family not in ("gdn", "kda"):
        raise ValueError(f"pool: gating forms GDN / KDA inputs, got a {spec.family} pool")
    HK, HV, K = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim
    N = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() else 0
    per_channel = spec.family == "kda"
    for name, t, shape in (("q", q, (N, HK, K)), ("k", k, (N, HK, K)), ("a", a, (N, HV, K) if per_channel else (N, HV)),
                           ("b", b, (N, HV)), ("A_log", A_log, (HV,)),
                           ("dt_bias", dt_bias, (HV, K) if per_channel else (HV,))):
        check_tensor(name, t, shape, pool.device)
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a contiguous last dimension, got strides {t.stride()}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (a layer constant, never copied)")
    check_flag("beta_round", beta_round)
    check_number("lower_bound", lower_bound, optional=True)
    check_number("softplus_beta", softplus_beta)
    check_number("softplus_threshold", softplus_threshold)
    if lower_bound is not None and not per_channel:
        raise ValueError("lower_bound: the safe gate is KDA's; a GDN pool takes None")
    if l2norm not in L2NORMS:
        raise ValueError(f"l2norm: expected one of {L2NORMS}, got {l2norm!r}")
    if not softplus_beta > 0:
        raise ValueError(f"softplus_beta: expected a positive factor, got {softplus_beta}")
    return pool.backend_ops.gating(pool, q=q, k=k, a=a, b=b, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                                   beta_round=beta_round, l2norm=l2norm, softplus_beta=float(softplus_beta),
                                   softplus_threshold=float(softplus_threshold))
