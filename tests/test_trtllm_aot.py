"""The AOT CLI writes the TensorRT plugin layers' PTX (``ptx_launch.build_step``'s, text for text) and
the manifests they launch from (no GPU needed)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from replayssm.integrations.trtllm import aot, ptx_launch
from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.ring import RING_VERSION

N, S = 3, 5
# each step of the CLI's index rebuilt through ptx_launch.build_step, as the plugin compiles it
_REFERENCE = """
import json, os, sys
from replayssm.integrations.trtllm import aot, ptx_launch
index = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
ref = {}
for s in index["steps"]:
    spec, cfg = aot.model_config(s["model"], s["tokens"], s["read_format"], s["checkpoint_dtype"], s["window"],
                                 s["max_draft_tokens"])
    ref[s["dir"]] = ptx_launch.build_step(spec, cfg, op=s["op"], tokens=s["tokens"], has_z=s["has_z"], arch=sys.argv[2])
print(json.dumps(ref))
"""


def _env():
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _aot(out, *args):
    cmd = [sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(out), *args]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.load(open(out / "manifest.json"))


def test_cli_writes_the_plugin_layers(tmp_path):
    index = _aot(tmp_path, "--arch", "sm_90", "--models", "kimi-linear,nemotron-h", "--tokens", "1,3",
                 "--read-formats", "fp8", "--gate")
    assert index["ring_contract_version"] == RING_VERSION and index["arch"] == "sm_90"
    assert [(s["model"], s["op"], s["tokens"], s["has_z"]) for s in index["steps"]] == [
        ("kimi-linear", "decode", 1, False), ("kimi-linear", "verify", 3, False),
        ("nemotron-h", "decode", 1, True), ("nemotron-h", "verify", 3, True)]
    r = subprocess.run([sys.executable, "-c", _REFERENCE, str(tmp_path), "sm_90"], env=_env(), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = json.loads(r.stdout)
    for s in index["steps"]:
        got = ptx_launch.load_step(tmp_path / s["dir"])
        want = ref[s["dir"]]
        assert {k: v for k, v in got.items() if k != "layers"} == {k: v for k, v in want.items() if k != "layers"}
        assert [e["plugin_id"] for e in got["layers"]] == [e["plugin_id"] for e in want["layers"]]
        for g, w in zip(got["layers"], want["layers"], strict=True):
            assert g["ptx"] == w["ptx"], g["plugin_id"]
            assert {k: v for k, v in g.items() if k != "file"} == w, g["plugin_id"]

        spec, cfg = aot.model_config(s["model"], s["tokens"], s["read_format"], s["checkpoint_dtype"], s["window"],
                                     s["max_draft_tokens"])
        descs = pd.describe_step(spec, cfg, op=s["op"], tokens=s["tokens"], has_z=s["has_z"])
        bufs = aot.materialize(aot.step_buffers(spec, cfg, s["tokens"], has_z=s["has_z"]), N, S, device="cpu")
        bufs["pending"] = torch.zeros(S + 1, dtype=torch.int32)
        for entry, desc in zip(got["layers"], descs, strict=True):
            ptx_launch.check_ptx_params(entry, entry["ptx"])
            args = entry["args"]
            kinds = [a["kind"] for a in args]
            assert kinds == sorted(kinds, key=["input", "extra", "output"].index), entry["plugin_id"]
            assert [a.get("buffer", a["name"]) for a in args] == desc.trt_parameters(), entry["plugin_id"]
            # the manifest's argument list is what pack_args launches, in its order
            values, _ = ptx_launch.pack_args(entry, bufs)
            assert list(values) == [{"n": N, "S": S}.get(a["value"], a["value"]) if a["kind"] == "extra"
                                    else bufs[a["buffer"]].data_ptr() for a in args], entry["plugin_id"]


def test_cli_sm100(tmp_path):
    index = _aot(tmp_path, "--arch", "sm_100", "--models", "kimi-linear", "--tokens", "1", "--read-formats",
                 "checkpoint")
    assert index["arch"] == "sm_100" and len(index["steps"]) == 1
    step = ptx_launch.load_step(tmp_path / index["steps"][0]["dir"])
    assert step["arch"] == "sm_100" and len(step["layers"]) == 2   # a decode on the checkpoint: one launch, advance
    for entry in step["layers"]:
        assert ".target sm_100" in entry["ptx"] and f".entry {entry['name']}(" in entry["ptx"]


@pytest.mark.parametrize("args,match", [
    (["--models", "llama"], "--models: unknown model 'llama'"),
    (["--arch", "hopper"], "--arch: expected sm_<major><minor>"),
    (["--tokens", "1,x"], "--tokens: expected comma-separated ints >= 1"),
    (["--tokens", "0"], "--tokens: expected comma-separated ints >= 1"),
])
def test_bad_arguments_are_refused(tmp_path, args, match):
    r = subprocess.run([sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(tmp_path), *args],
                       env=_env(), capture_output=True, text=True)
    assert r.returncode != 0 and match in r.stderr
