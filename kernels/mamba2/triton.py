"""Mamba-2 replay step in Triton: decode (T = 1) and verify (T tokens) in one launch.

One program per (P-tile, head, row). It reads the row's checkpoint tile (flush rows) or read
copy tile (other rows) once, evaluates the window (committed ring + this step's tokens),
writes the outputs, appends the tokens to the ring and, on flush rows, writes the folded
checkpoint and its read copy. Cursors are read, never written (see kernels/ring).
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
def _mamba2_step_row(
    ckpt, c_s, c_h, c_p, c_n,                  # [S, H, P, N] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, H, P, ...]
    ring_x, ring_dt, ring_B,                   # contiguous [S, H, C, P], [S, H, C], [S, G, C, N]
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    pid_p, h, i, slot,
    x, x_r, x_t, x_h,                          # [n, T, H, P]
    dt, dt_r, dt_t,                            # [n, T, H]
    A, D, dt_bias,                             # [H] fp32
    B, b_r, b_t, b_g,                          # [n, T, G, N]
    C, cc_r, cc_t, cc_g,                       # [n, T, G, N]
    z, z_r, z_t, z_h,                          # [n, T, H, P]
    out, o_r, o_t, o_h,                        # [n, T, H, P]
    window, capacity, sr_base,
    T: tl.constexpr, H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, DOT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr,
):
    op = pid_p * BP + tl.arange(0, BP)
    pmask = op < P
    e = tl.arange(0, BM)                                   # window entry
    on = tl.arange(0, N)
    g = h // (H // G)
    count = tl.load(count_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    is_flush = count + T >= window
    hist = e < count
    new = (e >= count) & (e < count + T)
    tok = e - count                                        # token index of new entries
    pos = (origin + e) % capacity                          # ring entry of window entry e

    # window inputs: committed ring entries, then this step's tokens, then neutral padding
    rdt = ring_dt + (slot * H + h) * capacity
    dt_new = tl.load(dt + i * dt_r + tok * dt_t + h, mask=new, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt_new += tl.load(dt_bias + h)
    dt_w = tl.load(rdt + pos, mask=hist, other=0.0) + tl.where(new, dt_new, 0.0)   # ring entries dt + dt_bias
    dtp = tl.where(hist | new, _softplus(dt_w), 0.0)
    dA = tl.load(A + h) * dtp
    lam = tl.cumsum(dA, axis=0)                            # [BM]
    rx = ring_x + ((slot * H + h) * capacity) * P
    x_w = (tl.load(rx + pos[:, None] * P + op[None, :], mask=hist[:, None] & pmask[None, :], other=0.0)
           + tl.load(x + i * x_r + tok[:, None] * x_t + h * x_h + op[None, :],
                     mask=new[:, None] & pmask[None, :], other=0.0))           # [BM, BP]
    rB = ring_B + ((slot * G + g) * capacity) * N
    B_w = (tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None], other=0.0)
           + tl.load(B + i * b_r + tok[:, None] * b_t + g * b_g + on[None, :], mask=new[:, None], other=0.0))
    C_w = tl.load(C + i * cc_r + tok[:, None] * cc_t + g * cc_g + on[None, :], mask=new[:, None],
                  other=0.0).to(tl.float32)                                   # [BM, N], zero off tokens
    xf = x_w.to(tl.float32)
    Bf = B_w.to(tl.float32)

    # the state this step reads: the checkpoint on flush rows, else the read copy
    ck = ckpt + slot * c_s + h * c_h + op[:, None] * c_p + on[None, :] * c_n
    if READ_FMT == READ_CHECKPOINT:
        S0 = tl.load(ck, mask=pmask[:, None], other=0.0).to(tl.float32)
    elif is_flush:
        S0 = tl.load(ck, mask=pmask[:, None], other=0.0).to(tl.float32)
    else:
        head = (slot * H + h) * P
        S0 = load_read_copy(rc_codes + head * RC_CW, rc_bs + head * (N // 16), rc_rs + head, op, pmask,
                            READ_FMT, BP, N, RC_CW)                                   # [BP, N]

    # outputs: y_j = exp(lam_j) S0 C_j + sum_{r<=j} exp(lam_j - lam_r) dt'_r (B_r . C_j) x_r
    if T == 1:
        c_vec = tl.sum(C_w, axis=0)                                            # [N]
        lam_j = tl.sum(tl.where(new, lam, 0.0), axis=0)
        w = tl.where(e <= count, tl.exp(tl.minimum(lam_j - lam, 0.0)) * dtp * tl.sum(Bf * c_vec[None, :], axis=1), 0.0)
        y = tl.exp(lam_j) * tl.sum(S0 * c_vec[None, :], axis=1) + tl.sum(xf * w[:, None], axis=0)   # [BP]
        x_j = tl.sum(tl.where(new[:, None], xf, 0.0), axis=0)
        if HAS_D:
            y += tl.load(D + h) * x_j
        if HAS_Z:
            zz = tl.load(z + i * z_r + h * z_h + op, mask=pmask, other=0.0).to(tl.float32)
            y = y * zz * tl.sigmoid(zz)
        tl.store(out + i * o_r + h * o_h + op, y.to(out.dtype.element_ty), mask=pmask)
    else:
        S0C = tl.dot(C_w, tl.trans(S0), input_precision=DOT)                  # [BM, BP]
        CB = tl.dot(C_w, tl.trans(Bf), input_precision=DOT)                   # [BM, BM]
        causal = e[None, :] <= e[:, None]
        decay = tl.exp(tl.where(causal, lam[:, None] - lam[None, :], float("-inf")))
        W = decay * dtp[None, :] * CB
        Y = tl.exp(lam)[:, None] * S0C + tl.dot(W, xf, input_precision=DOT)   # [BM, BP]
        if HAS_D:
            Y += tl.load(D + h) * xf
        if HAS_Z:
            zz = tl.load(z + i * z_r + tok[:, None] * z_t + h * z_h + op[None, :],
                         mask=new[:, None] & pmask[None, :], other=0.0).to(tl.float32)
            Y = Y * zz * tl.sigmoid(zz)
        tl.store(out + i * o_r + tok[:, None] * o_t + h * o_h + op[None, :], Y.to(out.dtype.element_ty),
                 mask=new[:, None] & pmask[None, :])

    # flush: fold the committed window (decode: history and token; verify: history) into S0
    if is_flush:
        if COMMITTED:
            last = count + T - 1
        else:
            last = count - 1
        lam_e = tl.sum(tl.where(e == last, lam, 0.0), axis=0)
        s = tl.where(e <= last, tl.exp(tl.minimum(lam_e - lam, 0.0)) * dtp, 0.0)
        S_new = tl.exp(lam_e) * S0 + tl.dot(tl.trans(xf * s[:, None]), Bf, input_precision=DOT)   # [BP, N]
        ep = tl.load(epoch_ptr + slot)
        index = h * (P * N) + op[:, None] * N + on[None, :]
        stored = round_checkpoint(S_new, index, sr_base, ep, CKPT_FMT)
        tl.store(ck, stored, mask=pmask[:, None])
        if READ_FMT != READ_CHECKPOINT:
            head = (slot * H + h) * P
            store_read_copy(rc_codes + head * RC_CW, rc_bs + head * (N // 16), rc_rs + head,
                            stored.to(tl.float32), op, pmask, READ_FMT, RC_EMAX, BP, N, RC_CW)

    # append this step's tokens at ring entries (origin + count + t) % C
    tl.store(rx + pos[:, None] * P + op[None, :], x_w, mask=new[:, None] & pmask[None, :])
    if pid_p == 0:
        tl.store(rdt + pos, dt_w, mask=new)
        if h % (H // G) == 0:
            tl.store(rB + pos[:, None] * N + on[None, :], B_w, mask=new[:, None])


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
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, DOT: tl.constexpr,
    RC_CW: tl.constexpr, RC_EMAX: tl.constexpr,
):
    pid_p, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i)
    if slot < 0:
        op = pid_p * BP + tl.arange(0, BP)
        for t in tl.static_range(T):
            tl.store(out + i * o_r + t * o_t + h * o_h + op, tl.zeros([BP], tl.float32), mask=op < P)
    else:
        _mamba2_step_row(
            ckpt, c_s, c_h, c_p, c_n, rc_codes, rc_bs, rc_rs, ring_x, ring_dt, ring_B,
            count_ptr, origin_ptr, epoch_ptr, pid_p, h, i, slot,
            x, x_r, x_t, x_h, dt, dt_r, dt_t, A, D, dt_bias, B, b_r, b_t, b_g, C, cc_r, cc_t, cc_g,
            z, z_r, z_t, z_h, out, o_r, o_t, o_h, window, capacity, sr_base,
            T, H, G, P, N, BP, BM, COMMITTED, HAS_D, HAS_Z, HAS_DT_BIAS, CKPT_FMT, READ_FMT, DOT,
            RC_CW, RC_EMAX)
