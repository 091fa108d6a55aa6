"""The GDN / KDA flush behind a read copy from a coefficient ring, timed against the replay in use.

    python benchmarks/sweep_coefficient_flush.py [--models qwen3.5,kimi-linear] [--batch 256]
                                                 [--layouts kv,vk] [--json OUT.json]

Behind an fp8 / NVFP4 read copy the flush pass replays the window entry by entry on the exact
checkpoint (``_delta_flush_kernel``): a chain of 16 dependent reductions and updates per tile, issue-
bound (BENCHMARKS.md, "Where the flush steps spend their time"). The window's d are
``D = M (V - X)``, ``X_j = S0ᵀ(e^{Γ_j} ⊙ k_j)``, and ``M = (I + A)⁻¹ Diag(β)`` depends on the keys,
gates and betas only (``reference.delta_window_coefficients``), one row per entry from the rows
before it. If each decode step appended its entry's row of M to the ring (a coefficient ring,
``[S, HV, C, BM]`` fp32), a flush would be three products on the tile, no dependent chain:
``X = (e^Γ ⊙ K) S0``, ``D = M (V - X)``, ``S = e^{Γ_e} S0 + Wᵀ D``. ``_coefficient_flush_kernel``
is that flush for a committed decode step (the step's own entry's row it derives itself, from its
key products with the history); the ring's rows come here from the reference, so what this times
is the flush pass such a ring would give, not yet what the decode steps would pay to fill it. The
flush pass's ``solve`` tiles derive M in the program instead (``solve_window``, no ring change;
``sweep_tiles.py --kinds flush_solve,flush_solve_vk``): the difference is what the derivation costs.

Per model, layout (``kv``: ``[S, HV, K, V]``; ``vk``: the hosts' ``[S, HV, V, K]``) and read format,
with every row flushing (15 history entries and the step's token): the replay pass in use
(``replay_us``), each candidate tile (``candidates``: value rows, warps, µs), and the fold of the same
step on the checkpoint (``checkpoint_fold_us``: the decode kernel folding cached d, what a flush costs
without a read copy); ``rms_vs_replay`` is the candidate's new checkpoint against the replay's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from replayssm.kernels import ops  # noqa: E402
from replayssm.kernels.delta.reference import delta_window, delta_window_coefficients  # noqa: E402
from replayssm.kernels.delta.triton import load_ckpt_tile, store_ckpt_tile  # noqa: E402
from replayssm.kernels.formats.triton import dot_fp32, round_checkpoint, store_read_copy  # noqa: E402

# (value rows per program, warps)
CANDIDATES = [(16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4)]


@triton.jit(do_not_specialize=["num_slots"])
def _coefficient_flush_kernel(
    ckpt, c_s, c_h, c_k, c_v,                  # [S, HV, K, V] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, HV, V, ...]
    ring_k, ring_v, ring_g, ring_beta, ring_d,  # as _delta_flush_kernel's
    ring_m,                                    # [S, HV, C, BM] fp32: entry j's row of M, columns 0..j
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    slots, num_slots,                          # [n] int64: -1 or outside [0, S) = padded row
    q, q_r, q_h,                               # [n, 1, HK, K]
    k, k_r, k_h,                               # [n, 1, HK, K]
    v, v_r, v_h,                               # [n, 1, HV, V]
    g, g_r, g_h,                               # [n, 1, HV] or [n, 1, HV, K]
    beta, be_r,                                # [n, 1, HV]
    out, o_r, o_h,                             # [n, 1, HV, V]
    scale, window, capacity, sr_base,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr,
    PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr,
    CODE_MAX: tl.constexpr, ROWS_FROM_BLOCKS: tl.constexpr, DOT: tl.constexpr,
):
    """The flush rows of a committed decode step (``count + 1 >= window``) folded from the ring's rows of M.

    Grid ``(V / BV, HV, n)``. The window is the ``count`` committed entries and the step's token
    (entry ``count``), whose row of M is ``β (e - a M)`` with ``a_r = (e^{Γ_e - Γ_r} ⊙ k_r)·k``. Then
    ``X = (e^Γ ⊙ K) S0 [BM, BV]``, ``D = M (V - X)``, ``S = e^{Γ_e} S0 + Wᵀ D`` (``W_r = e^{Γ_e - Γ_r} ⊙ k_r``),
    all ``dot_fp32`` at precision ``DOT``; the output, the token's d, the checkpoint and its read copy
    are stored and the token's raw inputs and row of M appended, as the replay stores them."""
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    sl = tl.load(slots + i)
    real = (sl >= 0) & (sl < num_slots)
    sl = tl.where(real, sl, 0)
    count = tl.load(count_ptr + sl)
    if real & (count + 1 >= window):
        origin = tl.load(origin_ptr + sl)
        ep = tl.load(epoch_ptr + sl)
        hk = h // (HV // HK)
        e = tl.arange(0, BM)
        ok = tl.arange(0, K)
        ov = pid_v * BV + tl.arange(0, BV)
        vmask = ov < V
        hist = e < count
        tok = e == count
        pos = (origin + e) % capacity
        rk = ring_k + ((sl * HK + hk) * capacity) * K
        rv = ring_v + ((sl * HV + h) * capacity) * V
        rd = ring_d + ((sl * HV + h) * capacity) * V
        rm = ring_m + ((sl * HV + h) * capacity) * BM
        rbeta = ring_beta + (sl * HV + h) * capacity
        p_tok = (origin + count) % capacity
        k_n = tl.load(k + i * k_r + hk * k_h + ok)
        v_n = tl.load(v + i * v_r + h * v_h + ov, mask=vmask, other=0.0)
        b_n = tl.load(beta + i * be_r + h).to(tl.float32)
        # the window's keys [BM, K] and values [BM, BV]: the ring's entries, then the token
        kw = tl.where(tok[:, None], k_n.to(tl.float32)[None, :],
                      tl.load(rk + pos[:, None] * K + ok[None, :], mask=hist[:, None], other=0.0).to(tl.float32))
        vw = tl.where(tok[:, None], v_n.to(tl.float32)[None, :],
                      tl.load(rv + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :],
                              other=0.0).to(tl.float32))
        if PER_CHANNEL:
            rg = ring_g + ((sl * HV + h) * capacity) * K
            g_n = tl.load(g + i * g_r + h * g_h + ok).to(tl.float32)
            gw = tl.where(tok[:, None], g_n[None, :],
                          tl.load(rg + pos[:, None] * K + ok[None, :], mask=hist[:, None], other=0.0))   # [BM, K]
            gam = tl.cumsum(gw, axis=0)
            gam_e = tl.sum(gw, axis=0)                                                                 # [K]
            w_k = tl.exp(tl.minimum(gam_e[None, :] - gam, 0.0)) * kw
            x_k = tl.exp(gam) * kw
            a = tl.sum(w_k * k_n.to(tl.float32)[None, :], axis=1)                                      # [BM]
            top = tl.exp(gam_e)[:, None]
        else:
            rg = ring_g + (sl * HV + h) * capacity
            g_n = tl.load(g + i * g_r + h).to(tl.float32)
            gw = tl.where(tok, g_n, tl.load(rg + pos, mask=hist, other=0.0))                             # [BM]
            gam = tl.cumsum(gw, axis=0)
            gam_e = tl.sum(gw, axis=0)
            dec = tl.exp(tl.minimum(gam_e - gam, 0.0))
            w_k = dec[:, None] * kw
            x_k = tl.exp(gam)[:, None] * kw
            a = dec * tl.sum(kw * k_n.to(tl.float32)[None, :], axis=1)
            top = tl.exp(gam_e)
        # M [BM, BM]: the ring's rows (columns up to their own entry), then the token's
        low = e[None, :] <= e[:, None]
        m_hist = tl.load(rm + pos[:, None] * BM + e[None, :], mask=hist[:, None] & low, other=0.0)
        m_n = b_n * (tl.where(tok, 1.0, 0.0) - tl.sum(tl.where(hist, a, 0.0)[:, None] * m_hist, axis=0))
        m_w = tl.where(tok[:, None], m_n[None, :], m_hist)
        S = load_ckpt_tile(ckpt + sl * c_s + h * c_h, c_k, c_v, pid_v * BV, V, K, BV).to(tl.float32)   # [K, BV]
        x = dot_fp32(x_k, S, tl.zeros([BM, BV], dtype=tl.float32), False, False, DOT)                 # [BM, BV]
        d_w = dot_fp32(m_w, vw - x, tl.zeros([BM, BV], dtype=tl.float32), False, False, DOT)
        S = dot_fp32(tl.trans(w_k), d_w, S * top, False, False, DOT)
        q_n = tl.load(q + i * q_r + hk * q_h + ok).to(tl.float32)
        o = scale * tl.sum(S * q_n[:, None], axis=0)
        tl.store(out + i * o_r + h * o_h + ov, o.to(out.dtype.element_ty), mask=vmask)
        tl.store(rd + p_tok * V + ov, tl.sum(tl.where(tok[:, None], d_w, 0.0), axis=0), mask=vmask)
        stored = round_checkpoint(S, h * (K * V) + ok[:, None] * V + ov[None, :], sr_base, ep, CKPT_FMT)
        store_ckpt_tile(ckpt + sl * c_s + h * c_h, c_k, c_v, stored, pid_v * BV, V, K, BV)
        head = (sl * HV + h) * V
        store_read_copy(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (K // 16), rc_rs + head,
                        tl.trans(stored.to(tl.float32)), ov, vmask, READ_FMT, CODE_MAX, BV, K, ROW_CODE_BYTES,
                        ROWS_FROM_BLOCKS)
        # the token's raw inputs and row of M at ring entry (origin + count) % C
        tl.store(rv + p_tok * V + ov, v_n, mask=vmask)
        if pid_v == 0:
            tl.store(rbeta + p_tok, b_n)
            tl.store(rm + p_tok * BM + e, m_n)
            if PER_CHANNEL:
                tl.store(rg + p_tok * K + ok, g_n)
            else:
                tl.store(rg + p_tok, g_n)
            if h % (HV // HK) == 0:
                tl.store(rk + p_tok * K + ok, k_n)


def flush_launch(plan) -> "ops.Launch":
    """The flush pass of a committed decode step's plan (``ops.delta_plan``)."""
    return next(lc for lc in plan if lc.flush_pass)


def coefficient_flush(lc, ring_m: torch.Tensor, rows: int, num_warps: int):
    """Run ``_coefficient_flush_kernel`` on the buffers of ``lc`` (a committed decode step's flush
    pass behind a read copy) with the coefficient ring ``ring_m [S, HV, C, BM]`` fp32, ``rows`` value
    rows per program; returns Triton's compiled kernel."""
    a, c = lc.kwargs(), lc.constexprs
    if c["T"] != 1 or not c["COMMITTED"] or c.get("HAS_QS"):
        raise ValueError("lc: expected the flush pass of a committed decode step without q_scale")
    names = _coefficient_flush_kernel.arg_names
    const = dict(HK=c["HK"], HV=c["HV"], K=c["K"], V=c["V"], BV=rows, BM=c["BM"], PER_CHANNEL=c["PER_CHANNEL"],
                 CKPT_FMT=c["CKPT_FMT"], READ_FMT=c["READ_FMT"], ROW_CODE_BYTES=c["ROW_CODE_BYTES"],
                 CODE_MAX=c["CODE_MAX"], ROWS_FROM_BLOCKS=c["ROWS_FROM_BLOCKS"], DOT=c["DOT"])
    S, HV, C = a["ring_d"].shape[:3]
    if ring_m.shape != (S, HV, C, c["BM"]) or ring_m.dtype != torch.float32 or not ring_m.is_contiguous():
        raise ValueError(f"ring_m: expected contiguous fp32 {(S, HV, C, c['BM'])}, got {tuple(ring_m.shape)} "
                         f"{ring_m.dtype}")
    args = {n: a[n] for n in names if n in a}
    args["ring_m"] = ring_m
    n = a["slots"].shape[0]
    return _coefficient_flush_kernel[(triton.cdiv(c["V"], rows), c["HV"], n)](**args, **const, num_warps=num_warps)


def fill_coefficients(ring_m: torch.Tensor, ring_k, ring_g, ring_beta, count, origin, slots) -> None:
    """Write each row's committed entries' rows of M (``delta_window_coefficients`` of its ring
    entries, zero past each row's own entry) into ``ring_m [S, HV, C, BM]`` at their ring positions:
    what decode steps appending to a coefficient ring would have left there."""
    S, HV, C, BM = ring_m.shape
    K = ring_k.shape[-1]
    for sl in slots.tolist():
        if not 0 <= sl < S:
            continue
        m, o = int(count[sl]), int(origin[sl])
        if m == 0:
            continue
        pos = (o + torch.arange(m, device=ring_m.device)) % C
        kh, gam = delta_window(ring_k[sl:sl + 1][:, :, pos], ring_g[sl:sl + 1][:, :, pos], HV, K)
        M = delta_window_coefficients(kh, gam, ring_beta[sl:sl + 1][:, :, pos])[0]          # [HV, m, m]
        ring_m[sl, :, pos] = torch.nn.functional.pad(M, (0, BM - m))


def main():
    from bench_decode import Layer, timed
    from shapes import MODEL_SPECS

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen3.5,kimi-linear")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layouts", default="kv,vk")
    ap.add_argument("--read-formats", default="nvfp4")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("times kernels on a CUDA GPU; none is visible")
    rows = []
    for model in args.models.split(","):
        spec = MODEL_SPECS[model]
        if spec.family not in ("gdn", "kda"):
            ap.error(f"--models: {model} is no GDN / KDA model")
        for layout in args.layouts.split(","):
            fold = Layer(spec, args.batch, read_format="checkpoint", state_layout=layout)
            fold.set_fill(15)
            fn, _ = fold.step_fn(fold.inputs(1))
            fold_us = timed(fn)
            del fold
            for rf in args.read_formats.split(","):
                layer = Layer(spec, args.batch, read_format=rf, state_layout=layout)
                layer.set_fill(15)
                inp = layer.inputs(1)
                captured = []
                run, ops.launch = ops.launch, captured.extend
                try:
                    layer.step_fn(inp)[0]()
                finally:
                    ops.launch = run
                lc = flush_launch(captured)
                pool, cur = layer.pool, layer.pool.cursors
                ring = {n: b[0] for n, b in pool.ring.items()}
                S, HV, C = ring["d"].shape[:3]
                ring_m = torch.full((S, HV, C, lc.constexprs["BM"]), float("nan"), device="cuda")
                fill_coefficients(ring_m, ring["k"], ring["g"], ring["beta"], cur["count"][0], cur["origin"][0],
                                  layer.slots)
                ckpt = pool.checkpoint[0]
                saved = [t.clone() for t in (ckpt, *[pool.read[n][0] for n in pool.read], *ring.values(), ring_m)]
                bufs = [ckpt, *[pool.read[n][0] for n in pool.read], *ring.values(), ring_m]

                def restore():
                    for t, s in zip(bufs, saved):
                        t.copy_(s)
                out = lc.kwargs()["out"]
                lc.run()
                want, want_out = ckpt.float().clone(), out.float().clone()
                restore()
                row = dict(model=model, batch=args.batch, layout=layout, read_format=rf,
                           replay_us=round(timed(lc.run), 2), checkpoint_fold_us=round(fold_us, 2), candidates=[])
                restore()
                for bv, nw in CANDIDATES:
                    cand = dict(rows=bv, num_warps=nw)
                    try:
                        kernel = coefficient_flush(lc, ring_m, bv, nw)
                        got = ckpt.float()
                        cand["rms_vs_replay"] = ((got - want).norm() / want.norm()).item()
                        cand["out_rms_vs_replay"] = ((out.float() - want_out).norm() / want_out.norm()).item()
                        restore()
                        cand["us"] = round(timed(lambda: coefficient_flush(lc, ring_m, bv, nw)), 2)
                        cand.update(regs=kernel.n_regs, spills=kernel.n_spills)
                    except Exception as ex:  # a tile that does not compile is reported, not fatal
                        cand["error"] = repr(ex)[:300]
                    restore()
                    row["candidates"].append(cand)
                print(json.dumps(row), flush=True)
                rows.append(row)
                del layer, saved
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=triton.__version__,
                           commit=os.environ.get("REPLAYSSM_COMMIT", ""), command=" ".join(sys.argv), rows=rows),
                      f, indent=1)


if __name__ == "__main__":
    main()
