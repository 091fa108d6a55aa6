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
cursor move, so each step op is three plugin layers:

| plugin id                            | kernel                         | writes                    |
|--------------------------------------|--------------------------------|---------------------------|
| ``replayssm::<family>_<op>``         | decode / verify kernel         | ring, ``out`` (new)       |
| ``replayssm::<family>_<op>_flush``   | flush kernel                   | checkpoint, read copy, out|
| ``replayssm::advance``               | ``_advance_kernel``            | cursors                   |

(``family`` mamba2 / gdn / kda, ``op`` decode / verify). Each launch is the ``Launch`` that
``kernels/ops.py`` builds for the torch op (``aot.step_plan``), with every scalar argument
(strides, window, capacity, ``sr_base``, ``scale``) compiled in as a constant, so the kernel's
runtime parameters are exactly its tensors (plus ``n`` and ``S`` for ``advance``); that order is
checked against TensorRT's here. The two trailing Triton parameters (global and profile scratch)
receive the aliased output pointers and must stay unused (scratch size 0, checked at compile).

Shapes are symbolic in ``n`` (rows of the batch; slot ``-1`` = padding), ``S`` (slots) and
``S + 1`` (cursors); ``T`` (tokens per step) is a number because the kernels specialize on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import aot

NAMESPACE = "replayssm"
OPS = ("decode", "verify")
ADVANCE_BLOCK = 128  # rows per program of kernels/ring/triton.py:advance
_READ_PARAMS = {"read_codes": "rc_codes", "read_block_scale": "rc_bs", "read_row_scale": "rc_rs"}


@dataclass(frozen=True)
class PluginTensor:
    """One input or output of a plugin layer.

    name: the kernel parameter it feeds (inputs) or the buffer it is (outputs).
    buffer: the ``aot.step_buffers`` tensor passed (a placeholder repeats another buffer).
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
    ``"cdiv(n, 128)"``), block ``[num_warps * 32, 1, 1]``, constexprs, the scalar arguments compiled
    in (``baked``), the runtime integer arguments TensorRT passes as extra args (``extra_args``:
    ``"n"`` / ``"S"``), and the ``kernels.ops.Launch`` it was taken from."""

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
        """Buffers / extra args in the order TensorRT passes them: inputs, extra args, outputs."""
        return [t.buffer for t in self.inputs] + list(self.kernel.extra_args) + [t.buffer for t in self.outputs]


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


def _check_order(desc: PluginDesc, runtime: list[str]) -> None:
    """Raise if the kernel's runtime parameters are not the first ones TensorRT passes."""
    passed = desc.trt_parameters()
    if passed[:len(runtime)] != runtime:
        raise ValueError(f"{desc.plugin_id}: kernel parameters {runtime} do not match TensorRT's order "
                         f"(inputs, extra args, outputs) {passed[:len(runtime)]}")


def describe_step(spec, cfg, *, op: str, tokens: int, layer: int = 0, has_z: bool = False,
                  state_layout: str = "kv") -> list[PluginDesc]:
    """The three plugin layers of one layer's step (non-flush pass, flush pass, cursor advance).

    Args:
        spec, cfg: ``replayssm.LayerSpec`` / ``ReplayConfig`` (window, checkpoint dtype, read format,
            ring dtype, seed are compiled in).
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
    bufs = aot.step_buffers(spec, cfg, tokens, has_z=has_z, state_layout=state_layout)
    named = aot.materialize(bufs, 2, 3)
    plan = aot.step_plan(spec, cfg, named, committed=op == "decode", layer=layer, state_layout=state_layout)
    mutated = [m for m in _mutated(plan[0].op) if m != "out"]
    base = f"{NAMESPACE}::{spec.family}_{op}"
    descs = []
    for lc in plan:
        params = [a for a in lc.kernel.arg_names if a not in lc.constexprs]
        tensors = [(p, _owner(v, named)) for p, v in zip(params, lc.args) if isinstance(v, torch.Tensor)]
        baked = {p: v for p, v in zip(params, lc.args) if not isinstance(v, torch.Tensor)}
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
                          dict(lc.constexprs), baked, (), lc)
        desc = PluginDesc(base + ("_flush" if lc.flush_pass else ""), tuple(ins), tuple(outs), kl)
        _check_order(desc, [b for _, b in tensors])
        descs.append(desc)
    descs.append(_describe_advance(ring_triton, spec, cfg, tokens, committed=op == "decode"))
    return descs


def _describe_advance(ring_triton, spec, cfg, tokens: int, *, committed: bool) -> PluginDesc:
    """``replayssm::advance``: the cursor move of ``kernels/ring/triton.py:advance`` after a step.

    That launcher builds no ``Launch``; its grid, BLOCK and (Triton's default) 4 warps are mirrored
    here and compared with a recorded call of it in the tests. ``n`` and ``num_slots`` stay runtime
    parameters (TensorRT extra args ``n`` and ``S``); T, window and capacity are compiled in.
    """
    from replayssm.kernels.ops import Launch

    cur = {"count": (("S + 1",), torch.int32), "origin": (("S + 1",), torch.int32),
           "pending": (("S + 1",), torch.int32), "epoch": (("S + 1",), torch.int32), "slots": (("n",), torch.int64)}
    kernel = ring_triton._advance_kernel
    const = dict(COMMITTED=committed, BLOCK=ADVANCE_BLOCK)
    baked = dict(T=tokens, window=cfg.window, capacity=cfg.capacity)
    grid = (f"cdiv(n, {ADVANCE_BLOCK})",)
    ins = tuple(PluginTensor(p, b, *cur[b]) for p, b in
                (("count_ptr", "count"), ("origin_ptr", "origin"), ("pending_ptr", "pending"),
                 ("epoch_ptr", "epoch"), ("slots", "slots")))
    outs = tuple(PluginTensor(b, b, *cur[b], alias_of=i) for i, b in enumerate(("count", "origin", "pending", "epoch")))
    meta = [torch.empty(2, dtype=t.dtype, device="meta") for t in ins]
    args = meta + [1, 1, tokens, cfg.window, cfg.capacity]  # n, num_slots: runtime (TensorRT's extra args)
    lc = Launch("advance", kernel, grid, 0, args, const, 4, False)
    desc = PluginDesc(f"{NAMESPACE}::advance", ins, outs, KernelLaunch(kernel.__name__, grid, (128, 1, 1), 4, const,
                                                                        baked, ("n", "S"), lc))
    _check_order(desc, [t.buffer for t in ins] + ["n", "S"])
    return desc


def compile_kernel(desc: PluginDesc, arch: str = "sm_90") -> dict:
    """PTX of a plugin layer's kernel, scalars compiled in (needs Triton, no GPU, no TensorRT).

    Returns ``name`` (PTX entry), ``ptx``, ``grid``, ``block``, ``shared`` (bytes of dynamic shared
    memory) and ``params`` (the kernel's runtime parameters, in TensorRT's order). Raises if the
    kernel needs Triton's global or profile scratch: those parameters receive aliased outputs.
    """
    runtime = ("n", "num_slots") if desc.kernel.extra_args else ()
    sig, compiled = aot.compile_launch(desc.kernel.launch, arch, bake_scalars=True, runtime=runtime)
    md = compiled.metadata
    for key in ("global_scratch_size", "profile_scratch_size"):
        if getattr(md, key, 0):
            raise RuntimeError(f"{desc.plugin_id}: the kernel needs {key}={getattr(md, key)}; TensorRT passes none")
    params = [k for k, v in sig.items() if v != "constexpr"]
    expected = [t.name for t in desc.inputs] + list(runtime)
    expected += [t.name for t in desc.outputs if t.alias_of is None]
    if params != expected[:len(params)]:
        raise AssertionError(f"{desc.plugin_id}: compiled parameters {params}, expected {expected[:len(params)]}")
    return dict(name=md.name, ptx=compiled.asm["ptx"], grid=desc.kernel.grid, block=desc.kernel.block,
                shared=md.shared, params=params)
