"""The plugin layers' PTX launched through the CUDA driver the way TensorRT launches an AOT plugin.

A TensorRT AOT plugin (``plugin_desc``, ``plugins``) hands TensorRT a PTX entry, its grid, block
and dynamic shared memory, and integer extra args; TensorRT loads the PTX and passes the kernel
``[input pointers..., extra args (int32)..., output pointers...]``, an aliased output repeating its
input's pointer. This module does the same through ``cuda.bindings.driver`` (``cuda-python``),
without TensorRT:

- :func:`build_step`: the manifest of one layer's step (its three plugin layers, PTX included),
  compiled in-process (Triton, not its interpreter; no GPU unless the arch is read from it).
  :func:`save_step` / :func:`load_step` write and read it as a directory (``manifest.json`` and
  one ``.ptx`` per layer); loading needs neither Triton nor a GPU.
- :func:`pack_args`, :func:`grid_for`, :func:`check_ptx_params`: a layer's kernel parameters from
  named buffers in TensorRT's order, its grid, and that order against the PTX entry's parameters
  (plain functions; they run on a CPU).
- :class:`PtxStep`: a step's PTX loaded with ``cuModuleLoadData`` and launched with
  ``cuLaunchKernel`` on torch's current stream (GPU only).

Triton (>= 3.3) appends a global and a profile scratch pointer to every kernel's parameters. The
plugin passes no scratch: those parameters receive the trailing output pointers and must stay
unused (``plugin_desc.compile_kernel`` refuses a kernel with a scratch size); TensorRT's list
must still cover every PTX parameter, which :func:`check_ptx_params` checks.

``manifest.json``: ``ring_contract_version``, ``arch``, ``triton`` and ``layers``, in launch order,
each with ``plugin_id``, ``name`` (PTX entry), ``file``, ``grid`` (ints, ``"n"``,
``"cdiv(n, 128)"``), ``block``, ``shared`` (bytes of dynamic shared memory) and ``args``:
TensorRT's parameters in order, ``{"kind": "input" | "extra" | "output", "name": ...}``; extra args
carry ``value`` (the int32 passed: an integer, a float's fp32 bits, or ``"n"`` / ``"S"``); inputs and
outputs also carry ``buffer`` (a ``steps.step_buffers`` name, or ``pending``), ``shape`` (ints,
``"n"``, ``"S"``, ``"S + 1"``) and ``dtype`` (torch's name), outputs ``alias_of`` (the index of the
input whose buffer they are, or null for a new tensor).
"""

from __future__ import annotations

import ctypes
import json
import os
import re

import torch

from . import plugin_desc as pd
from . import steps

MANIFEST = "manifest.json"
_STATIC_SHARED = 48 * 1024  # dynamic shared memory a kernel gets without opting in
_INT32 = 2 ** 31


def driver():
    """``cuda.bindings.driver``, or ImportError saying to install cuda-python."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise ImportError("replayssm.integrations.trtllm.ptx_launch: the CUDA driver bindings are required: "
                          f"pip install 'cuda-python>=12.6' (module cuda.bindings.driver) ({e})") from e
    return cu


def layer_entry(desc: pd.PluginDesc, *, name: str, shared: int) -> dict:
    """The manifest entry of a plugin layer (no PTX): its launch and TensorRT's parameters.

    Args:
        desc: the layer's descriptor (``plugin_desc.describe_step``).
        name: the PTX entry. shared: bytes of dynamic shared memory (``compile_kernel``'s).
    """
    def tensor(kind: str, t: pd.PluginTensor) -> dict:
        arg = dict(kind=kind, name=t.name, buffer=t.buffer, shape=list(t.shape),
                   dtype=str(t.dtype).removeprefix("torch."))
        return arg if kind == "input" else dict(arg, alias_of=t.alias_of)

    args = [tensor("input", t) for t in desc.inputs]
    args += [dict(kind="extra", name=p, value=v) for p, v in desc.kernel.extra_args]
    args += [tensor("output", t) for t in desc.outputs]
    return dict(plugin_id=desc.plugin_id, name=name, grid=list(desc.kernel.grid), block=list(desc.kernel.block),
                shared=shared, args=args)


def build_step(spec, cfg, *, op: str, tokens: int, layer: int = 0, has_z: bool = False, state_layout: str = "kv",
               arch: str | None = None) -> dict:
    """The manifest of one layer's step (non-flush pass, flush pass, cursor advance; a decode on the
    checkpoint has no flush pass), PTX included.

    Args:
        spec, cfg, op, tokens, layer, has_z, state_layout: as ``plugin_desc.describe_step``.
        arch: ``sm_90``, ``sm_100a``, ...; None: the current CUDA device's (``sm_<major><minor>``).
    Returns:
        The manifest (module docstring), each layer with its ``ptx`` text and no ``file``.
    Raises:
        ValueError from :func:`check_ptx_params` if a PTX entry takes parameters TensorRT's order
        does not supply.
    """
    import triton

    from replayssm.ring import RING_VERSION

    if arch is None:
        arch = "sm_%d%d" % torch.cuda.get_device_capability()
    layers = []
    for desc in pd.describe_step(spec, cfg, op=op, tokens=tokens, layer=layer, has_z=has_z,
                                 state_layout=state_layout):
        k = pd.compile_kernel(desc, arch)
        entry = dict(layer_entry(desc, name=k["name"], shared=k["shared"]), ptx=k["ptx"])
        check_ptx_params(entry, entry["ptx"])
        layers.append(entry)
    return dict(ring_contract_version=RING_VERSION, arch=arch, triton=triton.__version__, layers=layers)


def save_step(manifest: dict, directory) -> None:
    """Write ``manifest`` (with its layers' ``ptx``) to ``directory``: one ``<i>.<name>.ptx`` per
    layer and ``manifest.json`` naming them (``file``) in place of the PTX text."""
    os.makedirs(directory, exist_ok=True)
    layers = []
    for i, entry in enumerate(manifest["layers"]):
        fname = f"{i}.{entry['plugin_id'].split('::')[-1]}.ptx"
        with open(os.path.join(directory, fname), "w") as f:
            f.write(entry["ptx"])
        layers.append({**{k: v for k, v in entry.items() if k != "ptx"}, "file": fname})
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({**manifest, "layers": layers}, f, indent=1)


def load_step(directory) -> dict:
    """The manifest :func:`save_step` wrote to ``directory``, each layer with its ``ptx`` read back.

    Raises ValueError for a manifest of another ring contract version."""
    from replayssm.ring import RING_VERSION

    with open(os.path.join(directory, MANIFEST)) as f:
        manifest = json.load(f)
    if manifest.get("ring_contract_version") != RING_VERSION:
        raise ValueError(f"directory: {MANIFEST} is for ring contract version "
                         f"{manifest.get('ring_contract_version')!r}, this package implements {RING_VERSION}")
    for entry in manifest["layers"]:
        with open(os.path.join(directory, entry["file"])) as f:
            entry["ptx"] = f.read()
    return manifest


def step_sizes(buffers: dict) -> tuple[int, int]:
    """``(n, S)`` as TensorRT's shape expressions give them: rows from ``slots [n]``, slots from
    ``count [S + 1]``."""
    for name in ("slots", "count"):
        t = buffers.get(name)
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-d tensor in buffers, got "
                             f"{type(t).__name__} {list(getattr(t, 'shape', []))}")
    return buffers["slots"].shape[0], buffers["count"].shape[0] - 1


def pack_args(entry: dict, buffers: dict) -> tuple[tuple, tuple]:
    """A layer's kernel parameters in TensorRT's order, as ``cuLaunchKernel``'s ``kernelParams``
    takes them: ``(values, ctypes types)``, a ``c_void_p`` (``data_ptr()``) per input and output
    (an aliased output repeats its input's pointer) and a ``c_int`` per extra arg (its ``value``,
    ``n`` or ``S``).

    Args:
        entry: a manifest layer (:func:`layer_entry`).
        buffers: name -> tensor for every ``buffer`` the entry names; ``n`` and ``S`` come from
            ``slots`` and ``count`` (:func:`step_sizes`). Each must have the entry's shape and
            dtype, be contiguous (its strides are the entry's extra args), 16-byte aligned (the PTX is
            compiled for aligned buffers, as Triton's JIT compiles the torch op's) and be on the device
            of the others.
    """
    n, S = step_sizes(buffers)
    values, types, device = [], [], None
    for arg in entry["args"]:
        if arg["kind"] == "extra":
            v = {"n": n, "S": S}.get(arg["value"], arg["value"])
            if not -_INT32 <= v < _INT32:
                raise ValueError(f"{arg['name']}: TensorRT passes extra args as int32, got {v}")
            values.append(v)
            types.append(ctypes.c_int)
            continue
        name, where = arg["buffer"], f"({entry['plugin_id']} {arg['kind']} {arg['name']})"
        t = buffers.get(name)
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor in buffers {where}, got {type(t).__name__}")
        shape = [steps.resolve_dim(d, n, S) for d in arg["shape"]]
        if list(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} {where}, got {list(t.shape)}")
        if t.dtype != getattr(torch, arg["dtype"]):
            raise TypeError(f"{name}: expected dtype torch.{arg['dtype']} {where}, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor {where} (its strides are extra args), "
                             f"got strides {t.stride()}")
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: expected a 16-byte aligned address {where}, got {t.data_ptr():#x}")
        device = t.device if device is None else device
        if t.device != device:
            raise ValueError(f"{name}: expected device {device} like the other buffers {where}, got {t.device}")
        values.append(t.data_ptr())
        types.append(ctypes.c_void_p)
    return tuple(values), tuple(types)


def grid_for(entry: dict, n: int) -> tuple[int, int, int]:
    """A layer's grid for ``n`` rows, padded to three dimensions."""
    sym = {"n": n, f"cdiv(n, {pd.ADVANCE_BLOCK})": -(-n // pd.ADVANCE_BLOCK)}
    grid = [sym[g] if isinstance(g, str) else g for g in entry["grid"]]
    return tuple(grid + [1] * (3 - len(grid)))


def ptx_params(ptx: str, name: str) -> list[str]:
    """Parameter types of PTX entry ``name`` in order: ``"ptr"`` for a pointer (Triton declares
    them ``.u64 .ptr``), else the PTX type (``"u32"``, ``"s32"``, ...)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise ValueError(f"ptx: no .entry {name}")
    types = []
    for param in filter(None, (p.strip() for p in m.group(1).split(","))):
        tokens = param.split()
        if tokens[0] != ".param" or len(tokens) < 3:
            raise ValueError(f"ptx: cannot read parameter {param!r} of .entry {name}")
        types.append("ptr" if ".ptr" in tokens else tokens[1].lstrip("."))
    return types


def check_ptx_params(entry: dict, ptx: str) -> None:
    """Raise ValueError unless TensorRT's parameters (``entry["args"]``) cover the PTX entry's:
    one for each PTX parameter (extra ones are ignored by the driver), a pointer where the entry
    takes a 64-bit pointer and an int32 extra arg where it takes a 32-bit integer or float (the
    float's bits)."""
    got = ptx_params(ptx, entry["name"])
    passed = ["int32" if a["kind"] == "extra" else "ptr" for a in entry["args"]]
    if len(got) > len(passed):
        raise ValueError(f"{entry['plugin_id']}: the PTX entry takes {len(got)} parameters, TensorRT passes "
                         f"{len(passed)}")
    for i, (want, have) in enumerate(zip(got, passed)):
        if (want == "ptr") != (have == "ptr") or (have == "int32" and want not in ("u32", "s32", "b32", "f32")):
            raise ValueError(f"{entry['plugin_id']}: PTX parameter {i} is {want}, TensorRT passes {have} "
                             f"({entry['args'][i]['name']})")


def _check(cu, result, what: str):
    """The value of a driver call's ``(CUresult, value...)``; RuntimeError naming the call otherwise."""
    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {getattr(err, 'name', err)}")
    return rest[0] if rest else None


def _ptx_header(ptx: str) -> str:
    return " ".join(re.findall(r"^\s*\.(?:version|target)\s+\S+", ptx, re.M)).strip()


class PtxStep:
    """One layer's step: its plugin layers' PTX loaded into a CUDA device's primary context (the
    context torch allocates in), launched as TensorRT launches the plugins. GPU only.

    Args:
        manifest: :func:`build_step`'s or :func:`load_step`'s (every layer with its ``ptx``).
        device: the CUDA device of the buffers (default: torch's current one).

    ``step(buffers)`` launches the layers in order on torch's current stream of that device, each
    with :func:`pack_args`'s parameters, :func:`grid_for`'s grid (no launch for an empty one, as
    Triton's launcher does), the entry's block and dynamic shared memory (the function's
    ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` raised to it above 48 KiB at load). It does
    not synchronize. ``buffers``: as :func:`pack_args` takes them (``out`` included: written).

    Raises ImportError naming cuda-python without it, and RuntimeError naming the driver call and
    its CUresult when one fails.
    """

    def __init__(self, manifest: dict, device=None):
        device = torch.device("cuda" if device is None else device)
        if device.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device}")
        cu = driver()
        self.device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        self._cu = cu
        _check(cu, cu.cuInit(0), "cuInit")
        dev = _check(cu, cu.cuDeviceGet(self.device.index), "cuDeviceGet")
        self._ctx = _check(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(cu, cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        self.layers = []
        for entry in manifest["layers"]:
            check_ptx_params(entry, entry["ptx"])
            what = entry["plugin_id"]
            err, module = cu.cuModuleLoadData(entry["ptx"].encode() + b"\0")
            if err != cu.CUresult.CUDA_SUCCESS:
                version = _check(cu, cu.cuDriverGetVersion(), "cuDriverGetVersion")
                major, minor = torch.cuda.get_device_capability(self.device)
                raise RuntimeError(f"{what}: cuModuleLoadData: {getattr(err, 'name', err)} (PTX "
                                   f"{_ptx_header(entry['ptx'])} built for {manifest.get('arch')}; device "
                                   f"sm_{major}{minor}, driver CUDA {version // 1000}.{version % 1000 // 10})")
            fn = _check(cu, cu.cuModuleGetFunction(module, entry["name"].encode()), f"{what}: cuModuleGetFunction")
            if entry["shared"] > _STATIC_SHARED:
                attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                _check(cu, cu.cuFuncSetAttribute(fn, attr, entry["shared"]), f"{what}: cuFuncSetAttribute")
            self.layers.append((entry, fn))

    def __call__(self, buffers: dict) -> None:
        cu = self._cu
        n, _ = step_sizes(buffers)
        if buffers["slots"].device != self.device:
            raise ValueError(f"slots: expected device {self.device} (the PTX's), got {buffers['slots'].device}")
        _check(cu, cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        stream = cu.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        for entry, fn in self.layers:
            params = pack_args(entry, buffers)
            grid = grid_for(entry, n)
            if 0 in grid:
                continue
            _check(cu, cu.cuLaunchKernel(fn, *grid, *entry["block"], entry["shared"], stream, params, 0),
                   f"{entry['plugin_id']}: cuLaunchKernel")
