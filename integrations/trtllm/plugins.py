"""TensorRT Python-plugin registrations of the replayssm steps (``tensorrt.plugin``, TensorRT >= 10.9).

NEVER RUN: TensorRT installs only on CUDA machines (no CPU wheels; the bindings need
``libnvinfer`` and a driver) and has never run with these registrations, which were checked
against the published API only (NVIDIA/TensorRT ``python/packaging/bindings_wheel/tensorrt/plugin``:
``_lib.py`` 5ca4580 ``register`` / ``aot_impl`` / ``PluginDef.__call__``, ``_validate.py`` 8c6d69d
for the signatures they parse, ``_tensor.py`` 17003e4 ``TensorDesc.like`` / ``aliased``;
``KernelLaunchParams``, ``SymIntExprs``, ``SymInt32``, ``cdiv``, ``add_plugin(..., aot=True)`` from
the documentation). ``register`` reads the input names from the function's signature and the
output count from its return annotation, so both are built here per plugin id. What
they return comes from ``plugin_desc``, which is tested on a CPU.

Every plugin takes one attribute, ``config`` (JSON of :func:`step_config`): the layer dims,
replay configuration, op, T, layer, gate, state layout and target arch. AOT attributes are not
serialized into the engine; the PTX, launch parameters and extra args are.

``import replayssm.integrations.trtllm.plugins`` works without TensorRT; :func:`register` and
:func:`add_step` raise ImportError saying what to install.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing

from . import plugin_desc as pd

INSTALL_HINT = ("TensorRT >= 10.9 with its Python plugin API (tensorrt.plugin) is required: install "
                "'replayssm[trtllm]' (tensorrt>=10.9) on a Linux machine with an NVIDIA driver; "
                "TensorRT-LLM 1.2.x pins tensorrt~=10.14")
FAMILIES = ("mamba2", "gdn", "kda")


def _trtp():
    """``tensorrt.plugin``, or ImportError naming what to install."""
    try:
        import tensorrt.plugin as trtp
    except ImportError as e:
        raise ImportError(f"replayssm.integrations.trtllm.plugins: {INSTALL_HINT} ({e})") from e
    return trtp


def step_config(spec, cfg, *, op: str, tokens: int, layer: int = 0, has_z: bool = False,
                state_layout: str = "kv", arch: str = "sm_90") -> str:
    """The ``config`` attribute of one layer's step plugins (JSON); validated by describing it."""
    pd.describe_step(spec, cfg, op=op, tokens=tokens, layer=layer, has_z=has_z, state_layout=state_layout)
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
        raise ValueError(f"arch: expected 'sm_<major><minor>' (sm_90, sm_100a, ...), got {arch!r}")
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    dims = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return json.dumps(dict(spec=dims, cfg=fields, op=op, tokens=tokens, layer=layer, has_z=has_z,
                           state_layout=state_layout, arch=arch), sort_keys=True)


@functools.lru_cache(maxsize=None)
def _descs(config: str) -> tuple[dict, str]:
    """Plugin id -> descriptor of a ``config``, and its target arch."""
    import replayssm as rs

    c = json.loads(config)
    spec, cfg = rs.LayerSpec(**c["spec"]), rs.ReplayConfig(**c["cfg"])
    descs = pd.describe_step(spec, cfg, op=c["op"], tokens=c["tokens"], layer=c["layer"], has_z=c["has_z"],
                             state_layout=c["state_layout"])
    return {d.plugin_id: d for d in descs}, c["arch"]


@functools.lru_cache(maxsize=None)
def _compiled(config: str, plugin_id: str) -> dict:
    descs, arch = _descs(config)
    return pd.compile_kernel(descs[plugin_id], arch)


def _io(family: str, plugin_id: str) -> tuple[list[str], int]:
    """The input names (kernel parameters) and the number of outputs of a plugin id: the same for
    every config (checked by the tests), as one registration serves them all."""
    import replayssm as rs

    spec = {"mamba2": rs.LayerSpec.mamba2(num_heads=2, head_dim=16, state_dim=16, num_groups=1),
            "gdn": rs.LayerSpec.gdn(num_k_heads=1, num_v_heads=1, head_k_dim=16, head_v_dim=16),
            "kda": rs.LayerSpec.kda(num_k_heads=1, num_v_heads=1, head_k_dim=16, head_v_dim=16)}[family]
    name = plugin_id.split("::")[1]
    op = name.removeprefix(family + "_").removesuffix("_flush") if name != "advance" else "decode"
    # with a read copy: a decode on the checkpoint is one launch (no decode_flush layer)
    descs = pd.describe_step(spec, rs.ReplayConfig(window=4, max_draft_tokens=1, read_format="fp8"), op=op, tokens=1)
    desc = {d.plugin_id: d for d in descs}[plugin_id]
    return [t.name for t in desc.inputs], len(desc.outputs)


def _plugin_ids() -> list[tuple[str, str]]:
    ids = [(f, f"{pd.NAMESPACE}::{f}_{op}{p}") for f in FAMILIES for op in pd.OPS for p in ("", "_flush")]
    return ids + [("mamba2", f"{pd.NAMESPACE}::advance")]


def _signature(names: list[str], trtp, extra: tuple, returns) -> inspect.Signature:
    """Tensors, ``config: str``, then ``extra`` (unannotated): the signature ``tensorrt.plugin`` parses."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind, annotation=trtp.TensorDesc) for n in names]
    params.append(inspect.Parameter("config", kind, annotation=str))
    params += [inspect.Parameter(k, kind) for k in extra]
    return inspect.Signature(params, return_annotation=returns)


def _bound(fn, sig: inspect.Signature, names: list[str]):
    """``fn(inputs, config)`` behind ``sig``."""
    def wrapper(*args, **kw):
        b = sig.bind(*args, **kw).arguments
        if not isinstance(b["config"], str):
            raise TypeError("config: expected the JSON string of plugins.step_config, got "
                            f"{type(b['config']).__name__}")
        return fn([b[n] for n in names], b["config"])
    wrapper.__signature__ = sig
    return wrapper


_registered: set = set()


def register() -> None:
    """Register every replayssm plugin with ``tensorrt.plugin`` (shape function + AOT implementation).

    Idempotent. Each plugin's outputs: the aliased in-place buffers of its descriptor and, for a
    non-flush pass, a new ``out`` like ``x`` (Mamba-2) / ``v`` (GDN, KDA).
    """
    trtp = _trtp()
    for family, pid in _plugin_ids():
        if pid in _registered:
            continue
        names, n_out = _io(family, pid)
        outputs = typing.Tuple[(trtp.TensorDesc,) * n_out]  # the output count is read from this annotation
        trtp.register(pid)(_bound(functools.partial(_shape, pid), _signature(names, trtp, (), outputs), names))
        kernel = typing.Tuple[typing.Union[str, bytes], typing.Union[str, bytes], trtp.KernelLaunchParams,
                              trtp.SymIntExprs]
        aot_sig = _signature(names, trtp, ("outputs", "tactic"), kernel)
        trtp.aot_impl(pid)(_bound(functools.partial(_aot_impl, pid, trtp), aot_sig, names))
        _registered.add(pid)


def _shape(pid: str, inputs: list, config: str) -> tuple:
    """Output descriptors: aliases of in-place inputs, a new ``out`` like x / v."""
    desc = _descs(config)[0][pid]
    outs = []
    for o in desc.outputs:
        if o.alias_of is not None:
            outs.append(inputs[o.alias_of].aliased())
        else:
            like = next(i for i, t in enumerate(desc.inputs) if t.buffer in ("x", "v") and t.name == t.buffer)
            outs.append(inputs[like].like())
    return tuple(outs)


def _aot_impl(pid: str, trtp, inputs: list, config: str) -> tuple:
    """(PTX entry name, PTX, launch parameters, extra args) of a plugin layer."""
    desc = _descs(config)[0][pid]
    k = _compiled(config, pid)
    buffers = [t.buffer for t in desc.inputs]
    n = inputs[buffers.index("slots")].shape_expr[0]
    sym = {"n": n, f"cdiv(n, {pd.ADVANCE_BLOCK})": trtp.cdiv(n, pd.ADVANCE_BLOCK)}
    grid = [sym[g] if isinstance(g, str) else g for g in k["grid"]] + [1] * (3 - len(k["grid"]))
    params = trtp.KernelLaunchParams()
    params.grid_x, params.grid_y, params.grid_z = grid
    params.block_x, params.block_y, params.block_z = k["block"]
    params.shared_mem = k["shared"]
    extra = trtp.SymIntExprs(len(desc.kernel.extra_args))
    sizes = {"n": n, "S": inputs[buffers.index("count")].shape_expr[0] - 1}  # S: the cursors' length - 1
    for i, (_, v) in enumerate(desc.kernel.extra_args):  # a constant, or "n" / "S"
        extra[i] = trtp.SymInt32(sizes.get(v, v))
    return k["name"], k["ptx"], params, extra


def add_step(network, tensors: dict, spec, cfg, *, op: str, tokens: int, layer: int = 0, has_z: bool = False,
             state_layout: str = "kv", arch: str = "sm_90") -> dict:
    """Add one layer's step (non-flush pass, flush pass, cursor advance) to ``network`` with ``aot=True``.

    Args:
        network: a ``tensorrt.INetworkDefinition``.
        tensors: ``steps.step_buffers`` name -> ``tensorrt.ITensor`` (checkpoint, read_* for fp8 /
            nvfp4, ring_*, count, origin, pending, epoch ``[S + 1]`` int32, slots ``[n]`` int64,
            the step inputs ``[n, T, ...]``); placeholders are filled by the descriptor.
        spec, cfg, op, tokens, layer, has_z, state_layout, arch: as :func:`step_config`.
    Returns:
        ``tensors`` updated with the layers' outputs: ``out [n, T, heads, dim]`` and the in-place
        buffers (use these, not the inputs, downstream so TensorRT orders the layers).
    """
    descs = pd.describe_step(spec, cfg, op=op, tokens=tokens, layer=layer, has_z=has_z, state_layout=state_layout)
    needed = {t.buffer for d in descs for t in d.inputs} - {"out"}
    missing = sorted(needed - set(tensors))
    if missing:
        raise ValueError(f"tensors: missing {missing} (names of steps.step_buffers)")
    config = step_config(spec, cfg, op=op, tokens=tokens, layer=layer, has_z=has_z, state_layout=state_layout,
                         arch=arch)
    trtp = _trtp()
    register()
    cur = dict(tensors)
    for desc in descs:
        ns, name = desc.plugin_id.split("::")
        plugin = getattr(getattr(trtp.op, ns), name)(*[cur[t.buffer] for t in desc.inputs], config=config)
        layer_ = network.add_plugin(plugin, aot=True)
        for i, o in enumerate(desc.outputs):
            cur[o.buffer] = layer_.get_output(i)
    return cur
