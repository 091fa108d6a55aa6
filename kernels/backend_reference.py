"""The reference backend (``replayssm.backend.Backend``): the replay algebra of
``kernels/*/reference.py`` over a StatePool.

Gathers each row's checkpoint (or read copy) and ring window, evaluates outputs, folds on
flush, appends the tokens to the ring and moves the cursors, following RING.md. Works on any
device; synchronizes with it (it is the CPU default, not the fast path), so it indexes rows on
the host and takes no ``checked=False`` step.
"""

from __future__ import annotations

import torch

from replayssm import formats, ring
from replayssm.kernels.delta import reference as dref
from replayssm.kernels.gating.reference import gating_ref
from replayssm.kernels.mamba2 import reference as mref
from replayssm.pool import round_checkpoint, to_read_layout
from replayssm.validate import LAYER_INPUTS

supports_unchecked = False


def check(spec, cfg) -> None:
    """Every dimension a ``LayerSpec`` takes is served."""


def _history(pool, layer: int, rows: torch.Tensor, width: int):
    """Committed ring entries of ``rows`` as ``[r, heads, width, ...]`` (entries past count are zero)
    and their validity mask ``[r, width]``."""
    count = pool.cursors["count"][layer, rows]
    origin = pool.cursors["origin"][layer, rows]
    i = torch.arange(width, device=rows.device)
    pos = (origin[:, None] + i[None, :]) % pool.cfg.capacity                      # [r, width]
    valid = i[None, :] < count[:, None]
    out = {}
    for name, buf in pool.ring.items():
        b = buf[layer, rows]                                                      # [r, heads, C, ...]
        idx = pos[:, None, :].expand(b.shape[0], b.shape[1], width)
        extra = b.shape[3:]
        idx = idx.reshape(*idx.shape, *([1] * len(extra))).expand(*idx.shape, *extra)
        vals = torch.gather(b, 2, idx)
        mask = valid[:, None, :].reshape(*valid.shape[:1], 1, width, *([1] * len(extra)))
        out[name] = torch.where(mask, vals, torch.zeros_like(vals))
    return out, valid


def _append(pool, layer: int, rows: torch.Tensor, tokens: dict[str, torch.Tensor]) -> None:
    """Write token s of each row to ring entry (origin + count + s) % C; tokens ``[r, heads, T, ...]``."""
    count = pool.cursors["count"][layer, rows]
    origin = pool.cursors["origin"][layer, rows]
    T = next(iter(tokens.values())).shape[2]
    for s in range(T):
        pos = (origin + count + s) % pool.cfg.capacity
        for name, t in tokens.items():
            pool.ring[name][layer][rows, :, pos] = t[:, :, s].to(pool.ring[name].dtype)


def _window_inputs(pool, layer, rows, width, new):
    """History then this step's tokens: ``([r, heads, width + T, ...] per buffer, valid [r, width + T])``."""
    hist, valid = _history(pool, layer, rows, width)
    T = next(iter(new.values())).shape[2]
    valid = torch.cat((valid, torch.ones(valid.shape[0], T, dtype=torch.bool, device=valid.device)), dim=1)
    return {name: torch.cat((hist[name].float(), new[name].float()), dim=2) for name in new}, valid


def _tokens_first(inputs: dict, names) -> dict[str, torch.Tensor]:
    """Inputs ``[r, T, heads, ...]`` to ``[r, heads, T, ...]``."""
    return {name: inputs[name].movedim(1, 2) for name in names}


def step(pool, layer: int, slots: torch.Tensor, cpu_slots: torch.Tensor, inputs: dict, *, committed: bool,
         out: torch.Tensor) -> None:
    """One decode (committed, T = 1) or verify step; inputs ``[n, T, ...]``, ``out [n, T, heads, D]``.

    Rows with slot -1 get zeros and touch nothing.
    """
    out.zero_()
    keep = cpu_slots >= 0
    if not bool(keep.any()):
        return
    dev_keep = keep.to(pool.device)
    rows_inputs = {k: (v if k in LAYER_INPUTS or v is None else v[dev_keep]) for k, v in inputs.items()}
    y = _step_rows(pool, layer, cpu_slots[keep], rows_inputs, committed)
    out[dev_keep] = y.to(out.dtype)


def _step_rows(pool, layer: int, cpu_rows: torch.Tensor, inputs: dict, committed: bool) -> torch.Tensor:
    spec, cfg = pool.spec, pool.cfg
    rows = cpu_rows.to(pool.device)
    T = (inputs["x"] if spec.family == "mamba2" else inputs["v"]).shape[1]
    count = pool.cursors["count"][layer, rows]
    width = int(count.max().item())
    flush = ring.flush_rows(count, T, cfg.window)
    ckpt = pool.checkpoint[layer, rows].float()
    S0 = torch.where(flush.reshape(-1, 1, 1, 1), ckpt, pool.decoded_read_copy(layer, rows))
    upto = width + T if committed else width
    if spec.family == "mamba2":
        pool.layer_A[layer] = inputs["A"]
        new = _tokens_first(inputs, ("x", "B"))
        new["dt"] = mref.mamba2_dt_entry(inputs["dt"], inputs["dt_bias"]).movedim(1, 2)
        win, valid = _window_inputs(pool, layer, rows, width, new)
        x, dtp, B, lam = mref.mamba2_window(win["x"], win["dt"], valid, win["B"], inputs["A"])
        C = inputs["C"].movedim(1, 2).float().repeat_interleave(spec.num_heads // spec.num_groups, 1)
        y = mref.mamba2_window_outputs(S0, x, dtp, B, lam, C, first=width).movedim(2, 1)
        y = mref.mamba2_gate(y, inputs["x"].float(), inputs["D"], inputs["z"])
        if bool(flush.any()):
            S_new = mref.mamba2_window_fold(S0[flush], x[flush], dtp[flush], B[flush], lam[flush], upto)
            store(pool, layer, cpu_rows[flush.cpu()], S_new)
    else:
        new = _tokens_first(inputs, ("k", "v", "g", "beta"))
        win, _ = _window_inputs(pool, layer, rows, width, new)
        k, gam = dref.delta_window(win["k"], win["g"], spec.num_v_heads, spec.head_k_dim)
        d = dref.delta_window_d(S0, k, win["v"], win["beta"], gam)
        q = inputs["q"].float() if inputs["q_scale"] is None else inputs["q"].float() * inputs["q_scale"][..., None]
        q = dref.expand_heads(q.movedim(1, 2), spec.num_v_heads, 1)
        y = dref.delta_window_outputs(S0, k, d, gam, q, inputs["scale"]).movedim(2, 1)
        if bool(flush.any()):
            S_new = dref.delta_window_fold(S0[flush], k[flush], d[flush], gam[flush], upto)
            store(pool, layer, cpu_rows[flush.cpu()], S_new)
        new["d"] = d[:, :, width:]                       # the tokens' d, cached for later outputs
    _append(pool, layer, rows, new)
    ring.advance(pool.cursors, layer, rows, T, cfg, committed=committed)
    return y


def flush(pool, layer: int, rows: torch.Tensor) -> None:
    """Fold the committed ring of ``rows`` (device, distinct, no padded row) into the checkpoint of
    ``layer`` and re-derive its read copy; their rings empty. Rows with an empty ring are untouched."""
    count = pool.cursors["count"][layer, rows].cpu()
    cpu_rows = rows.cpu()[count > 0]
    if cpu_rows.numel():
        store(pool, layer, cpu_rows, fold_committed(pool, layer, cpu_rows))
        ring.empty(pool.cursors, layer, cpu_rows.to(pool.device), wrote_checkpoint=True)


def store(pool, layer: int, cpu_rows: torch.Tensor, state: torch.Tensor) -> None:
    """Write fp32 ``state [r, *state_shape]`` as the checkpoint of rows and re-derive their read copy."""
    if cpu_rows.numel() == 0:
        return
    rows = cpu_rows.to(pool.device)
    stored = round_checkpoint(state, pool.cfg, layer, pool.cursors["epoch"][layer, rows])
    pool.checkpoint[layer, rows] = stored
    if pool.read:
        codes, bs, rs = formats.quantize(to_read_layout(pool.spec, stored.float()), pool.cfg.read_format)
        pool.read["codes"][layer, rows] = codes
        pool.read["block_scale"][layer, rows] = bs
        pool.read["row_scale"][layer, rows] = rs


commit = ring.commit


def refresh(pool, layer: int, rows: torch.Tensor) -> None:
    """Re-derive the read copy of ``rows`` (int64 on the pool's device) of ``layer`` from their stored
    checkpoint; checkpoint and cursors untouched."""
    stored = pool.checkpoint[layer, rows].float()
    codes, bs, rs = formats.quantize(to_read_layout(pool.spec, stored), pool.cfg.read_format)
    pool.read["codes"][layer, rows] = codes
    pool.read["block_scale"][layer, rows] = bs
    pool.read["row_scale"][layer, rows] = rs


def copy(pool, src: torch.Tensor, dst: torch.Tensor, *, layer: int | None, checkpoint: bool) -> None:
    """Slots ``src`` into ``dst`` (int64 ``[n]`` on the pool's device, slots of the pool): read copy,
    ring and cursors, and the checkpoint when ``checkpoint``, in ``layer`` or every layer."""
    sel = slice(None) if layer is None else slice(layer, layer + 1)
    if checkpoint:
        pool.checkpoint[sel, dst] = pool.checkpoint[sel, src]
    for buf in (*pool.read.values(), *pool.ring.values(), *pool.cursors.values()):
        raw = buf[sel].view(torch.uint8) if buf.element_size() == 1 else buf[sel]   # fp8: copied as bytes
        raw.index_copy_(1, dst, raw.index_select(1, src))


def fold_committed(pool, layer: int, cpu_rows: torch.Tensor) -> torch.Tensor:
    """fp32 state after the committed ring of ``cpu_rows``, from the exact checkpoint."""
    spec = pool.spec
    rows = cpu_rows.to(pool.device)
    count = pool.cursors["count"][layer, rows]
    width = int(count.max().item())
    S0 = pool.checkpoint[layer, rows].float()
    if width == 0:
        return S0
    hist, valid = _history(pool, layer, rows, width)
    hist = {name: t.float() for name, t in hist.items()}
    if spec.family == "mamba2":
        x, dtp, B, lam = mref.mamba2_window(hist["x"], hist["dt"], valid, hist["B"], pool.layer_A[layer])
        return mref.mamba2_window_fold(S0, x, dtp, B, lam, width)
    k, gam = dref.delta_window(hist["k"], hist["g"], spec.num_v_heads, spec.head_k_dim)
    d = dref.delta_window_d(S0, k, hist["v"], hist["beta"], gam)
    return dref.delta_window_fold(S0, k, d, gam, width)


def gating(pool, *, q, k, a, b, A_log, dt_bias, lower_bound, beta_round, l2norm, softplus_beta,
           softplus_threshold) -> dict:
    """A GDN / KDA step's inputs from raw projections (``kernels/gating/reference.py``)."""
    return gating_ref(q, k, a, b, A_log, dt_bias, ring_dtype=pool.cfg.torch_ring_dtype, lower_bound=lower_bound,
                      beta_dtype=b.dtype if beta_round else None, l2norm=l2norm, softplus_beta=softplus_beta,
                      softplus_threshold=softplus_threshold)
