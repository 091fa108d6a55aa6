"""The ring contract (RING.md, version 1) in code: buffer table, flush rule, cursor moves.

Cursor moves run on the device with no host synchronization; they take slot indices where
-1 marks a padded row. Cursor tensors carry one extra trailing column (index ``num_slots``)
that padded rows write to, so no masking needs the host.
"""

from __future__ import annotations

import torch

from .spec import LayerSpec, ReplayConfig

RING_VERSION = 1
CURSOR_FIELDS = ("count", "origin", "pending", "epoch")


def ring_buffers(spec: LayerSpec, cfg: ReplayConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-slot ring buffers: name -> (shape ``[heads, capacity, ...]``, dtype).

    Every buffer holds raw inputs except the delta families' ``d``: the delta vector each token
    got from the state its step read, cached for later steps' outputs (and folded by a flush
    only when that state was the checkpoint itself: RING.md).
    """
    C, act, f32 = cfg.capacity, cfg.torch_ring_dtype, torch.float32
    if spec.family == "mamba2":
        return {
            "x": ((spec.num_heads, C, spec.head_dim), act),
            "dt": ((spec.num_heads, C), f32),
            "B": ((spec.num_groups, C, spec.state_dim), act),
        }
    g_shape = (spec.num_v_heads, C) if spec.family == "gdn" else (spec.num_v_heads, C, spec.head_k_dim)
    return {
        "k": ((spec.num_k_heads, C, spec.head_k_dim), act),
        "v": ((spec.num_v_heads, C, spec.head_v_dim), act),
        "g": (g_shape, f32),
        "beta": ((spec.num_v_heads, C), f32),
        "d": ((spec.num_v_heads, C, spec.head_v_dim), f32),
    }


def new_cursors(num_layers: int, num_slots: int, device) -> dict[str, torch.Tensor]:
    """Zeroed cursors: int32 ``[num_layers, num_slots + 1]`` per field (last column: padding)."""
    return {f: torch.zeros(num_layers, num_slots + 1, dtype=torch.int32, device=device) for f in CURSOR_FIELDS}


def row_index(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Slot indices with padded rows (-1) sent to the trailing padding column."""
    return torch.where(slots >= 0, slots, torch.full_like(slots, num_slots))


def flush_rows(count: torch.Tensor, num_tokens: int, window: int) -> torch.Tensor:
    """Rows whose step writes the checkpoint: the history plus this step's tokens fill the window."""
    return count + num_tokens >= window


def advance(cursors: dict[str, torch.Tensor], layer: int, slots: torch.Tensor, num_tokens: int,
            cfg: ReplayConfig, *, committed: bool) -> None:
    """Move one layer's cursors after a step of ``num_tokens`` tokens (updated in place).

    A decode (``committed=True``, one token) that flushes folds history and token: the ring
    empties. A verify that flushes folds only the committed history; its tokens stay pending.
    """
    idx = row_index(slots, cursors["count"].shape[1] - 1)
    count = cursors["count"][layer, idx]
    origin = cursors["origin"][layer, idx]
    flush = flush_rows(count, num_tokens, cfg.window)
    folded = count + num_tokens if committed else count
    cursors["origin"][layer, idx] = torch.where(flush, (origin + folded) % cfg.capacity, origin)
    cursors["epoch"][layer, idx] = cursors["epoch"][layer, idx] + flush.to(torch.int32)
    if committed:
        cursors["count"][layer, idx] = torch.where(flush, torch.zeros_like(count), count + num_tokens)
    else:
        cursors["count"][layer, idx] = torch.where(flush, torch.zeros_like(count), count)
        cursors["pending"][layer, idx] = torch.full_like(count, num_tokens)


def commit(cursors: dict[str, torch.Tensor], slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Keep the first ``num_accepted`` pending tokens of every layer's last verify (in place)."""
    idx = row_index(slots, cursors["count"].shape[1] - 1)
    acc = num_accepted.to(device=idx.device, dtype=torch.int32)
    cursors["count"][:, idx] = cursors["count"][:, idx] + acc[None, :]
    cursors["pending"][:, idx] = 0


def empty(cursors: dict[str, torch.Tensor], layer: int | None, slots: torch.Tensor, *, wrote_checkpoint: bool) -> None:
    """Empty the ring of ``slots`` (one layer, or all when ``layer`` is None), in place: the cursor
    move of a refresh, of a slot's assignment and of a flush done outside a step.
    ``wrote_checkpoint``: the checkpoint was written, so ``epoch`` counts one more write."""
    idx = row_index(slots, cursors["count"].shape[1] - 1)
    sel = (slice(None), idx) if layer is None else (layer, idx)
    for f in ("count", "origin", "pending"):
        # index_fill_ takes its value on the device side, where `[sel] = 0` copies a host scalar (which a
        # CUDA graph cannot record)
        rows = cursors[f] if layer is None else cursors[f][layer:layer + 1]
        rows.index_fill_(1, idx.to(rows.device), 0)
    if wrote_checkpoint:
        cursors["epoch"][sel] = cursors["epoch"][sel] + 1
