"""One layer's step as the TensorRT plugin layers see it: its buffers, the launches the torch ops
make for them, and Triton's JIT specialization of each launch, for ``plugin_desc``, ``ptx_launch``
and the ``aot`` command.

``step_buffers`` names every tensor of a step with symbolic shapes, ``allocate`` makes them
(meta tensors by default), ``step_plan`` / ``plan_for`` give the launches ``kernels/ops.py``
performs on them, ``jit_specialization`` / ``compile_jit`` compile one launch as the JIT would.
Models: ``MODELS`` (``replayssm.spec.MODELS``) by name, a Hugging Face ``config.json``
(``dims_from_config``) or explicit dims (``parse_dims``).
"""

from __future__ import annotations

import inspect
import os

import torch

from replayssm.spec import MODELS

# Hugging Face model_type -> (family, LayerSpec dim -> config key; "a.b": key b of the dict under a)
_GDN_KEYS = dict(num_k_heads="linear_num_key_heads", num_v_heads="linear_num_value_heads",
                 head_k_dim="linear_key_head_dim", head_v_dim="linear_value_head_dim")
CONFIG_FAMILIES = {
    "nemotron_h": ("mamba2", dict(num_heads="mamba_num_heads", head_dim="mamba_head_dim", state_dim="ssm_state_size",
                                  num_groups="n_groups")),
    "mamba2": ("mamba2", dict(num_heads="num_heads", head_dim="head_dim", state_dim="state_size",
                              num_groups="n_groups")),
    "qwen3_next": ("gdn", _GDN_KEYS),
    "qwen3_5_text": ("gdn", _GDN_KEYS),
    "qwen3_5_moe_text": ("gdn", _GDN_KEYS),
    "kimi_linear": ("kda", dict(num_k_heads="linear_attn_config.num_heads", num_v_heads="linear_attn_config.num_heads",
                                head_k_dim="linear_attn_config.head_dim", head_v_dim="linear_attn_config.head_dim")),
}
TEXT_CONFIGS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}   # multimodal: the text model's
FAMILY_DIMS = {"mamba2": ("num_heads", "head_dim", "state_dim", "num_groups"),
               "gdn": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
               "kda": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")}
_PTR = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
        torch.int64: "i64", torch.uint8: "u8", torch.float8_e4m3fn: "fp8e4nv"}


def launch_signature(kernel, args: list, constexprs: dict) -> dict:
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


def resolve_dim(d, n: int, S: int) -> int:
    """A ``step_buffers`` dim for ``n`` rows and ``S`` slots: ``"n"``, ``"S"``, ``"S + 1"`` or an int."""
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


def allocate(buffers: dict, n: int, S: int, device="meta") -> dict:
    """Tensors of ``step_buffers`` for ``n`` rows and ``S`` slots (uninitialized; meta by default)."""
    return {k: torch.empty([resolve_dim(d, n, S) for d in shape], dtype=dt, device=device)
            for k, (shape, dt) in buffers.items()}


def step_plan(spec, cfg, tensors: dict, *, committed: bool, layer: int = 0, state_layout: str = "kv") -> list:
    """``ops.mamba2_plan`` / ``ops.delta_plan`` over named step tensors (as ``allocate`` gives)."""
    from replayssm.kernels import ops
    from replayssm.kernels.formats.codes import CKPT_CODES, READ_CODES

    t = dict(tensors)
    if spec.is_delta and state_layout == "vk":
        t["checkpoint"] = t["checkpoint"].transpose(-1, -2)
    fixed = dict(window=cfg.window, committed=committed, checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype],
                 read_format=READ_CODES[cfg.read_format], sr_base=ops.sr_base(cfg.seed, layer))
    if spec.family == "mamba2":
        plan = ops.mamba2_plan
    else:
        plan, fixed["scale"] = ops.delta_plan, spec.head_k_dim ** -0.5
    # the plan's tensor parameters by name (an optional one absent from ``tensors`` is None)
    named = {p: t.get(p) for p in inspect.signature(plan).parameters if p not in fixed}
    return plan(**named, **fixed)


def dims_from_config(config: dict) -> dict:
    """The ``MODELS``-style dims (``family`` and the ``LayerSpec`` dims) of a Hugging Face
    ``config.json`` (as a dict) of a served family: ``CONFIG_FAMILIES`` by ``model_type`` (a
    multimodal Qwen3.5 config: its ``text_config``). ValueError naming the key otherwise."""
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type in TEXT_CONFIGS and isinstance(config.get("text_config"), dict):
        return dims_from_config({"model_type": TEXT_CONFIGS[model_type], **config["text_config"]})
    if model_type not in CONFIG_FAMILIES:
        raise ValueError(f"model_type: expected a model with replayed layers, one of "
                         f"{sorted(CONFIG_FAMILIES) + sorted(TEXT_CONFIGS)}, got {model_type!r}")
    family, keys = CONFIG_FAMILIES[model_type]
    dims = dict(family=family)
    for dim, key in keys.items():
        value = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{key}: expected an int in a {model_type} config, got {value!r}")
        dims[dim] = value
    return dims


def parse_dims(text: str) -> dict:
    """``FAMILY:key=value,...`` (e.g. ``gdn:num_k_heads=16,num_v_heads=32,head_k_dim=128,head_v_dim=128``)
    as ``MODELS``-style dims; every dim of the family (``FAMILY_DIMS``) once, a positive int."""
    family, sep, rest = text.partition(":")
    if not sep or family not in FAMILY_DIMS:
        raise ValueError(f"expected FAMILY:key=value,... with FAMILY one of {sorted(FAMILY_DIMS)}, got {text!r}")
    dims = dict(family=family)
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in FAMILY_DIMS[family] or key in dims or not value.isdigit():
            raise ValueError(f"expected {','.join(k + '=<int>' for k in FAMILY_DIMS[family])} for {family}, "
                             f"got {item!r}")
        dims[key] = int(value)
    missing = [k for k in FAMILY_DIMS[family] if k not in dims]
    if missing:
        raise ValueError(f"{family}: missing {', '.join(missing)}")
    return dims


def model_config(model, tokens: int, read_format: str, checkpoint_dtype: str, window: int,
                 max_draft_tokens: int | None = None):
    """``(spec, cfg)`` of ``model`` (a ``MODELS`` name, or dims as ``MODELS`` holds them) for steps
    of up to ``tokens`` tokens: bf16 ring.

    ``max_draft_tokens``: the pool's draft budget, which sizes its ring and so the kernels' window
    block; every step of one pool (decode and each verify size) must use the pool's. None: just
    enough for this step (``tokens - 1``)."""
    import replayssm as rs

    if isinstance(model, dict):
        dims = dict(model)
    elif model in MODELS:
        dims = dict(MODELS[model])
    else:
        raise ValueError(f"model: expected one of {sorted(MODELS)} or a dict of dims, got {model!r}")
    drafts = max(tokens - 1, 0) if max_draft_tokens is None else max_draft_tokens
    if not isinstance(drafts, int) or drafts < 0 or tokens > drafts + 1:
        raise ValueError(f"max_draft_tokens: expected an int >= tokens - 1 = {tokens - 1}, got {max_draft_tokens!r}")
    family = dims.pop("family", None)
    if family not in FAMILY_DIMS:
        raise ValueError(f"family: expected one of {sorted(FAMILY_DIMS)}, got {family!r}")
    spec = getattr(rs.LayerSpec, family)(**dims)
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts, checkpoint_dtype=checkpoint_dtype,
                          read_format=read_format, ring_dtype="bfloat16")
    return spec, cfg


def check_model(model, tokens, read_formats, checkpoint_dtype: str, window: int) -> None:
    """ValueError (naming the dim) unless every step of ``model`` (as :func:`model_config` takes it)
    compiles: dims a ``LayerSpec`` takes, that each read format can serve and the kernels take."""
    from replayssm.kernels import backend

    drafts = max(tokens) - 1
    for T in tokens:
        for rf in read_formats:
            spec, cfg = model_config(model, T, rf, checkpoint_dtype, window, max_draft_tokens=drafts)
            cfg.check(spec)
            backend.check(spec, cfg)


def plan_for(model: str, tokens: int, read_format: str, checkpoint_dtype: str, window: int, n: int = 8,
             max_draft_tokens: int | None = None):
    """The launches of one step of ``model`` (meta tensors: shapes, dtypes and strides only), with
    ``model_config``'s spec and config (``max_draft_tokens`` as there)."""
    spec, cfg = model_config(model, tokens, read_format, checkpoint_dtype, window, max_draft_tokens)
    tensors = allocate(step_buffers(spec, cfg, tokens), n, 2 * n)
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
        lc: a ``kernels.plan.Launch``.
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
    kwargs = dict(lc.constexprs, **lc.options(), debug=kernel.debug or knobs.runtime.debug,
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
