"""Mamba-2 replay step in Triton: decode (T = 1) and verify (T tokens).

A step is two launches, one program per (P-tile, head, row) each (the flush pass: per P-tile,
head and one of ``ROW_PROGRAMS`` programs that share the step's flush rows), every launch handling only its
rows (a step on the checkpoint is one launch: the decode or verify kernel folds its flush rows too):
the non-flush pass (``_mamba2_decode_kernel`` for T = 1, ``_mamba2_verify_kernel``
for T > 1) streams the checkpoint or its read copy once and writes outputs and ring entries
only; the flush pass (``_mamba2_flush_kernel``) streams the checkpoint in chunks, folds the
window into each chunk (``e^{lam_F} S0 + (s * x)^T B``, one ``tl.dot``), stores it, evaluates the
step's outputs from it and re-derives the read copy (a verify on the checkpoint with a tile of
``fold=False`` evaluates its flush rows in the verify kernel, and the flush pass only folds). Cursors
are only read.
Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, abs_max, dot_fp32, load_read_copy, load_read_words,
                                              round_checkpoint, store_read_chunk, store_read_rows_scale,
                                              word_element, word_values)
from replayssm.kernels.ring.triton import flush_row_block, flush_row_of_rank, program_ranks, row_route


@triton.jit
def _softplus(x):
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _fold_chunks(ck, c_p, c_n, xs, decay, rB, pos, hist, B_tok, tok_e, op, pmask, h, sr_base, ep,
                 P: tl.constexpr, N: tl.constexpr, FOLD_CHUNK: tl.constexpr, STAGES: tl.constexpr,
                 CKPT_FMT: tl.constexpr,
                 B_EX: tl.constexpr, DOT: tl.constexpr, TOKEN: tl.constexpr):
    """The fold of one flush row's ``[BP, N]`` checkpoint tile (``ck``: its head) in ``FOLD_CHUNK``-column
    chunks: ``S_F = decay S0 + xs B`` with ``xs [BP, BM]`` (x weighted by ``s``) and the window's B
    rows: the history's from the ring (``hist``, ring positions ``pos``) and, with ``TOKEN`` (a
    decode), this token's (``B_tok``) at window entry ``tok_e``; rounded and stored."""
    jf = tl.arange(0, FOLD_CHUNK)
    for c in tl.range(0, N // FOLD_CHUNK, num_stages=STAGES):
        on = c * FOLD_CHUNK + jf
        ptr = ck + op[:, None] * c_p + on[None, :] * c_n
        S0 = tl.load(ptr, mask=pmask[:, None], other=0.0).to(tl.float32)                          # [BP, FOLD_CHUNK]
        B_w = tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None],
                      other=0.0).to(tl.float32)  # [BM, FOLD_CHUNK]
        if TOKEN:
            B_w = tl.where(tok_e[:, None], tl.load(B_tok + on).to(tl.float32)[None, :], B_w)
        S_F = dot_fp32(xs, B_w, decay * S0, False, B_EX, DOT)
        tl.store(ptr, round_checkpoint(S_F, h * (P * N) + op[:, None] * N + on[None, :], sr_base, ep, CKPT_FMT),
                 mask=pmask[:, None])


@triton.jit(do_not_specialize=["num_slots", "n"])   # one compile for every pool and batch (and PTX for TensorRT)
def _mamba2_flush_kernel(
    ckpt, c_s, c_h, c_p, c_n,                  # [S, H, P, N] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, H, P, ...]
    ring_x, ring_dt, ring_B,                   # contiguous [S, H, C, P], [S, H, C], [S, G, C, N]
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    slots, num_slots,                          # [n] int64, S: -1 or outside [0, S) = padded row
    x, x_r, x_t, x_h,                          # [n, T, H, P]
    dt, dt_r, dt_t,                            # [n, T, H]
    A, D, dt_bias,                             # [H] fp32
    B, b_r, b_t, b_g,                          # [n, T, G, N]
    C, cc_r, cc_t, cc_g,                       # [n, T, G, N]
    z, z_r, z_t, z_h,                          # [n, T, H, P]
    out, o_r, o_t, o_h,                        # [n, T, H, P]
    window, capacity, sr_base, n,              # n: the step's rows
    T: tl.constexpr, H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr,
    CHUNK: tl.constexpr, STAGES: tl.constexpr, PADDED_T: tl.constexpr, DOT: tl.constexpr, ROW_PROGRAMS: tl.constexpr,
    SCAN_ROWS: tl.constexpr,
):
    """Flush rows of a step (``count + T >= window``); other rows are left to the non-flush pass.

    The checkpoint is streamed in ``CHUNK``-column chunks (``STAGES``-deep pipeline) with the window's
    B columns: each chunk of ``S_F = e^{lam_F} S0 + (s ⊙ X)ᵀ B`` (F = last folded entry, one
    ``tl.dot`` at precision ``DOT``) is stored at once and read by the tokens' ``C`` (decode: the
    token is entry F, so ``y = S_F C + D x``; verify: ``y_t = e^{lam_t - lam_F} S_F C_t +`` the
    tokens after F, as the verify kernel). The read copy is re-derived from the stored chunks in a
    second pass once the row maxima are known. ``PADDED_T``: T padded as the verify's (verify only).

    Grid ``(P / BP, H, ROW_PROGRAMS)``: program ``rp`` of a (P-tile, head) takes the step's flush rows of
    rank ``rp``, ``rp + ROW_PROGRAMS``, ... (ranks in row order, found by scanning the cursors in ``SCAN_ROWS``-row
    blocks), so that a step where few rows flush launches no program per row."""
    tl.static_assert((not COMMITTED) or (T == 1), "a committed step takes one token")
    # a verify of T > 1 tokens on the checkpoint: the verify kernel has evaluated and appended every row's
    # tokens (T = 1 verifies run the decode kernel, which leaves flush rows to this pass)
    EVALUATED: tl.constexpr = (not COMMITTED) and (T > 1) and (READ_FMT == READ_CHECKPOINT)
    pid_p, h, rp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    op = pid_p * BP + tl.arange(0, BP)
    pmask = op < P
    base = rp * 0                                          # flush rows before the block
    for r0 in tl.range(0, n, SCAN_ROWS, num_stages=1):
        rows, fl, rank, nf = flush_row_block(slots, num_slots, count_ptr, n, r0, base, T, window, SCAN_ROWS)
        k0, k1 = program_ranks(base, nf, rp, ROW_PROGRAMS)
        for kf in tl.range(k0, k1, ROW_PROGRAMS, num_stages=1):
            i, sl, count, origin = flush_row_of_rank(rows, fl, rank, kf, slots, count_ptr, origin_ptr)
            g = h // (H // G)
            head = (sl * H + h) * P
            e = tl.arange(0, BM)                                   # window entry
            hist = e < count
            new = (e >= count) & (e < count + T)
            tok = tl.maximum(e - count, 0)                         # token index of new entries
            pos = (origin + e) % capacity                          # ring entry of window entry e
            rB = ring_B + ((sl * G + g) * capacity) * N
            rx = ring_x + ((sl * H + h) * capacity) * P
            rdt = ring_dt + (sl * H + h) * capacity
            append_B = (pid_p == 0) & (h % (H // G) == 0)

            # per-head window scalars: dt' = softplus(dt + dt_bias), lam = cumsum(A dt'), fold weights s
            dt_new = tl.load(dt + i * dt_r + tok * dt_t + h, mask=new, other=0.0).to(tl.float32)
            if HAS_DT_BIAS:
                dt_new += tl.load(dt_bias + h)
            dt_w = tl.where(hist, tl.load(rdt + pos, mask=hist, other=0.0), tl.where(new, dt_new, 0.0))
            dtp = tl.where(hist | new, _softplus(dt_w), 0.0)
            lam = tl.cumsum(tl.load(A + h) * dtp, axis=0)          # [BM]
            n_fold = count + T if COMMITTED else count
            lam_F = tl.sum(tl.where(e == n_fold - 1, lam, 0.0), axis=0)      # 0 when nothing folds
            s = tl.where(e < n_fold, tl.exp(tl.minimum(lam_F - lam, 0.0)) * dtp, 0.0)
            x_w = (tl.load(rx + pos[:, None] * P + op[None, :], mask=hist[:, None] & pmask[None, :], other=0.0)
                   + tl.load(x + i * x_r + tok[:, None] * x_t + h * x_h + op[None, :],
                             mask=new[:, None] & pmask[None, :], other=0.0))                        # [BM, BP]
            xs = tl.trans(x_w.to(tl.float32) * s[:, None])                                          # [BP, BM]
            decay = tl.exp(lam_F)
            ep = tl.load(epoch_ptr + sl)

            tt = tl.arange(0, PADDED_T)
            tmask = tt < T
            yc = tl.zeros([BP], dtype=tl.float32)                  # decode: S_F C
            sc = tl.zeros([BP, PADDED_T], dtype=tl.float32)              # verify: S_F C_t
            bc = tl.zeros([BM, PADDED_T], dtype=tl.float32)              # verify: B_e . C_t
            amax = tl.zeros([BP], dtype=tl.float32)
            jn = tl.arange(0, CHUNK)
            for c in tl.range(0, N // CHUNK, num_stages=STAGES):
                on = c * CHUNK + jn
                ck = ckpt + sl * c_s + h * c_h + op[:, None] * c_p + on[None, :] * c_n
                S0 = tl.load(ck, mask=pmask[:, None], other=0.0).to(tl.float32)                    # [BP, CHUNK]
                B_w = (tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None], other=0.0)
                       + tl.load(B + i * b_r + tok[:, None] * b_t + g * b_g + on[None, :], mask=new[:, None],
                                 other=0.0))                                                        # [BM, CHUNK]
                Bf = B_w.to(tl.float32)
                S_F = tl.dot(xs, Bf, acc=decay * S0, input_precision=DOT)
                stored = round_checkpoint(S_F, h * (P * N) + op[:, None] * N + on[None, :], sr_base, ep, CKPT_FMT)
                tl.store(ck, stored, mask=pmask[:, None])
                if READ_FMT != READ_CHECKPOINT:
                    amax = tl.maximum(amax, abs_max(stored.to(tl.float32), 1), propagate_nan=tl.PropagateNan.ALL)
                if COMMITTED:
                    yc += tl.sum(S_F * tl.load(C + i * cc_r + g * cc_g + on).to(tl.float32)[None, :], axis=1)
                elif not EVALUATED:
                    Ct = tl.load(C + i * cc_r + tt[None, :] * cc_t + g * cc_g + on[:, None], mask=tmask[None, :],
                                 other=0.0).to(tl.float32)                                          # [CHUNK, PADDED_T]
                    sc += tl.dot(S_F, Ct, input_precision=DOT)
                    bc += tl.dot(Bf, Ct, input_precision=DOT)
                if not EVALUATED:
                    tl.store(rB + pos[:, None] * N + on[None, :], B_w, mask=new[:, None] & append_B)
            if READ_FMT != READ_CHECKPOINT:
                # every thread's chunk stores are visible to the whole program after the barrier
                tl.debug_barrier()
                store_read_rows_scale(rc_rs + head, amax, op, pmask, CODE_MAX)
                for c in tl.range(0, N // CHUNK, num_stages=STAGES):
                    on = c * CHUNK + jn
                    stored = tl.load(ckpt + sl * c_s + h * c_h + op[:, None] * c_p + on[None, :] * c_n,
                                     mask=pmask[:, None], other=0.0).to(tl.float32)
                    store_read_chunk(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (N // 16), stored, amax, op,
                                     pmask, c,
                                     READ_FMT, CODE_MAX, BP, CHUNK, N, ROW_CODE_BYTES)

            if not EVALUATED:
                tok_mask = pmask[:, None] & tmask[None, :]
                x_tok = tl.load(x + i * x_r + tt[None, :] * x_t + h * x_h + op[:, None], mask=tok_mask,
                                other=0.0).to(tl.float32)                                               # [BP, PADDED_T]
                if COMMITTED:
                    y = tl.where(tt[None, :] == 0, yc[:, None], 0.0)
                else:
                    # y_t = e^{lam_t - lam_F} S_F C_t + sum_{F < r <= t} e^{lam_t - lam_r} dt'_r (B_r . C_t) x_r
                    jt = count + tt
                    lam_t = tl.sum(tl.where(e[:, None] == jt[None, :], lam[:, None], 0.0), axis=0)     # [PADDED_T]
                    W = tl.where((e[:, None] >= n_fold) & (e[:, None] <= jt[None, :]),
                                 tl.exp(tl.minimum(lam_t[None, :] - lam[:, None], 0.0)) * dtp[:, None] * bc, 0.0)
                    y = (tl.exp(tl.minimum(lam_t - lam_F, 0.0))[None, :] * sc
                         + tl.dot(tl.trans(x_w.to(tl.float32)), W, input_precision=DOT))               # [BP, PADDED_T]
                if HAS_D:
                    y += tl.load(D + h) * x_tok
                if HAS_Z:
                    zz = tl.load(z + i * z_r + tt[None, :] * z_t + h * z_h + op[:, None], mask=tok_mask,
                                 other=0.0).to(tl.float32)
                    y = y * zz * tl.sigmoid(zz)
                tl.store(out + i * o_r + tt[None, :] * o_t + h * o_h + op[:, None], y.to(out.dtype.element_ty),
                         mask=tok_mask)

                # append this step's tokens at ring entries (origin + count + t) % C
                tl.store(rx + pos[:, None] * P + op[None, :], x_w, mask=new[:, None] & pmask[None, :])
                tl.store(rdt + pos, dt_w, mask=new & (pid_p == 0))
        base += nf


@triton.jit(do_not_specialize=["num_slots"])   # one compile for every pool (and PTX for TensorRT)
def _mamba2_decode_kernel(
    ckpt, c_s, c_h, c_p, c_n,
    rc_codes, rc_bs, rc_rs,
    ring_x, ring_dt, ring_B,
    count_ptr, origin_ptr, epoch_ptr,
    slots, num_slots,
    x, x_r, x_t, x_h,
    dt, dt_r, dt_t,
    A, D, dt_bias,
    B, b_r, b_t, b_g,
    C, cc_r, cc_t, cc_g,
    z, z_r, z_t, z_h,
    out, o_r, o_t, o_h,
    window, capacity, sr_base,
    T: tl.constexpr, H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr,
    CODES_PER_WORD: tl.constexpr, CHUNK: tl.constexpr, STAGES: tl.constexpr, ACC: tl.constexpr, FOLD: tl.constexpr,
    FOLD_CHUNK: tl.constexpr, DOT: tl.constexpr, FOLD_STAGES: tl.constexpr,
):
    """Non-flush decode rows (T = 1), arguments as ``_mamba2_flush_kernel``: the state (or read
    copy) is streamed in ``CHUNK``-column chunks through a ``STAGES``-deep pipeline, with the ring's
    B rows of the same columns; flush rows are left to the flush pass. An NVFP4 read copy
    moves as 32-bit words of ``CODES_PER_WORD`` = 8 codes, decoded in registers column-strided (no byte
    shuffles); fp8 (``CODES_PER_WORD`` = 1) as bytes, one per column. ``ACC``: the chunks' products are
    summed elementwise and reduced over columns (which lie across lanes) once after the stream,
    instead of once per chunk.

    ``FOLD`` (checkpoint read format only): the flush rows too, so that a decode step is this one
    launch. A flush row runs the pass above (its output), then streams its checkpoint again (the
    chunks are still in L2) in ``FOLD_CHUNK``-column chunks, folds the window and this token into each,
    ``S_F = e^{lam_F} S0 + (s ⊙ X)ᵀ B`` (one ``tl.dot`` at precision ``DOT``), rounds and stores
    it. That second stream sits behind a branch on the row's cursor: non-flush rows skip it."""
    tl.static_assert((not FOLD) or (READ_FMT == READ_CHECKPOINT), "the fold reads the checkpoint")
    pid_p, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    op = pid_p * BP + tl.arange(0, BP)
    pmask = op < P
    valid, sl, count, is_flush = row_route(slots, i, num_slots, count_ptr, 1, window)
    if not FOLD:
        if valid & is_flush:                               # the flush pass's row
            return
    origin = tl.load(origin_ptr + sl)
    active = valid                                         # rows this pass owns
    amask = pmask & active                                 # other rows' state and history are not read
    g = h // (H // G)
    e = tl.arange(0, BM)
    hist = (e < count) & active
    pos = (origin + e) % capacity
    tok = (origin + count) % capacity                      # ring entry this token is appended at
    head = (sl * H + h) * P
    rB = ring_B + ((sl * G + g) * capacity) * N
    rx = ring_x + ((sl * H + h) * capacity) * P
    append_B = active & (pid_p == 0) & (h % (H // G) == 0)
    # window dt and x rows, issued before the state stream
    rdt = ring_dt + (sl * H + h) * capacity
    dt_tok = tl.load(dt + i * dt_r + h).to(tl.float32)
    if HAS_DT_BIAS:
        dt_tok += tl.load(dt_bias + h)
    dt_w = tl.where(hist, tl.load(rdt + pos, mask=hist, other=0.0), tl.where(e == count, dt_tok, 0.0))
    x_raw = tl.load(x + i * x_r + h * x_h + op, mask=pmask, other=0.0)
    xt = x_raw.to(tl.float32)
    xh = tl.load(rx + pos[:, None] * P + op[None, :], mask=hist[:, None] & pmask[None, :], other=0.0)
    sc = tl.zeros([BP], dtype=tl.float32)                  # S0 C
    bc = tl.zeros([BM], dtype=tl.float32)                  # B_e . C for the history
    bc_tok = tl.zeros([1], dtype=tl.float32)               # B . C of this token
    jw = tl.arange(0, CHUNK // CODES_PER_WORD)
    asc = tl.zeros([BP, CHUNK // CODES_PER_WORD], dtype=tl.float32)    # ACC: products, reduced after the stream
    abc = tl.zeros([BM, CHUNK // CODES_PER_WORD], dtype=tl.float32)
    abt = tl.zeros([CHUNK // CODES_PER_WORD], dtype=tl.float32)
    for c in tl.range(0, N // CHUNK, num_stages=STAGES):
        # chunk c as [BP, CHUNK / PW] tiles; element w of word j is column c CHUNK + j PW + w (PW = 1: fp32)
        if READ_FMT == READ_CHECKPOINT:
            tile = tl.load(ckpt + sl * c_s + h * c_h + op[:, None] * c_p + (c * CHUNK + jw)[None, :] * c_n,
                           mask=amask[:, None], other=0.0)
        elif CODES_PER_WORD == 1:                                   # fp8 bytes, decoded and scaled here
            tile = load_read_copy(rc_codes + head * ROW_CODE_BYTES + c * CHUNK,
                                  rc_bs + head * (N // 16) + c * (CHUNK // 16),
                                  rc_rs + head, op, amask, READ_FMT, BP, CHUNK, ROW_CODE_BYTES, N // 16)
        else:
            tile, bscale = load_read_words(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (N // 16), op, amask, c,
                                           N, ROW_CODE_BYTES, CHUNK, CODES_PER_WORD, CHUNK // CODES_PER_WORD)
        part = tl.zeros([BP, CHUNK // CODES_PER_WORD], dtype=tl.float32)
        if CODES_PER_WORD > 1:
            # NVFP4 words: C, B and the ring's B on the chunk's contiguous columns (coalesced loads), their
            # products once per chunk, then each word element's C picked in registers
            onf = c * CHUNK + tl.arange(0, CHUNK)
            cf = tl.load(C + i * cc_r + g * cc_g + onf).to(tl.float32)
            b_f = tl.load(B + i * b_r + g * b_g + onf)
            Bhf = tl.load(rB + pos[:, None] * N + onf[None, :], mask=hist[:, None], other=0.0).to(tl.float32)
            bc += tl.sum(Bhf * cf[None, :], axis=1)
            bc_tok += tl.sum(b_f.to(tl.float32) * cf, axis=0)
            cc2 = tl.reshape(cf, [CHUNK // CODES_PER_WORD, CODES_PER_WORD])        # [j, w]: column c CHUNK + j PW + w
            tl.store(rB + tok * N + onf, b_f, mask=append_B)
        for w in tl.static_range(CODES_PER_WORD):
            if CODES_PER_WORD > 1:
                cc = word_element(cc2, w, CODES_PER_WORD)
                part += word_values(tile, w, READ_FMT) * cc[None, :]
            else:
                on = c * CHUNK + jw
                cc = tl.load(C + i * cc_r + g * cc_g + on).to(tl.float32)
                b_raw = tl.load(B + i * b_r + g * b_g + on)
                Bh = tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None], other=0.0).to(tl.float32)
                part += word_values(tile, w, READ_CHECKPOINT) * cc[None, :]
                if ACC:
                    abc += Bh * cc[None, :]
                    abt += b_raw.to(tl.float32) * cc
                else:
                    bc += tl.sum(Bh * cc[None, :], axis=1)
                    bc_tok += tl.sum(b_raw.to(tl.float32) * cc, axis=0)
                tl.store(rB + tok * N + on, b_raw, mask=(on < N) & append_B)
        if CODES_PER_WORD > 1:
            part *= bscale
        if ACC:
            asc += part
        else:
            sc += tl.sum(part, axis=1)
    if ACC:
        sc = tl.sum(asc, axis=1)
        if CODES_PER_WORD == 1:                                     # words sum the products in place
            bc = tl.sum(abc, axis=1)
            bc_tok += tl.sum(abt, axis=0)
    if CODES_PER_WORD > 1:
        sc *= tl.load(rc_rs + head + op, mask=pmask, other=0.0)

    # window scalars: dt' = softplus(dt + dt_bias), lam = cumsum(A dt') over history + token
    dtp = tl.where(e <= count, _softplus(dt_w), 0.0)
    lam = tl.cumsum(tl.load(A + h) * dtp, axis=0)                                          # [BM]
    lam_t = tl.sum(tl.where(e == count, lam, 0.0), axis=0)
    bc = tl.where(e == count, tl.sum(bc_tok, axis=0), bc)
    w = tl.where(e <= count, tl.exp(tl.minimum(lam_t - lam, 0.0)) * dtp * bc, 0.0)
    y = (tl.exp(lam_t) * sc + tl.sum(xh.to(tl.float32) * w[:, None], axis=0)
         + tl.sum(tl.where(e == count, w, 0.0), axis=0) * xt)                               # [BP]
    if HAS_D:
        y += tl.load(D + h) * xt
    if HAS_Z:
        zz = tl.load(z + i * z_r + h * z_h + op, mask=pmask, other=0.0).to(tl.float32)
        y = y * zz * tl.sigmoid(zz)
    tl.store(out + i * o_r + h * o_h + op, tl.where(valid, y, 0.0).to(out.dtype.element_ty),
             mask=pmask & (active | ~valid))
    tl.store(rx + tok * P + op, x_raw, mask=pmask & active)
    tl.store(rdt + tok, dt_tok, mask=active & (pid_p == 0))
    if FOLD:
        if valid & is_flush:
            # the window is the history and this token (entry count): weights s_e = e^{lam_t - lam_e} dt'_e
            s_w = tl.where(e <= count, tl.exp(tl.minimum(lam_t - lam, 0.0)) * dtp, 0.0)                 # [BM]
            xs = tl.trans(tl.where((e == count)[:, None], xt[None, :], xh.to(tl.float32)) * s_w[:, None])  # [BP, BM]
            decay = tl.exp(lam_t)
            ep = tl.load(epoch_ptr + sl)
            # 16-bit ring and token B are exact tf32 operands: two tf32 products per piece (dot_fp32)
            B_EX: tl.constexpr = (rB.dtype.element_ty.primitive_bitwidth == 16
                                  and B.dtype.element_ty.primitive_bitwidth == 16)
            _fold_chunks(ckpt + sl * c_s + h * c_h, c_p, c_n, xs, decay, rB, pos, hist, B + i * b_r + g * b_g,
                         e == count, op, pmask, h, sr_base, ep, P, N, FOLD_CHUNK, FOLD_STAGES, CKPT_FMT, B_EX, DOT,
                         True)


@triton.jit(do_not_specialize=["num_slots"])   # one compile for every pool (and PTX for TensorRT)
def _mamba2_verify_kernel(
    ckpt, c_s, c_h, c_p, c_n,
    rc_codes, rc_bs, rc_rs,
    ring_x, ring_dt, ring_B,
    count_ptr, origin_ptr, epoch_ptr,
    slots, num_slots,
    x, x_r, x_t, x_h,
    dt, dt_r, dt_t,
    A, D, dt_bias,
    B, b_r, b_t, b_g,
    C, cc_r, cc_t, cc_g,
    z, z_r, z_t, z_h,
    out, o_r, o_t, o_h,
    window, capacity, sr_base,
    T: tl.constexpr, H: tl.constexpr, G: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    BP: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr,
    CODES_PER_WORD: tl.constexpr, CHUNK: tl.constexpr, CHUNK_WORDS: tl.constexpr, STAGES: tl.constexpr,
    PADDED_T: tl.constexpr,
    DOT: tl.constexpr, FOLD: tl.constexpr,
):
    """Non-flush verify rows (T > 1; ``PADDED_T``: T padded to a power of two, at least the tile's ``tokens``),
    arguments as ``_mamba2_flush_kernel``.

    The state (or read copy) is streamed once, in ``CHUNK``-column chunks, into two small products:
    ``S0 C [BP, PADDED_T]`` and the window's ``B_e . C_t [BM, PADDED_T]`` (``dot_fp32`` at precision ``DOT``:
    "ieee" fp32 or "tf32x3", fp32-accurate on tensor cores, in fewer tf32 passes on operands that
    tf32 holds exactly); then
    ``y = e^{lam_t} S0 C_t + X W`` with ``W[e, t] = e^{lam_t - lam_e} dt'_e (B_e . C_t)`` for
    ``e <= t``. Writes outputs and ring entries only.

    On the checkpoint the flush rows are evaluated here too (the window block holds their whole
    history); with ``FOLD`` their history also folds here after the outputs, the flush pass's
    product ``S_F = e^{lam_F} S0 + (s ⊙ X)ᵀ B`` over the state read again, and the step is one launch;
    without it the flush pass folds them. Behind a read copy they are left to the flush pass,
    which evaluates them on the exact checkpoint."""
    pid_p, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    op = pid_p * BP + tl.arange(0, BP)
    pmask = op < P
    valid, sl, count, is_flush = row_route(slots, i, num_slots, count_ptr, T, window)
    tl.static_assert((not FOLD) or (READ_FMT == READ_CHECKPOINT), "the fold reads the checkpoint")
    if valid & is_flush & (READ_FMT != READ_CHECKPOINT):   # the flush pass's row (behind a read copy)
        return
    origin = tl.load(origin_ptr + sl)
    active = valid
    amask = pmask & active                                 # other rows' state and history are not read
    g = h // (H // G)
    e = tl.arange(0, BM)
    hist = (e < count) & active
    new = (e >= count) & (e < count + T)
    tok_e = tl.maximum(e - count, 0)                       # token index of window entry e (new entries)
    pos = (origin + e) % capacity
    tt = tl.arange(0, PADDED_T)
    tmask = tt < T
    tpos = (origin + count + tt) % capacity                # ring entries the tokens are appended at
    head = (sl * H + h) * P
    rB = ring_B + ((sl * G + g) * capacity) * N
    rx = ring_x + ((sl * H + h) * capacity) * P
    rdt = ring_dt + (sl * H + h) * capacity
    append_B = active & (pid_p == 0) & (h % (H // G) == 0)
    # operands that tf32 holds exactly take fewer tensor-core passes (dot_fp32): 16-bit tokens and ring
    # entries, read-copy values (a code times an e4m3 block scale) and a 16-bit checkpoint
    C_EX: tl.constexpr = C.dtype.element_ty.primitive_bitwidth == 16
    B_EX: tl.constexpr = (B.dtype.element_ty.primitive_bitwidth == 16
                          and ring_B.dtype.element_ty.primitive_bitwidth == 16)
    X_EX: tl.constexpr = (x.dtype.element_ty.primitive_bitwidth == 16
                          and ring_x.dtype.element_ty.primitive_bitwidth == 16)
    S_EX: tl.constexpr = (READ_FMT != READ_CHECKPOINT) or ckpt.dtype.element_ty.primitive_bitwidth == 16
    # window dt (history from the ring, then the tokens) and x, transposed [BP, BM]
    dt_new = tl.load(dt + i * dt_r + tok_e * dt_t + h, mask=new, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt_new += tl.load(dt_bias + h)
    dt_w = tl.where(hist, tl.load(rdt + pos, mask=hist, other=0.0), tl.where(new, dt_new, 0.0))
    xw = (tl.load(rx + pos[None, :] * P + op[:, None], mask=hist[None, :] & pmask[:, None], other=0.0)
          + tl.load(x + i * x_r + tok_e[None, :] * x_t + h * x_h + op[:, None], mask=new[None, :] & pmask[:, None],
                    other=0.0))
    sc = tl.zeros([BP, PADDED_T], dtype=tl.float32)             # S0 C_t
    bc = tl.zeros([BM, PADDED_T], dtype=tl.float32)             # B_e . C_t
    jw = tl.arange(0, CHUNK_WORDS)
    wmask = jw < CHUNK // CODES_PER_WORD
    for c in tl.range(0, N // CHUNK, num_stages=STAGES):
        if READ_FMT == READ_CHECKPOINT:
            tile = tl.load(ckpt + sl * c_s + h * c_h + op[:, None] * c_p + (c * CHUNK + jw)[None, :] * c_n,
                           mask=amask[:, None] & wmask[None, :], other=0.0)
        else:
            tile, bscale = load_read_words(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (N // 16), op, amask, c,
                                           N, ROW_CODE_BYTES, CHUNK, CODES_PER_WORD, CHUNK_WORDS)
        for w in tl.static_range(CODES_PER_WORD):
            on = c * CHUNK + jw * CODES_PER_WORD + w                                                    # [CHUNK_WORDS]
            Ct = tl.load(C + i * cc_r + tt[None, :] * cc_t + g * cc_g + on[:, None],
                         mask=wmask[:, None] & tmask[None, :], other=0.0).to(tl.float32)    # [CHUNK_WORDS, PADDED_T]
            Bw = (tl.load(rB + pos[:, None] * N + on[None, :], mask=hist[:, None] & wmask[None, :], other=0.0)
                  + tl.load(B + i * b_r + tok_e[:, None] * b_t + g * b_g + on[None, :],
                            mask=new[:, None] & wmask[None, :], other=0.0))                # [BM, CHUNK_WORDS]
            val = word_values(tile, w, READ_FMT)
            if READ_FMT != READ_CHECKPOINT:
                val = val * bscale
            sc = dot_fp32(val, Ct, sc, S_EX, C_EX, DOT)
            bc = dot_fp32(Bw.to(tl.float32), Ct, bc, B_EX, C_EX, DOT)
            Bt = tl.load(B + i * b_r + tt[:, None] * b_t + g * b_g + on[None, :],
                         mask=tmask[:, None] & wmask[None, :], other=0.0)
            tl.store(rB + tpos[:, None] * N + on[None, :], Bt, mask=tmask[:, None] & wmask[None, :] & append_B)
    if READ_FMT != READ_CHECKPOINT:
        sc *= tl.load(rc_rs + head + op, mask=pmask, other=0.0)[:, None]

    dtp = tl.where(hist | new, _softplus(dt_w), 0.0)
    lam = tl.cumsum(tl.load(A + h) * dtp, axis=0)                                           # [BM]
    jt = count + tt                                                                         # window index of token t
    lam_t = tl.sum(tl.where(e[:, None] == jt[None, :], lam[:, None], 0.0), axis=0)          # [PADDED_T]
    W = tl.where(e[:, None] <= jt[None, :],
                 tl.exp(tl.minimum(lam_t[None, :] - lam[:, None], 0.0)) * dtp[:, None] * bc, 0.0)  # [BM, PADDED_T]
    y = dot_fp32(xw.to(tl.float32), W, tl.exp(lam_t)[None, :] * sc, X_EX, False, DOT)       # [BP, PADDED_T]
    io = pmask[:, None] & tmask[None, :]
    x_tok = tl.load(x + i * x_r + tt[None, :] * x_t + h * x_h + op[:, None], mask=io, other=0.0)
    if HAS_D:
        y += tl.load(D + h) * x_tok.to(tl.float32)
    if HAS_Z:
        zz = tl.load(z + i * z_r + tt[None, :] * z_t + h * z_h + op[:, None], mask=io, other=0.0).to(tl.float32)
        y = y * zz * tl.sigmoid(zz)
    tl.store(out + i * o_r + tt[None, :] * o_t + h * o_h + op[:, None], tl.where(valid, y,
                                                                                 0.0).to(out.dtype.element_ty),
             mask=io & (active | ~valid))
    tl.store(rx + tpos[None, :] * P + op[:, None], x_tok, mask=io & active)
    dt_tok = tl.sum(tl.where(e[:, None] == jt[None, :], dt_w[:, None], 0.0), axis=0)        # [PADDED_T]
    tl.store(rdt + tpos, dt_tok, mask=tmask & active & (pid_p == 0))
    if FOLD:
        if valid & is_flush:
            # the flush row's history folds, S_F = e^{lam_F} S0 + (s ⊙ X)ᵀ B (F: the last history entry): the
            # state and the history's x, dt are read again (mostly from L2), so that the fold holds no registers
            # during the stream above
            dtp_f = tl.where(hist, _softplus(tl.load(rdt + pos, mask=hist, other=0.0)), 0.0)
            lam_f = tl.cumsum(tl.load(A + h) * dtp_f, axis=0)                                # [BM]
            lam_F = tl.sum(tl.where(e == count - 1, lam_f, 0.0), axis=0)
            x_f = tl.load(rx + pos[None, :] * P + op[:, None], mask=hist[None, :] & pmask[:, None], other=0.0)
            xs = x_f.to(tl.float32) * tl.where(hist, tl.exp(tl.minimum(lam_F - lam_f, 0.0)) * dtp_f, 0.0)[None, :]
            # small chunks, not pipelined: pipelined, the loop's buffers cost the verify without flush rows
            # shared memory and registers (docs/kernel-design.md)
            _fold_chunks(ckpt + sl * c_s + h * c_h, c_p, c_n, xs, tl.exp(lam_F), rB, pos, hist, B, hist, op, pmask, h,
                         sr_base, tl.load(epoch_ptr + sl), P, N, 16, 1, CKPT_FMT, B_EX, DOT, False)
