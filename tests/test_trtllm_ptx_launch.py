"""GPU only: the plugin PTX launched through the CUDA driver the way a TensorRT AOT plugin passes
parameters ([input pointers, int32 extra args, output pointers], aliased outputs repeating their
inputs' pointers) gives bit-for-bit the buffers of the torch ops' own launches, over steps that
flush, verify + commit and padded rows. TensorRT itself is not involved (not installable)."""

import ctypes

import pytest
import torch
from helpers import SPECS, Params, make_inputs

import replayssm as rs
from replayssm.integrations.trtllm import aot
from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.kernels import ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="launches PTX through the CUDA driver")
CASES = [(f, rf) for f in SPECS for rf in ("checkpoint", "nvfp4")]


def _check(result):
    err, *rest = result
    assert int(err) == 0, f"CUDA driver error {err}"
    return rest[0] if rest else None


class _Kernel:
    """A plugin layer's PTX loaded with cuModuleLoadData and launched with cuLaunchKernel."""

    def __init__(self, desc, arch):
        from cuda.bindings import driver as cu

        self.cu, self.desc = cu, desc
        k = pd.compile_kernel(desc, arch)
        self.module = _check(cu.cuModuleLoadData(k["ptx"].encode() + b"\0"))
        self.fn = _check(cu.cuModuleGetFunction(self.module, k["name"].encode()))
        if k["shared"] > 48 * 1024:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(cu.cuFuncSetAttribute(self.fn, attr, k["shared"]))
        self.k = k

    def __call__(self, bufs, n, S):
        d = self.desc
        values = [bufs[t.buffer].data_ptr() for t in d.inputs]
        types = [ctypes.c_void_p] * len(values)
        values += [n if e == "n" else S for e in d.kernel.extra_args]
        types += [ctypes.c_int] * len(d.kernel.extra_args)
        values += [bufs[o.buffer].data_ptr() for o in d.outputs]
        types += [ctypes.c_void_p] * len(d.outputs)
        grid = list(d.kernel.grid_for(n)) + [1] * (3 - len(d.kernel.grid))
        _check(self.cu.cuLaunchKernel(self.fn, *grid, *self.k["block"], self.k["shared"], 0,
                                      (tuple(values), tuple(types)), 0))


def _ptx_step(kernels, bufs, n, S):
    for k in kernels:
        k(bufs, n, S)


def _op_step(spec, cfg, bufs, *, committed, T, layer):
    ops.launch(aot.step_plan(spec, cfg, bufs, committed=committed, layer=layer))
    ops.advance(bufs["count"], bufs["origin"], bufs["pending"], bufs["epoch"], bufs["slots"], T, cfg.window,
                cfg.capacity, committed)


@pytest.mark.parametrize("family,rf", CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_ptx_in_tensorrt_order_equals_ops(family, rf):
    spec, layer, arch = SPECS[family], 1, "sm_%d%d" % torch.cuda.get_device_capability()
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format=rf, checkpoint_dtype="float16_sr",
                          ring_dtype="bfloat16", seed=7)
    n, S, dev = 4, 6, "cuda"
    gen = torch.Generator().manual_seed(0)
    params = Params(spec, 1, gen)
    slots = torch.tensor([4, -1, 0, 2], dtype=torch.int64, device=dev)
    kernels = {op: [_Kernel(d, arch) for d in pd.describe_step(spec, cfg, op=op, tokens=T, layer=layer)]
               for op, T in (("decode", 1), ("verify", 3))}
    state = {}
    for op, T in (("decode", 1),) * 4 + (("verify", 3),) + (("decode", 1),) * 2 + (("verify", 3),):
        bufs_spec = aot.step_buffers(spec, cfg, T, has_z=False)
        if not state:  # persistent buffers, random but finite, identical for both paths
            init = aot.materialize(bufs_spec, n, S, device=dev)
            init["pending"] = torch.empty(S + 1, dtype=torch.int32, device=dev)  # advance's, not the step's
            for k, t in init.items():
                if t.dtype.is_floating_point:
                    t.copy_((torch.randn(t.shape, generator=gen) * 0.1).to(t.dtype))
                else:
                    t.zero_()
            state = {"ops": init, "ptx": {k: v.clone() for k, v in init.items()}}
        inp = make_inputs(spec, params, 0, n, T, gen, torch.bfloat16, device=dev)
        if spec.family == "mamba2":
            inp["A"], inp["D"], inp["dt_bias"] = (inp[k].float() for k in ("A", "D", "dt_bias"))
        fresh = {"slots": slots, **{k: v for k, v in inp.items() if k in bufs_spec},
                 "out": torch.full([aot._dim(d, n, S) for d in bufs_spec["out"][0]], float("nan"),
                                   dtype=torch.bfloat16, device=dev)}
        for path in ("ops", "ptx"):
            state[path].update({k: v.clone() for k, v in fresh.items()})
        _op_step(spec, cfg, state["ops"], committed=op == "decode", T=T, layer=layer)
        _ptx_step(kernels[op], state["ptx"], n, S)
        if op == "verify":
            acc = torch.tensor([2, 0, 3, 1], dtype=torch.int32, device=dev)
            for path in ("ops", "ptx"):
                b = state[path]
                ops.commit(b["count"][None], b["pending"][None], slots, acc)
        torch.cuda.synchronize()
        for k in state["ops"]:
            a, b = state["ops"][k], state["ptx"][k]
            assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                               b.view(torch.uint8) if b.is_floating_point() else b), (op, k)
        assert not state["ptx"]["out"].isnan().any() and (state["ptx"]["out"][1] == 0).all()
    assert int(state["ptx"]["epoch"][:S].sum()) > 0  # flushes happened (checkpoint written)
