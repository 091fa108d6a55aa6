"""GPU only: the plugin PTX launched through the CUDA driver the way a TensorRT AOT plugin passes
parameters ([input pointers, int32 extra args, output pointers], aliased outputs repeating their
inputs' pointers; ``ptx_launch.PtxStep``) gives bit-for-bit the buffers of the torch ops' own
launches, over steps that flush, verify + commit and padded rows. The PTX is built in-process for
the GPU's arch and read back from a saved manifest directory. TensorRT itself is not involved (not
installable)."""

import pytest
import torch
from helpers import SPECS, Params, make_inputs

import replayssm as rs
from replayssm.integrations.trtllm import ptx_launch, steps
from replayssm.kernels import ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="launches PTX through the CUDA driver")
FORMATS = (("checkpoint", "float16_sr"), ("nvfp4", "float16_sr"), ("fp8", "bfloat16"))
CASES = [(f, rf, ck) for f in SPECS for rf, ck in FORMATS]


def _op_step(spec, cfg, bufs, *, committed, T, layer):
    ops.launch(steps.step_plan(spec, cfg, bufs, committed=committed, layer=layer))
    ops.advance(bufs["count"], bufs["origin"], bufs["pending"], bufs["epoch"], bufs["slots"], T, cfg.window,
                cfg.capacity, committed)


@pytest.mark.parametrize("family,rf,ckpt", CASES, ids=["-".join(c) for c in CASES])
def test_ptx_in_tensorrt_order_equals_ops(family, rf, ckpt, tmp_path):
    spec, layer = SPECS[family], 1
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format=rf, checkpoint_dtype=ckpt,
                          ring_dtype="bfloat16", seed=7)
    n, S, dev = 4, 6, "cuda"
    gen = torch.Generator().manual_seed(0)
    params = Params(spec, 1, gen)
    slots = torch.tensor([4, -1, 0, 2], dtype=torch.int64, device=dev)
    ptx_steps = {}
    for op, T in (("decode", 1), ("verify", 3)):
        ptx_launch.save_step(ptx_launch.build_step(spec, cfg, op=op, tokens=T, layer=layer), tmp_path / op)
        ptx_steps[op] = ptx_launch.PtxStep(ptx_launch.load_step(tmp_path / op))
    state = {}
    for op, T in (("decode", 1),) * 4 + (("verify", 3),) + (("decode", 1),) * 2 + (("verify", 3),):
        bufs_spec = steps.step_buffers(spec, cfg, T, has_z=False)
        if not state:  # persistent buffers, random but finite, identical for both paths
            init = steps.allocate(bufs_spec, n, S, device=dev)
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
        else:  # the plugin's q stays bf16 with the inverse of its norm as q_scale (steps.step_buffers)
            inp["q_scale"] = torch.rsqrt(inp["q"].float().square().sum(-1) + 1e-6)
        fresh = {"slots": slots, **{k: v for k, v in inp.items() if k in bufs_spec},
                 "out": torch.full([steps.resolve_dim(d, n, S) for d in bufs_spec["out"][0]], float("nan"),
                                   dtype=torch.bfloat16, device=dev)}
        for path in ("ops", "ptx"):
            state[path].update({k: v.clone() for k, v in fresh.items()})
        _op_step(spec, cfg, state["ops"], committed=op == "decode", T=T, layer=layer)
        ptx_steps[op](state["ptx"])
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
