"""TensorRT plugin descriptors: shapes, dtypes, aliasing, and the launches kernels/ops.py performs."""

import json
import os
import struct
import subprocess
import sys

import pytest
import torch
from helpers import SPECS

import replayssm as rs
from replayssm.integrations.trtllm import steps
from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.kernels import ops
from replayssm.kernels.formats.triton import CKPT_CODES, READ_CODES
from replayssm.kernels.ring import triton as ring_triton

BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
CASES = [(f, op, rf) for f in SPECS for op in pd.OPS for rf in ("checkpoint", "nvfp4")]


def _cfg(rf="checkpoint", ckpt="float32"):
    return rs.ReplayConfig(window=4, max_draft_tokens=3, read_format=rf, checkpoint_dtype=ckpt, ring_dtype="bfloat16")


def _T(op):
    return 1 if op == "decode" else 3


def _tensor(desc, name):
    return next(t for t in desc.inputs if t.name == name)


def test_mamba2_shapes_and_dtypes():
    H, P, N, G = 4, 6, 16, 2
    step, flush, adv = pd.describe_step(SPECS["mamba2"], _cfg("fp8"), op="verify", tokens=3, has_z=True)
    assert [step.plugin_id, flush.plugin_id, adv.plugin_id] == \
        ["replayssm::mamba2_verify", "replayssm::mamba2_verify_flush", "replayssm::advance"]
    fp8 = torch.float8_e4m3fn
    want = {"ckpt": ("checkpoint", ("S", H, P, N), F32), "rc_codes": ("read_codes", ("S", H, P, N), fp8),
            "rc_bs": ("read_block_scale", ("S", H, P, N // 16), fp8),
            "rc_rs": ("read_row_scale", ("S", H, P), F32), "ring_x": ("ring_x", ("S", H, 8, P), BF16),
            "ring_dt": ("ring_dt", ("S", H, 8), F32), "ring_B": ("ring_B", ("S", G, 8, N), BF16),
            "slots": ("slots", ("n",), torch.int64), "x": ("x", ("n", 3, H, P), BF16), "dt": ("dt", ("n", 3, H), F32),
            "A": ("A", (H,), F32), "C": ("C", ("n", 3, G, N), BF16), "z": ("z", ("n", 3, H, P), BF16)}
    for name, (buf, shape, dtype) in want.items():
        t = _tensor(step, name)
        assert (t.buffer, t.shape, t.dtype) == (buf, shape, dtype), name
    assert [(t.buffer, t.shape, t.dtype) for t in step.inputs if t.buffer in ("count", "origin", "epoch")] == \
        [(c, ("S + 1",), I32) for c in ("count", "origin", "epoch")]
    assert (step.outputs[0].name, step.outputs[0].shape, step.outputs[0].dtype) == ("out", ("n", 3, H, P), BF16)
    assert [t.shape for t in adv.inputs] == [("S + 1",)] * 4 + [("n",)]


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_delta_checkpoint_layout_and_placeholders(layout):
    HK, HV, K, V = 2, 4, 16, 5
    step = pd.describe_step(SPECS["kda"], _cfg(), op="decode", tokens=1, state_layout=layout)[0]
    assert _tensor(step, "ckpt").shape == (("S", HV, K, V) if layout == "kv" else ("S", HV, V, K))
    assert _tensor(step, "g").shape == ("n", 1, HV, K) and _tensor(step, "g").dtype == F32
    assert _tensor(step, "q").shape == ("n", 1, HK, K)
    # without a read copy the kernel's read-copy parameters receive ring_beta (never written)
    assert [_tensor(step, p).buffer for p in ("rc_codes", "rc_bs", "rc_rs")] == ["ring_beta"] * 3
    assert step.aliases["ring_beta"] == "ring_beta"


def _launches(family, op, rf):
    """Launches of a step: one on the checkpoint, whose flush rows fold in it (a verify unless its tile
    says fold=False); behind a read copy, or with fold=False, a flush layer follows."""
    tiles = {**ops.TILES["delta"], **ops.TILES.get(family, {})} if family != "mamba2" else ops.TILES["mamba2"]
    tile = tiles["decode" if op == "decode" else "verify"]
    return 1 if rf == "checkpoint" and tile.get("fold", True) else 2


@pytest.mark.parametrize("family,op,rf", CASES, ids=["-".join(c) for c in CASES])
def test_aliasing_table(family, op, rf):
    spec = SPECS[family]
    *layers, adv = pd.describe_step(spec, _cfg(rf), op=op, tokens=_T(op))
    step = layers[0]
    assert len(layers) == _launches(family, op, rf)
    ring = [f"ring_{k}" for k in rs.ring.ring_buffers(spec, _cfg())]
    read = ["read_codes", "read_block_scale", "read_row_scale"]
    own = {"checkpoint": "ckpt", **{r: r for r in ring}, "read_codes": "rc_codes", "read_block_scale": "rc_bs",
           "read_row_scale": "rc_rs", "count": "count_ptr", "origin": "origin_ptr", "epoch": "epoch_ptr"}
    cursors = ["count", "origin", "epoch"]
    # the same outputs for every config (the registration fixes their number); without a read copy
    # the read_* outputs alias the inputs standing in for it and are not written
    unwritten = cursors if rf != "checkpoint" else read + cursors
    for desc in layers:
        assert [o.name for o in desc.outputs] == ["out", "checkpoint", *read, *ring, *cursors]
        assert {k: v for k, v in desc.aliases.items() if k != "out"} == {m: own[m] for m in ["checkpoint", *read,
                                                                                             *ring, *cursors]}
        assert [o.name for o in desc.outputs if not o.written] == unwritten
        for o in desc.outputs:
            if o.alias_of is not None:
                src = desc.inputs[o.alias_of]
                assert (src.buffer, src.shape, src.dtype) == (o.buffer, o.shape, o.dtype)
        assert len({o.alias_of for o in desc.outputs}) == len(desc.outputs)  # one output per input slot
    assert step.outputs[0].alias_of is None and all(f.aliases["out"] == "out" for f in layers[1:])
    assert adv.aliases == {"count": "count_ptr", "origin": "origin_ptr", "pending": "pending_ptr", "epoch": "epoch_ptr"}
    # the torch op declares the same buffers mutated
    assert set(pd._mutated(step.kernel.launch.op)) == {"checkpoint", "read_codes", "read_block_scale",
                                                      "read_row_scale", *ring, "out"}


def _ops_plan(spec, cfg, t, committed, layer):
    """The launches kernels/ops.py performs, called directly on CPU tensors."""
    fmt = dict(checkpoint_format=CKPT_CODES[cfg.checkpoint_dtype], read_format=READ_CODES[cfg.read_format],
               sr_base=ops.sr_base(cfg.seed, layer))
    read = [t.get(f"read_{k}") for k in ("codes", "block_scale", "row_scale")]
    if spec.family == "mamba2":
        return ops.mamba2_plan(t["checkpoint"], *read, t["ring_x"], t["ring_dt"], t["ring_B"], t["count"], t["origin"],
                               t["epoch"], t["slots"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["dt_bias"],
                               None, t["out"], cfg.window, committed, **fmt)
    return ops.delta_plan(t["checkpoint"], *read, t["ring_k"], t["ring_v"], t["ring_g"], t["ring_beta"], t["ring_d"],
                          t["count"], t["origin"], t["epoch"], t["slots"], t["q"], t["k"], t["v"], t["g"], t["beta"],
                          t["out"], spec.head_k_dim ** -0.5, cfg.window, committed, **fmt, q_scale=t["q_scale"])


@pytest.mark.parametrize("family,op,rf", CASES, ids=["-".join(c) for c in CASES])
def test_launch_equals_ops(family, op, rf):
    spec, cfg, layer = SPECS[family], _cfg(rf, "float16_sr"), 3
    descs = pd.describe_step(spec, cfg, op=op, tokens=_T(op), layer=layer)
    n, S = 5, 11  # other sizes than the descriptor's: compiled-in scalars must not depend on them
    t = steps.allocate(steps.step_buffers(spec, cfg, _T(op), has_z=False), n, S, device="cpu")
    plan = _ops_plan(spec, cfg, t, op == "decode", layer)
    assert len(plan) == _launches(family, op, rf) == len(descs) - 1
    for desc, lc in zip(descs, plan):
        k = desc.kernel
        assert desc.kernel.launch.kernel is lc.kernel and k.kernel_name == lc.kernel.__name__
        assert k.grid_for(n) == tuple(n if g == "n" else g for g in lc.grid)
        assert k.block == (lc.num_warps * 32, 1, 1) and k.constexprs == lc.constexprs
        params = [a for a in lc.kernel.arg_names if a not in lc.constexprs]
        scalars = {p: v for p, v in zip(params, lc.args) if not isinstance(v, torch.Tensor)}
        # Triton's JIT compiles an int equal to 1 in (not a flush pass's rows ``n`` nor the pool's slots
        # ``num_slots``: do_not_specialize); every other scalar is an int32 extra arg, ``n`` the batch and
        # ``num_slots`` the pool's slots TensorRT passes
        sizes = {"n": "n", "num_slots": "S"}
        assert k.baked == {p: v for p, v in scalars.items() if type(v) is int and v == 1 and p not in sizes}
        assert [p for p, _ in k.extra_args] == [p for p in scalars if p not in k.baked]
        extra = dict(k.extra_args)
        assert lc.flush_pass == ("n" in scalars) and scalars.get("n", n) == n and extra.get("n", "n") == "n"
        assert scalars["num_slots"] == S and extra["num_slots"] == "S"
        assert extra["sr_base"] % 2 ** 32 == ops.sr_base(cfg.seed, layer)
        if spec.is_delta:
            assert struct.pack("<i", extra["scale"]) == struct.pack("<f", spec.head_k_dim ** -0.5)
        assert all(extra[p] == v for p, v in scalars.items() if p not in k.baked | {"sr_base": 0, "scale": 0} | sizes)
        # the kernel's tensors, in its order, are the plugin's inputs then its new outputs
        fed = [t[x.buffer] for x in desc.inputs] + [t[o.buffer] for o in desc.outputs if o.alias_of is None]
        tensors = [v for v in lc.args if isinstance(v, torch.Tensor)]
        assert len(tensors) == len(fed) and all(a is b for a, b in zip(tensors, fed))


def test_advance_equals_launcher(monkeypatch):
    calls = []

    class Recorder:
        arg_names = ring_triton._advance_kernel.arg_names

        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    monkeypatch.setattr(ring_triton, "_advance_kernel", Recorder())
    cfg, n, S = _cfg(), 300, 40
    cur = {f: torch.zeros(1, S + 1, dtype=I32) for f in ("count", "origin", "pending", "epoch")}
    slots = torch.arange(n, dtype=torch.int64) % S
    ring_triton.advance(cur, 0, slots, 3, cfg.window, cfg.capacity, committed=False)
    monkeypatch.undo()
    adv = pd.describe_step(SPECS["gdn"], cfg, op="verify", tokens=3)[-1]
    (grid, args, kw), = calls
    assert adv.kernel.grid_for(n) == grid == (3,)
    bufs = [cur[f][0] for f in ("count", "origin", "pending", "epoch")] + [slots]
    assert [(a.data_ptr(), a.shape, a.dtype) for a in args[:5]] == [(b.data_ptr(), b.shape, b.dtype) for b in bufs]
    assert [t.dtype for t in adv.inputs] == [b.dtype for b in bufs]
    assert list(args[5:7]) == [n, S] and adv.kernel.baked == {}
    assert adv.kernel.extra_args == (("n", "n"), ("num_slots", "S"), *zip(("T", "window", "capacity"), args[7:]))
    decode = pd.describe_step(SPECS["gdn"], cfg, op="decode", tokens=1)[-1].kernel
    assert decode.baked == {"T": 1} and [p for p, _ in decode.extra_args] == ["n", "num_slots", "window", "capacity"]
    assert kw == adv.kernel.constexprs and adv.kernel.block == (32 * 4, 1, 1)


def test_parameter_order_mismatch_is_refused():
    step = pd.describe_step(SPECS["mamba2"], _cfg(), op="decode", tokens=1)[0]
    swapped = pd.PluginDesc(step.plugin_id, (step.inputs[1], step.inputs[0], *step.inputs[2:]), step.outputs,
                            step.kernel)
    with pytest.raises(ValueError, match="do not match TensorRT's order"):
        pd._check_order(swapped, [t.buffer for t in step.inputs] + ["out"])
    pd._check_order(step, [t.buffer for t in step.inputs] + ["out"])


@pytest.mark.parametrize("kwargs,match", [
    (dict(op="prefill", tokens=1), "op: expected one of"),
    (dict(op="verify", tokens=5), r"tokens: expected an int in 1\.\.4"),
    (dict(op="decode", tokens=2), "tokens: a decode takes one token"),
    (dict(op="decode", tokens=1, state_layout="kvv"), "state_layout: expected"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pd.describe_step(SPECS["gdn"], _cfg(), **kwargs)


def test_gate_only_for_mamba2():
    with pytest.raises(ValueError, match="has_z: only a mamba2 layer"):
        pd.describe_step(SPECS["kda"], _cfg(), op="decode", tokens=1, has_z=True)


_COMPILE = """
import json
import replayssm as rs
from replayssm.integrations.trtllm import plugin_desc as pd, steps
spec, _ = steps.plan_for("kimi-linear", 1, "fp8", "float32", 16)
cfg = rs.ReplayConfig(window=16, read_format="fp8", ring_dtype="bfloat16")
out = [{k: v for k, v in pd.compile_kernel(d, "sm_90").items() if k != "ptx"} | {"entry": pd.compile_kernel(d)["ptx"]
       .count(".entry " + d.kernel.kernel_name + "(")} for d in pd.describe_step(spec, cfg, op="decode", tokens=1)]
man = [dict(name=lc.kernel.__name__, grid=list(lc.grid), block=[32 * lc.num_warps, 1, 1],
            args=[dict(name=k, type=v) for k, v in steps.launch_signature(lc.kernel, lc.args, lc.constexprs).items()
                  if v != "constexpr"])
       for lc in steps.plan_for("kimi-linear", 1, "fp8", "float32", 16)[1]]
print(json.dumps(dict(plugins=out, manifest=man)))
"""


def test_compiled_kernels_match_launches():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    step, flush, adv = got["plugins"]
    for p, m in zip((step, flush), got["manifest"]):
        assert p["entry"] == 1 and p["name"] == m["name"] and p["block"] == m["block"]
        assert p["grid"] == m["grid"]
        # the plugin's parameters are the launch's in TensorRT's order: input tensors, the scalars
        # (int32 extra args), the new output
        tensors = [a["name"] for a in m["args"] if a["type"].startswith("*")]
        new = ["out"] if p is step else []
        # the checkpoint's and q_scale's last strides are 1: Triton's JIT compiles them in, so the plugin does
        scalars = [a["name"] for a in m["args"] if not a["type"].startswith("*") and a["name"] not in ("c_v", "qs_h")]
        assert p["params"] == [t for t in tensors if t not in new] + scalars + new
    assert adv["name"] == "_advance_kernel" and adv["entry"] == 1
    assert adv["params"] == ["count_ptr", "origin_ptr", "pending_ptr", "epoch_ptr", "slots", "n", "num_slots",
                             "window", "capacity"]
