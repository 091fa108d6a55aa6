"""The TensorRT plugin module imports without TensorRT and says what to install when it is needed.

TensorRT installs only on CUDA machines: the registrations themselves never ran (docs/trtllm.md).
"""

import subprocess
import sys

import pytest
import torch
from helpers import SPECS

import replayssm as rs
from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.integrations.trtllm import plugins

CFG = rs.ReplayConfig(window=4, max_draft_tokens=3, read_format="nvfp4", ring_dtype="bfloat16")


def test_import_needs_no_tensorrt():
    code = ("import sys, replayssm.integrations.trtllm.plugins, replayssm.integrations.trtllm.plugin_desc, "
            "replayssm.integrations.trtllm.cache; "
            "print(' '.join(sys.modules))")
    mods = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert not {m.split(".")[0] for m in mods} & {"tensorrt", "tensorrt_llm"}


@pytest.fixture
def no_tensorrt(monkeypatch):
    """TensorRT made unimportable whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", None)


def test_register_says_what_to_install(no_tensorrt):
    with pytest.raises(ImportError, match=r"TensorRT >= 10\.9 .*replayssm\[trtllm\]"):
        plugins.register()


def test_add_step_says_what_to_install(no_tensorrt):
    names = pd.describe_step(SPECS["gdn"], CFG, op="decode", tokens=1)
    tensors = {t.buffer: object() for d in names for t in d.inputs}
    with pytest.raises(ImportError, match="tensorrt.plugin"):
        plugins.add_step(object(), tensors, SPECS["gdn"], CFG, op="decode", tokens=1)


def test_add_step_names_missing_tensors():
    with pytest.raises(ValueError, match=r"tensors: missing \['pending', 'ring_d'\]"):
        plugins.add_step(object(), {"checkpoint": object()} | {k: object() for k in
                         ("read_codes", "read_block_scale", "read_row_scale", "ring_k", "ring_v", "ring_g", "ring_beta",
                          "count", "origin", "epoch", "slots", "q", "q_scale", "k", "v", "g", "beta")},
                         SPECS["gdn"], CFG, op="decode", tokens=1)


def test_config_round_trip():
    config = plugins.step_config(SPECS["kda"], CFG, op="verify", tokens=3, layer=2, state_layout="vk", arch="sm_100a")
    descs, arch = plugins._descs(config)
    direct = pd.describe_step(SPECS["kda"], CFG, op="verify", tokens=3, layer=2, state_layout="vk")
    assert arch == "sm_100a" and list(descs) == [d.plugin_id for d in direct]
    for d in direct:
        got = descs[d.plugin_id]
        assert (got.inputs, got.outputs, got.kernel) == (d.inputs, d.outputs, d.kernel)
    assert dict(got.kernel.extra_args)["T"] == 3


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_x"])
def test_config_rejects_bad_arch(arch):
    with pytest.raises(ValueError, match="arch: expected 'sm_<major><minor>'"):
        plugins.step_config(SPECS["gdn"], CFG, op="decode", tokens=1, arch=arch)


@pytest.mark.parametrize("family", list(SPECS))
def test_registered_io_fits_every_config(family):
    """One registration per plugin id: its input names and output count must not depend on dims,
    read format, checkpoint dtype, gate, layout or T."""
    ids = {pid for f, pid in plugins._plugin_ids() if f == family or pid.endswith("advance")}
    seen = set()
    layouts = ("kv", "vk") if family != "mamba2" else ("kv",)
    for rf, ckpt in (("checkpoint", "float32"), ("fp8", "bfloat16"), ("nvfp4", "float16_sr")):
        cfg = rs.ReplayConfig(window=4, max_draft_tokens=3, read_format=rf, checkpoint_dtype=ckpt)
        for op, T in (("decode", 1), ("verify", 4)):
            for layout in layouts:
                for d in pd.describe_step(SPECS[family], cfg, op=op, tokens=T, has_z=family == "mamba2",
                                          state_layout=layout):
                    fam = family if d.plugin_id != "replayssm::advance" else "mamba2"
                    assert plugins._io(fam, d.plugin_id) == ([t.name for t in d.inputs], len(d.outputs))
                    seen.add(d.plugin_id)
    assert seen == ids


def test_new_output_is_like_the_activation():
    """The shape function gives ``out`` the shape and dtype of x / v: true of the descriptors."""
    for family, act in (("mamba2", "x"), ("gdn", "v"), ("kda", "v")):
        step = pd.describe_step(SPECS[family], CFG, op="verify", tokens=2)[0]
        src = next(t for t in step.inputs if t.buffer == act and t.name == act)
        out = step.outputs[0]
        assert out.alias_of is None and (out.shape, out.dtype) == (src.shape, src.dtype) == (out.shape, torch.bfloat16)
