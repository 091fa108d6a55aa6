"""The Triton backend of StatePool: the custom ops of ``replayssm.kernels.ops`` over a pool."""

from __future__ import annotations

import torch
import triton

from replayssm.kernels import backend_reference, ops
from replayssm.validate import L2NORMS
from replayssm.kernels.formats.codes import CKPT_CODES, READ_CODES

supports_unchecked = True


def check(spec, cfg) -> None:
    """Raise ValueError for dimensions these kernels do not take."""
    cols, name = (spec.state_dim, "state_dim") if spec.family == "mamba2" else (spec.head_k_dim, "head_k_dim")
    if cols < 16 or cols != triton.next_power_of_2(cols):
        raise ValueError(f"{name}: the triton backend needs a power of two >= 16, got {cols}")


def layer_state(pool, layer: int) -> dict:
    """The buffers of ``layer`` of ``pool`` named as the step ops name them (views, no copy):

    | Name                                         | Pool buffer                          |
    |----------------------------------------------|--------------------------------------|
    | checkpoint                                   | ``pool.checkpoint[layer]``           |
    | read_codes, read_block_scale, read_row_scale | ``pool.read[...][layer]`` (None without a read copy) |
    | ring_<name> (ring_x, ring_k, ...)            | ``pool.ring[name][layer]``           |
    | count, origin, epoch                         | ``pool.cursors[...][layer]``         |
    """
    state = {"checkpoint": pool.checkpoint[layer]}
    state.update({f"read_{k}": pool.read[k][layer] if pool.read else None for k in ("codes", "block_scale", "row_scale")})
    state.update({f"ring_{k}": v[layer] for k, v in pool.ring.items()})
    state.update({f: pool.cursors[f][layer] for f in ("count", "origin", "epoch")})
    return state


def _formats(cfg, layer: int) -> dict:
    """The format arguments of a layer's step ops: checkpoint and read-copy codes, the rounding seed."""
    return dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
                sr_base=ops.sr_base(cfg.seed, layer))


def _fp32(t):
    return None if t is None else t.float()


def step(pool, layer: int, slots: torch.Tensor, cpu_slots: torch.Tensor | None, inputs: dict, *, committed: bool,
         out: torch.Tensor) -> None:
    """One decode / verify step of ``slots`` (device, -1 = padding) through the kernels; cursors advance.
    ``cpu_slots`` is not needed (the kernels index rows on the device)."""
    spec, cfg = pool.spec, pool.cfg
    args = dict(layer_state(pool, layer), slots=slots, out=out, window=cfg.window, committed=committed,
                **_formats(cfg, layer))
    if spec.family == "mamba2":
        ops.mamba2_step(**args, x=inputs["x"], dt=inputs["dt"], A=inputs["A"].float(), B=inputs["B"], C=inputs["C"],
                        D=_fp32(inputs["D"]), dt_bias=_fp32(inputs["dt_bias"]), z=inputs["z"])
        pool.layer_A[layer] = inputs["A"]          # once the op took the step (a refused one keeps the old)
        T = inputs["x"].shape[1]
    else:
        ops.delta_step(**args, q=inputs["q"], k=inputs["k"], v=inputs["v"], g=inputs["g"], beta=inputs["beta"],
                       scale=float(inputs["scale"]), q_scale=inputs["q_scale"])
        T = inputs["v"].shape[1]
    _advance(pool, layer, slots, T, committed)


def _advance(pool, layer: int, slots: torch.Tensor, num_tokens: int, committed: bool) -> None:
    cur, cfg = pool.cursors, pool.cfg
    ops.advance(count=cur["count"][layer], origin=cur["origin"][layer], pending=cur["pending"][layer],
                epoch=cur["epoch"][layer], slots=slots, num_tokens=num_tokens, window=cfg.window,
                capacity=cfg.capacity, committed=committed)


def flush(pool, layer: int, slots: torch.Tensor) -> None:
    """Fold the committed ring of ``slots`` (device, distinct, -1 = padding) into the checkpoint of
    ``layer`` and re-derive its read copy, on the device: a flush-only step (T = 0) whose rows with
    committed entries flush; cursors advance (``count = 0``). Reads no device value."""
    spec, cfg = pool.spec, pool.cfg
    n, act, dev = slots.numel(), cfg.torch_ring_dtype, pool.device
    empty = lambda *shape, dtype=act: torch.empty(n, 0, *shape, dtype=dtype, device=dev)  # noqa: E731
    if spec.family == "mamba2":
        A = pool.layer_A[layer]
        if A is None:                        # never stepped: nothing committed to fold
            return
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        tokens = dict(x=empty(H, P), dt=empty(H, dtype=torch.float32), A=A.float(), B=empty(G, N), C=empty(G, N),
                      D=None, dt_bias=None, z=None, out=empty(H, P))
        op = ops.mamba2_step
    else:
        HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
        g = empty(HV, K, dtype=torch.float32) if spec.family == "kda" else empty(HV, dtype=torch.float32)
        tokens = dict(q=empty(HK, K), k=empty(HK, K), v=empty(HV, V), g=g, beta=empty(HV, dtype=torch.float32),
                      out=empty(HV, V), scale=1.0)
        op = ops.delta_step
    op(**layer_state(pool, layer), slots=slots, **tokens, window=cfg.window, committed=False, **_formats(cfg, layer))
    _advance(pool, layer, slots, 0, False)


def store(pool, layer: int, cpu_rows: torch.Tensor, state: torch.Tensor) -> None:
    """Write fp32 ``state`` as the checkpoint of ``cpu_rows`` and refresh their read copy."""
    if cpu_rows.numel() == 0:
        return
    buffers = layer_state(pool, layer)
    ops.store_checkpoint(state=state.contiguous(), slots=cpu_rows.to(pool.device), checkpoint=buffers["checkpoint"],
                         read_codes=buffers["read_codes"], read_block_scale=buffers["read_block_scale"],
                         read_row_scale=buffers["read_row_scale"], epoch=buffers["epoch"], is_delta=pool.spec.is_delta,
                         **_formats(pool.cfg, layer))


def refresh(pool, layer: int, rows: torch.Tensor) -> None:
    """Re-derive the read copy of ``rows`` (int64 on the device, slots of the pool; -1 = padding, skipped)
    of ``layer`` from their stored checkpoint, on the device; checkpoint and cursors untouched. Reads
    no device value."""
    buffers = layer_state(pool, layer)
    ops.refresh_read_copy(checkpoint=buffers["checkpoint"], slots=rows, read_codes=buffers["read_codes"],
                          read_block_scale=buffers["read_block_scale"], read_row_scale=buffers["read_row_scale"],
                          is_delta=pool.spec.is_delta, read_format=READ_CODES[pool.cfg.read_format])


def copy(pool, src: torch.Tensor, dst: torch.Tensor, *, layer: int | None, checkpoint: bool) -> None:
    """Slots ``src`` into ``dst`` (int64 ``[n]`` on the device; a row with either outside the pool is
    skipped): read copy, ring and cursors, and the checkpoint when ``checkpoint``, in ``layer`` or
    every layer, in one launch. Reads no device value."""
    ops.copy_slots(buffers=[*pool.read.values(), *pool.ring.values(), *pool.cursors.values()],
                   checkpoint=pool.checkpoint if checkpoint else None, src=src, dst=dst, num_slots=pool.num_slots,
                   layer=layer)


def commit(cursors: dict, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Keep ``num_accepted`` pending tokens of ``slots`` in every layer (one launch)."""
    ops.commit(count=cursors["count"], pending=cursors["pending"], slots=slots, num_accepted=num_accepted)


fold_committed = backend_reference.fold_committed


# the gating kernel's NORM codes of replayssm.validate.L2NORMS
_L2NORM_CODES = dict(zip(L2NORMS, (1, 2, 0)))


def gating(pool, *, q, k, a, b, A_log, dt_bias, lower_bound, beta_round, l2norm, softplus_beta,
           softplus_threshold) -> dict:
    """A GDN / KDA step's inputs from raw projections in one launch (``ops.delta_gating``)."""
    N, HK, K = q.shape
    made = dict(k=torch.empty(N, HK, K, dtype=pool.cfg.torch_ring_dtype, device=q.device),
                g=torch.empty(a.shape, dtype=torch.float32, device=q.device),
                beta=torch.empty(b.shape, dtype=torch.float32, device=q.device))
    if l2norm is not None:
        made["q_scale"] = torch.empty(N, HK, dtype=torch.float32, device=q.device)
    ops.delta_gating(q, k, a, b, A_log, dt_bias, made.get("q_scale"), made["k"], made["g"], made["beta"],
                     lower_bound=lower_bound, beta_round=beta_round, l2norm=_L2NORM_CODES[l2norm],
                     softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    return made
