"""Cursor moves in Triton, one launch each; the reference is ``replayssm.ring`` (bit-exact). And the
slot copy (``copy_slots``): a slot's side buffers and checkpoint into another slot, every layer in one
launch; the reference is ``StatePool.copy`` on the reference backend (``index_copy_``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def flush_rule(count, T: tl.constexpr, window):
    """Whether a row holding ``count`` committed entries flushes at a step of ``T`` tokens (RING.md).

    ``T = 0`` is a flush-only launch (``StatePool.flush`` on the device): every row with committed
    entries flushes."""
    if T == 0:
        return count > 0
    else:
        return count + T >= window


@triton.jit
def in_pool(slot, num_slots):
    """Whether a loaded slot index is a row of the pool, ``0 <= slot < num_slots``: -1 (padding) and
    any index outside the pool are padded rows, which read and write nothing of the pool."""
    return (slot >= 0) & (slot < num_slots)


@triton.jit
def row_route(slots, i, num_slots, count_ptr, T: tl.constexpr, window):
    """A step's row: ``(valid, slot or 0 for a padded row, count, is_flush)``; a slot outside
    ``[0, num_slots)`` is a padded row (:func:`in_pool`)."""
    slot = tl.load(slots + i)
    valid = in_pool(slot, num_slots)
    sl = tl.where(valid, slot, 0)
    count = tl.load(count_ptr + sl)
    return valid, sl, count, flush_rule(count, T, window)


@triton.jit
def flush_row_block(slots, num_slots, count_ptr, n, r0, base, T: tl.constexpr, window, SCAN_ROWS: tl.constexpr):
    """Rows ``r0 .. r0 + SCAN_ROWS`` of a step's ``n``, for a flush pass that takes only the flush rows:
    ``(rows [SCAN_ROWS], is_flush [SCAN_ROWS], rank [SCAN_ROWS], flush rows in the block)``. ``rank``: a flush row's
    index among the step's flush rows, in row order (``base``: the flush rows before ``r0``). A
    padded row (:func:`in_pool`) never flushes."""
    r = r0 + tl.arange(0, SCAN_ROWS)
    slot = tl.load(slots + r, mask=r < n, other=-1)
    ok = in_pool(slot, num_slots)
    count = tl.load(count_ptr + tl.where(ok, slot, 0), mask=ok, other=0)
    fl = ok & flush_rule(count, T, window)
    f = fl.to(tl.int32)
    return r, fl, base + tl.cumsum(f, axis=0) - f, tl.sum(f, axis=0)


@triton.jit
def program_ranks(base, nf, rp, ROW_PROGRAMS: tl.constexpr):
    """The flush ranks of a :func:`flush_row_block` that program ``rp`` of ``ROW_PROGRAMS`` takes (those equal
    to ``rp`` mod ``ROW_PROGRAMS``), as ``tl.range`` bounds ``(first, end)``, step ``ROW_PROGRAMS``."""
    return base + (rp - base % ROW_PROGRAMS + ROW_PROGRAMS) % ROW_PROGRAMS, base + nf


@triton.jit
def flush_row_of_rank(rows, fl, rank, kf, slots, count_ptr, origin_ptr):
    """The flush row of rank ``kf`` in a :func:`flush_row_block`: ``(row, slot, count, origin)``."""
    i = tl.sum(tl.where(fl & (rank == kf), rows, 0), axis=0)
    sl = tl.load(slots + i)
    return i, sl, tl.load(count_ptr + sl), tl.load(origin_ptr + sl)


@triton.jit
def _advance_kernel(count_ptr, origin_ptr, pending_ptr, epoch_ptr, slots, n, num_slots,
                    T, window, capacity, COMMITTED: tl.constexpr, BLOCK: tl.constexpr):
    # one layer's cursors [S + 1]; padded rows (slot -1 or outside the pool) are skipped
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.load(slots + i, mask=i < n, other=-1)
    m = in_pool(s, num_slots)
    s = tl.where(m, s, num_slots)
    count = tl.load(count_ptr + s, mask=m, other=0)
    origin = tl.load(origin_ptr + s, mask=m, other=0)
    epoch = tl.load(epoch_ptr + s, mask=m, other=0)
    flush = (count + T >= window) | ((T == 0) & (count > 0))       # T = 0: a flush-only launch
    if COMMITTED:
        folded = count + T
        new_count = tl.where(flush, 0, count + T)
    else:
        folded = count
        new_count = tl.where(flush, 0, count)
        tl.store(pending_ptr + s, tl.zeros_like(count) + T, mask=m)
    moved = tl.where(T == 0, 0, (origin + folded) % capacity)     # a flush-only launch resets, as the host
    tl.store(origin_ptr + s, tl.where(flush, moved, origin), mask=m)
    tl.store(epoch_ptr + s, epoch + flush.to(tl.int32), mask=m)
    tl.store(count_ptr + s, new_count, mask=m)


# the advance kernel itself, for hosts that compile it ahead of time (its name is the PTX entry)
ADVANCE_KERNEL = _advance_kernel


@triton.jit
def _commit_kernel(count_ptr, pending_ptr, layer_stride, slots, num_slots, num_accepted, n, BLOCK: tl.constexpr):
    # cursors [NL, S + 1]; program (block, layer); padded rows (slot -1 or outside the pool) are skipped.
    # A count outside [0, pending] (a host's bad value, a commit without a verify or a second commit)
    # keeps the nearest end: count never drops below its committed entries nor takes a token the
    # verify did not append, so a ring position never leaves [0, C)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    layer = tl.program_id(1)
    s = tl.load(slots + i, mask=i < n, other=-1)
    m = in_pool(s, num_slots)
    pending = tl.load(pending_ptr + layer * layer_stride + s, mask=m, other=0)
    acc = tl.load(num_accepted + i, mask=m, other=0)
    acc = tl.minimum(tl.maximum(acc, 0), pending.to(acc.dtype)).to(tl.int32)
    c = count_ptr + layer * layer_stride + s
    tl.store(c, tl.load(c, mask=m, other=0) + acc, mask=m)
    tl.store(pending_ptr + layer * layer_stride + s, tl.zeros_like(acc), mask=m)


def advance(cursors: dict, layer: int, slots, num_tokens: int, window: int, capacity: int, *,
            committed: bool) -> None:
    """Move one layer's cursors after a step (in place); same semantics as ``replayssm.ring.advance``."""
    n = slots.numel()
    num_slots = cursors["count"].shape[1] - 1
    BLOCK = 128
    _advance_kernel[(triton.cdiv(n, BLOCK),)](
        cursors["count"][layer], cursors["origin"][layer], cursors["pending"][layer], cursors["epoch"][layer],
        slots, n, num_slots, num_tokens, window, capacity, COMMITTED=committed, BLOCK=BLOCK)


def commit(cursors: dict, slots, num_accepted) -> None:
    """Keep ``num_accepted`` pending tokens in every layer (in place); as ``replayssm.ring.commit``."""
    n = slots.numel()
    count = cursors["count"]
    BLOCK = 128
    _commit_kernel[(triton.cdiv(n, BLOCK), count.shape[0])](
        count, cursors["pending"], count.stride(0), slots, count.shape[1] - 1, num_accepted, n, BLOCK=BLOCK)


@triton.jit
def _copy_words(buf, layer_stride, W: tl.constexpr, BW: tl.constexpr, layer, s, d, part, PARTS: tl.constexpr):
    # one layer of a buffer [NL, S', W] int32 words: slot s's W words into slot d, this program's
    # blocks of BW words (part, part + PARTS, ...); nothing for W = 0 (an unused buffer argument)
    if W > 0:
        base = buf + layer * layer_stride
        for start in tl.range(part * BW, W, PARTS * BW):
            o = start + tl.arange(0, BW)
            m = o < W
            tl.store(base + d * W + o, tl.load(base + s * W + o, mask=m), mask=m)


@triton.jit
def _copy_strided(ckpt, c_l, c_s, c_h, c_a, c_b, CH: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr,
                  BW: tl.constexpr, layer, s, d, part, PARTS: tl.constexpr):
    # one layer of a checkpoint [NL, S, CH, CA, CB] (any strides, its own dtype): slot s into slot d
    E: tl.constexpr = CH * CA * CB
    base = ckpt + layer * c_l
    for start in tl.range(part * BW, E, PARTS * BW):
        e = start + tl.arange(0, BW)
        m = e < E
        off = (e // (CA * CB)) * c_h + ((e // CB) % CA) * c_a + (e % CB) * c_b
        tl.store(base + d * c_s + off, tl.load(base + s * c_s + off, mask=m), mask=m)


@triton.jit
def _copy_slots_kernel(
    src, dst, n, num_slots, layer0,            # [n] int64 rows; a row outside [0, num_slots) in either is padded
    b0, l0, b1, l1, b2, l2, b3, l3, b4, l4, b5, l5,          # side buffers [NL, S', W] as int32 words,
    b6, l6, b7, l7, b8, l8, b9, l9, b10, l10, b11, l11,      # each with its layer stride in words
    ckpt, c_l, c_s, c_h, c_a, c_b,                           # checkpoint [NL, S, CH, CA, CB] (HAS_CKPT)
    W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, W4: tl.constexpr,
    W5: tl.constexpr, W6: tl.constexpr, W7: tl.constexpr, W8: tl.constexpr, W9: tl.constexpr,
    W10: tl.constexpr, W11: tl.constexpr,                    # words per slot (0: no buffer)
    BW: tl.constexpr, HAS_CKPT: tl.constexpr, CH: tl.constexpr, CA: tl.constexpr, CB: tl.constexpr,
    PARTS: tl.constexpr, SCAN_ROWS: tl.constexpr,
):
    # program (part, layer): its share of every buffer of one layer, for each row to copy. The rows
    # are found by a scan of the step's slots (a masked copy, as SGLang's track copy, is mostly
    # padded rows: the grid does not grow with them)
    part = tl.program_id(0)
    layer = (layer0 + tl.program_id(1)).to(tl.int64)
    for r0 in tl.range(0, n, SCAN_ROWS):
        r = r0 + tl.arange(0, SCAN_ROWS)
        s = tl.load(src + r, mask=r < n, other=-1)
        d = tl.load(dst + r, mask=r < n, other=-1)
        ok = in_pool(s, num_slots) & in_pool(d, num_slots)
        f = ok.to(tl.int32)
        rank = tl.cumsum(f, axis=0) - f
        for j in tl.range(0, tl.sum(f, axis=0)):
            pick = ok & (rank == j)
            sj = tl.sum(tl.where(pick, s, 0), axis=0)
            dj = tl.sum(tl.where(pick, d, 0), axis=0)
            _copy_words(b0, l0, W0, BW, layer, sj, dj, part, PARTS)
            _copy_words(b1, l1, W1, BW, layer, sj, dj, part, PARTS)
            _copy_words(b2, l2, W2, BW, layer, sj, dj, part, PARTS)
            _copy_words(b3, l3, W3, BW, layer, sj, dj, part, PARTS)
            _copy_words(b4, l4, W4, BW, layer, sj, dj, part, PARTS)
            _copy_words(b5, l5, W5, BW, layer, sj, dj, part, PARTS)
            _copy_words(b6, l6, W6, BW, layer, sj, dj, part, PARTS)
            _copy_words(b7, l7, W7, BW, layer, sj, dj, part, PARTS)
            _copy_words(b8, l8, W8, BW, layer, sj, dj, part, PARTS)
            _copy_words(b9, l9, W9, BW, layer, sj, dj, part, PARTS)
            _copy_words(b10, l10, W10, BW, layer, sj, dj, part, PARTS)
            _copy_words(b11, l11, W11, BW, layer, sj, dj, part, PARTS)
            if HAS_CKPT:
                _copy_strided(ckpt, c_l, c_s, c_h, c_a, c_b, CH, CA, CB, BW, layer, sj, dj, part, PARTS)


# side buffers one copy launch takes (a pool has at most 12: 5 ring, 3 read copy, 4 cursor fields)
COPY_BUFFERS = 12


def copy_slots(buffers: list, checkpoint, src, dst, num_slots: int, layer) -> None:
    """Copy slot ``src[i]`` into slot ``dst[i]`` in ``buffers`` (each ``[NL, S or S + 1, ...]``,
    contiguous, a multiple of 4 bytes per slot) and ``checkpoint`` (``[NL, S, a, b, c]``, any
    strides, or None), in ``layer`` or every layer (None), in one launch; a row with either slot
    outside ``[0, num_slots)`` is skipped. The caller's ``dst`` are distinct and disjoint from
    ``src``."""
    if len(buffers) > COPY_BUFFERS:
        raise ValueError(f"buffers: a copy takes at most {COPY_BUFFERS} side buffers, got {len(buffers)}")
    n = src.numel()
    layers = buffers[0].shape[0] if layer is None else 1
    if n == 0 or layers == 0:
        return
    words, args, consts = [], {}, {}
    for i in range(COPY_BUFFERS):
        if i < len(buffers):
            b = buffers[i]
            per_slot = b[0, 0].numel() * b.element_size()
            if per_slot % 4 or not b.is_contiguous():
                raise ValueError(f"buffers[{i}]: expected a contiguous buffer of a multiple of 4 bytes per slot, got "
                                 f"{per_slot} bytes, strides {b.stride()}")
            w = b.view(b.shape[0], b.shape[1], -1).view(torch.uint8).view(torch.int32)
            args[f"b{i}"], args[f"l{i}"], consts[f"W{i}"] = w, w.stride(0), per_slot // 4
            words.append(per_slot // 4)
        else:
            args[f"b{i}"], args[f"l{i}"], consts[f"W{i}"] = src, 0, 0
    if checkpoint is not None:
        # the checkpoint's dims in memory order (innermost last), so that its loads are coalesced
        order = sorted(range(2, 5), key=lambda k: -checkpoint.stride(k))
        ck = checkpoint.permute(0, 1, *order)
        args.update(ckpt=ck, c_l=ck.stride(0), c_s=ck.stride(1), c_h=ck.stride(2), c_a=ck.stride(3),
                    c_b=ck.stride(4))
        consts.update(HAS_CKPT=True, CH=ck.shape[2], CA=ck.shape[3], CB=ck.shape[4])
        words.append(ck[0, 0].numel())
    else:
        args.update(ckpt=src, c_l=0, c_s=0, c_h=0, c_a=0, c_b=0)
        consts.update(HAS_CKPT=False, CH=1, CA=1, CB=1)
    BW = 1024
    parts = max(1, min(64, triton.cdiv(max(words), 4 * BW)))
    _copy_slots_kernel[(parts, layers)](
        src=src, dst=dst, n=n, num_slots=num_slots, layer0=0 if layer is None else layer, **args, **consts,
        BW=BW, PARTS=parts, SCAN_ROWS=128, num_warps=4)
