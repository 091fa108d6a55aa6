"""Gated DeltaNet / KDA replay step in Triton: decode (T = 1) and verify (T tokens).

A step is two launches, one program per (V-tile, value head, row) each (the flush pass: per
V-tile, value head and one of ``ROW_PROGRAMS`` programs that share the step's flush rows), every launch
handling only its rows:
- the non-flush pass (``_delta_decode_kernel`` for T = 1, ``_delta_verify_kernel`` for T > 1)
  streams the read copy (or checkpoint) once and evaluates the tokens in output-only form:
  ``u_t = S0ᵀ(e^{Γ_t} ⊙ k_t) + Σ_{j<t} c_tj d_j``, ``d_t = β_t (v_t - u_t)``,
  ``o_t = scale [S0ᵀ(e^{Γ_t} ⊙ q_t) + Σ_{j<=t} ĉ_tj d_j]`` with the d of earlier entries taken from
  the ring's d cache. The new d is cached for later steps' outputs; the state is not written.
- the flush pass (``_delta_flush_kernel``) folds the committed window into the checkpoint,
  stores it and its read copy, then, behind a read copy, evaluates a verify's tokens from it. With
  the checkpoint as the read format the cached d are the recurrence's own and the history folds as
  one product; behind an fp8 / NVFP4 read copy the window replays step by step from the raw inputs
  (k, v, g, beta; loads pipelined across entries), so the copy's rounding never reaches the checkpoint.
A step on the checkpoint is one launch instead: the decode kernel also folds its flush rows
(``FOLD``; ``_fold_rows``), since an early-exit flush launch cost about a fifth of the decode pass
at batch 256, and the verify kernel evaluates its flush rows and folds their history (``FOLD``,
``_fold_rows`` without a token; with a tile of ``fold=False`` the flush pass folds them). Cursors
are only read. Derivation: README.md beside this file; reference: reference.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.triton import (READ_CHECKPOINT, dot_fp32, load_read_copy, load_read_words,
                                              round_checkpoint, store_read_copy, word_element, word_values)
from replayssm.kernels.ring.triton import flush_row_block, flush_row_of_rank, program_ranks, row_route


@triton.jit(do_not_specialize=["num_slots", "n"])   # one compile for every pool and batch (and PTX for TensorRT)
def _delta_flush_kernel(
    ckpt, c_s, c_h, c_k, c_v,                  # [S, HV, K, V] checkpoint (any strides)
    rc_codes, rc_bs, rc_rs,                    # read copy, contiguous [S, HV, V, ...]
    ring_k, ring_v, ring_g, ring_beta, ring_d,  # contiguous [S, HK, C, K], [S, HV, C, V], [S, HV, C(, K)],
                                               # [S, HV, C], [S, HV, C, V] (fp32 d cache)
    count_ptr, origin_ptr, epoch_ptr,          # [S + 1] int32
    slots, num_slots,                          # [n] int64, S: -1 or outside [0, S) = padded row
    q, q_r, q_t, q_h,                          # [n, T, HK, K]
    qs, qs_r, qs_t, qs_h,                      # [n, T, HK] fp32 factors on q (HAS_QS)
    k, k_r, k_t, k_h,                          # [n, T, HK, K]
    v, v_r, v_t, v_h,                          # [n, T, HV, V]
    g, g_r, g_t, g_h,                          # [n, T, HV] or [n, T, HV, K]
    beta, be_r, be_t,                          # [n, T, HV]
    out, o_r, o_t, o_h,                        # [n, T, HV, V]
    scale, window, capacity, sr_base, n,       # n: the step's rows
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    PER_CHANNEL: tl.constexpr, HAS_QS: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr,
    ROW_PROGRAMS: tl.constexpr, SCAN_ROWS: tl.constexpr, ROWS_FROM_BLOCKS: tl.constexpr, KEY_RUNS: tl.constexpr,
):
    """Flush rows of a step (``count + T >= window``); other rows are left to the non-flush pass.

    With the checkpoint as the read format, the history's cached d were derived from this
    checkpoint, so they are the recurrence's own d: the history folds as one product
    ``S = e^{Γ_e} S0 + Wᵀ D`` (``W_j = e^{Γ_e - Γ_j} ⊙ k_j``, ``tl.dot`` at precision ``DOT``) and
    only a decode's own token is stepped. Behind an fp8 / NVFP4 read copy the d carry its
    rounding, so every committed entry is replayed from its raw inputs instead, and a verify's
    tokens are then evaluated from the folded state; on the checkpoint the verify kernel has
    evaluated and appended them (``EVALUATED``), and this pass only folds.

    Grid ``(V / BV, HV, ROW_PROGRAMS)``: program ``rp`` of a (V-tile, head) takes the step's flush rows of
    rank ``rp``, ``rp + ROW_PROGRAMS``, ... (ranks in row order, found by scanning the cursors in ``SCAN_ROWS``-row
    blocks), so that a step where few rows flush launches no program per row.

    ``ROWS_FROM_BLOCKS``: the read copy's encode as :func:`store_read_copy` says (the tile's lanes
    along K, as a ``[S, HV, V, K]`` checkpoint loads). ``KEY_RUNS`` > 0 (behind a read copy only): the
    replay holds the tile as runs of that many key channels, value rows across the lanes, from the
    load through the stores, so that an entry's reduction over K stays mostly within a thread where
    K is the contiguous axis (README.md beside this file)."""
    tl.static_assert((not COMMITTED) or (T == 1), "a committed step takes one token")
    tl.static_assert(KEY_RUNS == 0 or READ_FMT != READ_CHECKPOINT, "key runs are a replay's (behind a read copy)")
    # a verify of T > 1 tokens on the checkpoint: the verify kernel has evaluated and appended every row's
    # tokens (T = 1 verifies run the decode kernel, which leaves flush rows to this pass)
    EVALUATED: tl.constexpr = (not COMMITTED) and (T > 1) and (READ_FMT == READ_CHECKPOINT)
    pid_v, h, rp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    base = rp * 0                                          # flush rows before the block
    for r0 in tl.range(0, n, SCAN_ROWS, num_stages=1):
        rows, fl, rank, nf = flush_row_block(slots, num_slots, count_ptr, n, r0, base, T, window, SCAN_ROWS)
        k0, k1 = program_ranks(base, nf, rp, ROW_PROGRAMS)
        for kf in tl.range(k0, k1, ROW_PROGRAMS, num_stages=1):
            i, sl, count, origin = flush_row_of_rank(rows, fl, rank, kf, slots, count_ptr, origin_ptr)
            ok = tl.arange(0, K)
            ck = ckpt + sl * c_s + h * c_h                      # the head's [K, V] checkpoint
            head = (sl * HV + h) * V
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
            # this row's step tokens: token t of head hd at x_i + t * x_t + x_hd
            k_i, v_i, beta_i, g_i = k + i * k_r, v + i * v_r, beta + i * be_r, g + i * g_r
            k_hd, v_hd, g_hd = hk * k_h, h * v_h, h * g_h if PER_CHANNEL else h

            n_fold = count + T if COMMITTED else count
            ep = tl.load(epoch_ptr + sl)
            if KEY_RUNS > 0:
                # behind a read copy, the tile as [BV / VR, VR, K / KEY_RUNS, KEY_RUNS] (value row a VR + b,
                # channel c KEY_RUNS + j at [a, b, c, j]): where K is contiguous, a run of KEY_RUNS channels is
                # one piece of memory over KEY_RUNS / (16 bytes) lanes, the warp's other lanes take value rows,
                # VR adjacent ones each (so that an entry's v loads as one copy of VR values, which the loop
                # pipelines), and the K / KEY_RUNS runs sit in registers: each entry's reduction over K then
                # stays mostly within a thread, where one [K, BV] load spreads all 32 lanes along K
                VEC: tl.constexpr = 128 // ckpt.dtype.element_ty.primitive_bitwidth        # values in 16 bytes
                LV: tl.constexpr = 32 // (KEY_RUNS // VEC) if KEY_RUNS > VEC else 32      # lanes over value rows
                VR: tl.constexpr = BV // LV if BV > LV else 1
                okr = tl.arange(0, K // KEY_RUNS)[:, None] * KEY_RUNS + tl.arange(0, KEY_RUNS)[None, :]   # [K/KR, KR]
                ovr = pid_v * BV + tl.arange(0, BV // VR)[:, None] * VR + tl.arange(0, VR)[None, :]       # [BV/VR, VR]
                vrm = ovr < V
                S4 = tl.load(ck + ovr[:, :, None, None] * c_v + okr[None, None, :, :] * c_k,
                             mask=vrm[:, :, None, None], other=0.0).to(tl.float32)        # [BV/VR, VR, K/KR, KR]
                d4 = tl.zeros([BV // VR, VR], dtype=tl.float32)
                for j in tl.range(0, n_fold, num_stages=STAGES):
                    kj, vj, bj, gj = replay_entry(j, count, origin, capacity, rk, rv, rbeta, rg, k_i, k_t, k_hd, v_i,
                                                  v_t, v_hd, beta_i, be_t, h, g_i, g_t, g_hd, okr, ovr, True, vrm, K, V,
                                                  PER_CHANNEL)
                    if PER_CHANNEL:
                        S4 = S4 * tl.exp(gj)[None, None, :, :]
                    else:
                        S4 = S4 * tl.exp(gj)
                    # the runs first (within a thread), then the run's channels
                    d4 = bj * (vj - tl.sum(tl.sum(S4 * kj[None, None, :, :], axis=2), axis=2))
                    S4 += kj[None, None, :, :] * d4[:, :, None, None]
                if COMMITTED:
                    q4 = tl.load(q + i * q_r + hk * q_h + okr).to(tl.float32)
                    o4 = (scale * q_factor(qs + i * qs_r + hk * qs_h, HAS_QS)
                          * tl.sum(tl.sum(S4 * q4[None, None, :, :], axis=2), axis=2))
                    tl.store(out + i * o_r + h * o_h + ovr, o4.to(out.dtype.element_ty), mask=vrm)
                    tl.store(rd + ((origin + n_fold - 1) % capacity) * V + ovr, d4, mask=vrm)
                # stored from the runs' layout; the read copy encodes its [BV, K] rows
                stored4 = round_checkpoint(S4, h * (K * V) + okr[None, None, :, :] * V + ovr[:, :, None, None],
                                           sr_base, ep, CKPT_FMT)
                tl.store(ck + ovr[:, :, None, None] * c_v + okr[None, None, :, :] * c_k, stored4,
                         mask=vrm[:, :, None, None])
                store_read_copy(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (K // 16), rc_rs + head,
                                tl.reshape(stored4.to(tl.float32), (BV, K)), ov, vmask, READ_FMT, CODE_MAX, BV, K,
                                ROW_CODE_BYTES, ROWS_FROM_BLOCKS)
                S = tl.trans(tl.reshape(S4, (BV, K)))                                # [K, BV], a verify's tokens
            else:
                S = load_ckpt_tile(ck, c_k, c_v, pid_v * BV, V, K, BV).to(tl.float32)           # [K, BV]
                if READ_FMT == READ_CHECKPOINT:
                    # the history's d came from this checkpoint: fold it as one product
                    hist = e < count
                    pos = (origin + e) % capacity
                    k_hist = tl.load(rk + pos[:, None] * K + ok[None, :], mask=hist[:, None],
                                     other=0.0).to(tl.float32)  # [BM, K]
                    d_hist = tl.load(rd + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :],
                                     other=0.0)                                                         # [BM, BV]
                    if PER_CHANNEL:
                        g_w = tl.load(rg + pos[:, None] * K + ok[None, :], mask=hist[:, None], other=0.0)   # [BM, K]
                        g_e = tl.sum(g_w, axis=0)                                                       # [K]
                        w_h = k_hist * tl.exp(g_e[None, :] - tl.cumsum(g_w, axis=0))
                        S = S * tl.exp(g_e)[:, None]
                    else:
                        g_w = tl.load(rg + pos, mask=hist, other=0.0)                                   # [BM]
                        g_e = tl.sum(g_w, axis=0)
                        w_h = k_hist * tl.exp(g_e - tl.cumsum(g_w, axis=0))[:, None]
                        S = S * tl.exp(g_e)
                    S += tl.dot(tl.trans(w_h), d_hist, input_precision=DOT)
                    j0 = count
                else:
                    j0 = 0
                # exact steps: the committed entries not folded above (all of them behind a read copy, else
                # a decode's own token) replay on the checkpoint tile
                dj = tl.zeros([BV], dtype=tl.float32)
                for j in tl.range(j0, n_fold, num_stages=STAGES):
                    kj, vj, bj, gj = replay_entry(j, count, origin, capacity, rk, rv, rbeta, rg, k_i, k_t, k_hd, v_i,
                                                  v_t, v_hd, beta_i, be_t, h, g_i, g_t, g_hd, ok, ov, ok < K, vmask, K,
                                                  V, PER_CHANNEL)
                    if PER_CHANNEL:
                        S = S * tl.exp(gj)[:, None]
                    else:
                        S = S * tl.exp(gj)
                    dj = bj * (vj - tl.sum(S * kj[:, None], axis=0))
                    S += kj[:, None] * dj[None, :]
                if COMMITTED:
                    qj = tl.load(q + i * q_r + hk * q_h + ok).to(tl.float32)
                    o = scale * q_factor(qs + i * qs_r + hk * qs_h, HAS_QS) * tl.sum(S * qj[:, None], axis=0)
                    tl.store(out + i * o_r + h * o_h + ov, o.to(out.dtype.element_ty), mask=vmask)
                    tl.store(rd + ((origin + n_fold - 1) % capacity) * V + ov, dj, mask=vmask)
                index = h * (K * V) + ok[:, None] * V + ov[None, :]
                stored = round_checkpoint(S, index, sr_base, ep, CKPT_FMT)
                store_ckpt_tile(ck, c_k, c_v, stored, pid_v * BV, V, K, BV)
                if READ_FMT != READ_CHECKPOINT:
                    store_read_copy(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (K // 16), rc_rs + head,
                                    tl.trans(stored.to(tl.float32)), ov, vmask, READ_FMT, CODE_MAX, BV, K,
                                    ROW_CODE_BYTES, ROWS_FROM_BLOCKS)
            if not (COMMITTED or EVALUATED):
                # a verify's tokens, evaluated from the folded state S (exact): the window is the T tokens
                wmask = e < T
                tk = tl.minimum(e, T - 1)
                k_w = tl.load(k + i * k_r + tk[:, None] * k_t + hk * k_h + ok[None, :], mask=wmask[:, None],
                              other=0.0).to(tl.float32)                                                # [BM, K]
                d_w = tl.zeros([BM, BV], dtype=tl.float32)
                if PER_CHANNEL:
                    g_w = tl.load(g + i * g_r + tk[:, None] * g_t + h * g_h + ok[None, :], mask=wmask[:, None],
                                  other=0.0).to(tl.float32)
                else:
                    g_w = tl.load(g + i * g_r + tk * g_t + h, mask=wmask, other=0.0).to(tl.float32)
                gam = tl.cumsum(g_w, axis=0)
                for t in tl.static_range(T):
                    kt = tl.load(k + i * k_r + t * k_t + hk * k_h + ok).to(tl.float32)
                    qt = tl.load(q + i * q_r + t * q_t + hk * q_h + ok).to(tl.float32)
                    vt = tl.load(v + i * v_r + t * v_t + h * v_h + ov, mask=vmask, other=0.0).to(tl.float32)
                    bt = tl.load(beta + i * be_r + t * be_t + h).to(tl.float32)
                    before = e < t
                    if PER_CHANNEL:
                        gt = tl.sum(tl.where((e == t)[:, None], gam, 0.0), axis=0)                       # [K]
                        dec = tl.where(before[:, None] | (e == t)[:, None],
                                       tl.exp(tl.minimum(gt[None, :] - gam, 0.0)), 0.0) * k_w            # [BM, K]
                        ck_ = tl.sum(dec * kt[None, :], axis=1)
                        cq = tl.sum(dec * qt[None, :], axis=1)
                        top = tl.exp(gt)
                        u = tl.sum(S * (top * kt)[:, None], axis=0)
                        r = tl.sum(S * (top * qt)[:, None], axis=0)
                    else:
                        gt = tl.sum(tl.where(e == t, gam, 0.0), axis=0)
                        dec = tl.where(e <= t, tl.exp(tl.minimum(gt - gam, 0.0)), 0.0)                  # [BM]
                        ck_ = dec * tl.sum(k_w * kt[None, :], axis=1)
                        cq = dec * tl.sum(k_w * qt[None, :], axis=1)
                        top = tl.exp(gt)
                        u = top * tl.sum(S * kt[:, None], axis=0)
                        r = top * tl.sum(S * qt[:, None], axis=0)
                    u += tl.sum(tl.where(before, ck_, 0.0)[:, None] * d_w, axis=0)
                    dt_ = bt * (vt - u)
                    d_w = tl.where((e == t)[:, None], dt_[None, :], d_w)
                    o = (scale * q_factor(qs + i * qs_r + t * qs_t + hk * qs_h, HAS_QS)
                         * (r + tl.sum(cq[:, None] * d_w, axis=0)))
                    tl.store(out + i * o_r + t * o_t + h * o_h + ov, o.to(out.dtype.element_ty), mask=vmask)
                    tl.store(rd + ((origin + count + t) % capacity) * V + ov, dt_, mask=vmask)

            # append this step's raw inputs at ring entries (origin + count + t) % C
            for t in tl.static_range(0 if EVALUATED else T):
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
        base += nf


@triton.jit
def replay_entry(j, count, origin, capacity, rk, rv, rbeta, rg, k_i, k_t, k_hd, v_i, v_t, v_hd, beta_i, be_t, b_hd,
                 g_i, g_t, g_hd, okx, ovx, kin, vmx, K: tl.constexpr, V: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Entry ``j`` of a flush row's replay in fp32, (k, v, beta, g): the ring's entry ``(origin + j) %
    capacity`` (``j < count``) or the step's token ``j - count`` (at ``x_i + t x_t + x_hd``), loaded
    branch-free so that the next entries' loads are in flight during this entry's update.
    ``okx`` / ``ovx``: the tile's key channels and value rows, in its shape; ``kin`` / ``vmx``: their
    masks (``kin`` may be True)."""
    p = (origin + j) % capacity
    rj = j < count
    t = tl.maximum(j - count, 0)
    kj = (tl.load(rk + p * K + okx, mask=kin & rj, other=0.0).to(tl.float32)
          + tl.load(k_i + t * k_t + k_hd + okx, mask=kin & ~rj, other=0.0).to(tl.float32))
    vj = (tl.load(rv + p * V + ovx, mask=vmx & rj, other=0.0).to(tl.float32)
          + tl.load(v_i + t * v_t + v_hd + ovx, mask=vmx & ~rj, other=0.0).to(tl.float32))
    bj = tl.load(rbeta + p, mask=rj, other=0.0) + tl.load(beta_i + t * be_t + b_hd, mask=~rj, other=0.0).to(tl.float32)
    if PER_CHANNEL:
        gj = (tl.load(rg + p * K + okx, mask=kin & rj, other=0.0)
              + tl.load(g_i + t * g_t + g_hd + okx, mask=kin & ~rj, other=0.0).to(tl.float32))
    else:
        gj = tl.load(rg + p, mask=rj, other=0.0) + tl.load(g_i + t * g_t + g_hd, mask=~rj, other=0.0).to(tl.float32)
    return kj, vj, bj, gj


@triton.jit
def load_ckpt_tile(ck, c_k, c_v, v0, V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr):
    """A head's checkpoint tile ``[K, BV]``, value columns ``v0 + [0, BV)`` (< V; ``ck``: the head,
    strides ``c_k``, ``c_v``: either layout)."""
    ov = v0 + tl.arange(0, BV)
    return tl.load(ck + tl.arange(0, K)[:, None] * c_k + ov[None, :] * c_v, mask=(ov < V)[None, :], other=0.0)


@triton.jit
def store_ckpt_tile(ck, c_k, c_v, x, v0, V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr):
    """Store ``x [K, BV]`` as a head's checkpoint tile (:func:`load_ckpt_tile`'s columns)."""
    ov = v0 + tl.arange(0, BV)
    tl.store(ck + tl.arange(0, K)[:, None] * c_k + ov[None, :] * c_v, x, mask=(ov < V)[None, :])


@triton.jit
def q_factor(ptr, HAS_QS: tl.constexpr):
    """The factor on a token's q (``q_scale``, e.g. a host's inverse L2 norm), or 1."""
    if HAS_QS:
        return tl.load(ptr)
    else:
        return 1.0


@triton.jit
def _fold_rows(ck, c_k, c_v, rk, rg, pos, hist, k_tok, g_tok, d_h, d_t, dec, top, ov, vmask, h, sr_base, ep,
              K: tl.constexpr, V: tl.constexpr, FOLD_CHUNK: tl.constexpr, STAGES: tl.constexpr,
              PER_CHANNEL: tl.constexpr, CKPT_FMT: tl.constexpr, DOT: tl.constexpr, TOKEN: tl.constexpr):
    """The fold of one flush row's ``[K, BV]`` checkpoint tile (``ck``: its head), streamed in
    ``FOLD_CHUNK``-channel chunks: ``S = e^{Γ} S0 + Wᵀ D (+ k dᵀ)`` over the history entries (``hist``, ring
    positions ``pos``; their d ``d_h [BM, BV]``) and, with ``TOKEN`` (a decode), this token
    (``k_tok``, ``g_tok``, ``d_t``; a verify's tokens stay in the ring), rounded and stored. A scalar
    gate arrives as ``dec = e^{Γ - Γ_j}`` and ``top = e^{Γ}``; per-channel gates are re-read from the
    ring chunk by chunk."""
    jc = tl.arange(0, FOLD_CHUNK)
    # A scalar gate over 16-bit ring keys: the decay moves onto D, so that the keys are exact tf32 operands
    # (dot_fp32: two tf32 products per piece against tf32x3's three)
    DECAY_ON_D: tl.constexpr = (not PER_CHANNEL) and rk.dtype.element_ty.primitive_bitwidth == 16
    if DECAY_ON_D:
        dd = d_h * dec[:, None]                                                                   # [BM, BV]
    for c in tl.range(0, K // FOLD_CHUNK, num_stages=STAGES):
        okc = c * FOLD_CHUNK + jc
        ptr = ck + okc[:, None] * c_k + ov[None, :] * c_v
        s0 = tl.load(ptr, mask=vmask[None, :], other=0.0).to(tl.float32)                          # [FOLD_CHUNK, BV]
        kh = tl.load(rk + pos[:, None] * K + okc[None, :], mask=hist[:, None],
                     other=0.0).to(tl.float32)  # [BM, FOLD_CHUNK]
        if PER_CHANNEL:
            g_hc = tl.load(rg + pos[:, None] * K + okc[None, :], mask=hist[:, None], other=0.0)
            gt_c = tl.sum(g_hc, axis=0)
            if TOKEN:
                gt_c += tl.load(g_tok + okc).to(tl.float32)
            w = tl.where(hist[:, None], tl.exp(tl.minimum(gt_c[None, :] - tl.cumsum(g_hc, axis=0), 0.0)), 0.0) * kh
            s = s0 * tl.exp(gt_c)[:, None]
            s = tl.dot(tl.trans(w), d_h, acc=s, input_precision=DOT)
        elif DECAY_ON_D:
            s = dot_fp32(tl.trans(kh), dd, s0 * top, True, False, DOT)
        else:
            s = tl.dot(tl.trans(kh * dec[:, None]), d_h, acc=s0 * top, input_precision=DOT)
        if TOKEN:
            s += tl.load(k_tok + okc).to(tl.float32)[:, None] * d_t[None, :]
        index = h * (K * V) + okc[:, None] * V + ov[None, :]
        tl.store(ptr, round_checkpoint(s, index, sr_base, ep, CKPT_FMT), mask=vmask[None, :])


@triton.jit(do_not_specialize=["num_slots"])   # one compile for every pool (and PTX for TensorRT)
def _delta_decode_kernel(
    ckpt, c_s, c_h, c_k, c_v,
    rc_codes, rc_bs, rc_rs,
    ring_k, ring_v, ring_g, ring_beta, ring_d,
    count_ptr, origin_ptr, epoch_ptr,
    slots, num_slots,
    q, q_r, q_t, q_h,
    qs, qs_r, qs_t, qs_h,
    k, k_r, k_t, k_h,
    v, v_r, v_t, v_h,
    g, g_r, g_t, g_h,
    beta, be_r, be_t,
    out, o_r, o_t, o_h,
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    PER_CHANNEL: tl.constexpr, HAS_QS: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr, CODES_PER_WORD: tl.constexpr, CHUNK: tl.constexpr,
    STAGES: tl.constexpr,
    ACC: tl.constexpr, FOLD: tl.constexpr, FOLD_CHUNK: tl.constexpr, DOT: tl.constexpr, FOLD_STAGES: tl.constexpr,
):
    """Non-flush decode rows (T = 1), arguments as ``_delta_flush_kernel``: the state (or read
    copy) is streamed in ``CHUNK``-key-channel chunks through a ``STAGES``-deep pipeline together with
    the same channels of q, k and the ring's keys (and KDA gates); flush rows are left to the
    flush pass. Output-only form as there, with the window entries e < count from the ring.
    An NVFP4 read copy moves as 32-bit words of ``CODES_PER_WORD`` = 8 codes, decoded in registers
    column-strided; fp8 (``CODES_PER_WORD`` = 1) as bytes, one per channel. ``ACC``: the chunks' products
    are summed elementwise and reduced over channels once after the stream (fewer cross-lane
    reductions where the channels lie across lanes: a [S, HV, V, K] checkpoint, the read copies),
    instead of once per chunk.
    Flush rows of a two-launch step return at once (computing them masked cost a whole decode
    pass of arithmetic on a flush step); otherwise branch-free: a padded row computes on slot 0
    with its state and history loads masked off (no bytes move) and stores only its zero output.

    ``FOLD`` (checkpoint read format only): the flush rows too, so that a decode step is this one
    launch. A flush row runs the pass above (this token's d and output in output-only form), then
    streams its checkpoint again (the chunks are still in L2) in ``FOLD_CHUNK``-channel chunks through an
    ``FOLD_STAGES``-deep pipeline and folds the window, history and this token: ``S = e^{Γ} S0 + Wᵀ D`` with
    ``W_j = e^{Γ - Γ_j} ⊙ k_j`` (one ``tl.dot`` per chunk at precision ``DOT``), rounds and stores it.
    The cached d are the recurrence's own because they came from this checkpoint. That second
    stream sits behind a branch on the row's cursor: non-flush rows skip it."""
    tl.static_assert((not FOLD) or (READ_FMT == READ_CHECKPOINT), "the fold flush reads the checkpoint")
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    valid, sl, count, is_flush = row_route(slots, i, num_slots, count_ptr, 1, window)
    if not FOLD:
        if valid & is_flush:                               # the flush pass's row
            return
    origin = tl.load(origin_ptr + sl)
    active = valid                                         # rows this pass owns
    amask = vmask & active                                 # other rows' state and history are not read
    e = tl.arange(0, BM)
    hist = (e < count) & active
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
        g_hist = tl.load(rg + pos, mask=hist, other=0.0)                                       # [BM]
        gam = tl.cumsum(g_hist, axis=0)                    # Γ_j of the history entries
        gt = tl.sum(g_hist, axis=0) + g_tok                # Γ at this token
    # the history's cached d and this token's v, beta: issued before the state stream
    d_h = tl.load(rd + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :], other=0.0)  # [BM, BV]
    v_raw = tl.load(v + i * v_r + h * v_h + ov, mask=vmask, other=0.0)
    bt = tl.load(beta + i * be_r + h).to(tl.float32)
    u = tl.zeros([BV], dtype=tl.float32)                   # S0ᵀ(e^Γ ⊙ k)
    r = tl.zeros([BV], dtype=tl.float32)                   # S0ᵀ(e^Γ ⊙ q)
    ck_ = tl.zeros([BM], dtype=tl.float32)                 # history coefficients for u
    cq = tl.zeros([BM], dtype=tl.float32)                  # history coefficients for the output
    kq = tl.zeros([1], dtype=tl.float32)                   # this token's own k . q
    jw = tl.arange(0, CHUNK // CODES_PER_WORD)
    if READ_FMT == READ_CHECKPOINT:                       # ACC: the chunks' products summed elementwise,
        au = tl.zeros([CHUNK, BV], dtype=tl.float32)          # reduced over channels once after the stream
        ar = tl.zeros([CHUNK, BV], dtype=tl.float32)
    else:
        au = tl.zeros([BV, CHUNK // CODES_PER_WORD], dtype=tl.float32)
        ar = tl.zeros([BV, CHUNK // CODES_PER_WORD], dtype=tl.float32)
    ahk = tl.zeros([BM, CHUNK // CODES_PER_WORD], dtype=tl.float32)    # ACC: the history coefficients' products
    ahq = tl.zeros([BM, CHUNK // CODES_PER_WORD], dtype=tl.float32)
    akq = tl.zeros([CHUNK // CODES_PER_WORD], dtype=tl.float32)
    for c in tl.range(0, K // CHUNK, num_stages=STAGES):
        # chunk c as [BV, CHUNK / PW] tiles; element w of word j is key channel c CHUNK + j PW + w (PW = 1: fp32)
        if READ_FMT == READ_CHECKPOINT:                   # [CHUNK, BV]: channels down, as the state
            tile = tl.load(ckpt + sl * c_s + h * c_h + (c * CHUNK + jw)[:, None] * c_k + ov[None, :] * c_v,
                           mask=amask[None, :], other=0.0)
        elif CODES_PER_WORD == 1:                                   # fp8 bytes, decoded and scaled here
            tile = load_read_copy(rc_codes + head * ROW_CODE_BYTES + c * CHUNK,
                                  rc_bs + head * (K // 16) + c * (CHUNK // 16),
                                  rc_rs + head, ov, amask, READ_FMT, BV, CHUNK, ROW_CODE_BYTES, K // 16)
        else:
            tile, bscale = load_read_words(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (K // 16), ov, amask, c,
                                           K, ROW_CODE_BYTES, CHUNK, CODES_PER_WORD, CHUNK // CODES_PER_WORD)
        if READ_FMT == READ_CHECKPOINT:
            pu = tl.zeros([CHUNK, BV], dtype=tl.float32)
            pr = tl.zeros([CHUNK, BV], dtype=tl.float32)
        else:
            pu = tl.zeros([BV, CHUNK // CODES_PER_WORD], dtype=tl.float32)
            pr = tl.zeros([BV, CHUNK // CODES_PER_WORD], dtype=tl.float32)
        if CODES_PER_WORD > 1:
            # NVFP4 words: q, k, the ring's keys (KDA: gates) on the chunk's contiguous channels (coalesced
            # loads), the history coefficients once per chunk, then each word element's factors picked in
            # registers (loaded per element they were 8 channels apart, one load per element and ring entry)
            okf = c * CHUNK + tl.arange(0, CHUNK)
            k_f = tl.load(k + i * k_r + hk * k_h + okf)
            kf = k_f.to(tl.float32)
            qf = tl.load(q + i * q_r + hk * q_h + okf).to(tl.float32)
            dec_f = tl.load(rk + pos[:, None] * K + okf[None, :], mask=hist[:, None], other=0.0).to(tl.float32)
            if PER_CHANNEL:
                g_f = tl.load(g + i * g_r + h * g_h + okf).to(tl.float32)
                g_hf = tl.load(rg + pos[:, None] * K + okf[None, :], mask=hist[:, None], other=0.0)   # [BM, CHUNK]
                gt_f = tl.sum(g_hf, axis=0) + g_f
                dec_f *= tl.where(hist[:, None], tl.exp(tl.minimum(gt_f[None, :] - tl.cumsum(g_hf, axis=0), 0.0)),
                                  0.0)
                ef = tl.exp(gt_f)
                kk2 = tl.reshape(ef * kf, [CHUNK // CODES_PER_WORD,
                                           CODES_PER_WORD])  # [j, w]: channel c CHUNK + j PW + w
                qq2 = tl.reshape(ef * qf, [CHUNK // CODES_PER_WORD, CODES_PER_WORD])
                tl.store(rg + tok * K + okf, g_f, mask=active & (pid_v == 0))
            else:
                kk2 = tl.reshape(kf, [CHUNK // CODES_PER_WORD, CODES_PER_WORD])
                qq2 = tl.reshape(qf, [CHUNK // CODES_PER_WORD, CODES_PER_WORD])
            ck_ += tl.sum(dec_f * kf[None, :], axis=1)
            cq += tl.sum(dec_f * qf[None, :], axis=1)
            kq += tl.sum(kf * qf, axis=0)
            tl.store(rk + tok * K + okf, k_f, mask=append_k)
        for w in tl.static_range(CODES_PER_WORD):
            S0 = word_values(tile, w,
                             READ_FMT if CODES_PER_WORD > 1 else READ_CHECKPOINT)  # [CHUNK, BV] or [BV, CHUNK / PW]
            if CODES_PER_WORD > 1:
                pu += S0 * word_element(kk2, w, CODES_PER_WORD)[None, :]
                pr += S0 * word_element(qq2, w, CODES_PER_WORD)[None, :]
            else:
                okc = c * CHUNK + jw * CODES_PER_WORD + w
                k_raw = tl.load(k + i * k_r + hk * k_h + okc)
                kt = k_raw.to(tl.float32)
                qt = tl.load(q + i * q_r + hk * q_h + okc).to(tl.float32)
                kh = tl.load(rk + pos[:, None] * K + okc[None, :], mask=hist[:, None], other=0.0).to(tl.float32)
                if PER_CHANNEL:
                    g_c = tl.load(g + i * g_r + h * g_h + okc).to(tl.float32)
                    g_hc = tl.load(rg + pos[:, None] * K + okc[None, :], mask=hist[:, None], other=0.0)  # [BM, CHUNK]
                    gt_c = tl.sum(g_hc, axis=0) + g_c
                    dec = tl.where(hist[:, None], tl.exp(tl.minimum(gt_c[None, :] - tl.cumsum(g_hc, axis=0), 0.0)),
                                   0.0) * kh
                    hk_, hq_ = dec * kt[None, :], dec * qt[None, :]
                    kk = tl.exp(gt_c) * kt
                    qq = tl.exp(gt_c) * qt
                    tl.store(rg + tok * K + okc, g_c, mask=(okc < K) & active & (pid_v == 0))
                else:
                    hk_, hq_ = kh * kt[None, :], kh * qt[None, :]
                    kk = kt
                    qq = qt
                if READ_FMT == READ_CHECKPOINT:
                    pu += S0 * kk[:, None]
                    pr += S0 * qq[:, None]
                else:
                    pu += S0 * kk[None, :]
                    pr += S0 * qq[None, :]
                if ACC:
                    ahk += hk_
                    ahq += hq_
                    akq += kt * qt
                else:
                    ck_ += tl.sum(hk_, axis=1)
                    cq += tl.sum(hq_, axis=1)
                    kq += tl.sum(kt * qt, axis=0)
                tl.store(rk + tok * K + okc, k_raw, mask=(okc < K) & append_k)
        if CODES_PER_WORD > 1:
            pu *= bscale
            pr *= bscale
        if ACC:
            au += pu
            ar += pr
        elif READ_FMT == READ_CHECKPOINT:
            u += tl.sum(pu, axis=0)
            r += tl.sum(pr, axis=0)
        else:
            u += tl.sum(pu, axis=1)
            r += tl.sum(pr, axis=1)
    if ACC:
        u = tl.sum(au, axis=0 if READ_FMT == READ_CHECKPOINT else 1)
        r = tl.sum(ar, axis=0 if READ_FMT == READ_CHECKPOINT else 1)
        if CODES_PER_WORD == 1:                                     # words sum the coefficients in place
            ck_ += tl.sum(ahk, axis=1)
            cq += tl.sum(ahq, axis=1)
            kq += tl.sum(akq, axis=0)
    if CODES_PER_WORD > 1:
        rsc = tl.load(rc_rs + head + ov, mask=vmask, other=0.0)
        u *= rsc
        r *= rsc
    if not PER_CHANNEL:
        dec = tl.where(hist, tl.exp(tl.minimum(gt - gam, 0.0)), 0.0)                          # [BM] e^{Γ - Γ_j}
        ck_ = ck_ * dec
        cq = cq * dec
        top = tl.exp(gt)
        u = u * top
        r = r * top
    d_t = bt * (v_raw.to(tl.float32) - u - tl.sum(ck_[:, None] * d_h, axis=0))
    o = scale * q_factor(qs + i * qs_r + hk * qs_h, HAS_QS) * (r + tl.sum(cq[:, None] * d_h, axis=0)
                                                              + tl.sum(kq, axis=0) * d_t)
    if FOLD:
        if valid & is_flush:
            _fold_rows(ckpt + sl * c_s + h * c_h, c_k, c_v, rk, rg, pos, hist, k + i * k_r + hk * k_h,
                      g + i * g_r + h * g_h, d_h, d_t, hist if PER_CHANNEL else dec, 1.0 if PER_CHANNEL else top,
                      ov, vmask, h, sr_base, tl.load(epoch_ptr + sl),
                      K, V, FOLD_CHUNK, FOLD_STAGES, PER_CHANNEL, CKPT_FMT, DOT, True)
    tl.store(out + i * o_r + h * o_h + ov, tl.where(valid, o, 0.0).to(out.dtype.element_ty),
             mask=vmask & (active | ~valid))
    tl.store(rd + tok * V + ov, d_t, mask=vmask & active)
    tl.store(rv + tok * V + ov, v_raw, mask=vmask & active)
    tl.store(rbeta + tok, bt, mask=active & (pid_v == 0))
    if not PER_CHANNEL:
        tl.store(rg + tok, g_tok, mask=active & (pid_v == 0))


@triton.jit(do_not_specialize=["num_slots"])   # one compile for every pool (and PTX for TensorRT)
def _delta_verify_kernel(
    ckpt, c_s, c_h, c_k, c_v,
    rc_codes, rc_bs, rc_rs,
    ring_k, ring_v, ring_g, ring_beta, ring_d,
    count_ptr, origin_ptr, epoch_ptr,
    slots, num_slots,
    q, q_r, q_t, q_h,
    qs, qs_r, qs_t, qs_h,
    k, k_r, k_t, k_h,
    v, v_r, v_t, v_h,
    g, g_r, g_t, g_h,
    beta, be_r, be_t,
    out, o_r, o_t, o_h,
    scale, window, capacity, sr_base,
    T: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BM: tl.constexpr, COMMITTED: tl.constexpr,
    PER_CHANNEL: tl.constexpr, HAS_QS: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr,
    ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr, CODES_PER_WORD: tl.constexpr, CHUNK: tl.constexpr,
    CHUNK_WORDS: tl.constexpr,
    STAGES: tl.constexpr, PADDED_T: tl.constexpr,
    DOT: tl.constexpr, FOLD: tl.constexpr,
):
    """Non-flush verify rows (T > 1; ``PADDED_T``: T padded to a power of two, at least the tile's ``tokens``),
    arguments as ``_delta_flush_kernel``.

    One pass over the state (or read copy) in ``CHUNK``-channel chunks builds, with ``dot_fp32`` at
    precision ``DOT`` ("ieee" fp32 or "tf32x3", fp32-accurate on tensor cores, in fewer passes on
    operands that tf32 holds exactly):
    ``U = S0ᵀ(e^{Γ_t} ⊙ k_t)``, ``R = S0ᵀ(e^{Γ_t} ⊙ q_t)`` ``[BV, PADDED_T]``, the decayed key
    products of history entries with the tokens ``[BM, PADDED_T]`` and of tokens with tokens ``[PADDED_T, PADDED_T]``.
    Then the tokens' d solve forward (``d_t = β_t (v_t - U_t - Σ_e c_et d_e)``, T steps on
    ``[BV]`` vectors), ``O = scale (R + D_hist C_q + D_tok N_q)``. KDA's per-channel decays enter
    the products factored at the history's end (both factors <= 1) for history pairs, and pair
    by pair for token pairs (``[16, PADDED_T, PADDED_T]`` blocks of 16 channels, before the stream). Writes
    outputs, the tokens' d and ring entries only.

    On the checkpoint the flush rows are evaluated here too (their history, up to ``L - 1``
    entries, fits the ``BM`` block, and its cached d are the recurrence's own); with ``FOLD`` their
    history also folds here after the outputs, the flush pass's product ``S = e^{Γ_e} S0 + Wᵀ D``
    (``W_j = e^{Γ_e - Γ_j} ⊙ k_j``) over the state read again, and the step is one launch; without it the
    flush pass folds them. Behind a read copy they are left to the flush pass, which evaluates
    them on the exact checkpoint."""
    pid_v, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ov = pid_v * BV + tl.arange(0, BV)
    vmask = ov < V
    valid, sl, count, is_flush = row_route(slots, i, num_slots, count_ptr, T, window)
    tl.static_assert((not FOLD) or (READ_FMT == READ_CHECKPOINT), "the fold reads the checkpoint")
    if valid & is_flush & (READ_FMT != READ_CHECKPOINT):   # the flush pass's row (behind a read copy)
        return
    origin = tl.load(origin_ptr + sl)
    active = valid
    amask = vmask & active                                 # other rows' state and history are not read
    e = tl.arange(0, BM)
    hist = (e < count) & active
    pos = (origin + e) % capacity
    tt = tl.arange(0, PADDED_T)
    tmask = tt < T
    tpos = (origin + count + tt) % capacity               # ring entries the tokens are appended at
    hk = h // (HV // HK)
    head = (sl * HV + h) * V
    rk = ring_k + ((sl * HK + hk) * capacity) * K
    rv = ring_v + ((sl * HV + h) * capacity) * V
    rd = ring_d + ((sl * HV + h) * capacity) * V
    rbeta = ring_beta + (sl * HV + h) * capacity
    append_k = active & (pid_v == 0) & (h % (HV // HK) == 0)
    # operands that tf32 holds exactly take fewer tensor-core passes (dot_fp32): 16-bit tokens and ring
    # keys, read-copy values (a code times an e4m3 block scale) and a 16-bit checkpoint
    K_EX: tl.constexpr = k.dtype.element_ty.primitive_bitwidth == 16
    Q_EX: tl.constexpr = q.dtype.element_ty.primitive_bitwidth == 16
    RK_EX: tl.constexpr = ring_k.dtype.element_ty.primitive_bitwidth == 16
    S_EX: tl.constexpr = (READ_FMT != READ_CHECKPOINT) or ckpt.dtype.element_ty.primitive_bitwidth == 16
    if PER_CHANNEL:
        rg = ring_g + ((sl * HV + h) * capacity) * K
    else:
        rg = ring_g + (sl * HV + h) * capacity
        g_h = tl.load(rg + pos, mask=hist, other=0.0)
        g_tok = tl.load(g + i * g_r + tt * g_t + h, mask=tmask, other=0.0).to(tl.float32)       # [PADDED_T]
        gam_h = tl.cumsum(g_h, axis=0)                                                        # [BM]
        gam_t = tl.sum(g_h, axis=0) + tl.cumsum(g_tok, axis=0)                                # [PADDED_T]
    NK = tl.zeros([PADDED_T, PADDED_T], dtype=tl.float32)             # token s . token t (keys)
    NQ = tl.zeros([PADDED_T, PADDED_T], dtype=tl.float32)             # token s . token t (queries)
    if PER_CHANNEL:
        # token pairs s <= t under per-channel decays: e^{Γ_t - Γ_s} <= 1 taken pair by pair (a factored form
        # over- / underflows under strong decays) in [PC, PADDED_T, PADDED_T] blocks of PC channels, before the state
        # stream so that the blocks are not live beside its accumulators
        PC: tl.constexpr = 16
        jp = tl.arange(0, PC)
        pair = (tt[:, None] <= tt[None, :])[None, :, :]                                      # [1, PADDED_T, PADDED_T]
        tp = tmask[None, :]
        for c in tl.range(0, K // PC):
            okp = c * PC + jp
            kP = tl.load(k + i * k_r + tt[None, :] * k_t + hk * k_h + okp[:, None], mask=tp,
                         other=0.0).to(tl.float32)                                              # [PC, PADDED_T]
            qP = tl.load(q + i * q_r + tt[None, :] * q_t + hk * q_h + okp[:, None], mask=tp,
                         other=0.0).to(tl.float32)
            gP = tl.cumsum(tl.load(g + i * g_r + tt[None, :] * g_t + h * g_h + okp[:, None], mask=tp,
                                   other=0.0).to(tl.float32), axis=1)
            w3 = tl.where(pair, tl.exp(tl.minimum(gP[:, None, :] - gP[:, :, None], 0.0)), 0.0) * kP[:, :, None]
            NK += tl.sum(w3 * kP[:, None, :], axis=0)                                      # [PADDED_T(s), PADDED_T(t)]
            NQ += tl.sum(w3 * qP[:, None, :], axis=0)
    d_h = tl.load(rd + pos[None, :] * V + ov[:, None], mask=hist[None, :] & vmask[:, None], other=0.0)  # [BV, BM]
    U = tl.zeros([BV, PADDED_T], dtype=tl.float32)
    R = tl.zeros([BV, PADDED_T], dtype=tl.float32)
    HK_ = tl.zeros([BM, PADDED_T], dtype=tl.float32)            # history entry e . token t (keys)
    HQ = tl.zeros([BM, PADDED_T], dtype=tl.float32)             # history entry e . token t (queries)
    jw = tl.arange(0, CHUNK_WORDS)
    wmask = jw < CHUNK // CODES_PER_WORD
    for c in tl.range(0, K // CHUNK, num_stages=STAGES):
        if READ_FMT == READ_CHECKPOINT:
            tile = tl.load(ckpt + sl * c_s + h * c_h + (c * CHUNK + jw)[None, :] * c_k + ov[:, None] * c_v,
                           mask=amask[:, None] & wmask[None, :], other=0.0)
        else:
            tile, bscale = load_read_words(rc_codes + head * ROW_CODE_BYTES, rc_bs + head * (K // 16), ov, amask, c,
                                           K, ROW_CODE_BYTES, CHUNK, CODES_PER_WORD, CHUNK_WORDS)
        for w in tl.static_range(CODES_PER_WORD):
            okc = c * CHUNK + jw * CODES_PER_WORD + w  # [CHUNK_WORDS]
            S0 = word_values(tile, w, READ_FMT)                                               # [BV, CHUNK_WORDS]
            if READ_FMT != READ_CHECKPOINT:
                S0 = S0 * bscale
            tw = wmask[:, None] & tmask[None, :]
            k_raw = tl.load(k + i * k_r + tt[None, :] * k_t + hk * k_h + okc[:, None], mask=tw, other=0.0)
            kT = k_raw.to(tl.float32)                                                         # [CHUNK_WORDS, PADDED_T]
            qT = tl.load(q + i * q_r + tt[None, :] * q_t + hk * q_h + okc[:, None], mask=tw, other=0.0).to(tl.float32)
            kh = tl.load(rk + pos[:, None] * K + okc[None, :], mask=hist[:, None] & wmask[None, :],
                         other=0.0).to(tl.float32)                                            # [BM, CHUNK_WORDS]
            if PER_CHANNEL:
                gh = tl.load(rg + pos[:, None] * K + okc[None, :], mask=hist[:, None] & wmask[None, :], other=0.0)
                gT = tl.load(g + i * g_r + tt[None, :] * g_t + h * g_h + okc[:, None], mask=tw,
                             other=0.0).to(tl.float32)                                        # [CHUNK_WORDS, PADDED_T]
                gc = tl.sum(gh, axis=0)  # [CHUNK_WORDS] history total
                gam_T = tl.cumsum(gT, axis=1)  # [CHUNK_WORDS, PADDED_T] after gc
                f_t = tl.exp(gam_T)                                                           # <= 1
                kh_s = kh * tl.exp(gc[None, :] - tl.cumsum(gh, axis=0))                       # <= 1 factors
                U = dot_fp32(S0, kT * (f_t * tl.exp(gc)[:, None]), U, S_EX, False, DOT)
                R = dot_fp32(S0, qT * (f_t * tl.exp(gc)[:, None]), R, S_EX, False, DOT)
                HK_ += tl.dot(kh_s, kT * f_t, input_precision=DOT)
                HQ += tl.dot(kh_s, qT * f_t, input_precision=DOT)
                tl.store(rg + tpos[None, :] * K + okc[:, None], gT, mask=tw & active & (pid_v == 0))
            else:
                kS = tl.trans(kT)                                                             # [PADDED_T, CHUNK_WORDS]
                U = dot_fp32(S0, kT, U, S_EX, K_EX, DOT)
                R = dot_fp32(S0, qT, R, S_EX, Q_EX, DOT)
                HK_ = dot_fp32(kh, kT, HK_, RK_EX, K_EX, DOT)
                HQ = dot_fp32(kh, qT, HQ, RK_EX, Q_EX, DOT)
                NK = dot_fp32(kS, kT, NK, K_EX, K_EX, DOT)
                NQ = dot_fp32(kS, qT, NQ, K_EX, Q_EX, DOT)
            tl.store(rk + tpos[None, :] * K + okc[:, None], k_raw, mask=tw & append_k)
    if READ_FMT != READ_CHECKPOINT:
        rsc = tl.load(rc_rs + head + ov, mask=vmask, other=0.0)[:, None]
        U *= rsc
        R *= rsc
    if not PER_CHANNEL:
        top = tl.exp(gam_t)[None, :]                                                          # [1, PADDED_T]
        U *= top
        R *= top
        hdec = tl.where(hist[:, None], tl.exp(tl.minimum(gam_t[None, :] - gam_h[:, None], 0.0)), 0.0)
        HK_ *= hdec
        HQ *= hdec
        ndec = tl.where(tt[:, None] <= tt[None, :], tl.exp(tl.minimum(gam_t[None, :] - gam_t[:, None], 0.0)), 0.0)
        NK *= ndec
        NQ *= ndec
    # tokens' d, in order: d_t = beta_t (v_t - U_t - history term - earlier tokens' term)
    io = vmask[:, None] & tmask[None, :]
    v_raw = tl.load(v + i * v_r + tt[None, :] * v_t + h * v_h + ov[:, None], mask=io, other=0.0)   # [BV, PADDED_T]
    bt = tl.load(beta + i * be_r + tt * be_t + h, mask=tmask, other=0.0).to(tl.float32)            # [PADDED_T]
    Ub = v_raw.to(tl.float32) - U - tl.dot(d_h, HK_, input_precision=DOT)
    NK = tl.where(tt[:, None] < tt[None, :], NK, 0.0)                                       # strictly earlier
    Dt = tl.zeros([BV, PADDED_T], dtype=tl.float32)
    O = R + tl.dot(d_h, HQ, input_precision=DOT)
    for t in tl.static_range(T):
        col = (tt == t)[None, :]
        nk_t = tl.sum(tl.where(col, NK, 0.0), axis=1)                                       # [PADDED_T] over s
        u_t = tl.sum(tl.where(col, Ub, 0.0), axis=1) - tl.sum(Dt * nk_t[None, :], axis=1)
        b_t = tl.sum(tl.where(tt == t, bt, 0.0), axis=0)
        d_t = b_t * u_t                                                                     # [BV]
        Dt = tl.where(col, d_t[:, None], Dt)
        # token t's term in every output (no tl.dot over PADDED_T: its K dimension would be T padded)
        O += d_t[:, None] * tl.sum(tl.where((tt == t)[:, None], NQ, 0.0), axis=0)[None, :]
    if HAS_QS:
        O *= scale * tl.load(qs + i * qs_r + tt * qs_t + hk * qs_h, mask=tmask, other=0.0)[None, :]
    else:
        O *= scale
    tl.store(out + i * o_r + tt[None, :] * o_t + h * o_h + ov[:, None], tl.where(valid, O,
                                                                                 0.0).to(out.dtype.element_ty),
             mask=io & (active | ~valid))
    tl.store(rd + tpos[None, :] * V + ov[:, None], Dt, mask=io & active)
    tl.store(rv + tpos[None, :] * V + ov[:, None], v_raw, mask=io & active)
    tl.store(rbeta + tpos, bt, mask=tmask & active & (pid_v == 0))
    if not PER_CHANNEL:
        tl.store(rg + tpos, g_tok, mask=tmask & active & (pid_v == 0))
    if FOLD:
        if valid & is_flush:
            # the flush row's history folds (the decode's fold without a token): the history's d and gates are read
            # again, and the state in small chunks, not pipelined (mostly from L2), so that the fold holds no
            # registers during the stream above (pipelined, its buffers cost the verify without flush rows shared
            # memory and registers: docs/kernel-design.md)
            d_f = tl.load(rd + pos[:, None] * V + ov[None, :], mask=hist[:, None] & vmask[None, :],
                          other=0.0)                                                          # [BM, BV]
            if PER_CHANNEL:
                dec_f, top_f = hist, 1.0                                                      # re-read per chunk
            else:
                g_f = tl.load(rg + pos, mask=hist, other=0.0)                                 # [BM]
                g_e = tl.sum(g_f, axis=0)                                                     # the history's Γ_e
                dec_f, top_f = tl.where(hist, tl.exp(g_e - tl.cumsum(g_f, axis=0)), 0.0), tl.exp(g_e)
            no_token = tl.zeros([BV], dtype=tl.float32)                                     # TOKEN=False
            _fold_rows(ckpt + sl * c_s + h * c_h, c_k, c_v, rk, rg, pos, hist, k, g, d_f, no_token, dec_f, top_f,
                       ov, vmask, h, sr_base, tl.load(epoch_ptr + sl), K, V, 16, 1, PER_CHANNEL, CKPT_FMT, DOT,
                       False)
