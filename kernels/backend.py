"""The Triton backend of StatePool: the custom ops of ``replayssm.kernels.ops`` over a pool."""

from __future__ import annotations

import torch
import triton

from replayssm.kernels import backend_reference, ops
from replayssm.kernels.formats.codes import CKPT_CODES, READ_CODES

supports_unchecked = True


def check(spec, cfg) -> None:
    """Raise ValueError for dimensions these kernels do not take."""
    cols, name = (spec.state_dim, "state_dim") if spec.family == "mamba2" else (spec.head_k_dim, "head_k_dim")
    if cols < 16 or cols != triton.next_power_of_2(cols):
        raise ValueError(f"{name}: the triton backend needs a power of two >= 16, got {cols}")


def _layer_buffers(pool, layer: int):
    read = [pool.read[k][layer] if pool.read else None for k in ("codes", "block_scale", "row_scale")]
    cur = pool.cursors
    return read, cur["count"][layer], cur["origin"][layer], cur["epoch"][layer]


def step(pool, layer: int, slots: torch.Tensor, host: torch.Tensor, inputs: dict, *, committed: bool,
         out: torch.Tensor) -> None:
    """One decode / verify step of ``slots`` (device, -1 = padding) through the kernels; cursors advance."""
    spec, cfg = pool.spec, pool.cfg
    read, count, origin, epoch = _layer_buffers(pool, layer)
    ring = {k: v[layer] for k, v in pool.ring.items()}
    fmt = dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
               sr_base=ops.sr_base(cfg.seed, layer))
    if spec.family == "mamba2":
        pool.layer_A[layer] = inputs["A"]
        ops.mamba2_step(pool.checkpoint[layer], *read, ring["x"], ring["dt"], ring["B"], count, origin,
                        epoch, slots, inputs["x"], inputs["dt"], inputs["A"].float(), inputs["B"], inputs["C"],
                        None if inputs["D"] is None else inputs["D"].float(),
                        None if inputs["dt_bias"] is None else inputs["dt_bias"].float(), inputs["z"], out,
                        cfg.window, committed, **fmt)
        T = inputs["x"].shape[1]
    else:
        ops.delta_step(pool.checkpoint[layer], *read, ring["k"], ring["v"], ring["g"], ring["beta"], ring["d"], count,
                       origin, epoch, slots, inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], out,
                       float(inputs["scale"]), cfg.window, committed, **fmt, q_scale=inputs["q_scale"])
        T = inputs["v"].shape[1]
    cur = pool.cursors
    ops.advance(cur["count"][layer], cur["origin"][layer], cur["pending"][layer], cur["epoch"][layer], slots, T,
                cfg.window, cfg.capacity, committed)


def flush(pool, layer: int, slots: torch.Tensor) -> None:
    """Fold the committed ring of ``slots`` (device, distinct, -1 = padding) into the checkpoint of
    ``layer`` and re-derive its read copy, on the device: a flush-only step (T = 0) whose rows with
    committed entries flush; cursors advance (``count = 0``). Reads no device value."""
    spec, cfg = pool.spec, pool.cfg
    read, count, origin, epoch = _layer_buffers(pool, layer)
    ring = {k: v[layer] for k, v in pool.ring.items()}
    fmt = dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
               sr_base=ops.sr_base(cfg.seed, layer))
    n, act, dev = slots.numel(), cfg.torch_ring_dtype, pool.device
    empty = lambda *shape, dtype=act: torch.empty(n, 0, *shape, dtype=dtype, device=dev)  # noqa: E731
    if spec.family == "mamba2":
        A = pool.layer_A[layer]
        if A is None:                        # never stepped: nothing committed to fold
            return
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        ops.mamba2_step(pool.checkpoint[layer], *read, ring["x"], ring["dt"], ring["B"], count, origin, epoch,
                        slots, empty(H, P), empty(H, dtype=torch.float32), A.float(), empty(G, N),
                        empty(G, N), None, None, None, empty(H, P), cfg.window, False, **fmt)
    else:
        HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
        g = empty(HV, K, dtype=torch.float32) if spec.family == "kda" else empty(HV, dtype=torch.float32)
        ops.delta_step(pool.checkpoint[layer], *read, ring["k"], ring["v"], ring["g"], ring["beta"], ring["d"],
                       count, origin, epoch, slots, empty(HK, K), empty(HK, K), empty(HV, V), g,
                       empty(HV, dtype=torch.float32), empty(HV, V), 1.0, cfg.window, False, **fmt)
    cur = pool.cursors
    ops.advance(cur["count"][layer], cur["origin"][layer], cur["pending"][layer], cur["epoch"][layer], slots, 0,
                cfg.window, cfg.capacity, False)


def store(pool, layer: int, host_rows: torch.Tensor, state: torch.Tensor) -> None:
    """Write fp32 ``state`` as the checkpoint of ``host_rows`` and refresh their read copy."""
    if host_rows.numel() == 0:
        return
    cfg = pool.cfg
    read, _, _, epoch = _layer_buffers(pool, layer)
    ops.store_checkpoint(state.contiguous(), host_rows.to(pool.device), pool.checkpoint[layer], *read, epoch,
                         pool.spec.is_delta, CKPT_CODES[cfg.checkpoint_dtype], READ_CODES[cfg.read_format],
                         ops.sr_base(cfg.seed, layer))


def refresh(pool, layer: int, rows: torch.Tensor) -> None:
    """Re-derive the read copy of ``rows`` (int64 on the device, slots of the pool) of ``layer`` from
    their stored checkpoint, on the device; checkpoint and cursors untouched. Reads no device value."""
    read, _, _, _ = _layer_buffers(pool, layer)
    ops.refresh_read_copy(pool.checkpoint[layer], rows, *read, pool.spec.is_delta, READ_CODES[pool.cfg.read_format])


def commit(cursors: dict, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Keep ``num_accepted`` pending tokens of ``slots`` in every layer (one launch)."""
    ops.commit(cursors["count"], cursors["pending"], slots, num_accepted)


fold_committed = backend_reference.fold_committed
