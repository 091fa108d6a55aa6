"""Cursor moves in Triton, one launch each; the reference is ``replayssm.ring`` (bit-exact)."""

from __future__ import annotations

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
    # cursors [NL, S + 1]; program (block, layer); padded rows (slot -1 or outside the pool) are skipped
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    layer = tl.program_id(1)
    s = tl.load(slots + i, mask=i < n, other=-1)
    m = in_pool(s, num_slots)
    acc = tl.load(num_accepted + i, mask=m, other=0).to(tl.int32)
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
