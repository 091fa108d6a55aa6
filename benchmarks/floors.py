"""Bandwidth floors: a copy, a read-only pass and an in-place read+write pass over a state."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _read_floor_kernel(x, out, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    v = tl.load(x + i * BLOCK + tl.arange(0, BLOCK))
    tl.store(out + i, tl.sum(v, axis=0))


@triton.jit
def _rw_floor_kernel(x, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + o, tl.load(x + o) * 0.999)


def read_floor(state: torch.Tensor, block: int = 4096):
    """A launcher reading every element of a contiguous fp32 ``state`` once."""
    flat = state.view(-1)
    out = torch.empty(flat.numel() // block, device=state.device)
    return lambda: _read_floor_kernel[(flat.numel() // block,)](flat, out, BLOCK=block, num_warps=8)


def rw_floor(state: torch.Tensor, block: int = 4096):
    """A launcher reading and rewriting every element of ``state`` in place."""
    flat = state.view(-1)
    return lambda: _rw_floor_kernel[(flat.numel() // block,)](flat, BLOCK=block, num_warps=8)
