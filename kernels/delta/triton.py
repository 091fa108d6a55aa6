"""Gated DeltaNet / KDA replay step in Triton: decode (T = 1) and verify (T tokens) in one launch.

One program per (row, value head). The key side of the window (decays, A, the unit-lower-
triangular inverse by repeated squaring, the query-key weights) is computed once; then the
program walks V in tiles: reads the checkpoint tile (flush rows) or read-copy tile (other rows)
``S0 [K, BV]``, applies the UT transform (every window key against S0 in one small matmul),
writes the outputs and appends v to the ring. Launched twice per step (``FLUSH_PASS`` False /
True), each pass handling only its rows; the flush pass also folds and stores the checkpoint
and its read copy. Cursors are only read.
Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, load_read_copy, round_checkpoint,
                                              store_read_copy_chunk)


@triton.jit
def _inv_unit_lower(A, e, BM: tl.constexpr, LOG2_BM: tl.constexpr, DOT: tl.constexpr):
    """(I + A)^-1 for strictly lower A [BM, BM]: (I - A)(I + A^2)(I + A^4)... (A is nilpotent)."""
    eye = (e[:, None] == e[None, :]).to(tl.float32)
    inv = eye - A
    P = A
    for _ in tl.static_range(LOG2_BM - 1):
        P = tl.dot(P, P, input_precision=DOT)
        inv = tl.dot(inv, eye + P, input_precision=DOT)
    return inv


@triton.jit
def _key_chunk(rk, k, i, k_r, k_t, k_h, hk, rg, g, g_r, g_t, g_h, h, pos, tok, hist, new, c0,
               K: tl.constexpr, BK: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Window keys and (KDA) gates of key channels ``c0 .. c0 + BK``: ``(k [BM, BK] fp32, g [BM, BK])``."""
    oc = c0 + tl.arange(0, BK)
    kc = (tl.load(rk + pos[:, None] * K + oc[None, :], mask=hist[:, None], other=0.0)
          + tl.load(k + i * k_r + tok[:, None] * k_t + hk * k_h + oc[None, :], mask=new[:, None], other=0.0))
    if PER_CHANNEL:
        gc = (tl.load(rg + pos[:, None] * K + oc[None, :], mask=hist[:, None], other=0.0)
              + tl.load(g + i * g_r + tok[:, None] * g_t + h * g_h + oc[None, :], mask=new[:, None],
                        other=0.0).to(tl.float32))
    else:
        gc = tl.zeros([1, BK], tl.float32)
    return kc, gc


@triton.jit
def _delta_step_fwd_kernel(
    ckpt, c_s, c_h, c_k, c_v,                  # [S, HV, K, V] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, HV, V, ...]
    ring_k, ring_v, ring_g, ring_beta,         # contiguous [S, HK, C, K], [S, HV, C, V], [S, HV, C(, K)], [S, HV, C]
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
    BV: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, LOG2_BM: tl.constexpr, COMMITTED: tl.constexpr,
    FLUSH_PASS: tl.constexpr, PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    DOT: tl.constexpr, RC_CW: tl.constexpr, RC_EMAX: tl.constexpr, STAGES: tl.constexpr,
):
    i, h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + i)
    valid = slot >= 0
    sl = tl.maximum(slot, 0)
    count = tl.load(count_ptr + sl)
    is_flush = count + T >= window
    if not valid:
        if not FLUSH_PASS:
            for v0 in tl.range(0, V, BV):
                ov = v0 + tl.arange(0, BV)
                for t in tl.static_range(T):
                    tl.store(out + i * o_r + t * o_t + h * o_h + ov, tl.zeros([BV], tl.float32), mask=ov < V)
    elif is_flush == FLUSH_PASS:
        origin = tl.load(origin_ptr + sl)
        e = tl.arange(0, BM)
        hk = h // (HV // HK)
        hist = e < count
        new = (e >= count) & (e < count + T)
        valid_e = e < count + T
        tok = e - count
        pos = (origin + e) % capacity
        strict = (e[None, :] < e[:, None]) & valid_e[:, None]
        incl = e[None, :] <= e[:, None]
        rk = ring_k + ((sl * HK + hk) * capacity) * K
        rv = ring_v + ((sl * HV + h) * capacity) * V
        rbeta = ring_beta + (sl * HV + h) * capacity
        if PER_CHANNEL:
            rg = ring_g + ((sl * HV + h) * capacity) * K
        else:
            rg = ring_g + (sl * HV + h) * capacity
        beta_w = (tl.load(rbeta + pos, mask=hist, other=0.0)
                  + tl.load(beta + i * be_r + tok * be_t + h, mask=new, other=0.0).to(tl.float32))
        if FLUSH_PASS:
            last = count + T - 1 if COMMITTED else count - 1
            ep = tl.load(epoch_ptr + sl)
        if not PER_CHANNEL:
            g_w = (tl.load(rg + pos, mask=hist, other=0.0)
                   + tl.load(g + i * g_r + tok * g_t + h, mask=new, other=0.0).to(tl.float32))
            gam = tl.cumsum(g_w, axis=0)                                                      # [BM]
            if FLUSH_PASS:
                gam_e = tl.sum(tl.where(e == last, gam, 0.0), axis=0)

        # key side, over key-channel chunks: A (decayed k.k), W (decayed q.k)
        KK = tl.zeros([BM, BM], tl.float32)
        QK = tl.zeros([BM, BM], tl.float32)
        for c0 in tl.range(0, K, BK):
            kc, gc = _key_chunk(rk, k, i, k_r, k_t, k_h, hk, rg, g, g_r, g_t, g_h, h, pos, tok, hist, new, c0,
                                K, BK, PER_CHANNEL)
            kf = kc.to(tl.float32)
            qc = tl.load(q + i * q_r + tok[:, None] * q_t + hk * q_h + (c0 + tl.arange(0, BK))[None, :],
                         mask=new[:, None], other=0.0).to(tl.float32)
            if PER_CHANNEL:
                # exp(gam_j - gam_r) = exp(gam_j - ref) exp(ref - gam_r), ref = per-channel midpoint
                gm = tl.cumsum(gc, axis=0)
                ref = 0.5 * (tl.max(gm, axis=0) + tl.min(gm, axis=0))
                k_dn = kf * tl.exp(ref[None, :] - gm)
                KK += tl.dot(kf * tl.exp(gm - ref[None, :]), tl.trans(k_dn), input_precision=DOT)
                QK += tl.dot(qc * tl.exp(gm - ref[None, :]), tl.trans(k_dn), input_precision=DOT)
            else:
                KK += tl.dot(kf, tl.trans(kf), input_precision=DOT)
                QK += tl.dot(qc, tl.trans(kf), input_precision=DOT)
        if PER_CHANNEL:
            A = tl.where(strict, beta_w[:, None] * KK, 0.0)
            W = tl.where(incl, QK, 0.0)
        else:
            diff = gam[:, None] - gam[None, :]
            A = beta_w[:, None] * KK * tl.exp(tl.where(strict, diff, float("-inf")))
            W = QK * tl.exp(tl.where(incl, diff, float("-inf")))
        Minv = _inv_unit_lower(A, e, BM, LOG2_BM, DOT)
        head = (sl * HV + h) * V

        # value side, tile by tile
        for v0 in tl.range(0, V, BV):
            ov = v0 + tl.arange(0, BV)
            vmask = ov < V
            # U = S0^T k~ and O1 = S0^T q~ for every window entry, over key-channel chunks
            U = tl.zeros([BM, BV], tl.float32)
            O1 = tl.zeros([BM, BV], tl.float32)
            for c0 in tl.range(0, K, BK, num_stages=STAGES):
                oc = c0 + tl.arange(0, BK)
                if FLUSH_PASS or READ_FMT == READ_CHECKPOINT:
                    S0 = tl.load(ckpt + sl * c_s + h * c_h + oc[:, None] * c_k + ov[None, :] * c_v,
                                 mask=vmask[None, :], other=0.0).to(tl.float32)                 # [BK, BV]
                else:
                    S0 = tl.trans(load_read_copy(rc_codes + head * RC_CW + c0 // (K // RC_CW),
                                                 rc_bs + head * (K // 16) + c0 // 16, rc_rs + head, ov, vmask,
                                                 READ_FMT, BV, BK, RC_CW, K // 16))
                kc, gc = _key_chunk(rk, k, i, k_r, k_t, k_h, hk, rg, g, g_r, g_t, g_h, h, pos, tok, hist, new,
                                    c0, K, BK, PER_CHANNEL)
                qc = tl.load(q + i * q_r + tok[:, None] * q_t + hk * q_h + oc[None, :], mask=new[:, None],
                             other=0.0).to(tl.float32)
                if PER_CHANNEL:
                    dec = tl.exp(tl.cumsum(gc, axis=0))
                else:
                    dec = tl.exp(gam)[:, None]
                U += tl.dot(kc.to(tl.float32) * dec, S0, input_precision=DOT)
                O1 += tl.dot(qc * dec, S0, input_precision=DOT)
            v_w = (tl.load(rv + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :], other=0.0)
                   + tl.load(v + i * v_r + tok[:, None] * v_t + h * v_h + ov[None, :],
                             mask=new[:, None] & vmask[None, :], other=0.0))
            Dm = tl.dot(Minv, beta_w[:, None] * (v_w.to(tl.float32) - U), input_precision=DOT)   # [BM, BV]
            O = scale * (O1 + tl.dot(W, Dm, input_precision=DOT))
            tl.store(out + i * o_r + tok[:, None] * o_t + h * o_h + ov[None, :], O.to(out.dtype.element_ty),
                     mask=new[:, None] & vmask[None, :])
            tl.store(rv + pos[:, None] * V + ov[None, :], v_w, mask=new[:, None] & vmask[None, :])
            if FLUSH_PASS:
                # S = Diag(exp(gam_e)) S0 + sum_{r<=e} (exp(gam_e - gam_r) k_r) d_r^T, chunk by chunk;
                # the row amax for the read copy accumulates on the way
                amax = tl.zeros([BV], tl.float32)
                for c0 in tl.range(0, K, BK):
                    oc = c0 + tl.arange(0, BK)
                    ck = ckpt + sl * c_s + h * c_h + oc[:, None] * c_k + ov[None, :] * c_v
                    S0 = tl.load(ck, mask=vmask[None, :], other=0.0).to(tl.float32)
                    kc, gc = _key_chunk(rk, k, i, k_r, k_t, k_h, hk, rg, g, g_r, g_t, g_h, h, pos, tok, hist, new,
                                        c0, K, BK, PER_CHANNEL)
                    if PER_CHANNEL:
                        gm = tl.cumsum(gc, axis=0)
                        ge = tl.sum(tl.where((e == last)[:, None], gm, 0.0), axis=0)               # [BK]
                        kfold = tl.where((e <= last)[:, None],
                                         kc.to(tl.float32) * tl.exp(tl.minimum(ge[None, :] - gm, 0.0)), 0.0)
                        S_new = tl.exp(ge)[:, None] * S0 + tl.dot(tl.trans(kfold), Dm, input_precision=DOT)
                    else:
                        kfold = tl.where((e <= last)[:, None],
                                         kc.to(tl.float32) * tl.exp(tl.minimum(gam_e - gam, 0.0))[:, None], 0.0)
                        S_new = tl.exp(gam_e) * S0 + tl.dot(tl.trans(kfold), Dm, input_precision=DOT)
                    index = h * (K * V) + oc[:, None] * V + ov[None, :]
                    stored = round_checkpoint(S_new, index, sr_base, ep, CKPT_FMT)
                    tl.store(ck, stored, mask=vmask[None, :])
                    amax = tl.maximum(amax, tl.max(tl.abs(stored.to(tl.float32)), axis=0))
                if READ_FMT != READ_CHECKPOINT:
                    tl.debug_barrier()
                    for c0 in tl.range(0, K, BK):
                        oc = c0 + tl.arange(0, BK)
                        St = tl.load(ckpt + sl * c_s + h * c_h + oc[:, None] * c_k + ov[None, :] * c_v,
                                     mask=vmask[None, :], other=0.0).to(tl.float32)
                        store_read_copy_chunk(rc_codes + head * RC_CW + c0 // (K // RC_CW),
                                              rc_bs + head * (K // 16) + c0 // 16, rc_rs + head, tl.trans(St), amax,
                                              ov, vmask, c0 == 0, READ_FMT, RC_EMAX, BV, BK, RC_CW, K // 16)

        # append the tokens' key-side raw inputs
        tl.store(rbeta + pos, beta_w, mask=new)
        for c0 in tl.range(0, K, BK):
            oc = c0 + tl.arange(0, BK)
            kc, gc = _key_chunk(rk, k, i, k_r, k_t, k_h, hk, rg, g, g_r, g_t, g_h, h, pos, tok, hist, new, c0,
                                K, BK, PER_CHANNEL)
            if PER_CHANNEL:
                tl.store(rg + pos[:, None] * K + oc[None, :], gc, mask=new[:, None])
            if h % (HV // HK) == 0:
                tl.store(rk + pos[:, None] * K + oc[None, :], kc, mask=new[:, None])
        if not PER_CHANNEL:
            tl.store(rg + pos, g_w, mask=new)
