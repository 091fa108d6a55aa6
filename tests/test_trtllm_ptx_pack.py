"""The PTX launcher's CPU half (``ptx_launch``): kernel parameters packed in TensorRT's order from
named buffers, grids, the manifest directory, and that order against compiled PTX entries. The
driver launch itself is GPU only (``test_trtllm_ptx_launch.py``)."""

import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import SPECS

import replayssm as rs
from replayssm.integrations.trtllm import ptx_launch, steps
from replayssm.integrations.trtllm import plugin_desc as pd

CASES = [(f, op, rf) for f in SPECS for op in pd.OPS for rf in ("checkpoint", "fp8", "nvfp4")]
N, S = 5, 7


def _cfg(rf="checkpoint"):
    return rs.ReplayConfig(window=4, max_draft_tokens=2, read_format=rf, ring_dtype="bfloat16")


def _step(family, op, rf):
    """(descriptors, manifest entries without PTX, CPU buffers for N rows and S slots) of one step."""
    spec, cfg, T = SPECS[family], _cfg(rf), 1 if op == "decode" else 3
    has_z = family == "mamba2"
    descs = pd.describe_step(spec, cfg, op=op, tokens=T, has_z=has_z)
    entries = [ptx_launch.layer_entry(d, name=d.kernel.kernel_name, shared=0) for d in descs]
    bufs = steps.allocate(steps.step_buffers(spec, cfg, T, has_z=has_z), N, S, device="cpu")
    bufs["pending"] = torch.zeros(S + 1, dtype=torch.int32)
    return descs, entries, bufs


@pytest.mark.parametrize("family,op,rf", CASES, ids=["-".join(c) for c in CASES])
def test_pack_in_tensorrt_order(family, op, rf):
    descs, entries, bufs = _step(family, op, rf)
    assert ptx_launch.step_sizes(bufs) == (N, S)
    for desc, entry in zip(descs, entries):
        assert json.loads(json.dumps(entry)) == entry
        values, types = ptx_launch.pack_args(entry, bufs)
        extra = {"n": N, "S": S}
        passed = [bufs[t.buffer].data_ptr() for t in desc.inputs]
        passed += [extra.get(v, v) for _, v in desc.kernel.extra_args]
        passed += [bufs[t.buffer].data_ptr() for t in desc.outputs]
        assert list(values) == passed
        k = len(desc.inputs)
        assert list(types) == [ctypes.c_void_p] * k + [ctypes.c_int] * (len(values) - k - len(desc.outputs)) + \
            [ctypes.c_void_p] * len(desc.outputs)
        first_out = len(desc.inputs) + len(desc.kernel.extra_args)
        for k, o in enumerate(desc.outputs):  # an aliased output repeats its input's pointer
            if o.alias_of is not None:
                assert values[first_out + k] == values[o.alias_of]
        padded = desc.kernel.grid_for(N) + (1,) * (3 - len(desc.kernel.grid))
        assert ptx_launch.grid_for(entry, N) == padded


def test_advance_grid_and_extra_args():
    _, entries, bufs = _step("gdn", "verify", "checkpoint")
    adv = entries[-1]
    assert [(a["name"], a["value"]) for a in adv["args"] if a["kind"] == "extra"] == \
        [("n", "n"), ("num_slots", "S"), ("T", 3), ("window", 4), ("capacity", 6)]
    assert ptx_launch.grid_for(adv, 300) == (3, 1, 1) and ptx_launch.grid_for(adv, 0) == (0, 1, 1)


def _bad(bufs, name, fn):
    return dict(bufs, **{name: fn(bufs[name])})


@pytest.mark.parametrize("edit,error,match", [
    (lambda b: {k: v for k, v in b.items() if k != "ring_k"}, ValueError, r"ring_k: expected a tensor in buffers"),
    (lambda b: _bad(b, "ring_v", lambda t: t[:, :, :-1]), ValueError,
     r"ring_v: expected shape \[7, 4, 6, 5\] .*got \[7, 4, 5, 5\]"),
    (lambda b: _bad(b, "q_scale", lambda t: t.bfloat16()), TypeError,
     r"q_scale: expected dtype torch.float32 .*got torch.bfloat16"),
    (lambda b: _bad(b, "checkpoint", lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)), ValueError,
     "checkpoint: expected a contiguous tensor"),
    (lambda b: _bad(b, "g", lambda t: torch.empty_like(t, device="meta")), ValueError, "g: expected device cpu"),
    (lambda b: {k: v for k, v in b.items() if k != "slots"}, ValueError, "slots: expected a 1-d tensor"),
    (lambda b: _bad(b, "count", lambda t: t[None]), ValueError, "count: expected a 1-d tensor"),
], ids=["missing", "shape", "dtype", "strides", "device", "no-slots", "count-2d"])
def test_pack_refuses_bad_buffers(edit, error, match):
    _, entries, bufs = _step("gdn", "verify", "checkpoint")
    with pytest.raises(error, match=match):
        ptx_launch.pack_args(entries[0], edit(bufs))


def _fake_ptx(name, params):
    decl = ",\n".join(f"\t.param {p} {name}_param_{i}" for i, p in enumerate(params))
    return f".version 8.7\n.target sm_90a\n.address_size 64\n.visible .entry {name}(\n{decl}\n)\n{{\n\tret;\n}}\n"


def test_ptx_params_checked_against_tensorrt_order():
    _, entries, _ = _step("mamba2", "decode", "checkpoint")
    adv = entries[-1]  # 5 pointers, n, S, window, capacity (T = 1 is compiled in), 4 aliased output pointers
    ptr = ".u64 .ptr .global .align 1"
    # + Triton's two scratch pointers; an f32 parameter takes an int32 extra arg (the float's bits)
    ok = _fake_ptx(adv["name"], [ptr] * 5 + [".u32"] * 3 + [".f32"] + [ptr] * 2)
    assert ptx_launch.ptx_params(ok, adv["name"]) == ["ptr"] * 5 + ["u32"] * 3 + ["f32"] + ["ptr"] * 2
    ptx_launch.check_ptx_params(adv, ok)
    with pytest.raises(ValueError, match="PTX parameter 5 is ptr, TensorRT passes int32"):
        ptx_launch.check_ptx_params(adv, _fake_ptx(adv["name"], [ptr] * 11))
    with pytest.raises(ValueError, match="PTX parameter 0 is u64, TensorRT passes ptr"):
        ptx_launch.check_ptx_params(adv, _fake_ptx(adv["name"], [".u64"] + [ptr] * 4 + [".u32"] * 4))
    with pytest.raises(ValueError, match="the PTX entry takes 14 parameters, TensorRT passes 13"):
        ptx_launch.check_ptx_params(adv, _fake_ptx(adv["name"], [ptr] * 5 + [".u32"] * 4 + [ptr] * 5))
    with pytest.raises(ValueError, match="ptx: no .entry _advance_kernel"):
        ptx_launch.ptx_params(_fake_ptx("other", [ptr]), adv["name"])


def test_manifest_directory_round_trip(tmp_path):
    _, entries, _ = _step("kda", "verify", "nvfp4")
    manifest = dict(ring_contract_version=rs.ring.RING_VERSION, arch="sm_90", triton="x",
                    layers=[dict(e, ptx=f"// {e['plugin_id']}\n") for e in entries])
    ptx_launch.save_step(manifest, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["0.kda_verify.ptx", "1.kda_verify_flush.ptx", "2.advance.ptx",
                                            "manifest.json"]
    loaded = ptx_launch.load_step(tmp_path)
    assert loaded["layers"] == [dict(e, file=f) for e, f in zip(manifest["layers"], sorted(os.listdir(tmp_path)))]
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert all("ptx" not in e for e in on_disk["layers"])
    on_disk["ring_contract_version"] = rs.ring.RING_VERSION + 1
    (tmp_path / "manifest.json").write_text(json.dumps(on_disk))
    with pytest.raises(ValueError, match="ring contract version"):
        ptx_launch.load_step(tmp_path)


_BUILD = """
import sys
import replayssm as rs
from replayssm.integrations.trtllm import ptx_launch
from helpers import SPECS
cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="nvfp4", checkpoint_dtype="bfloat16",
                      ring_dtype="bfloat16")
for i, (family, op, T) in enumerate((("mamba2", "verify", 3), ("gdn", "decode", 1))):
    m = ptx_launch.build_step(SPECS[family], cfg, op=op, tokens=T, has_z=family == "mamba2", arch="sm_90")
    ptx_launch.save_step(m, f"{sys.argv[1]}/{i}")
"""


def test_compiled_ptx_takes_tensorrt_order(tmp_path):
    """PTX compiled in-process for sm_90 (Triton, no GPU), saved and read back: each entry's
    parameters are covered by TensorRT's, kind for kind; beyond the kernel's runtime parameters
    the entry takes only Triton's two scratch pointers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="nvfp4", checkpoint_dtype="bfloat16",
                          ring_dtype="bfloat16")
    for i, (family, op, T) in enumerate((("mamba2", "verify", 3), ("gdn", "decode", 1))):
        m = ptx_launch.load_step(tmp_path / str(i))
        assert m["arch"] == "sm_90" and len(m["layers"]) == 3
        descs = pd.describe_step(SPECS[family], cfg, op=op, tokens=T, has_z=family == "mamba2")
        for desc, entry in zip(descs, m["layers"]):
            assert {k: v for k, v in entry.items() if k not in ("ptx", "file")} == \
                ptx_launch.layer_entry(desc, name=entry["name"], shared=entry["shared"])
            assert ".target sm_90" in entry["ptx"] and f".entry {entry['name']}(" in entry["ptx"]
            ptx_launch.check_ptx_params(entry, entry["ptx"])
            runtime = len(desc.inputs) + len(desc.kernel.extra_args) + sum(o.alias_of is None for o in desc.outputs)
            assert ptx_launch.ptx_params(entry["ptx"], entry["name"])[runtime:] == ["ptr", "ptr"]


def test_driver_missing_is_named(monkeypatch):
    with pytest.raises(ValueError, match="device: expected a CUDA device, got cpu"):
        ptx_launch.PtxStep({"layers": []}, device="cpu")
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    with pytest.raises(ImportError, match="pip install 'cuda-python>=12.6'"):
        ptx_launch.driver()
    with pytest.raises(ImportError, match="cuda-python"):
        ptx_launch.PtxStep({"layers": []}, device="cuda")
