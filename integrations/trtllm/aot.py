"""Ahead-of-time PTX for the replayssm kernels, with a manifest a TensorRT plugin launches from.

    python -m replayssm.integrations.trtllm.aot --arch sm_90 --out DIR [--models qwen3.5,...]
        [--tokens 1,4] [--read-formats checkpoint,nvfp4] [--checkpoint-dtype float32] [--window 16]

Each kernel is compiled from the same launch the ``torch.ops.replayssm`` op performs
(``replayssm.kernels.ops.mamba2_plan`` / ``delta_plan``, built here on meta tensors), so the bytes
TensorRT runs are the kernels SGLang and the torch ops run. Compiling needs Triton only; no GPU.
Kernels are compiled without value specialization: every integer argument is a plain i32
(``sr_base`` i64), so one PTX serves any strides and batch.

``manifest.json``: ``ring_contract_version``, ``arch``, and per kernel ``name`` (PTX entry),
``file``, ``op``, ``model``, ``tokens``, ``flush_pass``, ``read_format``, ``checkpoint_dtype``,
``args`` (kernel order: name and Triton type), ``constexprs``, ``grid`` (``"n"`` = rows),
``block`` ([num_warps * 32, 1, 1]) and ``shared`` (bytes of dynamic shared memory).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

MODELS = {
    "nemotron-h": dict(family="mamba2", num_heads=128, head_dim=64, state_dim=128, num_groups=8),
    "qwen3.5": dict(family="gdn", num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
    "qwen3.5-122b": dict(family="gdn", num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
    "kimi-linear": dict(family="kda", num_k_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128),
}
_PTR = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
        torch.int64: "i64", torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv"}


def _signature(kernel, args: list, constexprs: dict) -> dict:
    """Triton signature of a launch: pointer types from tensors, i32 for integers (i64 for sr_base)."""
    names = [a for a in kernel.arg_names if a not in constexprs]
    if len(names) != len(args):
        raise AssertionError(f"{kernel.__name__}: {len(args)} arguments for {len(names)} parameters")
    sig = {}
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _PTR[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i64" if name == "sr_base" else "i32"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{name}: cannot type {type(value).__name__}")
    sig.update({k: "constexpr" for k in constexprs})
    return sig


def plan_for(model: str, tokens: int, read_format: str, checkpoint_dtype: str, window: int, n: int = 8):
    """The launches of one step of ``model`` (meta tensors: shapes, dtypes and strides only)."""
    import replayssm as rs
    from replayssm import formats, ring
    from replayssm.kernels import ops
    from replayssm.kernels.formats.triton import CKPT_CODES, READ_CODES

    dims = dict(MODELS[model])
    family = dims.pop("family")
    spec = getattr(rs.LayerSpec, family)(**dims)
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=max(tokens - 1, 0), checkpoint_dtype=checkpoint_dtype,
                          read_format=read_format, ring_dtype="bfloat16")
    meta = dict(device="meta")
    S = 2 * n
    ckpt = torch.empty(S, *spec.state_shape, dtype=cfg.torch_checkpoint_dtype, **meta)
    bufs = {k: torch.empty(S, *shape, dtype=dt, **meta) for k, (shape, dt) in ring.ring_buffers(spec, cfg).items()}
    read = [None, None, None]
    if read_format != "checkpoint":
        heads, rows, cols = spec.read_rows_cols
        shapes = formats.read_copy_shapes(read_format, rows, cols)
        read = [torch.empty(S, heads, *shapes[k][0], dtype=shapes[k][1], **meta)
                for k in ("codes", "block_scale", "row_scale")]
    cur = [torch.empty(S + 1, dtype=torch.int32, **meta) for _ in range(3)]
    slots = torch.empty(n, dtype=torch.int64, **meta)
    act = torch.bfloat16
    fmt = dict(checkpoint_format=CKPT_CODES[checkpoint_dtype], read_format=READ_CODES[read_format],
               sr_base=2 ** 31 + 1)
    if family == "mamba2":
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        e = lambda *shape, dtype=act: torch.empty(*shape, dtype=dtype, **meta)  # noqa: E731
        vec = e(H, dtype=torch.float32)
        return spec, ops.mamba2_plan(ckpt, *read, bufs["x"], bufs["dt"], bufs["B"], *cur, slots,
                                     e(n, tokens, H, P), e(n, tokens, H, dtype=torch.float32), vec,
                                     e(n, tokens, G, N), e(n, tokens, G, N), vec, vec, e(n, tokens, H, P),
                                     e(n, tokens, H, P), window, tokens == 1, **fmt)
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    e = lambda *shape, dtype=act: torch.empty(*shape, dtype=dtype, **meta)  # noqa: E731
    g = e(n, tokens, HV, K, dtype=torch.float32) if family == "kda" else e(n, tokens, HV, dtype=torch.float32)
    return spec, ops.delta_plan(ckpt, *read, bufs["k"], bufs["v"], bufs["g"], bufs["beta"], bufs["d"], *cur, slots,
                                e(n, tokens, HK, K), e(n, tokens, HK, K), e(n, tokens, HV, V), g,
                                e(n, tokens, HV, dtype=torch.float32), e(n, tokens, HV, V), K ** -0.5, window,
                                tokens == 1, **fmt)


def compile_all(out: str, arch: str, models, tokens, read_formats, checkpoint_dtype: str, window: int) -> dict:
    """Compile every requested kernel to ``out``; returns the manifest (also written as manifest.json)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from replayssm.ring import RING_VERSION

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: the kernels are interpreted functions; unset it to compile")
    cc = int(arch.removeprefix("sm_").rstrip("a"))
    os.makedirs(out, exist_ok=True)
    entries = []
    for model in models:
        for T in tokens:
            for rf in read_formats:
                spec, plan = plan_for(model, T, rf, checkpoint_dtype, window)
                for lc in plan:
                    sig = _signature(lc.kernel, lc.args, lc.constexprs)
                    consts = {(lc.kernel.arg_names.index(k),): v for k, v in lc.constexprs.items()}
                    src = ASTSource(fn=lc.kernel, signature=sig, constexprs=consts)
                    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(num_warps=lc.num_warps))
                    name = compiled.metadata.name
                    tag = f"{model}.T{T}.{rf}.{'flush' if lc.flush_pass else 'step'}"
                    fname = f"{tag}.ptx"
                    with open(os.path.join(out, fname), "w") as f:
                        f.write(compiled.asm["ptx"])
                    entries.append(dict(
                        name=name, file=fname, op=lc.op, model=model, tokens=T, read_format=rf,
                        checkpoint_dtype=checkpoint_dtype, window=window,
                        flush_pass=bool(lc.flush_pass),
                        args=[dict(name=k, type=v) for k, v in sig.items() if v != "constexpr"],
                        constexprs={k: (v if isinstance(v, (int, float, bool, str)) else str(v))
                                    for k, v in lc.constexprs.items()},
                        grid=list(lc.grid), block=[lc.num_warps * 32, 1, 1], shared=compiled.metadata.shared))
    manifest = dict(ring_contract_version=RING_VERSION, arch=arch, triton=triton.__version__, kernels=entries)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Compile the replayssm kernels to PTX with a launch manifest.")
    ap.add_argument("--arch", default="sm_90", help="sm_90, sm_100, ...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default="1,4", help="tokens per step: 1 = decode, T > 1 = verify")
    ap.add_argument("--read-formats", default="checkpoint,fp8,nvfp4")
    ap.add_argument("--checkpoint-dtype", default="float32")
    ap.add_argument("--window", type=int, default=16)
    a = ap.parse_args(argv)
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"--models: unknown model {m!r}; expected some of {sorted(MODELS)}")
    manifest = compile_all(a.out, a.arch, models, [int(t) for t in a.tokens.split(",")],
                           a.read_formats.split(","), a.checkpoint_dtype, a.window)
    print(f"wrote {len(manifest['kernels'])} kernels for {a.arch} to {a.out}")


if __name__ == "__main__":
    main()
