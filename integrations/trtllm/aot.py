"""Ahead-of-time PTX of the replayssm TensorRT plugin layers, with the manifests they launch from.

    python -m replayssm.integrations.trtllm.aot --arch sm_90 --out DIR [--models qwen3.5,...]
        [--tokens 1,4] [--read-formats checkpoint,nvfp4] [--checkpoint-dtype float32] [--window 16]
        [--gate]

For every model x T x read format it writes one step directory ``DIR/<model>.<op>.T<T>.<read
format>/`` (``op`` decode for T = 1, verify for T > 1) with ``ptx_launch.save_step``: the PTX of
the step's three plugin layers (``plugin_desc.describe_step``, compiled by
``plugin_desc.compile_kernel``: the kernels the torch ops' launches run, parameters in TensorRT's
order) and their ``manifest.json`` (entry names, TensorRT's arguments in order (inputs, int32 extra
args with their values, outputs) with shapes and dtypes, grid, block, shared memory, ring contract
version; ``ptx_launch`` module docstring), which ``ptx_launch.load_step`` reads back. Steps are
layer 0's (``sr_base`` of seed 0, layer 0) with the bf16 ring, the ``[S, HV, K, V]`` checkpoint and,
for Mamba-2, the gate ``z`` an input only with ``--gate``. Compiling needs Triton only; no GPU.

``DIR/manifest.json`` indexes them: ``ring_contract_version``, ``arch``, ``triton`` and ``steps``,
each with ``dir``, ``model``, ``family``, ``op``, ``tokens``, ``max_draft_tokens`` (the pool's draft
budget: every step sizes the ring for the largest ``tokens``), ``read_format``,
``checkpoint_dtype``, ``window`` and ``has_z``.
"""

from __future__ import annotations

import argparse
import json
import os
import re

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
    """Triton types of a launch's runtime arguments, unspecialized: pointer types from tensors, i32
    for integers (i64 for sr_base). The conformance suite compares plans with launches through it."""
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


def _dim(d, n: int, S: int) -> int:
    return {"n": n, "S": S, "S + 1": S + 1}.get(d, d) if isinstance(d, str) else d


def step_buffers(spec, cfg, tokens: int, *, has_z: bool = True, state_layout: str = "kv") -> dict:
    """Every tensor of one layer's step, in ``mamba2_step`` / ``delta_step`` argument order:
    name -> (shape, dtype), shapes symbolic in ``"n"`` (rows), ``"S"`` (slots) and ``"S + 1"``.

    The checkpoint is the framework's tensor: ``[S, HV, V, K]`` for a delta family with
    ``state_layout="vk"`` (the op then reads it through a transposed view). Read-copy buffers
    exist only for the fp8 / nvfp4 read formats; ``z`` only with ``has_z`` (Mamba-2).
    """
    from replayssm import formats, ring

    if state_layout not in ("kv", "vk"):
        raise ValueError(f"state_layout: expected 'kv' or 'vk', got {state_layout!r}")
    f32, i32, act = torch.float32, torch.int32, cfg.torch_ring_dtype
    state = tuple(spec.state_shape)
    if spec.is_delta and state_layout == "vk":
        state = (state[0], state[2], state[1])
    bufs = {"checkpoint": (("S", *state), cfg.torch_checkpoint_dtype)}
    if cfg.read_format != "checkpoint":
        heads, rows, cols = spec.read_rows_cols
        for k, (shape, dt) in formats.read_copy_shapes(cfg.read_format, rows, cols).items():
            bufs[f"read_{k}"] = (("S", heads, *shape), dt)
    bufs.update({f"ring_{k}": (("S", *shape), dt) for k, (shape, dt) in ring.ring_buffers(spec, cfg).items()})
    bufs.update({k: (("S + 1",), i32) for k in ("count", "origin", "epoch")})
    bufs["slots"] = (("n",), torch.int64)
    lead = ("n", tokens)
    if spec.family == "mamba2":
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        bufs.update(x=((*lead, H, P), act), dt=((*lead, H), f32), A=((H,), f32), B=((*lead, G, N), act),
                    C=((*lead, G, N), act), D=((H,), f32), dt_bias=((H,), f32))
        if has_z:
            bufs["z"] = ((*lead, H, P), act)
        bufs["out"] = ((*lead, H, P), act)
        return bufs
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    g = (*lead, HV, K) if spec.family == "kda" else (*lead, HV)
    # q in the ring dtype with q_scale, the inverse of its L2 norm in fp32 (the host's normalisation as a
    # factor on the outputs, as the SGLang adapters pass it)
    bufs.update(q=((*lead, HK, K), act), q_scale=((*lead, HK), f32), k=((*lead, HK, K), act), v=((*lead, HV, V), act),
                g=(g, f32), beta=((*lead, HV), f32), out=((*lead, HV, V), act))
    return bufs


def materialize(buffers: dict, n: int, S: int, device="meta") -> dict:
    """Tensors of ``step_buffers`` for ``n`` rows and ``S`` slots (uninitialized; meta by default)."""
    return {k: torch.empty([_dim(d, n, S) for d in shape], dtype=dt, device=device)
            for k, (shape, dt) in buffers.items()}


def step_plan(spec, cfg, tensors: dict, *, committed: bool, layer: int = 0, state_layout: str = "kv") -> list:
    """``ops.mamba2_plan`` / ``ops.delta_plan`` over named step tensors (as ``materialize`` gives)."""
    from replayssm.kernels import ops
    from replayssm.kernels.formats.triton import CKPT_CODES, READ_CODES

    t = dict(tensors)
    if spec.is_delta and state_layout == "vk":
        t["checkpoint"] = t["checkpoint"].transpose(-1, -2)
    read = [t.get(f"read_{k}") for k in ("codes", "block_scale", "row_scale")]
    fmt = dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
               sr_base=ops.sr_base(cfg.seed, layer))
    if spec.family == "mamba2":
        return ops.mamba2_plan(t["checkpoint"], *read, t["ring_x"], t["ring_dt"], t["ring_B"], t["count"],
                               t["origin"], t["epoch"], t["slots"], t["x"], t["dt"], t["A"], t["B"], t["C"],
                               t["D"], t["dt_bias"], t.get("z"), t["out"], cfg.window, committed, **fmt)
    return ops.delta_plan(t["checkpoint"], *read, t["ring_k"], t["ring_v"], t["ring_g"], t["ring_beta"], t["ring_d"],
                          t["count"], t["origin"], t["epoch"], t["slots"], t["q"], t["k"], t["v"], t["g"], t["beta"],
                          t["out"], spec.head_k_dim ** -0.5, cfg.window, committed, **fmt, q_scale=t["q_scale"])


def model_config(model: str, tokens: int, read_format: str, checkpoint_dtype: str, window: int,
                 max_draft_tokens: int | None = None):
    """``(spec, cfg)`` of ``model`` (``MODELS``) for steps of up to ``tokens`` tokens: bf16 ring.

    ``max_draft_tokens``: the pool's draft budget, which sizes its ring and so the kernels' window
    block; every step of one pool (decode and each verify size) must use the pool's. None: just
    enough for this step (``tokens - 1``)."""
    import replayssm as rs

    if model not in MODELS:
        raise ValueError(f"model: expected one of {sorted(MODELS)}, got {model!r}")
    drafts = max(tokens - 1, 0) if max_draft_tokens is None else max_draft_tokens
    if not isinstance(drafts, int) or drafts < 0 or tokens > drafts + 1:
        raise ValueError(f"max_draft_tokens: expected an int >= tokens - 1 = {tokens - 1}, got {max_draft_tokens!r}")
    dims = dict(MODELS[model])
    family = dims.pop("family")
    spec = getattr(rs.LayerSpec, family)(**dims)
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts, checkpoint_dtype=checkpoint_dtype,
                          read_format=read_format, ring_dtype="bfloat16")
    return spec, cfg


def plan_for(model: str, tokens: int, read_format: str, checkpoint_dtype: str, window: int, n: int = 8,
             max_draft_tokens: int | None = None):
    """The launches of one step of ``model`` (meta tensors: shapes, dtypes and strides only), with
    ``model_config``'s spec and config (``max_draft_tokens`` as there)."""
    spec, cfg = model_config(model, tokens, read_format, checkpoint_dtype, window, max_draft_tokens)
    tensors = materialize(step_buffers(spec, cfg, tokens), n, 2 * n)
    return spec, step_plan(spec, cfg, tensors, committed=tokens == 1)


def _check_compiler() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: the kernels are interpreted functions; unset it to compile")


def _target(arch: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", int(arch.removeprefix("sm_").rstrip("a")), 32)


def jit_specialization(lc, arch: str, *, dynamic: tuple = (), replace: dict | None = None):
    """The specialization Triton's JIT gives ``lc.kernel[grid](*lc.args, num_warps=..., **constexprs)``
    for ``arch``, computed by Triton's own binder (``create_function_from_signature``) and
    ``JITFunction._pack_args``, as ``JITFunction.run`` does before compiling.

    That is: an int equal to 1 becomes the constant 1; other ints are i32 (i64 outside int32) with
    ``tt.divisibility=16`` when divisible by 16; a tensor is a pointer with ``tt.divisibility=16``
    when its address is; floats are fp32, unspecialized.

    Args:
        lc: a ``kernels.ops.Launch``.
        dynamic: integer parameters compiled as Triton compiles a ``do_not_specialize`` one (plain
            i32, whatever the value): sizes that vary between launches of one PTX (``n``).
        replace: parameter -> value used in place of ``lc``'s argument.
    Returns:
        ``(signature, constexprs, attrs, options)`` as ``triton.compiler.ASTSource`` and
        ``triton.compile`` take them: signature name -> Triton type (``"constexpr"`` for constants),
        constexprs and attrs keyed by ``(parameter index,)``.
    """
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = lc.kernel
    backend = make_backend(_target(arch))
    names = [a for a in kernel.arg_names if a not in lc.constexprs]
    unknown = set(dynamic) - set(names) | set(replace or {}) - set(names)
    if unknown:
        raise ValueError(f"{kernel.__name__}: no runtime parameters {sorted(unknown)}")
    args = [(replace or {}).get(k, v) for k, v in zip(names, lc.args)]
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(lc.constexprs, num_warps=lc.num_warps, debug=kernel.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, specialization, options = binder(*args, **kwargs)
    for i, name in enumerate(kernel.arg_names):
        if name in dynamic:
            if specialization[i][0] not in ("i32", "constexpr") or not isinstance(bound[name], int):
                raise ValueError(f"{kernel.__name__}: dynamic parameter {name} is not an int32")
            specialization[i] = ("i32", None)
    options, sig, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return sig, constexprs, attrs, options


def compile_jit(lc, arch: str, *, dynamic: tuple = (), replace: dict | None = None):
    """``triton.compile`` of ``lc`` with the JIT's specialization (:func:`jit_specialization`):
    the kernel the torch op's launch of the same arguments runs. Returns (signature, compiled)."""
    import triton
    from triton.compiler import ASTSource

    _check_compiler()
    sig, constexprs, attrs, options = jit_specialization(lc, arch, dynamic=dynamic, replace=replace)
    src = ASTSource(lc.kernel, sig, constexprs, attrs)
    return sig, triton.compile(src, target=_target(arch), options=options.__dict__)


def compile_all(out: str, arch: str, models, tokens, read_formats, checkpoint_dtype: str, window: int, *,
                has_z: bool = False) -> dict:
    """Write every requested step's plugin layers to ``out`` (module docstring); returns the index
    (also written as ``out/manifest.json``).

    ``has_z``: Mamba-2 steps take the gate ``z`` as an input (ignored for GDN / KDA models)."""
    import triton

    from replayssm.ring import RING_VERSION

    from . import ptx_launch

    if not tokens or any(not isinstance(T, int) or T < 1 for T in tokens):
        raise ValueError(f"tokens: expected ints >= 1, got {list(tokens)!r}")
    drafts = max(tokens) - 1
    steps = []
    for model in models:
        for T in tokens:
            op = "decode" if T == 1 else "verify"
            for rf in read_formats:
                spec, cfg = model_config(model, T, rf, checkpoint_dtype, window, max_draft_tokens=drafts)
                z = has_z and spec.family == "mamba2"
                step = f"{model}.{op}.T{T}.{rf}"
                ptx_launch.save_step(ptx_launch.build_step(spec, cfg, op=op, tokens=T, has_z=z, arch=arch),
                                     os.path.join(out, step))
                steps.append(dict(dir=step, model=model, family=spec.family, op=op, tokens=T,
                                  max_draft_tokens=drafts, read_format=rf, checkpoint_dtype=checkpoint_dtype,
                                  window=window, has_z=z))
    index = dict(ring_contract_version=RING_VERSION, arch=arch, triton=triton.__version__, steps=steps)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, ptx_launch.MANIFEST), "w") as f:
        json.dump(index, f, indent=1)
    return index


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Compile the replayssm TensorRT plugin layers to PTX with their "
                                             "launch manifests.")
    ap.add_argument("--arch", default="sm_90", help="sm_90, sm_100, ...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default="1,4", help="tokens per step: 1 = decode, T > 1 = verify")
    ap.add_argument("--read-formats", default="checkpoint,fp8,nvfp4")
    ap.add_argument("--checkpoint-dtype", default="float32")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--gate", action="store_true", help="Mamba-2 steps take the gate z as an input")
    a = ap.parse_args(argv)
    if not re.fullmatch(r"sm_\d+a?", a.arch):
        ap.error(f"--arch: expected sm_<major><minor> such as sm_90 or sm_100, got {a.arch!r}")
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r}; expected some of {sorted(MODELS)}")
    tokens = [int(t) if t.strip().isdigit() else 0 for t in a.tokens.split(",")]
    if min(tokens) < 1:
        ap.error(f"--tokens: expected comma-separated ints >= 1, got {a.tokens!r}")
    index = compile_all(a.out, a.arch, models, tokens, a.read_formats.split(","), a.checkpoint_dtype, a.window,
                        has_z=a.gate)
    print(f"wrote {len(index['steps'])} steps for {a.arch} to {a.out}")


if __name__ == "__main__":
    main()
