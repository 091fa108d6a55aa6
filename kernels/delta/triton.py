"""Gated DeltaNet / KDA replay step in Triton: decode (T = 1) and verify (T tokens) in one launch.

One program per (V-tile, value head, row): reads the checkpoint tile (flush rows) or read copy
tile (other rows) ``S0 [K, BV]`` once, evaluates the window with the UT transform (every
window key against S0 in one small matmul, the unit-lower-triangular inverse by repeated
squaring), writes the outputs, appends the tokens' raw inputs to the ring and, on flush rows,
writes the folded checkpoint and its read copy. Cursors are only read.
Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, load_read_copy, round_checkpoint,
                                              store_read_copy)


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
def _delta_step_row(
    ckpt, c_s, c_h, c_k, c_v,                  # [S, HV, K, V] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, HV, V, ...]
    ring_k, ring_v, ring_g, ring_beta,         # contiguous [S, HK, C, K], [S, HV, C, V], [S, HV, C(, K)], [S, HV, C]
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    pid_v, h, i, slot,
    q, q_r, q_t, q_h,                          # [n, T, HK, K]
    k, k_r, k_t, k_h,                          # [n, T, HK, K]
    v, v_r, v_t, v_h,                          # [n, T, HV, V]
    g, g_r, g_t, g_h,                          # [n, T, HV] or [n, T, HV, K]
    beta, be_r, be_t,                          # [n, T, HV]
    out, o_r, o_t, o_h,                        # [n, T, HV, V]
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, LOG2_BM: tl.constexpr, COMMITTED: tl.constexpr,
    PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, DOT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr,
):
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    ok = tl.arange(0, K)
    e = tl.arange(0, BM)
    hk = h // (HV // HK)
    count = tl.load(count_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    is_flush = count + T >= window
    hist = e < count
    new = (e >= count) & (e < count + T)
    valid = e < count + T
    tok = e - count
    pos = (origin + e) % capacity

    # window: committed ring entries, this step's tokens, neutral padding (g = beta = 0)
    rk = ring_k + ((slot * HK + hk) * capacity) * K
    rv = ring_v + ((slot * HV + h) * capacity) * V
    rbeta = ring_beta + (slot * HV + h) * capacity
    k_w = (tl.load(rk + pos[:, None] * K + ok[None, :], mask=hist[:, None], other=0.0)
           + tl.load(k + i * k_r + tok[:, None] * k_t + hk * k_h + ok[None, :], mask=new[:, None], other=0.0))
    v_w = (tl.load(rv + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :], other=0.0)
           + tl.load(v + i * v_r + tok[:, None] * v_t + h * v_h + ov[None, :],
                     mask=new[:, None] & vmask[None, :], other=0.0))
    beta_w = (tl.load(rbeta + pos, mask=hist, other=0.0)
              + tl.load(beta + i * be_r + tok * be_t + h, mask=new, other=0.0).to(tl.float32))
    q_w = tl.load(q + i * q_r + tok[:, None] * q_t + hk * q_h + ok[None, :], mask=new[:, None],
                  other=0.0).to(tl.float32)
    kf = k_w.to(tl.float32)
    if PER_CHANNEL:
        rg = ring_g + ((slot * HV + h) * capacity) * K
        g_w = (tl.load(rg + pos[:, None] * K + ok[None, :], mask=hist[:, None], other=0.0)
               + tl.load(g + i * g_r + tok[:, None] * g_t + h * g_h + ok[None, :], mask=new[:, None],
                         other=0.0).to(tl.float32))                            # [BM, K]
        gam = tl.cumsum(g_w, axis=0)
        # exp(gam_j - gam_r) = exp(gam_j - ref) exp(ref - gam_r), ref = per-channel midpoint
        ref = 0.5 * (tl.max(gam, axis=0) + tl.min(gam, axis=0))
        k_up = kf * tl.exp(gam - ref[None, :])
        k_dn = kf * tl.exp(ref[None, :] - gam)
        q_up = q_w * tl.exp(gam - ref[None, :])
        KK = tl.dot(k_up, tl.trans(k_dn), input_precision=DOT)                # [BM, BM] decayed k_j . k_r
        QK = tl.dot(q_up, tl.trans(k_dn), input_precision=DOT)
        kt = kf * tl.exp(gam)
        qt = q_w * tl.exp(gam)
        strict = (e[None, :] < e[:, None]) & valid[:, None]
        incl = e[None, :] <= e[:, None]
        A = tl.where(strict, beta_w[:, None] * KK, 0.0)
        W = tl.where(incl, QK, 0.0)
    else:
        rg = ring_g + (slot * HV + h) * capacity
        g_w = (tl.load(rg + pos, mask=hist, other=0.0)
               + tl.load(g + i * g_r + tok * g_t + h, mask=new, other=0.0).to(tl.float32))   # [BM]
        gam = tl.cumsum(g_w, axis=0)
        KK = tl.dot(kf, tl.trans(kf), input_precision=DOT)
        QK = tl.dot(q_w, tl.trans(kf), input_precision=DOT)
        diff = gam[:, None] - gam[None, :]
        strict = (e[None, :] < e[:, None]) & valid[:, None]
        incl = e[None, :] <= e[:, None]
        A = beta_w[:, None] * KK * tl.exp(tl.where(strict, diff, float("-inf")))
        W = QK * tl.exp(tl.where(incl, diff, float("-inf")))
        kt = kf * tl.exp(gam)[:, None]
        qt = q_w * tl.exp(gam)[:, None]

    # the state this step reads: the checkpoint on flush rows, else the read copy
    ck = ckpt + slot * c_s + h * c_h + ok[:, None] * c_k + ov[None, :] * c_v
    if READ_FMT == READ_CHECKPOINT:
        S0 = tl.load(ck, mask=vmask[None, :], other=0.0).to(tl.float32)
    elif is_flush:
        S0 = tl.load(ck, mask=vmask[None, :], other=0.0).to(tl.float32)
    else:
        head = (slot * HV + h) * V
        S0 = tl.trans(load_read_copy(rc_codes + head * RC_CW, rc_bs + head * (K // 16), rc_rs + head, ov,
                                     vmask, READ_FMT, BV, K, RC_CW))                    # [K, BV]

    # UT transform: (I + A) D = beta (v - S0^T k~);  o = scale (S0^T q~ + W D)
    U = tl.dot(kt, S0, input_precision=DOT)                                     # [BM, BV]
    R = beta_w[:, None] * (v_w.to(tl.float32) - U)
    Dm = tl.dot(_inv_unit_lower(A, e, BM, LOG2_BM, DOT), R, input_precision=DOT)
    O = scale * (tl.dot(qt, S0, input_precision=DOT) + tl.dot(W, Dm, input_precision=DOT))
    tl.store(out + i * o_r + tok[:, None] * o_t + h * o_h + ov[None, :], O.to(out.dtype.element_ty),
             mask=new[:, None] & vmask[None, :])

    # flush: S = Diag(exp(gam_e)) S0 + sum_{r<=e} (exp(gam_e - gam_r) k_r) d_r^T
    if is_flush:
        if COMMITTED:
            last = count + T - 1
        else:
            last = count - 1
        if PER_CHANNEL:
            gam_e = tl.sum(tl.where((e == last)[:, None], gam, 0.0), axis=0)               # [K]
            kfold = tl.where((e <= last)[:, None], kf * tl.exp(tl.minimum(gam_e[None, :] - gam, 0.0)), 0.0)
            S_new = tl.exp(gam_e)[:, None] * S0 + tl.dot(tl.trans(kfold), Dm, input_precision=DOT)
        else:
            gam_e = tl.sum(tl.where(e == last, gam, 0.0), axis=0)
            kfold = tl.where((e <= last)[:, None], kf * tl.exp(tl.minimum(gam_e - gam, 0.0))[:, None], 0.0)
            S_new = tl.exp(gam_e) * S0 + tl.dot(tl.trans(kfold), Dm, input_precision=DOT)
        ep = tl.load(epoch_ptr + slot)
        index = h * (K * V) + ok[:, None] * V + ov[None, :]
        stored = round_checkpoint(S_new, index, sr_base, ep, CKPT_FMT)
        tl.store(ck, stored, mask=vmask[None, :])
        if READ_FMT != READ_CHECKPOINT:
            head = (slot * HV + h) * V
            store_read_copy(rc_codes + head * RC_CW, rc_bs + head * (K // 16), rc_rs + head,
                            tl.trans(stored.to(tl.float32)), ov, vmask, READ_FMT, RC_EMAX, BV, K, RC_CW)

    # append the tokens' raw inputs at ring entries (origin + count + t) % C
    tl.store(rv + pos[:, None] * V + ov[None, :], v_w, mask=new[:, None] & vmask[None, :])
    if pid_v == 0:
        tl.store(rbeta + pos, beta_w, mask=new)
        if PER_CHANNEL:
            tl.store(rg + pos[:, None] * K + ok[None, :], g_w, mask=new[:, None])
        else:
            tl.store(rg + pos, g_w, mask=new)
        if h % (HV // HK) == 0:
            tl.store(rk + pos[:, None] * K + ok[None, :], k_w, mask=new[:, None])


@triton.jit
def _delta_step_fwd_kernel(
    ckpt, c_s, c_h, c_k, c_v,
    rc_codes, rc_bs, rc_rs,
    ring_k, ring_v, ring_g, ring_beta,
    count_ptr, origin_ptr, epoch_ptr,
    slots,                                     # [n] int64, -1 = padded row
    q, q_r, q_t, q_h,
    k, k_r, k_t, k_h,
    v, v_r, v_t, v_h,
    g, g_r, g_t, g_h,
    beta, be_r, be_t,
    out, o_r, o_t, o_h,
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, LOG2_BM: tl.constexpr, COMMITTED: tl.constexpr,
    PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, DOT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr,
):
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i)
    if slot < 0:
        ov = pid_v * BV + tl.arange(0, BV)
        for t in tl.static_range(T):
            tl.store(out + i * o_r + t * o_t + h * o_h + ov, tl.zeros([BV], tl.float32), mask=ov < V)
    else:
        _delta_step_row(
            ckpt, c_s, c_h, c_k, c_v, rc_codes, rc_bs, rc_rs, ring_k, ring_v, ring_g, ring_beta,
            count_ptr, origin_ptr, epoch_ptr, pid_v, h, i, slot,
            q, q_r, q_t, q_h, k, k_r, k_t, k_h, v, v_r, v_t, v_h, g, g_r, g_t, g_h, beta, be_r, be_t,
            out, o_r, o_t, o_h, scale, window, capacity, sr_base,
            T, HK, HV, K, V, BV, BM, LOG2_BM, COMMITTED, PER_CHANNEL, CKPT_FMT, READ_FMT, DOT,
            RC_CW, RC_EMAX)
