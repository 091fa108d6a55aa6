"""A GDN / KDA step's inputs from a host's raw projections: ``replayssm.gating`` (one launch, each
``heads_per_program`` split) against the PyTorch operations a host call site runs for the same
formulas (SGLang's: L2 norms of q and k, ``-exp(A_log) softplus(a + dt_bias)``, ``sigmoid(b)``), one
layer's call per row, every call replayed from a CUDA graph (``bench_decode.timed``).

    python benchmarks/bench_gating.py [--models qwen3.5,qwen3.5-122b,kimi-linear] [--batches 64,256,512]
                                      [--heads tile,0,8,4,2,1] [--json OUT.json]

Inputs as SGLang's packed decode hands them over: q, k views of one bf16 ``mixed_qkv`` row, bf16 ``a``
and ``b``, fp32 ``A_log`` and ``dt_bias``. A row per (model, batch, variant): microseconds per call and
the largest difference from the PyTorch operations' k, g and beta (the two compute the sums in
another precision: at most one bf16 step in k).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from shapes import MODEL_SPECS  # noqa: E402

from replayssm.kernels import ops  # noqa: E402

DELTA_MODELS = [name for name, spec in MODEL_SPECS.items() if spec.family in ("gdn", "kda")]


def raw_inputs(spec, batch: int, device: str, seed: int = 0) -> dict:
    """SGLang's packed-decode inputs of one layer: ``q, k [B, HK, K]`` views of a bf16 packed row,
    bf16 ``a [B, HV]`` (GDN) or ``[B, HV, K]`` (KDA) and ``b [B, HV]``, fp32 ``A_log`` and ``dt_bias``."""
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randn(batch, 2 * HK * K + HV * V, generator=gen).to(torch.bfloat16).to(device)
    gate = (HV, K) if spec.family == "kda" else (HV,)
    return dict(q=packed[:, : HK * K].view(batch, HK, K), k=packed[:, HK * K: 2 * HK * K].view(batch, HK, K),
                a=(torch.randn(batch, *gate, generator=gen) - 3).to(torch.bfloat16).to(device),
                b=torch.randn(batch, HV, generator=gen).to(torch.bfloat16).to(device),
                A_log=torch.randn(HV, generator=gen).to(device), dt_bias=torch.randn(*gate, generator=gen).to(device))


def pytorch_gating(q, k, a, b, A_log, dt_bias) -> dict:
    """The formulas in PyTorch operations, in fp32 as a host call site writes them."""
    qf, kf = q.float(), k.float()
    rate = torch.exp(A_log.float())
    if a.dim() == 3:
        rate = rate[:, None]
    return dict(q_scale=torch.rsqrt(qf.square().sum(-1) + 1e-6),
                k=(kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)).to(torch.bfloat16),
                g=-rate * torch.nn.functional.softplus(a.float() + dt_bias.float(), threshold=20.0),
                beta=torch.sigmoid(b.float()))


def fused_gating(inp: dict, heads: int | None) -> dict:
    """``torch.ops.replayssm.delta_gating`` into fresh buffers, ``heads_per_program`` = ``heads`` (None:
    the ``gating`` tile's)."""
    N, HK, K = inp["q"].shape
    out = dict(q_scale=torch.empty(N, HK, device=inp["q"].device),
               k=torch.empty(N, HK, K, dtype=torch.bfloat16, device=inp["q"].device),
               g=torch.empty(inp["a"].shape, device=inp["q"].device),
               beta=torch.empty(inp["b"].shape, device=inp["q"].device))
    ops.delta_gating(inp["q"], inp["k"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], out["q_scale"], out["k"],
                     out["g"], out["beta"], heads_per_program=heads)
    return out


def max_difference(got: dict, want: dict) -> float:
    """The largest |difference| over k, g and beta."""
    return max((got[n].float() - want[n].float()).abs().max().item() for n in ("k", "g", "beta"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DELTA_MODELS))
    ap.add_argument("--batches", default="64,256,512")
    ap.add_argument("--heads", default="tile,0,8,4,2,1",
                    help="heads_per_program values to time (tile: the gating tile's; 0: all heads)")
    ap.add_argument("--json", help="write the rows and the run's versions here")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    unknown = [m for m in models if m not in DELTA_MODELS]
    if unknown:
        ap.error(f"--models: expected some of {DELTA_MODELS}, got {unknown}")
    if not torch.cuda.is_available():
        ap.error("a CUDA device is needed (the calls are timed from CUDA graphs)")
    from bench_decode import timed

    rows = []
    print(f"{'model':14s} {'batch':>5s} {'variant':18s} {'us':>8s} {'max |diff|':>11s}")
    for model in models:
        spec = MODEL_SPECS[model]
        for batch in map(int, args.batches.split(",")):
            inp = raw_inputs(spec, batch, "cuda")
            base = pytorch_gating(**inp)
            variants = [("pytorch", lambda: pytorch_gating(**inp), base)]
            for heads in (None if h == "tile" else int(h) for h in args.heads.split(",")):
                label = "tile" if heads is None else heads or "all"
                variants.append((f"gating heads={label}", lambda h=heads: fused_gating(inp, h),
                                 fused_gating(inp, heads)))
            for name, fn, result in variants:
                us = timed(fn)
                rows.append(dict(model=model, batch=batch, variant=name, us=round(us, 2),
                                 max_diff=max_difference(result, base)))
                print(f"{model:14s} {batch:5d} {name:18s} {us:8.2f} {rows[-1]['max_diff']:11.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d", time.gmtime()), gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=triton.__version__,
                           commit=os.environ.get("REPLAYSSM_COMMIT", "unknown"), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
