"""Gated DeltaNet / KDA replay step in Triton: decode (T = 1) and verify (T tokens).

One program per (V-tile, value head, row) holding ``S [K, BV]`` in registers.
- Non-flush rows read the read copy (or checkpoint) and evaluate each token in output-only form:
  ``u_t = S0ᵀ(e^{Γ_t} ⊙ k_t) + Σ_{j<t} c_tj d_j``, ``d_t = β_t (v_t - u_t)``,
  ``o_t = scale [S0ᵀ(e^{Γ_t} ⊙ q_t) + Σ_{j<=t} ĉ_tj d_j]`` with the d of earlier entries taken from
  the ring's d cache. The new d is cached for later steps' outputs; the state is not written.
  Their state load is issued together with the cursor loads.
- Flush rows replay the committed window step by step from the exact checkpoint using the raw
  inputs (k, v, g, beta; loads pipelined across entries), store the folded checkpoint and its
  read copy, then evaluate this step's tokens from it. The cached d never reaches the checkpoint.
Launched twice per step (``FLUSH_PASS`` False / True), each pass handling only its rows.
Cursors are only read. Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, load_read_copy, round_checkpoint,
                                              store_read_copy)
from replayssm.kernels.ring.triton import row_route, zero_rows


@triton.jit
def _delta_step_fwd_kernel(
    ckpt, c_s, c_h, c_k, c_v,                  # [S, HV, K, V] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, HV, V, ...]
    ring_k, ring_v, ring_g, ring_beta, ring_d,  # contiguous [S, HK, C, K], [S, HV, C, V], [S, HV, C(, K)],
                                               # [S, HV, C], [S, HV, C, V] (fp32 d cache)
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    slots,                                     # [n] int64, -1 = padded row
    q, q_r, q_t, q_h,                          # [n, T, HK, K]
    k, k_r, k_t, k_h,                          # [n, T, HK, K]
    v, v_r, v_t, v_h,                          # [n, T, HV, V]
    g, g_r, g_t, g_h,                          # [n, T, HV] or [n, T, HV, K]
    beta, be_r, be_t,                          # [n, T, HV]
    out, o_r, o_t, o_h,                        # [n, T, HV, V]
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr, FLUSH_PASS: tl.constexpr,
    PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr, STAGES: tl.constexpr,
):
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    valid, sl, count, is_flush = row_route(slots, i, count_ptr, T, window)
    origin = tl.load(origin_ptr + sl)
    ok = tl.arange(0, K)
    ck = ckpt + sl * c_s + h * c_h + ok[:, None] * c_k + ov[None, :] * c_v
    head = (sl * HV + h) * V
    if not FLUSH_PASS:
        # issued with the cursor loads, before the row is routed (a flush row's tile goes unused)
        if READ_FMT == READ_CHECKPOINT:
            S0 = tl.load(ck, mask=vmask[None, :], other=0.0).to(tl.float32)                   # [K, BV]
        else:
            S0 = tl.trans(load_read_copy(rc_codes + head * RC_CW, rc_bs + head * (K // 16), rc_rs + head,
                                         ov, vmask, READ_FMT, BV, K, RC_CW, K // 16))
    if not valid:
        if not FLUSH_PASS:
            zero_rows(out, i, o_r, o_t, o_h, h, ov, vmask, T, BV)
    elif is_flush == FLUSH_PASS:
        e = tl.arange(0, BM)
        hk = h // (HV // HK)
        rk = ring_k + ((sl * HK + hk) * capacity) * K
        rv = ring_v + ((sl * HV + h) * capacity) * V
        rd = ring_d + ((sl * HV + h) * capacity) * V
        rbeta = ring_beta + (sl * HV + h) * capacity
        if PER_CHANNEL:
            rg = ring_g + ((sl * HV + h) * capacity) * K
        else:
            rg = ring_g + (sl * HV + h) * capacity

        if FLUSH_PASS:
            # exact fold: replay the committed entries step by step on the fp32 checkpoint tile; each
            # entry's raw inputs come from the ring (j < count) or this step's tokens, loaded branch-free
            # so that the next entries' loads are in flight during this entry's update
            S = tl.load(ck, mask=vmask[None, :], other=0.0).to(tl.float32)                       # [K, BV]
            n_fold = count + T if COMMITTED else count
            dj = tl.zeros([BV], dtype=tl.float32)
            for j in tl.range(0, n_fold, num_stages=STAGES):
                p = (origin + j) % capacity
                rj = j < count
                t = tl.maximum(j - count, 0)
                kj = (tl.load(rk + p * K + ok, mask=(ok < K) & rj, other=0.0).to(tl.float32)
                      + tl.load(k + i * k_r + t * k_t + hk * k_h + ok, mask=(ok < K) & ~rj, other=0.0).to(tl.float32))
                vj = (tl.load(rv + p * V + ov, mask=vmask & rj, other=0.0).to(tl.float32)
                      + tl.load(v + i * v_r + t * v_t + h * v_h + ov, mask=vmask & ~rj, other=0.0).to(tl.float32))
                bj = (tl.load(rbeta + p, mask=rj, other=0.0)
                      + tl.load(beta + i * be_r + t * be_t + h, mask=~rj, other=0.0).to(tl.float32))
                if PER_CHANNEL:
                    gj = (tl.load(rg + p * K + ok, mask=(ok < K) & rj, other=0.0)
                          + tl.load(g + i * g_r + t * g_t + h * g_h + ok, mask=(ok < K) & ~rj, other=0.0).to(tl.float32))
                    S = S * tl.exp(gj)[:, None]
                else:
                    gj = (tl.load(rg + p, mask=rj, other=0.0)
                          + tl.load(g + i * g_r + t * g_t + h, mask=~rj, other=0.0).to(tl.float32))
                    S = S * tl.exp(gj)
                dj = bj * (vj - tl.sum(S * kj[:, None], axis=0))
                S += kj[:, None] * dj[None, :]
            if COMMITTED:
                qj = tl.load(q + i * q_r + hk * q_h + ok).to(tl.float32)
                o = scale * tl.sum(S * qj[:, None], axis=0)
                tl.store(out + i * o_r + h * o_h + ov, o.to(out.dtype.element_ty), mask=vmask)
                tl.store(rd + ((origin + n_fold - 1) % capacity) * V + ov, dj, mask=vmask)
            ep = tl.load(epoch_ptr + sl)
            index = h * (K * V) + ok[:, None] * V + ov[None, :]
            stored = round_checkpoint(S, index, sr_base, ep, CKPT_FMT)
            tl.store(ck, stored, mask=vmask[None, :])
            if READ_FMT != READ_CHECKPOINT:
                store_read_copy(rc_codes + head * RC_CW, rc_bs + head * (K // 16), rc_rs + head,
                                tl.trans(stored.to(tl.float32)), ov, vmask, READ_FMT, RC_EMAX, BV, K, RC_CW)
        if (not FLUSH_PASS) or (not COMMITTED):
            # output-only evaluation of this step's tokens from S0 (+ the history's cached d)
            if FLUSH_PASS:
                S0 = S                         # the state after the committed history (exact)
                n_hist = 0                     # entries after it are this step's tokens only
                base = count
            else:
                n_hist = count
                base = 0
            # window entries relative to S0: e < n_hist from the ring, then the T tokens
            n_win = n_hist + T
            wmask = e < n_win
            epos = (origin + base + e) % capacity
            from_ring = e < n_hist
            tk = e - n_hist
            k_w = (tl.load(rk + epos[:, None] * K + ok[None, :], mask=from_ring[:, None], other=0.0)
                   + tl.load(k + i * k_r + tk[:, None] * k_t + hk * k_h + ok[None, :],
                             mask=(~from_ring & wmask)[:, None], other=0.0)).to(tl.float32)      # [BM, K]
            d_w = tl.load(rd + epos[:, None] * V + ov[None, :], mask=from_ring[:, None] & vmask[None, :],
                          other=0.0)                                                              # [BM, BV]
            if PER_CHANNEL:
                g_w = (tl.load(rg + epos[:, None] * K + ok[None, :], mask=from_ring[:, None], other=0.0)
                       + tl.load(g + i * g_r + tk[:, None] * g_t + h * g_h + ok[None, :],
                                 mask=(~from_ring & wmask)[:, None], other=0.0).to(tl.float32))
            else:
                g_w = (tl.load(rg + epos, mask=from_ring, other=0.0)
                       + tl.load(g + i * g_r + tk * g_t + h, mask=~from_ring & wmask, other=0.0).to(tl.float32))
            gam = tl.cumsum(g_w, axis=0)
            for t in tl.static_range(T):
                jt = n_hist + t
                kt = tl.load(k + i * k_r + t * k_t + hk * k_h + ok).to(tl.float32)
                qt = tl.load(q + i * q_r + t * q_t + hk * q_h + ok).to(tl.float32)
                vt = tl.load(v + i * v_r + t * v_t + h * v_h + ov, mask=vmask, other=0.0).to(tl.float32)
                bt = tl.load(beta + i * be_r + t * be_t + h).to(tl.float32)
                before = e < jt
                if PER_CHANNEL:
                    gt = tl.sum(tl.where((e == jt)[:, None], gam, 0.0), axis=0)                       # [K]
                    dec = tl.where(before[:, None] | (e == jt)[:, None],
                                   tl.exp(tl.minimum(gt[None, :] - gam, 0.0)), 0.0) * k_w            # [BM, K]
                    ck_ = tl.sum(dec * kt[None, :], axis=1)
                    cq = tl.sum(dec * qt[None, :], axis=1)
                    top = tl.exp(gt)
                    u = tl.sum(S0 * (top * kt)[:, None], axis=0)
                    r = tl.sum(S0 * (top * qt)[:, None], axis=0)
                else:
                    gt = tl.sum(tl.where(e == jt, gam, 0.0), axis=0)
                    dec = tl.where(e <= jt, tl.exp(tl.minimum(gt - gam, 0.0)), 0.0)                  # [BM]
                    ck_ = dec * tl.sum(k_w * kt[None, :], axis=1)
                    cq = dec * tl.sum(k_w * qt[None, :], axis=1)
                    top = tl.exp(gt)
                    u = top * tl.sum(S0 * kt[:, None], axis=0)
                    r = top * tl.sum(S0 * qt[:, None], axis=0)
                u += tl.sum(tl.where(before, ck_, 0.0)[:, None] * d_w, axis=0)
                dt_ = bt * (vt - u)
                d_w = tl.where((e == jt)[:, None], dt_[None, :], d_w)
                o = scale * (r + tl.sum(cq[:, None] * d_w, axis=0))
                tl.store(out + i * o_r + t * o_t + h * o_h + ov, o.to(out.dtype.element_ty), mask=vmask)
                tl.store(rd + ((origin + base + jt) % capacity) * V + ov, dt_, mask=vmask)

        # append this step's raw inputs at ring entries (origin + count + t) % C
        for t in tl.static_range(T):
            p = (origin + count + t) % capacity
            tl.store(rv + p * V + ov, tl.load(v + i * v_r + t * v_t + h * v_h + ov, mask=vmask, other=0.0),
                     mask=vmask)
            if pid_v == 0:
                tl.store(rbeta + p, tl.load(beta + i * be_r + t * be_t + h).to(tl.float32))
                if PER_CHANNEL:
                    tl.store(rg + p * K + ok, tl.load(g + i * g_r + t * g_t + h * g_h + ok).to(tl.float32))
                else:
                    tl.store(rg + p, tl.load(g + i * g_r + t * g_t + h).to(tl.float32))
                if h % (HV // HK) == 0:
                    tl.store(rk + p * K + ok, tl.load(k + i * k_r + t * k_t + hk * k_h + ok))


@triton.jit
def _delta_decode_kernel(
    ckpt, c_s, c_h, c_k, c_v,
    rc_codes, rc_bs, rc_rs,
    ring_k, ring_v, ring_g, ring_beta, ring_d,
    count_ptr, origin_ptr, epoch_ptr,
    slots,
    q, q_r, q_t, q_h,
    k, k_r, k_t, k_h,
    v, v_r, v_t, v_h,
    g, g_r, g_t, g_h,
    beta, be_r, be_t,
    out, o_r, o_t, o_h,
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr, FLUSH_PASS: tl.constexpr,
    PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr, NC: tl.constexpr, STAGES: tl.constexpr,
):
    """Non-flush decode rows (T = 1), arguments as ``_delta_step_fwd_kernel``: the state (or read
    copy) is streamed in ``NC``-key-channel chunks through a ``STAGES``-deep pipeline together with
    the same channels of q, k and the ring's keys (and KDA gates); flush rows are left to the
    flush pass. Output-only form as there, with the window entries e < count from the ring.
    Branch-free: every row loads and computes (a padded row reads slot 0), stores are masked, so
    the cursor, state and ring loads are all in flight after the slot index arrives."""
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    valid, sl, count, is_flush = row_route(slots, i, count_ptr, 1, window)
    origin = tl.load(origin_ptr + sl)
    active = valid & ~is_flush                             # rows this pass owns; flush rows: flush pass
    e = tl.arange(0, BM)
    hist = e < count
    pos = (origin + e) % capacity
    tok = (origin + count) % capacity                      # ring entry this token is appended at
    hk = h // (HV // HK)
    head = (sl * HV + h) * V
    rk = ring_k + ((sl * HK + hk) * capacity) * K
    rv = ring_v + ((sl * HV + h) * capacity) * V
    rd = ring_d + ((sl * HV + h) * capacity) * V
    rbeta = ring_beta + (sl * HV + h) * capacity
    append_k = active & (pid_v == 0) & (h % (HV // HK) == 0)
    if PER_CHANNEL:
        rg = ring_g + ((sl * HV + h) * capacity) * K
    else:
        rg = ring_g + (sl * HV + h) * capacity
        g_tok = tl.load(g + i * g_r + h).to(tl.float32)
        gam = tl.cumsum(tl.where(hist, tl.load(rg + pos, mask=hist, other=0.0),
                                 tl.where(e == count, g_tok, 0.0)), axis=0)                    # [BM]
    # the history's cached d and this token's v, beta: issued before the state stream
    d_h = tl.load(rd + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :], other=0.0)  # [BM, BV]
    v_raw = tl.load(v + i * v_r + h * v_h + ov, mask=vmask, other=0.0)
    bt = tl.load(beta + i * be_r + h).to(tl.float32)
    u = tl.zeros([BV], dtype=tl.float32)                   # S0ᵀ(e^Γ ⊙ k)
    r = tl.zeros([BV], dtype=tl.float32)                   # S0ᵀ(e^Γ ⊙ q)
    ck_ = tl.zeros([BM], dtype=tl.float32)                 # history coefficients for u
    cq = tl.zeros([BM], dtype=tl.float32)                  # history coefficients for the output
    kq = tl.zeros([1], dtype=tl.float32)                   # this token's own k . q
    for c in tl.range(0, K // NC, num_stages=STAGES):
        okc = c * NC + tl.arange(0, NC)
        if READ_FMT == READ_CHECKPOINT:
            S0 = tl.load(ckpt + sl * c_s + h * c_h + okc[:, None] * c_k + ov[None, :] * c_v,
                         mask=vmask[None, :], other=0.0).to(tl.float32)                      # [NC, BV]
        else:
            S0 = tl.trans(load_read_copy(rc_codes + head * RC_CW + c * (RC_CW // (K // NC)),
                                         rc_bs + head * (K // 16) + c * (NC // 16), rc_rs + head, ov, vmask,
                                         READ_FMT, BV, NC, RC_CW, K // 16))
        k_raw = tl.load(k + i * k_r + hk * k_h + okc)
        kt = k_raw.to(tl.float32)
        qt = tl.load(q + i * q_r + hk * q_h + okc).to(tl.float32)
        kh = tl.load(rk + pos[:, None] * K + okc[None, :], mask=hist[:, None], other=0.0).to(tl.float32)  # [BM, NC]
        if PER_CHANNEL:
            g_c = tl.load(g + i * g_r + h * g_h + okc).to(tl.float32)
            gam_c = tl.cumsum(tl.where(hist[:, None], tl.load(rg + pos[:, None] * K + okc[None, :],
                                                              mask=hist[:, None], other=0.0),
                                       tl.where((e == count)[:, None], g_c[None, :], 0.0)), axis=0)
            gt = tl.sum(tl.where((e == count)[:, None], gam_c, 0.0), axis=0)                  # [NC]
            dec = tl.where(hist[:, None], tl.exp(tl.minimum(gt[None, :] - gam_c, 0.0)), 0.0) * kh
            ck_ += tl.sum(dec * kt[None, :], axis=1)
            cq += tl.sum(dec * qt[None, :], axis=1)
            top = tl.exp(gt)
            u += tl.sum(S0 * (top * kt)[:, None], axis=0)
            r += tl.sum(S0 * (top * qt)[:, None], axis=0)
            tl.store(rg + tok * K + okc, g_c, mask=(okc < K) & active & (pid_v == 0))
        else:
            ck_ += tl.sum(kh * kt[None, :], axis=1)
            cq += tl.sum(kh * qt[None, :], axis=1)
            u += tl.sum(S0 * kt[:, None], axis=0)
            r += tl.sum(S0 * qt[:, None], axis=0)
        kq += tl.sum(kt * qt, axis=0)
        tl.store(rk + tok * K + okc, k_raw, mask=(okc < K) & append_k)
    if not PER_CHANNEL:
        gt = tl.sum(tl.where(e == count, gam, 0.0), axis=0)
        dec = tl.where(hist, tl.exp(tl.minimum(gt - gam, 0.0)), 0.0)
        ck_ = ck_ * dec
        cq = cq * dec
        top = tl.exp(gt)
        u = u * top
        r = r * top
    d_t = bt * (v_raw.to(tl.float32) - u - tl.sum(ck_[:, None] * d_h, axis=0))
    o = scale * (r + tl.sum(cq[:, None] * d_h, axis=0) + tl.sum(kq, axis=0) * d_t)
    tl.store(out + i * o_r + h * o_h + ov, tl.where(valid, o, 0.0).to(out.dtype.element_ty),
             mask=vmask & (active | ~valid))
    tl.store(rd + tok * V + ov, d_t, mask=vmask & active)
    tl.store(rv + tok * V + ov, v_raw, mask=vmask & active)
    tl.store(rbeta + tok, bt, mask=active & (pid_v == 0))
    if not PER_CHANNEL:
        tl.store(rg + tok, g_tok, mask=active & (pid_v == 0))
