"""Triton helpers for the precision formats; the PyTorch reference is ``replayssm.formats``.

Every helper computes bit-for-bit what the reference computes on the same fp32 input
(rounding, scale arithmetic, stochastic-rounding bits), so a read copy or checkpoint written
by a kernel equals one written by the reference. Divisions of tensors are ``div_rn`` (IEEE, as
PyTorch's): Triton's ``/`` on fp32 is the approximate ``div.full.f32`` on NVIDIA GPUs (exact only in
the interpreter), which moved codes across rounding boundaries on the H200. The row scale is a
product with an fp32 reciprocal on both sides (PyTorch on CUDA divides by a scalar that way).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.kernels.formats.codes import CKPT_CODES, READ_CODES

# the read and checkpoint format codes (``codes.py``) as kernel constants
READ_CHECKPOINT, READ_FP8, READ_NVFP4 = (tl.constexpr(v) for v in READ_CODES.values())
CKPT_FP32, CKPT_BF16, CKPT_FP16_SR = (tl.constexpr(v) for v in CKPT_CODES.values())


@triton.jit
def mix32(x):
    """lowbias32 on uint32 (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def sr_uniform(sr_base, epoch, index):
    """Uniform [0, 1) draws: ``sr_base`` = mix32(seed + 0x9E3779B9 (layer + 1)), index uint32."""
    h = mix32(tl.cast(sr_base, tl.uint32) ^ epoch.to(tl.uint32))
    bits = mix32(h ^ index.to(tl.uint32))
    return (bits >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def fp16_stochastic_round(x, u):
    """fp32 -> fp16, up (away from zero) with probability equal to the fraction; saturating."""
    a = tl.minimum(tl.abs(x), 65504.0)
    h = a.to(tl.float16)
    hb = h.to(tl.int16, bitcast=True).to(tl.int32)
    hb = tl.where(h.to(tl.float32) > a, hb - 1, hb)
    lo = hb.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    up = tl.minimum(hb + 1, 0x7BFF)
    hi = up.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    gap = hi - lo
    # gap is a power of two (adjacent fp16 values, 2^-24 <= gap <= 32) or 0 at the saturation bound:
    # its reciprocal is exact from the exponent bits, and (a - lo) / gap = (a - lo) * (1 / gap) exactly
    inv_gap = ((254 - (gap.to(tl.int32, bitcast=True) >> 23)) << 23).to(tl.float32, bitcast=True)
    p = tl.where(gap > 0, (a - lo) * inv_gap, 0.0)
    hb = tl.where(u < p, up, hb)
    hb = tl.where(x < 0, hb | 0x8000, hb)
    out = hb.to(tl.int16).to(tl.float16, bitcast=True)
    return tl.where(x != x, x.to(tl.float16), out)


@triton.jit
def tf32_split(x):
    """fp32 ``x`` as ``hi + lo``, two tf32 operands: ``hi`` its top 10 mantissa bits (the low 13
    cleared, exact), ``lo`` the remainder rounded to nearest tf32. Against an operand that tf32 holds
    exactly (16-bit values, read-copy values), the two tf32 products over ``hi`` and ``lo`` carry
    ``tf32x3``'s precision in two passes instead of three and without its operand splits."""
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    lo = x - hi                                                                          # exact
    return hi, ((lo.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def dot_fp32(a, b, acc, A_EXACT: tl.constexpr, B_EXACT: tl.constexpr, DOT: tl.constexpr):
    """``acc + a b`` for fp32 ``a [M, K]``, ``b [K, N]``, ``acc [M, N]`` at precision ``DOT``.

    With ``DOT = "tf32x3"`` (fp32-accurate on tensor cores), operands that tf32 holds exactly
    (``A_EXACT`` / ``B_EXACT``: 16-bit values, read-copy values) take fewer passes: both exact, one
    tf32 product; one exact, two over the other's :func:`tf32_split`; neither, ``tf32x3``'s three.
    Other precisions ("ieee", "tf32") pass through."""
    if DOT != "tf32x3":
        return tl.dot(a, b, acc=acc, input_precision=DOT)
    elif A_EXACT and B_EXACT:
        return tl.dot(a, b, acc=acc, input_precision="tf32")
    elif A_EXACT:
        b_hi, b_lo = tf32_split(b)
        return tl.dot(a, b_lo, acc=tl.dot(a, b_hi, acc=acc, input_precision="tf32"), input_precision="tf32")
    elif B_EXACT:
        a_hi, a_lo = tf32_split(a)
        return tl.dot(a_lo, b, acc=tl.dot(a_hi, b, acc=acc, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a, b, acc=acc, input_precision="tf32x3")


@triton.jit
def bf16_round(x):
    """fp32 -> bf16, nearest-even, with integer arithmetic (every target rounds alike). A NaN stays a
    NaN (0x7FC0): the carry would take one with high mantissa bits (the GPU's 0x7FFFFFFF) to a zero."""
    b = x.to(tl.uint32, bitcast=True)
    r = b + 0x7FFF + ((b >> 16) & 1)
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, r)
    return (r >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e4m3_encode(x):
    """fp32 (|x| <= 448) -> e4m3fn bits as int32, nearest-even, saturating at 448.

    Integer arithmetic, so every target (and Triton's interpreter) rounds alike.
    """
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    E = (a >> 23) - 127
    sig = (a & 0x7FFFFF) | 0x800000
    normal = E >= -6
    shift = tl.where(normal, 20, tl.minimum(14 - E, 30))      # keep 3 bits, or units of 2^-9
    q = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = tl.where(normal, ((E + 7) << 3) + (q - 8), q)       # a carry into the exponent is exact
    return tl.minimum(code, 0x7E) | sign


@triton.jit
def e4m3_decode(code):
    """e4m3fn bits (int32 or uint8) -> fp32."""
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_encode(q):
    """fp32 (already scaled, |q| <= 6) -> e2m1 codes as uint8, nearest, ties to even code.

    The magnitude maps exactly onto a unit grid of its code group (``[0, 2)``: 2m, codes 0-4;
    ``[2, 4)``: m - 2, codes 4-6; ``[4, 6]``: (m - 4) / 2, codes 6-7); adding 2^23 rounds that to
    an integer, nearest even, which is the low bits of the sum: the reference's threshold ladder
    (``replayssm.formats.e2m1_encode``) in a few operations."""
    m = tl.abs(q)
    lo = m < 2.0
    mid = m < 4.0
    y = tl.where(lo, m * 2.0, tl.where(mid, m - 2.0, (m - 4.0) * 0.5))
    r = (y + 8388608.0).to(tl.int32, bitcast=True) & 7
    code = r + tl.where(lo, 0, tl.where(mid, 4, 6))
    return (code | ((q < 0).to(tl.int32) << 3)).to(tl.uint8)


@triton.jit
def e2m1_decode(code):
    """e2m1 codes (int32 0..15) -> fp32 with integer ops."""
    s = (code >> 3) & 1
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * (1 << tl.maximum(e - 1, 0)).to(tl.float32))
    return tl.where(s == 1, -mag, mag)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def abs_max(x, axis: tl.constexpr):
    """Largest magnitude of ``x`` along ``axis``; NaN where the values hold a NaN, as ``torch.amax``
    (``tl.max`` skips NaNs, on the GPU and in the interpreter). A read-copy row's scale is taken from
    it, so a NaN in the state decodes as a NaN row, not as finite values."""
    return tl.reduce(tl.abs(x), axis, _max_nan)


@triton.jit
def row_scale_of(amax_r, EMAX: tl.constexpr):
    """fp32 row scale of read-copy rows whose absolute maxima are ``amax_r``."""
    return amax_r * (1.0 / (EMAX * 448.0))


@triton.jit
def quantize_rows(x, amax_r, FMT: tl.constexpr, EMAX: tl.constexpr, R: tl.constexpr, COLS: tl.constexpr):
    """Encode ``x [R, COLS]`` fp32 rows whose absolute maxima are ``amax_r [R]``; EMAX: 448 for
    fp8, 6 for nvfp4. Returns ``(codes [R, COLS] or [R, COLS/2] bytes, block_scale
    bytes [R, COLS/16], row_scale fp32 [R])``."""
    xb = tl.reshape(x, (R, COLS // 16, 16))
    amax_b = tl.max(tl.abs(xb), axis=2)
    row_scale = row_scale_of(amax_r, EMAX)
    safe_row = tl.where(row_scale > 0, row_scale, 1.0)
    block_scale = e4m3_encode(tl.minimum(tl.math.div_rn(amax_b, tl.broadcast_to(EMAX * safe_row[:, None],
                                                                                amax_b.shape)), 448.0)).to(tl.uint8)
    denom = e4m3_decode(block_scale) * row_scale[:, None]
    inv = tl.where(denom > 0, tl.math.div_rn(tl.full(denom.shape, 1.0, tl.float32), tl.where(denom > 0, denom, 1.0)),
                   0.0)                                   # one IEEE division per block
    q = xb * inv[:, :, None]
    q = tl.reshape(tl.minimum(tl.maximum(q, -EMAX), EMAX), (R, COLS))
    if FMT == READ_FP8:
        codes = e4m3_encode(q).to(tl.uint8)
    else:
        c = tl.reshape(e2m1_encode(q).to(tl.int32), (R, COLS // 2, 2))
        even, odd = tl.split(c)
        codes = (even | (odd << 4)).to(tl.uint8)
    return codes, block_scale, row_scale


@triton.jit
def dequantize_rows(codes, block_scale, row_scale, FMT: tl.constexpr, R: tl.constexpr, COLS: tl.constexpr):
    """Decode a read-copy tile to fp32 ``[R, COLS]``; codes ``[R, COLS]`` (fp8) or ``[R, COLS/2]``
    bytes, block scales as bytes."""
    if FMT == READ_FP8:
        q = e4m3_decode(codes)
    else:
        c = codes.to(tl.int32)
        q = tl.reshape(tl.join(e2m1_decode(c & 15), e2m1_decode(c >> 4)), (R, COLS))
    qb = tl.reshape(q, (R, COLS // 16, 16))
    x = qb * e4m3_decode(block_scale)[:, :, None] * row_scale[:, None, None]
    return tl.reshape(x, (R, COLS))


@triton.jit
def load_read_copy(codes_ptr, bs_ptr, rs_ptr, rows, row_mask, FMT: tl.constexpr, R: tl.constexpr,
                   COLS: tl.constexpr, CODE_STRIDE: tl.constexpr, BS_STRIDE: tl.constexpr):
    """Load and decode ``COLS`` columns of rows ``rows [R]`` of a read copy; fp32 ``[R, COLS]``.

    ``codes_ptr`` / ``bs_ptr`` point at the first column of row 0 (codes: bytes, one per column for
    fp8, two columns per byte for nvfp4; block scales: one byte per 16 columns); rows are
    ``CODE_STRIDE`` / ``BS_STRIDE`` bytes apart. ``rs_ptr`` holds one fp32 scale per row.
    """
    if FMT == READ_FP8:
        oc = tl.arange(0, COLS)
    else:
        oc = tl.arange(0, COLS // 2)
    # fp8 buffers move as bytes (masked lanes read 0)
    codes = tl.load(codes_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * CODE_STRIDE + oc[None, :],
                    mask=row_mask[:, None], other=0)
    ob = tl.arange(0, COLS // 16)
    bs = tl.load(bs_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * BS_STRIDE + ob[None, :],
                 mask=row_mask[:, None], other=0)
    rs = tl.load(rs_ptr + rows, mask=row_mask, other=0.0)
    return dequantize_rows(codes, bs, rs, FMT, R, COLS)


@triton.jit
def load_read_words(codes_ptr, bs_ptr, rows, row_mask, c, COLS: tl.constexpr, CW: tl.constexpr,
                    CHUNK: tl.constexpr, PW: tl.constexpr, CHUNK_WORDS: tl.constexpr):
    """Chunk ``c`` (columns ``[c CHUNK, (c + 1) CHUNK)``) of rows ``rows [R]`` of a read copy as 32-bit words.

    Returns ``(words int32 [R, CHUNK_WORDS], block scales fp32 [R, CHUNK_WORDS])``: word j < CHUNK / PW holds the
    ``PW`` columns ``c CHUNK + j PW + w`` (w < PW; PW = 4 for fp8, 8 for nvfp4), read with
    :func:`word_values`; its block scale is the one of all of them (16 divides every word's
    first column), times 2^14 for nvfp4, whose word values come as e2m1 x 2^-14. ``CHUNK_WORDS >= CHUNK / PW``
    pads the tile with zero words (tl.dot needs 16).
    Pointers as in :func:`load_read_copy`, rows ``CW`` code bytes apart. Word loads are 4-byte
    aligned (a row's code bytes are a multiple of 4), so they pipeline.
    """
    jw = tl.arange(0, CHUNK_WORDS)
    mask = row_mask[:, None]
    if CHUNK_WORDS > CHUNK // PW:
        mask = mask & (jw < CHUNK // PW)[None, :]
    words = tl.load(codes_ptr.to(tl.pointer_type(tl.int32)) + rows[:, None] * (CW // 4) + c * (CHUNK // PW)
                    + jw[None, :], mask=mask, other=0)
    bs = tl.load(bs_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * (COLS // 16)
                 + ((c * CHUNK + jw * PW) // 16)[None, :], mask=mask, other=0)
    if PW == 8:
        return words, e4m3_decode(bs) * 16384.0
    return words, e4m3_decode(bs)


# fp16 sign and e2m1 magnitude bits of two nibbles 16 bits apart, as int32 (0x80008000, 0x0E000E00)
_PAIR_SIGN = tl.constexpr(0x80008000 - (1 << 32))
_PAIR_MAG = tl.constexpr(0x0E000E00)


@triton.jit
def word_values(words, w: tl.constexpr, FMT: tl.constexpr):
    """Element ``w`` of every word of :func:`load_read_words` as fp32 (block and row scales not
    applied); with the checkpoint as the read format the tile holds values (one per word).

    nvfp4: e2m1 x 2^-14 (the block scales of :func:`load_read_words` carry the 2^14). A nibble's
    sign and 3 magnitude bits placed as fp16 bits ``s.eee.m`` (exponent field e2m1's exponent,
    top mantissa bit m) are e2m1's value times 2^-14 exactly, subnormals included. Nibbles w and
    w + 4 lie 16 bits apart, so one shift and two masks place both as the two halves of an int32;
    the unrolled loops over w share that pair (common subexpressions), then each half converts."""
    if FMT == READ_CHECKPOINT:
        return words.to(tl.float32)            # checkpoint values, one per "word"
    elif FMT == READ_FP8:
        return e4m3_decode(words >> (8 * w))
    else:
        y = words >> (4 * (w % 4))
        pair = ((y << 12) & _PAIR_SIGN) | ((y << 9) & _PAIR_MAG)
        if w >= 4:
            pair = pair >> 16
        return pair.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def word_element(factors, w: tl.constexpr, PW: tl.constexpr):
    """Column ``w`` of ``factors [CHUNK / PW, PW]`` (a chunk's per-channel factors reshaped so that
    ``[j, w]`` is channel ``j PW + w``): ``[CHUNK / PW]``, the factor of element ``w`` of every word of
    :func:`load_read_words`, picked in registers from factors loaded on contiguous channels."""
    return tl.sum(tl.where(tl.arange(0, PW)[None, :] == w, factors, 0.0), axis=1)


@triton.jit
def store_read_copy(codes_ptr, bs_ptr, rs_ptr, x, rows, row_mask, FMT: tl.constexpr, EMAX: tl.constexpr,
                    R: tl.constexpr, COLS: tl.constexpr, CW: tl.constexpr, ROWS_FROM_BLOCKS: tl.constexpr):
    """Encode whole rows ``x [R, COLS]`` fp32 and store them as rows ``rows`` of a (slot, head) read
    copy; pointers as in :func:`load_read_copy` with ``CODE_STRIDE = CW``, ``BS_STRIDE = COLS / 16``.

    ``ROWS_FROM_BLOCKS``: the rows' maxima are taken over their block maxima (the same values), so
    that the scale arithmetic runs in the block maxima's layout; where the tile's lanes lie along the
    columns (a ``[V, K]`` tile of a ``[S, HV, V, K]`` checkpoint) it otherwise runs in the tile's,
    every block's division repeated in each lane of its row."""
    if ROWS_FROM_BLOCKS:
        amax = abs_max(abs_max(tl.reshape(x, (R, COLS // 16, 16)), 2), 1)
    else:
        amax = abs_max(x, 1)
    store_read_rows_scale(rs_ptr, amax, rows, row_mask, EMAX)
    store_read_chunk(codes_ptr, bs_ptr, x, amax, rows, row_mask, 0, FMT, EMAX, R, COLS, COLS, CW)


@triton.jit
def store_read_rows_scale(rs_ptr, amax_r, rows, row_mask, EMAX: tl.constexpr):
    """Store the row scales of read-copy rows ``rows`` whose absolute maxima are ``amax_r``."""
    tl.store(rs_ptr + rows, row_scale_of(amax_r, EMAX), mask=row_mask)


@triton.jit
def store_read_chunk(codes_ptr, bs_ptr, x, amax_r, rows, row_mask, c, FMT: tl.constexpr, EMAX: tl.constexpr,
                     R: tl.constexpr, CHUNK: tl.constexpr, COLS: tl.constexpr, CW: tl.constexpr):
    """Encode columns ``[c CHUNK, (c + 1) CHUNK)`` of rows ``rows`` (``x [R, CHUNK]`` fp32; whole-row maxima
    ``amax_r [R]``) and store their codes and block scales; the same bytes as encoding whole rows
    (``CHUNK`` a multiple of 16). Row scales: :func:`store_read_rows_scale`."""
    codes, bs, _ = quantize_rows(x, amax_r, FMT, EMAX, R, CHUNK)
    if FMT == READ_FP8:
        oc = c * CHUNK + tl.arange(0, CHUNK)
    else:
        oc = c * (CHUNK // 2) + tl.arange(0, CHUNK // 2)
    tl.store(codes_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * CW + oc[None, :], codes,
             mask=row_mask[:, None])
    ob = c * (CHUNK // 16) + tl.arange(0, CHUNK // 16)
    tl.store(bs_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * (COLS // 16) + ob[None, :], bs,
             mask=row_mask[:, None])


@triton.jit
def round_checkpoint(x, index, sr_base, epoch, FMT: tl.constexpr):
    """fp32 -> stored checkpoint value (fp32, bf16 nearest-even, fp16 stochastic)."""
    if FMT == CKPT_FP32:
        return x
    elif FMT == CKPT_BF16:
        return bf16_round(x)
    else:
        return fp16_stochastic_round(x, sr_uniform(sr_base, epoch, index))


@triton.jit
def _store_checkpoint_kernel(
    state, s_r, s_h, s_a, s_b,                 # [r, heads, A, B] fp32, canonical layout
    slots,                                     # [r] int64
    ckpt, c_s, c_h, c_a, c_b,                  # [S, heads, A, B] checkpoint of one layer
    codes, block_scale, row_scale,             # read copy of one layer, contiguous [S, heads, rows, ...]
    epoch, sr_base,                            # [S + 1] int32; uint32 scalar
    HEADS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, BR: tl.constexpr,
    IS_DELTA: tl.constexpr, CKPT_FMT: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr,
    CODE_MAX: tl.constexpr, ROWS_FROM_BLOCKS: tl.constexpr,
):
    # Read layout [rows, cols]: Mamba-2 [P, N] = canonical; delta [V, K] = canonical [K, V] transposed.
    pid_r, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)   # r rows: 64-bit offsets
    slot = tl.load(slots + i)
    ep = tl.load(epoch + slot)
    rows = pid_r * BR + tl.arange(0, BR)
    cols = tl.arange(0, COLS)
    rmask = rows < ROWS
    if IS_DELTA:
        off_a, off_b = cols[None, :], rows[:, None]       # a = k (col), b = v (row)
        index = h * (ROWS * COLS) + cols[None, :] * ROWS + rows[:, None]
    else:
        off_a, off_b = rows[:, None], cols[None, :]       # a = p (row), b = n (col)
        index = h * (ROWS * COLS) + rows[:, None] * COLS + cols[None, :]
    x = tl.load(state + i * s_r + h * s_h + off_a * s_a + off_b * s_b, mask=rmask[:, None], other=0.0)
    stored = round_checkpoint(x, index, sr_base, ep, CKPT_FMT)
    tl.store(ckpt + slot * c_s + h * c_h + off_a * c_a + off_b * c_b, stored, mask=rmask[:, None])
    if READ_FMT != READ_CHECKPOINT:
        head = (slot * HEADS + h) * ROWS
        store_read_copy(codes + head * ROW_CODE_BYTES, block_scale + head * (COLS // 16), row_scale + head,
                        stored.to(tl.float32), rows, rmask, READ_FMT, CODE_MAX, BR, COLS, ROW_CODE_BYTES,
                        ROWS_FROM_BLOCKS)


@triton.jit
def _refresh_read_copy_kernel(
    ckpt, c_s, c_h, c_a, c_b,                  # [S, heads, A, B] checkpoint of one layer (any strides)
    slots,                                     # [r] int64, slots of the pool; -1 = padding
    codes, block_scale, row_scale,             # read copy of one layer, contiguous [S, heads, rows, ...]
    num_slots,                                 # S
    HEADS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, BR: tl.constexpr,
    IS_DELTA: tl.constexpr, READ_FMT: tl.constexpr, ROW_CODE_BYTES: tl.constexpr, CODE_MAX: tl.constexpr,
    ROWS_FROM_BLOCKS: tl.constexpr,
):
    # program (row tile, head, slot): BR read rows of one (slot, head), re-encoded from the stored
    # checkpoint; read layout [rows, cols] as in _store_checkpoint_kernel. A padded slot's programs
    # (-1 or any slot outside [0, S)) return at once (a masked refresh of a batch is mostly padded rows)
    pid_r, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i)
    if (slot < 0) | (slot >= num_slots):
        return
    rows = pid_r * BR + tl.arange(0, BR)
    cols = tl.arange(0, COLS)
    rmask = rows < ROWS
    if IS_DELTA:
        off_a, off_b = cols[None, :], rows[:, None]       # a = k (col), b = v (row)
    else:
        off_a, off_b = rows[:, None], cols[None, :]       # a = p (row), b = n (col)
    x = tl.load(ckpt + slot * c_s + h * c_h + off_a * c_a + off_b * c_b, mask=rmask[:, None], other=0.0)
    head = (slot * HEADS + h) * ROWS
    store_read_copy(codes + head * ROW_CODE_BYTES, block_scale + head * (COLS // 16), row_scale + head,
                    x.to(tl.float32), rows, rmask, READ_FMT, CODE_MAX, BR, COLS, ROW_CODE_BYTES, ROWS_FROM_BLOCKS)
