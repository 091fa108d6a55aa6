"""``torch.ops.replayssm.*`` custom ops and their launchers (argument checks, then the launches
of ``kernels/plan.py``, with the tiles of ``kernels/tiles.py``): the one kernel set every host calls.

| op                          | does                                                        |
|-----------------------------|-------------------------------------------------------------|
| ``mamba2_step``             | Mamba-2 decode / verify step (outputs, ring append, flush)  |
| ``delta_step``              | GDN / KDA decode / verify step                              |
| ``store_checkpoint``        | write fp32 states as checkpoint (+ read copy)               |
| ``refresh_read_copy``       | re-derive read copies from the stored checkpoint            |
| ``advance`` / ``commit``    | cursor moves (ring contract)                                |
| ``copy_slots``              | slots' rings, read copies, cursors (+ checkpoint) into others |
| ``delta_gating``            | GDN / KDA step inputs from a host's raw projections         |

Every op mutates the caller's buffers in place (declared in ``mutates_args``), allocates
nothing, never synchronizes with the host and is CUDA-graph capturable. Checkpoints may have
any strides; ring, read-copy and cursor buffers must be contiguous per slot (asserted, never
copied); inputs must have a contiguous last dimension. The step, advance and commit kernels take a
slot index of -1, or any index outside the pool ``[0, S)``, as a padded row: it reads and writes
nothing of the pool (a step's output row is zero), so a host's bad index never reaches memory outside
the pool. The slots of one launch must be distinct; that is the caller's (``checked=True`` checks it).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton

from replayssm.formats import mix32
from replayssm.kernels.delta.triton import _delta_decode_kernel, _delta_flush_kernel, _delta_verify_kernel
from replayssm.kernels.formats.codes import ReadCode
from replayssm.kernels.formats.triton import _refresh_read_copy_kernel, _store_checkpoint_kernel
from replayssm.kernels.gating.reference import fp32
from replayssm.kernels.gating.triton import _delta_gating_kernel
from replayssm.kernels.mamba2.triton import _mamba2_decode_kernel, _mamba2_flush_kernel, _mamba2_verify_kernel
from replayssm.kernels.plan import Launch, launch, passes
from replayssm.kernels.ring import triton as ring_triton
from replayssm.kernels.tiles import REFRESH_TILES, TILES  # the tables sweeps and tests patch


@functools.lru_cache(maxsize=None)
def sr_base(seed: int, layer: int) -> int:
    """First hash of the stochastic-rounding key (RING.md): mix32(seed + 0x9E3779B9 (layer + 1))."""
    return int(mix32(torch.tensor((seed + 0x9E3779B9 * (layer + 1)) & 0xFFFFFFFF, dtype=torch.int64)))


def _require(name: str, t: torch.Tensor, shape, dtype=None, contiguous: bool = False,
             any_strides: bool = False) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (it is mutated in place, never copied)")
    if not contiguous and not any_strides and t.dim() and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected a contiguous last dimension, got strides {t.stride()}")


def _require_cursors(S: int, n: int, count: torch.Tensor, origin: torch.Tensor, epoch: torch.Tensor,
                     slots: torch.Tensor) -> None:
    """One layer's cursors ``[S + 1]`` int32 for a checkpoint of ``S`` slots and the step's slot
    indices ``[n]`` int64: the kernels take a slot outside ``[0, S)`` as a padded row."""
    for name, t in (("count", count), ("origin", origin), ("epoch", epoch)):
        _require(name, t, (S + 1,), torch.int32, contiguous=True)
    _require("slots", slots, (n,), torch.int64, contiguous=True)


def _require_committed(committed: bool, T: int) -> None:
    if committed and T != 1:
        raise ValueError(f"committed: a committed (decode) step takes one token per row, got T={T}")


def _window_block(capacity: int) -> int:
    """Window entries a Mamba-2 program holds (history and a step's tokens in one block): the ring
    capacity rounded up to a power of two >= 16."""
    return max(16, triton.next_power_of_2(capacity))


def _history_block(capacity: int, window: int, T: int) -> int:
    """Entries a delta program holds, a power of two >= 16: the committed history a flush folds
    (``count <= max(L - 1, T_max)``, RING.md), which also covers a non-flushing decode's history and
    own token (``count + 1 < L``), and a verify's ``T`` tokens. The Mamba-2 kernels hold history
    and tokens in one block instead (``_window_block``).

    ``T_max`` follows from the capacity ``C = max(L - 1, T_max) + T_max``."""
    history = window - 1 if capacity <= 2 * (window - 1) else capacity // 2
    return max(16, triton.next_power_of_2(max(history, capacity - history, T)))


def _strides(t: torch.Tensor, *names: str) -> dict:
    """The leading strides of ``t`` by kernel parameter name (as many as names)."""
    return dict(zip(names, t.stride()))


def _read_consts(read_format: int, cols: int) -> dict:
    """Read-copy code width and element max as kernel constants."""
    fp8 = read_format == ReadCode.FP8
    return dict(ROW_CODE_BYTES=cols if fp8 else cols // 2, CODE_MAX=448.0 if fp8 else 6.0)


def _cols_contiguous(t: torch.Tensor, is_delta: bool) -> bool:
    """Whether the read copy's columns (``a`` = K of a delta ``[.., K, V]`` tensor, ``b`` = N of a
    Mamba-2 ``[.., P, N]`` one) are contiguous in ``t``: a tile loaded from it then lies along the
    columns, and the encode takes the rows' maxima from the block maxima (``store_read_copy``'s
    ``ROWS_FROM_BLOCKS``), so that the block-scale arithmetic is not repeated in every lane of a row."""
    return t.stride(-2 if is_delta else -1) == 1


def _read_buffers(read_codes, read_block_scale, read_row_scale, ref: torch.Tensor, read_format: int):
    """The read-copy buffers a launch takes (``ref`` in their place, never written, for the checkpoint
    as the read format); ValueError unless a read copy's format comes with its three buffers."""
    if read_format == ReadCode.CHECKPOINT:
        return ref, ref, ref
    if read_codes is None:
        raise ValueError("read_codes: a read copy (fp8 / nvfp4) needs its codes, block scales and row scales")
    for name, t in (("read_codes", read_codes), ("read_block_scale", read_block_scale),
                    ("read_row_scale", read_row_scale)):
        if t is None or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor with the other read-copy buffers")
    return read_codes, read_block_scale, read_row_scale


def mamba2_plan(checkpoint: torch.Tensor, read_codes: Optional[torch.Tensor], read_block_scale: Optional[torch.Tensor],
                read_row_scale: Optional[torch.Tensor], ring_x: torch.Tensor, ring_dt: torch.Tensor,
                ring_B: torch.Tensor, count: torch.Tensor, origin: torch.Tensor,
                epoch: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                z: Optional[torch.Tensor], out: torch.Tensor, window: int, committed: bool, checkpoint_format: int,
                read_format: int, sr_base: int) -> list[Launch]:
    """Validated launches of one Mamba-2 step (non-flush pass, flush pass; a decode on the checkpoint
    is one launch); see ``mamba2_step``."""
    S, H, P, N = checkpoint.shape
    n, T = x.shape[:2]
    _require_committed(committed, T)
    G, C_cap = ring_B.shape[1], ring_B.shape[2]
    if G == 0 or H % G:
        raise ValueError(f"ring_B: {H} heads need a group count dividing them, got {G}")
    _require("ring_x", ring_x, (S, H, C_cap, P), contiguous=True)
    _require("ring_dt", ring_dt, (S, H, C_cap), torch.float32, contiguous=True)
    _require("ring_B", ring_B, (S, G, C_cap, N), ring_x.dtype, contiguous=True)
    _require_cursors(S, n, count, origin, epoch, slots)
    _require("x", x, (n, T, H, P), ring_x.dtype)
    _require("dt", dt, (n, T, H))
    _require("B", B, (n, T, G, N), ring_x.dtype)
    _require("C", C, (n, T, G, N))
    _require("out", out, (n, T, H, P))
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            _require(name, t, (H,), torch.float32, contiguous=True)
    if z is not None:
        _require("z", z, (n, T, H, P))
    codes, bs, rs = _read_buffers(read_codes, read_block_scale, read_row_scale, ring_dt, read_format)
    zz = z if z is not None else x
    BM = _window_block(C_cap)
    const = dict(T=T, H=H, G=G, P=P, N=N, BM=BM, COMMITTED=committed, HAS_D=D is not None,
                 HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, CKPT_FMT=checkpoint_format,
                 READ_FMT=read_format, **_read_consts(read_format, N))
    args = dict(ckpt=checkpoint, **_strides(checkpoint, "c_s", "c_h", "c_p", "c_n"), rc_codes=codes, rc_bs=bs,
                rc_rs=rs, ring_x=ring_x, ring_dt=ring_dt, ring_B=ring_B, count_ptr=count, origin_ptr=origin,
                epoch_ptr=epoch, slots=slots, num_slots=S, x=x, **_strides(x, "x_r", "x_t", "x_h"), dt=dt,
                **_strides(dt, "dt_r", "dt_t"), A=A, D=D if D is not None else A,
                dt_bias=dt_bias if dt_bias is not None else A, B=B, **_strides(B, "b_r", "b_t", "b_g"), C=C,
                **_strides(C, "cc_r", "cc_t", "cc_g"), z=zz, **_strides(zz, "z_r", "z_t", "z_h"), out=out,
                **_strides(out, "o_r", "o_t", "o_h"), window=window, capacity=C_cap, sr_base=sr_base)
    return [Launch.by_name("mamba2_step", kernel, (triton.cdiv(P, BP), H, z), n, dict(args, n=n) if fp else args,
                           {**c, "BP": BP}, nw, fp, maxnreg=mr)
            for kernel, BP, z, c, nw, fp, mr in passes("mamba2", T, N, P, (_mamba2_decode_kernel, _mamba2_verify_kernel,
                                                                         _mamba2_flush_kernel), const)]


@torch.library.custom_op("replayssm::mamba2_step", mutates_args=(
    "checkpoint", "read_codes", "read_block_scale", "read_row_scale", "ring_x", "ring_dt", "ring_B", "out"))
def mamba2_step(checkpoint: torch.Tensor, read_codes: Optional[torch.Tensor], read_block_scale: Optional[torch.Tensor],
                read_row_scale: Optional[torch.Tensor], ring_x: torch.Tensor, ring_dt: torch.Tensor,
                ring_B: torch.Tensor, count: torch.Tensor, origin: torch.Tensor,
                epoch: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                z: Optional[torch.Tensor], out: torch.Tensor, window: int, committed: bool, checkpoint_format: int,
                read_format: int, sr_base: int) -> None:
    """Mamba-2 replay step of one layer; every buffer updated in place.

    | Name        | Shape              | Dtype          | Dir   |
    |-------------|--------------------|----------------|-------|
    | checkpoint  | [S, H, P, N]       | fp32/bf16/fp16 | inout |
    | read_*      | [S, H, P, ...]     | see formats    | inout |
    | ring_x      | [S, H, C, P]       | ring dtype     | inout |
    | ring_dt     | [S, H, C] (dt + dt_bias) | fp32     | inout |
    | ring_B      | [S, G, C, N]       | ring dtype     | inout |
    | count, origin, epoch | [S + 1]   | int32          | in    |
    | slots       | [n] (-1: padding)  | int64          | in    |
    | x, z        | [n, T, H, P]       | ring dtype     | in    |
    | dt          | [n, T, H]          | float          | in    |
    | A, D, dt_bias | [H]              | fp32           | in    |
    | B, C        | [n, T, G, N]       | ring dtype     | in    |
    | out         | [n, T, H, P]       | x dtype        | out   |

    ``committed``: decode (the token folds at a flush) or verify (history only folds).
    The cursors are not moved here: call ``advance`` after the step.
    """
    launch(mamba2_plan(checkpoint, read_codes, read_block_scale, read_row_scale, ring_x, ring_dt, ring_B, count,
        origin, epoch, slots, x, dt, A, B, C, D, dt_bias, z, out, window, committed, checkpoint_format, read_format,
        sr_base))


def delta_plan(checkpoint: torch.Tensor, read_codes: Optional[torch.Tensor], read_block_scale: Optional[torch.Tensor],
               read_row_scale: Optional[torch.Tensor], ring_k: torch.Tensor, ring_v: torch.Tensor,
               ring_g: torch.Tensor, ring_beta: torch.Tensor, ring_d: torch.Tensor, count: torch.Tensor,
               origin: torch.Tensor,
               epoch: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               g: torch.Tensor, beta: torch.Tensor, out: torch.Tensor, scale: float, window: int, committed: bool,
               checkpoint_format: int, read_format: int, sr_base: int,
               q_scale: Optional[torch.Tensor] = None) -> list[Launch]:
    """Validated launches of one GDN / KDA step (non-flush pass, flush pass; a decode on the
    checkpoint is one launch); see ``delta_step``."""
    S, HV, K, V = checkpoint.shape
    n, T = v.shape[:2]
    _require_committed(committed, T)
    HK, C_cap = ring_k.shape[1], ring_k.shape[2]
    if HK == 0 or HV % HK:
        raise ValueError(f"ring_k: {HV} value heads need a key head count dividing them, got {HK}")
    per_channel = g.dim() == 4
    _require("ring_k", ring_k, (S, HK, C_cap, K), contiguous=True)
    _require("ring_v", ring_v, (S, HV, C_cap, V), ring_k.dtype, contiguous=True)
    _require("ring_g", ring_g, (S, HV, C_cap, K) if per_channel else (S, HV, C_cap), torch.float32, contiguous=True)
    _require("ring_beta", ring_beta, (S, HV, C_cap), torch.float32, contiguous=True)
    _require("ring_d", ring_d, (S, HV, C_cap, V), torch.float32, contiguous=True)
    _require_cursors(S, n, count, origin, epoch, slots)
    _require("q", q, (n, T, HK, K))
    _require("k", k, (n, T, HK, K), ring_k.dtype)
    _require("v", v, (n, T, HV, V), ring_k.dtype)
    _require("g", g, (n, T, HV, K) if per_channel else (n, T, HV))
    _require("beta", beta, (n, T, HV))
    _require("out", out, (n, T, HV, V))
    if q_scale is not None:
        _require("q_scale", q_scale, (n, T, HK), torch.float32)
    # without q_scale the kernels' factor pointer receives ring_beta (never read)
    qs, qs_strides = (q_scale, q_scale.stride()) if q_scale is not None else (ring_beta, (0, 0, 0))
    codes, bs, rs = _read_buffers(read_codes, read_block_scale, read_row_scale, ring_beta, read_format)
    BM = _history_block(C_cap, window, T)
    const = dict(T=T, HK=HK, HV=HV, K=K, V=V, BM=BM, COMMITTED=committed, PER_CHANNEL=per_channel,
                 HAS_QS=q_scale is not None, CKPT_FMT=checkpoint_format, READ_FMT=read_format,
                 **_read_consts(read_format, K))
    args = dict(ckpt=checkpoint, **_strides(checkpoint, "c_s", "c_h", "c_k", "c_v"), rc_codes=codes, rc_bs=bs,
                rc_rs=rs, ring_k=ring_k, ring_v=ring_v, ring_g=ring_g, ring_beta=ring_beta, ring_d=ring_d,
                count_ptr=count, origin_ptr=origin, epoch_ptr=epoch, slots=slots, num_slots=S, q=q,
                **_strides(q, "q_r", "q_t", "q_h"), qs=qs, **dict(zip(("qs_r", "qs_t", "qs_h"), qs_strides)), k=k,
                **_strides(k, "k_r", "k_t", "k_h"), v=v, **_strides(v, "v_r", "v_t", "v_h"), g=g,
                **_strides(g, "g_r", "g_t", "g_h"), beta=beta, **_strides(beta, "be_r", "be_t"), out=out,
                **_strides(out, "o_r", "o_t", "o_h"), scale=scale, window=window, capacity=C_cap, sr_base=sr_base)
    return [Launch.by_name("delta_step", kernel, (triton.cdiv(V, BV), HV, z), n, dict(args, n=n) if fp else args,
                           {**c, "BV": BV}, nw, fp, maxnreg=mr)
            for kernel, BV, z, c, nw, fp, mr in passes("kda" if per_channel else "delta", T, K, V,
                                                 (_delta_decode_kernel, _delta_verify_kernel, _delta_flush_kernel),
                                                 const, vk=checkpoint.stride(-2) == 1 and K > 1)]


@torch.library.custom_op("replayssm::delta_step", mutates_args=(
    "checkpoint", "read_codes", "read_block_scale", "read_row_scale", "ring_k", "ring_v", "ring_g", "ring_beta",
    "ring_d", "out"))
def delta_step(checkpoint: torch.Tensor, read_codes: Optional[torch.Tensor], read_block_scale: Optional[torch.Tensor],
               read_row_scale: Optional[torch.Tensor], ring_k: torch.Tensor, ring_v: torch.Tensor,
               ring_g: torch.Tensor, ring_beta: torch.Tensor, ring_d: torch.Tensor, count: torch.Tensor,
               origin: torch.Tensor,
               epoch: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               g: torch.Tensor, beta: torch.Tensor, out: torch.Tensor, scale: float, window: int, committed: bool,
               checkpoint_format: int, read_format: int, sr_base: int, q_scale: Optional[torch.Tensor] = None) -> None:
    """Gated DeltaNet (g ``[n, T, HV]``) or KDA (g ``[n, T, HV, K]``) replay step; buffers updated in place.

    | Name        | Shape                       | Dtype          | Dir   |
    |-------------|-----------------------------|----------------|-------|
    | checkpoint  | [S, HV, K, V] (any strides) | fp32/bf16/fp16 | inout |
    | read_*      | [S, HV, V, ...]             | see formats    | inout |
    | ring_k      | [S, HK, C, K]               | ring dtype     | inout |
    | ring_v      | [S, HV, C, V]               | ring dtype     | inout |
    | ring_g      | [S, HV, C] or [S, HV, C, K] | fp32           | inout |
    | ring_beta   | [S, HV, C]                  | fp32           | inout |
    | ring_d      | [S, HV, C, V] (output cache)| fp32           | inout |
    | count, origin, epoch | [S + 1]            | int32          | in    |
    | slots       | [n] (-1: padding)           | int64          | in    |
    | q, k        | [n, T, HK, K]               | float / ring   | in    |
    | q_scale     | [n, T, HK] (optional)       | fp32           | in    |
    | v           | [n, T, HV, V]               | ring dtype     | in    |
    | g, beta     | [n, T, HV(, K)], [n, T, HV] | float          | in    |
    | out         | [n, T, HV, V]               | v dtype        | out   |

    ``q_scale``: a factor per token and key head on q (outputs are linear in q), e.g. the inverse
    of a host's L2 norm, so that q can arrive in 16 bits, which the verify's tensor-core products take
    in fewer passes. The cursors are not moved here: call ``advance`` after the step.
    """
    launch(delta_plan(checkpoint, read_codes, read_block_scale, read_row_scale, ring_k, ring_v, ring_g, ring_beta,
        ring_d, count, origin, epoch, slots, q, k, v, g, beta, out, scale, window, committed, checkpoint_format,
        read_format, sr_base, q_scale))


@torch.library.custom_op("replayssm::store_checkpoint", mutates_args=(
    "checkpoint", "read_codes", "read_block_scale", "read_row_scale"))
def store_checkpoint(state: torch.Tensor, slots: torch.Tensor, checkpoint: torch.Tensor,
                     read_codes: Optional[torch.Tensor], read_block_scale: Optional[torch.Tensor],
                     read_row_scale: Optional[torch.Tensor], epoch: torch.Tensor, is_delta: bool,
                     checkpoint_format: int, read_format: int, sr_base: int) -> None:
    """Write fp32 ``state [r, heads, A, B]`` (canonical) as the checkpoint of ``slots [r]`` (no -1)
    and re-derive their read copy; ``checkpoint [S, heads, A, B]`` updated in place."""
    r, heads, a, b = state.shape
    _require("checkpoint", checkpoint, (checkpoint.shape[0], heads, a, b), any_strides=True)
    _require("slots", slots, (r,), torch.int64, contiguous=True)
    rows_n, cols_n = (b, a) if is_delta else (a, b)
    codes, bs, rs = _read_buffers(read_codes, read_block_scale, read_row_scale, state, read_format)
    BR = min(32, max(16, triton.next_power_of_2(rows_n)))
    _store_checkpoint_kernel[(triton.cdiv(rows_n, BR), heads, r)](
        state=state, **_strides(state, "s_r", "s_h", "s_a", "s_b"), slots=slots, ckpt=checkpoint,
        **_strides(checkpoint, "c_s", "c_h", "c_a", "c_b"), codes=codes, block_scale=bs, row_scale=rs, epoch=epoch,
        sr_base=sr_base, HEADS=heads, ROWS=rows_n, COLS=cols_n, BR=BR, IS_DELTA=is_delta, CKPT_FMT=checkpoint_format,
        READ_FMT=read_format, ROWS_FROM_BLOCKS=_cols_contiguous(state, is_delta), num_warps=4,
        **_read_consts(read_format, cols_n))


@torch.library.custom_op("replayssm::refresh_read_copy", mutates_args=("read_codes", "read_block_scale",
                                                                     "read_row_scale"))
def refresh_read_copy(checkpoint: torch.Tensor, slots: torch.Tensor, read_codes: torch.Tensor,
                      read_block_scale: torch.Tensor, read_row_scale: torch.Tensor, is_delta: bool,
                      read_format: int) -> None:
    """Re-derive the read copy of ``slots [r]`` (int64; -1 or any slot outside the pool: padding, skipped) from
    their stored checkpoint ``[S, heads, A, B]`` (canonical, any strides; not written): the bytes
    ``store_checkpoint`` writes for the same values. Read copy updated in place."""
    _, heads, a, b = checkpoint.shape
    _require("slots", slots, (slots.shape[0],), torch.int64)
    rows_n, cols_n = (b, a) if is_delta else (a, b)
    if read_format == ReadCode.CHECKPOINT:
        raise ValueError("read_format: expected a read-copy format (fp8 or nvfp4), got the checkpoint's")
    codes, bs, rs = _read_buffers(read_codes, read_block_scale, read_row_scale, checkpoint, read_format)
    if slots.shape[0] == 0:
        return
    along_cols = _cols_contiguous(checkpoint, is_delta)
    tile = REFRESH_TILES["cols" if along_cols else "rows"]
    BR = min(tile["rows"], max(16, triton.next_power_of_2(rows_n)))
    _refresh_read_copy_kernel[(triton.cdiv(rows_n, BR), heads, slots.shape[0])](
        ckpt=checkpoint, **_strides(checkpoint, "c_s", "c_h", "c_a", "c_b"), slots=slots, codes=codes,
        block_scale=bs, row_scale=rs, num_slots=checkpoint.shape[0], HEADS=heads, ROWS=rows_n, COLS=cols_n, BR=BR,
        IS_DELTA=is_delta, READ_FMT=read_format, ROWS_FROM_BLOCKS=tile.get("rows_from_blocks", along_cols),
        num_warps=tile["num_warps"], **_read_consts(read_format, cols_n))


@torch.library.custom_op("replayssm::advance", mutates_args=("count", "origin", "pending", "epoch"))
def advance(count: torch.Tensor, origin: torch.Tensor, pending: torch.Tensor, epoch: torch.Tensor,
            slots: torch.Tensor, num_tokens: int, window: int, capacity: int, committed: bool) -> None:
    """Move one layer's cursors ``[S + 1]`` after a step of ``num_tokens`` tokens (RING.md)."""
    ring_triton.advance({"count": count[None], "origin": origin[None], "pending": pending[None],
                         "epoch": epoch[None]}, 0, slots, num_tokens, window, capacity, committed=committed)


@torch.library.custom_op("replayssm::commit", mutates_args=("count", "pending"))
def commit(count: torch.Tensor, pending: torch.Tensor, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Keep ``num_accepted [n]`` pending tokens of ``slots [n]`` in every layer; cursors ``[NL, S + 1]``."""
    ring_triton.commit({"count": count, "pending": pending}, slots, num_accepted)


@torch.library.custom_op("replayssm::copy_slots", mutates_args=("buffers", "checkpoint"))
def copy_slots(buffers: list[torch.Tensor], checkpoint: Optional[torch.Tensor], src: torch.Tensor, dst: torch.Tensor,
               num_slots: int, layer: Optional[int] = None) -> None:
    """Copy slot ``src[i]`` into slot ``dst[i]`` in every buffer, in ``layer`` or every layer (None), in
    one launch; updated in place.

    | Name       | Shape                                  | Dtype  | Dir   |
    |------------|----------------------------------------|--------|-------|
    | buffers    | [NL, S or S + 1, ...] each, contiguous | any    | inout |
    | checkpoint | [NL, S, a, b, c] any strides, or None  | any    | inout |
    | src, dst   | [n]                                    | int64  | in    |

    A row whose ``src`` or ``dst`` is outside ``[0, num_slots)`` (-1: padding) copies nothing, so a
    masked copy (SGLang's track copy) needs no host read. ``dst`` must be distinct and disjoint from
    ``src`` (not checked: a source may repeat). Each buffer holds a multiple of 4 bytes per slot."""
    _require("src", src, (src.shape[0],), torch.int64, contiguous=True)
    _require("dst", dst, (src.shape[0],), torch.int64, contiguous=True)
    if not buffers:
        raise ValueError("buffers: expected at least one side buffer")
    layers = buffers[0].shape[0]
    for i, b in enumerate(buffers):
        if b.shape[0] != layers or b.shape[1] not in (num_slots, num_slots + 1):
            raise ValueError(f"buffers[{i}]: expected [{layers}, {num_slots} or {num_slots + 1}, ...], got "
                             f"{list(b.shape)}")
    if checkpoint is not None and (checkpoint.dim() != 5 or tuple(checkpoint.shape[:2]) != (layers, num_slots)):
        raise ValueError(f"checkpoint: expected [{layers}, {num_slots}, a, b, c], got {list(checkpoint.shape)}")
    if layer is not None and not 0 <= layer < layers:
        raise ValueError(f"layer: expected None or an int in [0, {layers}), got {layer}")
    ring_triton.copy_slots(buffers, checkpoint, src, dst, num_slots, layer)


@torch.library.custom_op("replayssm::delta_gating", mutates_args=("q_scale", "k_out", "g", "beta"))
def delta_gating(q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                 dt_bias: torch.Tensor, q_scale: Optional[torch.Tensor], k_out: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, lower_bound: Optional[float] = None, beta_round: bool = False,
                 l2norm: int = 1, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
                 heads_per_program: Optional[int] = None) -> None:
    """A GDN / KDA step's inputs from a host's raw projections, in one launch (the formulas of
    ``kernels/gating/reference.py``, bit for bit); outputs written in place.

    | Name     | Shape                      | Dtype        | Dir |
    |----------|----------------------------|--------------|-----|
    | q, k     | [N, HK, K]                 | float        | in  |
    | a        | [N, HV] or [N, HV, K]      | float        | in  |
    | b        | [N, HV]                    | float        | in  |
    | A_log    | [HV]                       | float        | in  |
    | dt_bias  | [HV] or [HV, K]            | float        | in  |
    | q_scale  | [N, HK] (None: l2norm 0)   | fp32         | out |
    | k_out    | [N, HK, K]                 | ring dtype   | out |
    | g        | [N, HV] or [N, HV, K]      | fp32         | out |
    | beta     | [N, HV]                    | fp32         | out |

    ``lower_bound``: a safe gate's bound (KDA), None for the softplus gate (``softplus_beta``,
    ``softplus_threshold``); ``beta_round``: round beta through b's dtype (SGLang's GDN packed
    decode); ``l2norm``: 1 ``x / sqrt(sum x^2 + 1e-6)`` (SGLang's), 2 ``x / (sqrt(sum x^2) + 1e-6)``
    (fla's, TensorRT-LLM's), 0 none (k only rounded to ``k_out``'s dtype, no q_scale);
    ``heads_per_program``: a power of two, value heads (and the key heads of the same indices) per
    program, 0 for all of a token's heads in one program, None for the ``gating`` tile's
    (``kernels/tiles.py``). Inputs need a contiguous last dimension, outputs and A_log / dt_bias are
    contiguous.
    """
    N, HK, K = q.shape
    per_channel = a.dim() == 3
    HV = a.shape[1]
    _require("k", k, (N, HK, K))
    _require("a", a, (N, HV, K) if per_channel else (N, HV))
    _require("b", b, (N, HV))
    _require("A_log", A_log, (HV,), contiguous=True)
    _require("dt_bias", dt_bias, (HV, K) if per_channel else (HV,), contiguous=True)
    if l2norm not in (0, 1, 2) or (q_scale is None) != (l2norm == 0):
        raise ValueError(f"l2norm, q_scale: expected 1 or 2 with a q_scale, or 0 without, got {l2norm} and "
                         f"{'no' if q_scale is None else 'a'} q_scale")
    if q_scale is not None:
        _require("q_scale", q_scale, (N, HK), torch.float32, contiguous=True)
    _require("k_out", k_out, (N, HK, K), contiguous=True)
    _require("g", g, tuple(a.shape), torch.float32, contiguous=True)
    _require("beta", beta, (N, HV), torch.float32, contiguous=True)
    tile = TILES["kda" if per_channel else "delta"]["gating"]
    heads = tile["heads"] if heads_per_program is None else heads_per_program
    if heads < 0 or heads & (heads - 1):
        raise ValueError(f"heads_per_program: expected 0 (all) or a power of two, got {heads}")
    if N == 0:
        return
    HB = heads or triton.next_power_of_2(HV)
    _delta_gating_kernel[(N, triton.cdiv(HV, HB))](
        q=q, q_r=q.stride(0), q_h=q.stride(1), k=k, k_r=k.stride(0), k_h=k.stride(1), a=a, a_r=a.stride(0),
        a_h=a.stride(1) if per_channel else 0, b=b, b_r=b.stride(0), A_log=A_log, dt_bias=dt_bias,
        q_scale=k_out if q_scale is None else q_scale, k_out=k_out, g=g, beta=beta,
        lower_bound=fp32(lower_bound or 0.0), softplus_beta=fp32(softplus_beta),
        softplus_threshold=fp32(softplus_threshold), HK=HK, HV=HV, K=K, HB=HB,
        BHK=min(HB, triton.next_power_of_2(HK)), BHV=min(HB, triton.next_power_of_2(HV)),
        BK=triton.next_power_of_2(K), PER_CHANNEL=per_channel,
        SAFE_GATE=lower_bound is not None, BETA_ROUND=beta_round, NORM=l2norm, num_warps=tile["num_warps"])


def _no_output(*args, **kwargs) -> None:
    """The ops' fake (meta) implementation: they return nothing and write only their arguments."""
    return None


for _op in (mamba2_step, delta_step, store_checkpoint, refresh_read_copy, advance, commit, copy_slots,
            delta_gating):
    _op.register_fake(_no_output)
