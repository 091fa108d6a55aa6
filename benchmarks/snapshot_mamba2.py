"""Baseline for Mamba-2 speculative verify: the conventional recurrence with a state snapshot
after every draft token (vLLM's semantics: one state read, T state writes)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _snapshot_verify_kernel(state, snaps, x, dt, A, B, C, D, dt_bias, out, T: tl.constexpr, H: tl.constexpr,
                            G: tl.constexpr, P: tl.constexpr, N: tl.constexpr, BP: tl.constexpr):
    # state [n, H, P, N] fp32; snaps [T, n, H, P, N]; x/out [n, T, H, P]; dt [n, T, H]; B, C [n, T, G, N]
    pid_p, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = tl.num_programs(2)
    op = pid_p * BP + tl.arange(0, BP)
    on = tl.arange(0, N)
    g = h // (H // G)
    base = ((i * H + h) * P + op[:, None]) * N + on[None, :]
    S = tl.load(state + base)
    A_h = tl.load(A + h)
    for t in tl.static_range(T):
        d = tl.load(dt + (i * T + t) * H + h) + tl.load(dt_bias + h)
        d = tl.where(d <= 20.0, tl.log(1.0 + tl.exp(d)), d)
        xv = tl.load(x + ((i * T + t) * H + h) * P + op).to(tl.float32)
        Bv = tl.load(B + ((i * T + t) * G + g) * N + on).to(tl.float32)
        Cv = tl.load(C + ((i * T + t) * G + g) * N + on).to(tl.float32)
        S = S * tl.exp(A_h * d) + (d * xv)[:, None] * Bv[None, :]
        y = tl.sum(S * Cv[None, :], axis=1) + tl.load(D + h) * xv
        tl.store(out + ((i * T + t) * H + h) * P + op, y.to(out.dtype.element_ty))
        tl.store(snaps + t * n * H * P * N + base, S)


def snapshot_verify(state, snaps, x, dt, A, B, C, D, dt_bias, out):
    """Conventional verify of ``x [n, T, H, P]`` from ``state``; the state after token t goes to ``snaps[t]``."""
    n, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    BP = 16
    _snapshot_verify_kernel[(triton.cdiv(P, BP), H, n)](state, snaps, x, dt, A, B, C, D, dt_bias, out, T=T, H=H, G=G,
                                                        P=P, N=N, BP=BP, num_warps=4)
