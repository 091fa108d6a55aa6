"""Mamba-2 replay step in Triton: decode (T = 1) and verify (T tokens).

One program per (row, head). The window quantities (decays, B·C weights) are computed once,
then the program walks the head's P rows in tiles: reads the checkpoint tile (flush rows) or
read-copy tile (other rows), writes the outputs and appends x to the ring. The kernel is
launched twice per step with ``FLUSH_PASS`` = False / True; each pass handles only its rows,
so the non-flush variant carries no fold code. Cursors are only read.
Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, load_read_copy, round_checkpoint,
                                              store_read_copy)


@triton.jit
def _softplus(x):
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _mamba2_step_fwd_kernel(
    ckpt, c_s, c_h, c_p, c_n,                  # [S, H, P, N] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, H, P, ...]
    ring_x, ring_dt, ring_B,                   # contiguous [S, H, C, P], [S, H, C], [S, G, C, N]
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    slots,                                     # [n] int64, -1 = padded row
    x, x_r, x_t, x_h,                          # [n, T, H, P]
    dt, dt_r, dt_t,                            # [n, T, H]
    A, D, dt_bias,                             # [H] fp32
    B, b_r, b_t, b_g,                          # [n, T, G, N]
    C, cc_r, cc_t, cc_g,                       # [n, T, G, N]
    z, z_r, z_t, z_h,                          # [n, T, H, P]
    out, o_r, o_t, o_h,                        # [n, T, H, P]
    window, capacity, sr_base,
    T: tl.constexpr, H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr, FLUSH_PASS: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, DOT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr, STAGES: tl.constexpr,
):
    i, h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + i)
    valid = slot >= 0
    sl = tl.maximum(slot, 0)
    count = tl.load(count_ptr + sl)
    is_flush = count + T >= window
    if not valid:
        if not FLUSH_PASS:
            for p0 in tl.range(0, P, BP):
                op = p0 + tl.arange(0, BP)
                for t in tl.static_range(T):
                    tl.store(out + i * o_r + t * o_t + h * o_h + op, tl.zeros([BP], tl.float32), mask=op < P)
    elif is_flush == FLUSH_PASS:
        origin = tl.load(origin_ptr + sl)
        g = h // (H // G)
        e = tl.arange(0, BM)                                   # window entry
        on = tl.arange(0, N)
        hist = e < count
        new = (e >= count) & (e < count + T)
        tok = e - count                                        # token index of new entries
        pos = (origin + e) % capacity                          # ring entry of window entry e

        # per-head window scalars: dt' = softplus(dt + dt_bias), lam = cumsum(A dt')
        rdt = ring_dt + (sl * H + h) * capacity
        dt_new = tl.load(dt + i * dt_r + tok * dt_t + h, mask=new, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt_new += tl.load(dt_bias + h)
        dt_w = tl.load(rdt + pos, mask=hist, other=0.0) + tl.where(new, dt_new, 0.0)
        dtp = tl.where(hist | new, _softplus(dt_w), 0.0)
        lam = tl.cumsum(tl.load(A + h) * dtp, axis=0)          # [BM]
        rB = ring_B + ((sl * G + g) * capacity) * N
        B_w = (tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None], other=0.0)
               + tl.load(B + i * b_r + tok[:, None] * b_t + g * b_g + on[None, :], mask=new[:, None], other=0.0))
        Bf = B_w.to(tl.float32)                                # [BM, N]
        if T == 1:
            c_vec = tl.load(C + i * cc_r + g * cc_g + on).to(tl.float32)                       # [N]
            lam_j = tl.sum(tl.where(new, lam, 0.0), axis=0)
            # y = exp(lam_j) S0 c + sum_r w_r x_r
            w = tl.where(e <= count, tl.exp(tl.minimum(lam_j - lam, 0.0)) * dtp * tl.sum(Bf * c_vec[None, :], 1), 0.0)
        else:
            C_w = tl.load(C + i * cc_r + tok[:, None] * cc_t + g * cc_g + on[None, :], mask=new[:, None],
                          other=0.0).to(tl.float32)                                          # [BM, N]
            causal = e[None, :] <= e[:, None]
            W = tl.exp(tl.where(causal, lam[:, None] - lam[None, :], float("-inf"))) * dtp[None, :] \
                * tl.dot(C_w, tl.trans(Bf), input_precision=DOT)                               # [BM, BM]
        if FLUSH_PASS:
            # decode folds history and token, verify the history only
            last = count + T - 1 if COMMITTED else count - 1
            lam_e = tl.sum(tl.where(e == last, lam, 0.0), axis=0)
            s = tl.where(e <= last, tl.exp(tl.minimum(lam_e - lam, 0.0)) * dtp, 0.0)
            ep = tl.load(epoch_ptr + sl)
        if HAS_D:
            D_h = tl.load(D + h)
        rx = ring_x + ((sl * H + h) * capacity) * P
        head = (sl * H + h) * P
        for p0 in tl.range(0, P, BP, num_stages=STAGES):
            op = p0 + tl.arange(0, BP)
            pmask = op < P
            ck = ckpt + sl * c_s + h * c_h + op[:, None] * c_p + on[None, :] * c_n
            if FLUSH_PASS or READ_FMT == READ_CHECKPOINT:
                S0 = tl.load(ck, mask=pmask[:, None], other=0.0).to(tl.float32)                # [BP, N]
            else:
                S0 = load_read_copy(rc_codes + head * RC_CW, rc_bs + head * (N // 16), rc_rs + head, op, pmask,
                                    READ_FMT, BP, N, RC_CW, N // 16)
            x_w = (tl.load(rx + pos[:, None] * P + op[None, :], mask=hist[:, None] & pmask[None, :], other=0.0)
                   + tl.load(x + i * x_r + tok[:, None] * x_t + h * x_h + op[None, :],
                             mask=new[:, None] & pmask[None, :], other=0.0))                    # [BM, BP]
            xf = x_w.to(tl.float32)
            if T == 1:
                x_j = tl.sum(tl.where(new[:, None], xf, 0.0), axis=0)
                y = tl.exp(lam_j) * tl.sum(S0 * c_vec[None, :], axis=1) + tl.sum(xf * w[:, None], axis=0)
                if HAS_D:
                    y += D_h * x_j
                if HAS_Z:
                    zz = tl.load(z + i * z_r + h * z_h + op, mask=pmask, other=0.0).to(tl.float32)
                    y = y * zz * tl.sigmoid(zz)
                tl.store(out + i * o_r + h * o_h + op, y.to(out.dtype.element_ty), mask=pmask)
            else:
                Y = tl.exp(lam)[:, None] * tl.dot(C_w, tl.trans(S0), input_precision=DOT) \
                    + tl.dot(W, xf, input_precision=DOT)                                       # [BM, BP]
                if HAS_D:
                    Y += D_h * xf
                if HAS_Z:
                    zz = tl.load(z + i * z_r + tok[:, None] * z_t + h * z_h + op[None, :],
                                 mask=new[:, None] & pmask[None, :], other=0.0).to(tl.float32)
                    Y = Y * zz * tl.sigmoid(zz)
                tl.store(out + i * o_r + tok[:, None] * o_t + h * o_h + op[None, :], Y.to(out.dtype.element_ty),
                         mask=new[:, None] & pmask[None, :])
            if FLUSH_PASS:
                S_new = tl.exp(lam_e) * S0 + tl.dot(tl.trans(xf * s[:, None]), Bf, input_precision=DOT)  # [BP, N]
                index = h * (P * N) + op[:, None] * N + on[None, :]
                stored = round_checkpoint(S_new, index, sr_base, ep, CKPT_FMT)
                tl.store(ck, stored, mask=pmask[:, None])
                if READ_FMT != READ_CHECKPOINT:
                    store_read_copy(rc_codes + head * RC_CW, rc_bs + head * (N // 16), rc_rs + head,
                                    stored.to(tl.float32), op, pmask, READ_FMT, RC_EMAX, BP, N, RC_CW)
            # append x of this step's tokens at ring entries (origin + count + t) % C
            tl.store(rx + pos[:, None] * P + op[None, :], x_w, mask=new[:, None] & pmask[None, :])
        tl.store(rdt + pos, dt_w, mask=new)
        if h % (H // G) == 0:
            tl.store(rB + pos[:, None] * N + on[None, :], B_w, mask=new[:, None])
