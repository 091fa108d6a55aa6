"""Where the flush pass on a ``[S, HV, V, K]`` checkpoint loses its time, in two probes.

    python benchmarks/vk_probe.py copy [--batch 256] [--model qwen3.5] [--work 0,16]
    ncu --profile-from-start off -k regex:_delta_flush_kernel ... \\
        python benchmarks/vk_probe.py step --layout vk [--batch 256] [--model qwen3.5] [--read-format nvfp4]

``copy`` times a kernel that moves each head's ``[K, BV]`` checkpoint tiles the way the flush pass
does (grid ``(V / BV, HV, S)``, one warp, ``BV`` = 16 value columns), through ``work`` dependent
rounds of a replay entry's shape (a reduction over K, then an update of the whole tile) between the
load and the store, on both layouts, and on ``[S, HV, V, K]`` with the value columns of a head's
programs interleaved (program ``j`` takes columns ``j, j + V / BV, ...``). At ``work`` = 0 it shows
whether the order of the bytes alone costs; at 16 (a window) whether the tile's layout in registers
does.

``step`` runs the decode step whose every row flushes (the window full, ``fill`` = 15), as
``sweep_tiles.py`` times it, and brackets its last launch with ``cudaProfilerStart`` / ``Stop``,
so that a profiler started with ``--profile-from-start off`` sees that step's launches alone.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import Layer, timed  # noqa: E402
from shapes import MODEL_SPECS, WINDOW  # noqa: E402


@triton.jit
def _tile_rounds_kernel(src, dst, s_s, s_h, s_k, s_v, work, K: tl.constexpr, V: tl.constexpr,
                        BV: tl.constexpr, INTERLEAVE: tl.constexpr):
    """``dst[s, h]`` tile ``[K, BV]`` = ``work`` rounds of ``x = 0.999 x + 1e-6 k (sum_K x)`` on ``src``'s."""
    pid_v, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ok = tl.arange(0, K)
    if INTERLEAVE:
        ov = pid_v + tl.arange(0, BV) * (V // BV)
    else:
        ov = pid_v * BV + tl.arange(0, BV)
    off = s * s_s + h * s_h + ok[:, None] * s_k + ov[None, :] * s_v
    x = tl.load(src + off)                                                # [K, BV] fp32
    kv = (ok.to(tl.float32) + 1.0) * 1e-6                                 # [K]
    for _ in tl.range(0, work, num_stages=1):
        x = 0.999 * x + kv[:, None] * tl.sum(x * kv[:, None], axis=0)[None, :]
    tl.store(dst + off, x)


def copy_probe(model: str, batch: int, works: list[int]) -> None:
    spec = MODEL_SPECS[model]
    HV, K, V = spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    BV = 16
    kv = torch.randn(batch, HV, K, V, device="cuda")
    vk = kv.transpose(-1, -2).contiguous()                               # [S, HV, V, K]
    moved = 2 * kv.numel() * 4
    print(f"{model} batch {batch}: [K, BV] = [{K}, {BV}] tiles, grid ({V // BV}, {HV}, {batch}), one warp, "
          f"{moved / 2**20:.0f} MiB moved")
    print(f"{'work':>5} {'layout':>16} {'us':>9} {'GB/s':>7}")
    for work in works:
        for name, t, (sk, sv), inter in (("kv", kv, (V, 1), False), ("vk", vk, (1, K), False),
                                         ("vk interleaved", vk, (1, K), True)):
            out = torch.empty_like(t)

            def fn(t=t, out=out, sk=sk, sv=sv, inter=inter):
                _tile_rounds_kernel[(V // BV, HV, batch)](t, out, t.stride(0), t.stride(1), sk, sv, work,
                                                          K=K, V=V, BV=BV, INTERLEAVE=inter, num_warps=1)
            us = timed(fn)
            print(f"{work:>5} {name:>16} {us:>9.1f} {moved / us / 1e3:>7.0f}", flush=True)


def step_probe(model: str, batch: int, layout: str, read_format: str, repeats: int) -> None:
    spec = MODEL_SPECS[model]
    layer = Layer(spec, batch, read_format=read_format, state_layout=layout)
    fn, _ = layer.step_fn(layer.inputs(1))
    for _ in range(repeats):          # compiled and warm before the profiled step
        layer.set_fill(WINDOW - 1)
        fn()
    layer.set_fill(WINDOW - 1)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{model} batch {batch} {layout} {read_format}: one flush step profiled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=["copy", "step"])
    ap.add_argument("--model", default="qwen3.5", choices=[m for m, s in MODEL_SPECS.items() if s.family != "mamba2"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--work", default="0,16", help="copy: comma-separated rounds between load and store")
    ap.add_argument("--layout", default="vk", choices=["kv", "vk"], help="step: the checkpoint's layout")
    ap.add_argument("--read-format", default="nvfp4", choices=["checkpoint", "fp8", "nvfp4"])
    ap.add_argument("--repeats", type=int, default=3, help="step: unprofiled steps first")
    args = ap.parse_args()
    if args.probe == "copy":
        copy_probe(args.model, args.batch, [int(w) for w in args.work.split(",")])
    else:
        step_probe(args.model, args.batch, args.layout, args.read_format, args.repeats)


if __name__ == "__main__":
    main()
