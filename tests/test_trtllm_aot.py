"""The TensorRT AOT path compiles the torch ops' own launches to PTX (no GPU needed) with a manifest."""

import json
import os
import subprocess
import sys

import pytest

from replayssm.kernels import ops
from replayssm.ring import RING_VERSION


def _aot(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(tmp_path), *args]
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return json.load(open(tmp_path / "manifest.json"))


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_ptx_and_manifest(tmp_path, arch):
    m = _aot(tmp_path, "--arch", arch, "--models", "kimi-linear", "--tokens", "1", "--read-formats", "fp8")
    assert m["ring_contract_version"] == RING_VERSION and m["arch"] == arch
    assert [k["flush_pass"] for k in m["kernels"]] == [False, True]
    warps = [ops.TILES["delta"]["decode"]["num_warps"], ops.TILES["delta"]["flush"]["num_warps"]]
    for k, nw in zip(m["kernels"], warps):
        ptx = (tmp_path / k["file"]).read_text()
        assert f".entry {k['name']}(" in ptx
        assert f".target {arch}" in ptx
        assert k["grid"][2] == "n" and k["block"] == [32 * nw, 1, 1]
        names = [a["name"] for a in k["args"]]
        assert names[:2] == ["ckpt", "c_s"] and "sr_base" in names and "slots" in names
        # one PTX parameter per non-constexpr argument, in the manifest's order
        assert ptx.count(f"{k['name']}_param_") >= len(names)
        assert k["constexprs"]["PER_CHANNEL"] is True and k["constexprs"]["READ_FMT"] == 1


def test_unknown_model_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(tmp_path),
                        "--models", "llama"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "--models: unknown model 'llama'" in r.stderr
