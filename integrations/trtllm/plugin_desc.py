"""TensorRT plugin descriptors of the replayssm steps, as plain data: no TensorRT needed.

A TensorRT Python plugin with an AOT implementation (``tensorrt.plugin``, TensorRT >= 10.9;
API read at NVIDIA/TensorRT ``python/packaging/bindings_wheel/tensorrt/plugin/``: ``_tensor.py``
17003e4, ``_lib.py`` 5ca4580, ``_validate.py`` 8c6d69d, and the ``tensorrt.plugin.aot_impl``
page) launches ONE kernel per plugin layer, passing its parameters as ``[input pointers...,
extra scalar args..., output pointers...]`` (extra args integer only). An aliased output
(``TensorDesc.aliased()``) shares its input's buffer: that is how the in-place checkpoint, read
copy, ring and cursors are expressed. ``register`` fixes a plugin's output count from its return
annotation, so every config of a plugin id has the same outputs: without a read copy the
``read_*`` outputs alias the inputs that stand in for it (never written), and the step passes
alias the cursors out too (not written) so that TensorRT orders ``advance`` after them.

A replay step is two launches (``kernels/ops.py``: the non-flush pass, then the flush pass) and a
cursor move, so each step op is three plugin layers (a decode on the checkpoint, without a read
copy, is one launch that folds its flush rows too: two layers, no ``_flush``):

| plugin id                            | kernel                         | writes                    |
|--------------------------------------|--------------------------------|---------------------------|
| ``replayssm::<family>_<op>``         | decode / verify kernel         | ring, ``out`` (new)       |
| ``replayssm::<family>_<op>_flush``   | flush kernel                   | checkpoint, read copy, out|
| ``replayssm::advance``               | ``_advance_kernel``            | cursors                   |

(``family`` mamba2 / gdn / kda, ``op`` decode / verify). Each launch is the ``Launch`` that
``kernels/ops.py`` builds for the torch op (``steps.step_plan``), compiled with the specialization
Triton's JIT gives the torch op's launch of it (``steps.jit_specialization``): an integer equal to 1
is a constant, every other scalar (strides, window, capacity, ``sr_base``, ``scale``) stays a
runtime parameter, with the JIT's divisibility-by-16 facts. Compiling values in instead changes
Triton's axis analysis (layouts, vector widths, reduction order) and so the last bits of the
results. TensorRT passes those scalars as int32 extra args: build-time constants (strides of
contiguous buffers do not depend on ``n`` or ``S``), ``scale`` as its fp32 bits, ``sr_base`` as
its uint32 bits, and the sizes ``n`` (a flush pass's and ``advance``'s rows) and ``S`` (every
kernel's ``num_slots``: a slot index outside ``[0, S)`` is a padded row). Triton declares the kernel's parameters in
its own order (tensors and scalars interleaved); ``compile_kernel`` reorders the PTX entry's
parameter declarations to TensorRT's (inputs, extra args, outputs), which leaves every instruction
unchanged (they name parameters, not positions). The two trailing Triton parameters (global and
profile scratch) receive the aliased output pointers and must stay unused (scratch size 0, checked
at compile).

Shapes are symbolic in ``n`` (rows of the batch; slot ``-1`` = padding), ``S`` (slots) and
``S + 1`` (cursors); ``T`` (tokens per step) is a number because the kernels specialize on it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

import torch

from . import steps

NAMESPACE = "replayssm"
OPS = ("decode", "verify")
ADVANCE_BLOCK = 128  # rows per program of kernels/ring/triton.py:advance
_READ_PARAMS = {"read_codes": "rc_codes", "read_block_scale": "rc_bs", "read_row_scale": "rc_rs"}


@dataclass(frozen=True)
class PluginTensor:
    """One input or output of a plugin layer.

    name: the kernel parameter it feeds (inputs) or the buffer it is (outputs).
    buffer: the ``steps.step_buffers`` tensor passed (a placeholder repeats another buffer).
    shape: ints and ``"n"`` / ``"S"`` / ``"S + 1"``. dtype: torch dtype.
    alias_of: outputs only: index of the input whose buffer this output is (in place), or None
        for a new tensor. written: outputs only: False for an alias declared for ordering only.
    """

    name: str
    buffer: str
    shape: tuple
    dtype: torch.dtype
    alias_of: int | None = None
    written: bool = True


@dataclass(frozen=True)
class KernelLaunch:
    """The launch of a plugin layer: Triton kernel (PTX entry) name, grid (ints, ``"n"`` or
    ``"cdiv(n, 128)"``), block ``[num_warps * 32, 1, 1]``, constexprs, the scalar arguments Triton's
    JIT compiles in as constants (``baked``: integers equal to 1), the runtime scalars TensorRT passes
    as int32 extra args (``extra_args``: ``(parameter, value)`` in kernel order, value ``"n"`` /
    ``"S"`` or the int32 passed: an integer, a float's fp32 bits, ``sr_base``'s uint32 bits), and the
    ``kernels.plan.Launch`` it was taken from."""

    kernel_name: str
    grid: tuple
    block: tuple
    num_warps: int
    constexprs: dict
    baked: dict
    extra_args: tuple
    launch: object = field(compare=False, repr=False)

    def grid_for(self, n: int) -> tuple[int, ...]:
        """The grid for ``n`` rows."""
        sym = {"n": n, f"cdiv(n, {ADVANCE_BLOCK})": -(-n // ADVANCE_BLOCK)}
        return tuple(sym[g] if isinstance(g, str) else g for g in self.grid)


@dataclass(frozen=True)
class PluginDesc:
    """A plugin layer: id (``replayssm::name``), inputs, outputs and its kernel launch."""

    plugin_id: str
    inputs: tuple
    outputs: tuple
    kernel: KernelLaunch

    @property
    def aliases(self) -> dict[str, str]:
        """Output name -> name of the input it aliases (in-place buffers)."""
        return {o.name: self.inputs[o.alias_of].name for o in self.outputs if o.alias_of is not None}

    def trt_parameters(self) -> list[str]:
        """Buffers / extra-arg parameters in the order TensorRT passes them: inputs, extra args, outputs."""
        return ([t.buffer for t in self.inputs] + [p for p, _ in self.kernel.extra_args]
                + [t.buffer for t in self.outputs])


def _mutated(op_name: str) -> list[str]:
    """Arguments the torch op declares mutated (``mutates_args``), from its registered schema."""
    schema = getattr(torch.ops.replayssm, op_name).default._schema
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _owner(t: torch.Tensor, named: dict) -> str:
    for name, buf in named.items():
        if t is buf or t._base is buf:
            return name
    raise AssertionError("a launch argument is not one of the step buffers")


def _placeholder(param: str, buffer: str) -> bool:
    """An absent optional argument the op fills with another buffer (read copy, Mamba-2 gate)."""
    return (param.startswith("rc_") and not buffer.startswith("read_")) or (param == "z" and buffer != "z")


def _check_order(desc: PluginDesc, tensors: list[str]) -> None:
    """Raise unless the kernel's tensor parameters (buffers, kernel order) are TensorRT's inputs
    then new outputs, in order (the PTX entry's declarations are reordered around that)."""
    passed = [t.buffer for t in desc.inputs] + [t.buffer for t in desc.outputs if t.alias_of is None]
    if passed != tensors:
        raise ValueError(f"{desc.plugin_id}: kernel parameters {tensors} do not match TensorRT's order "
                         f"(inputs, extra args, outputs) {passed}")


def _jit_constant(value) -> bool:
    """Whether Triton's JIT compiles a scalar argument in: an int equal to 1 (not a bool or float)."""
    return type(value) is int and value == 1


def _int32(param: str, value) -> int:
    """The int32 TensorRT passes for a runtime scalar: an int32 as is, a float as its fp32 bits,
    ``sr_base`` (read as uint32 by the kernels) as its uint32 bits."""
    if isinstance(value, float):
        return struct.unpack("<i", struct.pack("<f", value))[0]
    if isinstance(value, int) and not isinstance(value, bool):
        if -2 ** 31 <= value < 2 ** 31:
            return value
        if param == "sr_base" and 0 <= value < 2 ** 32:
            return value - 2 ** 32
    raise ValueError(f"{param}: TensorRT passes extra args as int32, cannot pass {value!r}")


def _scalars(params: list[str], args: list) -> tuple[dict, tuple]:
    """(``baked``, ``extra_args``) of a launch's scalar arguments, as :class:`KernelLaunch` holds them.
    A step kernel's parameters ``n`` (a flush pass's rows) and ``num_slots`` (the pool's slots, past
    which a slot index is a padded row) are the batch and the pool: ``"n"`` and ``"S"``, never baked."""
    sizes = {"n": "n", "num_slots": "S"}
    scalars = [(p, sizes.get(p, v)) for p, v in zip(params, args) if not isinstance(v, torch.Tensor)]
    return ({p: v for p, v in scalars if _jit_constant(v)},
            tuple((p, v if v in ("n", "S") else _int32(p, v)) for p, v in scalars if not _jit_constant(v)))


def describe_step(spec, cfg, *, op: str, tokens: int, layer: int = 0, has_z: bool = False,
                  state_layout: str = "kv") -> list[PluginDesc]:
    """The three plugin layers of one layer's step (non-flush pass, flush pass, cursor advance).

    Args:
        spec, cfg: ``replayssm.LayerSpec`` / ``ReplayConfig`` (window, checkpoint dtype, read format,
            ring dtype, seed fix the kernels and their extra args).
        op: "decode" (one committed token) or "verify" (``tokens`` pending tokens).
        tokens: T, tokens per row (1 for decode; 1..cfg.max_tokens for verify).
        layer: layer index (seeds the fp16-SR checkpoint rounding, ``sr_base``).
        has_z: Mamba-2 only: the gate ``z`` is an input (else the kernel gets ``x`` in its place).
        state_layout: GDN / KDA checkpoint as ``[S, HV, K, V]`` ("kv") or ``[S, HV, V, K]`` ("vk").
    """
    from replayssm.kernels.ring import triton as ring_triton

    if op not in OPS:
        raise ValueError(f"op: expected one of {OPS}, got {op!r}")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= cfg.max_tokens:
        raise ValueError(f"tokens: expected an int in 1..{cfg.max_tokens} (max_draft_tokens + 1), got {tokens!r}")
    if op == "decode" and tokens != 1:
        raise ValueError(f"tokens: a decode takes one token, got {tokens}")
    if has_z and spec.family != "mamba2":
        raise ValueError(f"has_z: only a mamba2 layer has a gate input, got family {spec.family!r}")
    cfg.check(spec)
    bufs = steps.step_buffers(spec, cfg, tokens, has_z=has_z, state_layout=state_layout)
    named = steps.allocate(bufs, 2, 3)
    plan = steps.step_plan(spec, cfg, named, committed=op == "decode", layer=layer, state_layout=state_layout)
    mutated = [m for m in _mutated(plan[0].op) if m != "out"]
    base = f"{NAMESPACE}::{spec.family}_{op}"
    descs = []
    for lc in plan:
        params = [a for a in lc.kernel.arg_names if a not in lc.constexprs]
        tensors = [(p, _owner(v, named)) for p, v in zip(params, lc.args) if isinstance(v, torch.Tensor)]
        baked, extra = _scalars(params, lc.args)
        new_out = not lc.flush_pass
        ins = [PluginTensor(p, b, *bufs[b]) for p, b in (tensors[:-1] if new_out else tensors)]
        first = {}
        for i, t in enumerate(ins):
            if not _placeholder(t.name, t.buffer):
                first.setdefault(t.buffer, i)
        outs = [PluginTensor("out", "out", *bufs["out"], alias_of=None if new_out else first["out"])]
        for m in mutated:
            if m in bufs:
                outs.append(PluginTensor(m, m, *bufs[m], alias_of=first[m]))
            else:  # no read copy: alias the placeholder so every config has the same outputs
                i = [t.name for t in ins].index(_READ_PARAMS[m])
                outs.append(PluginTensor(m, ins[i].buffer, ins[i].shape, ins[i].dtype, alias_of=i, written=False))
        outs += [PluginTensor(c, c, *bufs[c], alias_of=first[c], written=False) for c in ("count", "origin", "epoch")]
        kl = KernelLaunch(lc.kernel.__name__, tuple(lc.grid), (lc.num_warps * 32, 1, 1), lc.num_warps,
                          dict(lc.constexprs), baked, extra, lc)
        desc = PluginDesc(base + ("_flush" if lc.flush_pass else ""), tuple(ins), tuple(outs), kl)
        _check_order(desc, [b for _, b in tensors])
        descs.append(desc)
    descs.append(_describe_advance(ring_triton, spec, cfg, tokens, committed=op == "decode"))
    return descs


def _describe_advance(ring_triton, spec, cfg, tokens: int, *, committed: bool) -> PluginDesc:
    """``replayssm::advance``: the cursor move of ``kernels/ring/triton.py:advance`` after a step.

    That launcher builds no ``Launch``; its grid, BLOCK and (Triton's default) 4 warps are mirrored
    here and compared with a recorded call of it in the tests. Its scalars are TensorRT extra args:
    ``n`` and ``num_slots`` (``"n"``, ``"S"``; compiled unspecialized, one PTX for every batch), T,
    window and capacity (constants; T = 1 compiled in, as the JIT does).
    """
    from replayssm.kernels.plan import Launch

    cur = {"count": (("S + 1",), torch.int32), "origin": (("S + 1",), torch.int32),
           "pending": (("S + 1",), torch.int32), "epoch": (("S + 1",), torch.int32), "slots": (("n",), torch.int64)}
    kernel = ring_triton.ADVANCE_KERNEL
    const = dict(COMMITTED=committed, BLOCK=ADVANCE_BLOCK)
    grid = (f"cdiv(n, {ADVANCE_BLOCK})",)
    ins = tuple(PluginTensor(p, b, *cur[b]) for p, b in
                (("count_ptr", "count"), ("origin_ptr", "origin"), ("pending_ptr", "pending"),
                 ("epoch_ptr", "epoch"), ("slots", "slots")))
    outs = tuple(PluginTensor(b, b, *cur[b], alias_of=i) for i, b in enumerate(("count", "origin", "pending", "epoch")))
    meta = [torch.empty(2, dtype=t.dtype, device="meta") for t in ins]
    args = meta + ["n", "S", tokens, cfg.window, cfg.capacity]
    lc = Launch("advance", kernel, grid, 0, args, const, 4, False)
    baked, extra = _scalars(list(kernel.arg_names), args)
    desc = PluginDesc(f"{NAMESPACE}::advance", ins, outs, KernelLaunch(kernel.__name__, grid, (128, 1, 1), 4, const,
                                                                        baked, extra, lc))
    _check_order(desc, [t.buffer for t in ins])
    return desc


def compile_kernel(desc: PluginDesc, arch: str = "sm_90") -> dict:
    """PTX of a plugin layer's kernel as the torch op's JIT launch compiles it, parameters declared in
    TensorRT's order (needs Triton, no GPU, no TensorRT).

    Returns ``name`` (PTX entry), ``ptx``, ``grid``, ``block``, ``shared`` (bytes of dynamic shared
    memory) and ``params`` (the kernel's runtime parameters, in TensorRT's order). Raises if the
    kernel needs Triton's global or profile scratch: those parameters receive aliased outputs.
    """
    k = desc.kernel
    dynamic = tuple(p for p, v in k.extra_args if v in ("n", "S"))
    # the sizes get any non-specialized int (the kernel is compiled as do_not_specialize for them);
    # sr_base its int32 twin (same uint32 bits): TensorRT cannot pass the JIT's i64 for values >= 2**31
    replace = {p: (2 if v in ("n", "S") else v) for p, v in k.extra_args if p in dynamic or p == "sr_base"}
    sig, compiled = steps.compile_jit(k.launch, arch, dynamic=dynamic, replace=replace)
    md = compiled.metadata
    for key in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, key, 0):
            raise RuntimeError(f"{desc.plugin_id}: the kernel needs {key}={getattr(md, key)}; TensorRT passes none")
    runtime = [p for p, t in sig.items() if t != "constexpr"]
    for p, _ in k.extra_args:
        if sig[p] not in ("i32", "fp32"):
            raise AssertionError(f"{desc.plugin_id}: extra arg {p} compiles to {sig[p]}, TensorRT passes int32")
    params = [t.name for t in desc.inputs] + [p for p, _ in k.extra_args]
    params += [t.name for t in desc.outputs if t.alias_of is None]
    if sorted(params) != sorted(runtime) or set(k.baked) - {p for p, t in sig.items() if t == "constexpr"}:
        raise AssertionError(f"{desc.plugin_id}: compiled parameters {runtime}, expected {params} "
                             f"(constants {sorted(k.baked)})")
    order = [runtime.index(p) for p in params]
    ptx = reorder_params(compiled.asm["ptx"], md.name, order + list(range(len(runtime), len(runtime) + 2)))
    return dict(name=md.name, ptx=ptx, grid=k.grid, block=k.block, shared=md.shared, params=params)


def reorder_params(ptx: str, name: str, order: list[int]) -> str:
    """``ptx`` with the parameter declarations of entry ``name`` permuted: declaration ``i`` of the
    result is ``order[i]`` of ``ptx``. Nothing else changes: instructions read parameters by name
    (``ld.param.u32 %r1, [<name>_param_7]``), so only the parameters' offsets in the launch buffer move.
    """
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(\n(.*?)\n\)", ptx, re.S)
    if m is None:
        raise ValueError(f"ptx: no .entry {name}")
    decls = m.group(1).split(",\n")
    if sorted(order) != list(range(len(decls))):
        raise ValueError(f"order: expected a permutation of the {len(decls)} parameters of .entry {name}, got {order}")
    return ptx[:m.start(1)] + ",\n".join(decls[i] for i in order) + ptx[m.end(1):]
