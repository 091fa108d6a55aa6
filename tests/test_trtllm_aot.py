"""The AOT CLI writes the TensorRT plugin layers' PTX (``ptx_launch.build_step``'s, text for text) and
the manifests they launch from (no GPU needed)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from replayssm.integrations.trtllm import ptx_launch, steps
from replayssm.integrations.trtllm import plugin_desc as pd
from replayssm.ring import RING_VERSION

N, S = 3, 5
# each step of the CLI's index rebuilt through ptx_launch.build_step, as the plugin compiles it
_REFERENCE = """
import json, os, sys
from replayssm.integrations.trtllm import ptx_launch, steps
index = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
ref = {}
for s in index["steps"]:
    spec, cfg = steps.model_config(s["dims"], s["tokens"], s["read_format"], s["checkpoint_dtype"], s["window"],
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

        assert s["dims"] == dict(family=s["family"], **{k: v for k, v in steps.MODELS[s["model"]].items()
                                                        if k != "family"})
        spec, cfg = steps.model_config(s["model"], s["tokens"], s["read_format"], s["checkpoint_dtype"], s["window"],
                                     s["max_draft_tokens"])
        descs = pd.describe_step(spec, cfg, op=s["op"], tokens=s["tokens"], has_z=s["has_z"])
        bufs = steps.allocate(steps.step_buffers(spec, cfg, s["tokens"], has_z=s["has_z"]), N, S, device="cpu")
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


QWEN35 = dict(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"],
              text_config=dict(model_type="qwen3_5_text", linear_num_key_heads=16, linear_num_value_heads=32,
                               linear_key_head_dim=128, linear_value_head_dim=128, hidden_size=4096))


def test_cli_models_from_a_config_file_and_from_dims(tmp_path):
    """A model's dims from a Hugging Face config.json (a multimodal Qwen3.5: its text config) and from
    --dims compile to the built-in qwen3.5's PTX, text for text; the index records the dims."""
    model = tmp_path / "Qwen3.5-like"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN35))
    out = tmp_path / "out"
    index = _aot(out, "--models", "qwen3.5", "--config", str(model),
                 "--dims", "mine=gdn:num_k_heads=16,num_v_heads=32,head_k_dim=128,head_v_dim=128",
                 "--tokens", "1", "--read-formats", "checkpoint")
    assert [s["model"] for s in index["steps"]] == ["qwen3.5", "Qwen3.5-like", "mine"]
    assert all(s["dims"] == dict(steps.MODELS["qwen3.5"]) for s in index["steps"])
    built_in, *others = [ptx_launch.load_step(out / s["dir"]) for s in index["steps"]]
    for other in others:
        assert [e["ptx"] for e in other["layers"]] == [e["ptx"] for e in built_in["layers"]]


@pytest.mark.parametrize("config,dims", [
    (dict(model_type="nemotron_h", mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8),
     steps.MODELS["nemotron-h"]),
    (dict(model_type="mamba2", num_heads=8, head_dim=32, state_size=64, n_groups=2),
     dict(family="mamba2", num_heads=8, head_dim=32, state_dim=64, num_groups=2)),
    (dict(model_type="qwen3_next", linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
          linear_value_head_dim=128), steps.MODELS["qwen3.5"]),
    (QWEN35, steps.MODELS["qwen3.5"]),
    (dict(model_type="kimi_linear", linear_attn_config=dict(num_heads=32, head_dim=128, kda_layers=[1, 2])),
     steps.MODELS["kimi-linear"]),
])
def test_dims_from_config(config, dims):
    assert steps.dims_from_config(config) == dims


def test_dims_from_config_refusals():
    with pytest.raises(ValueError, match="model_type: expected a model with replayed layers.*got 'llama'"):
        steps.dims_from_config(dict(model_type="llama"))
    with pytest.raises(ValueError, match="linear_attn_config.head_dim: expected an int in a kimi_linear config"):
        steps.dims_from_config(dict(model_type="kimi_linear", linear_attn_config=dict(num_heads=32)))
    with pytest.raises(ValueError, match="gdn: missing head_v_dim"):
        steps.parse_dims("gdn:num_k_heads=1,num_v_heads=2,head_k_dim=16")
    with pytest.raises(ValueError, match="expected FAMILY:key=value"):
        steps.parse_dims("rwkv:heads=4")


def test_help_shows_every_default():
    r = subprocess.run([sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--help"], env=_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for default in ("(default: sm_90)", "(default: 1,4)", "(default: all)", "(default: float32)", "(default: 16)",
                    "(default: all of them when neither --config nor --dims is given)", "--config [NAME=]PATH",
                    "head_k_dim=128"):
        assert default in text, default


@pytest.mark.parametrize("args,match", [
    (["--models", "llama"], "argument --models: expected comma-separated built-in models, got 'llama'"),
    (["--arch", "hopper"], "argument --arch: expected sm_<major><minor>"),
    (["--tokens", "1,x"], "argument --tokens: expected comma-separated ints >= 1"),
    (["--tokens", "0"], "argument --tokens: expected comma-separated ints >= 1"),
    (["--read-formats", "fp4"], "argument --read-formats: expected comma-separated read formats, got 'fp4'"),
    (["--read-formats", "fp8,fp8"], "argument --read-formats: expected comma-separated read formats without repeats"),
    (["--checkpoint-dtype", "fp8"], "argument --checkpoint-dtype: invalid choice: 'fp8'"),
    (["--window", "0"], "argument --window: expected a positive int, got '0'"),
    (["--dims", "gdn:num_k_heads=16"], "argument --dims: expected NAME=FAMILY:key=value"),
    (["--dims", "x=gdn:num_k_heads=16,num_v_heads=32,head_k_dim=128"], "argument --dims: gdn: missing head_v_dim"),
    (["--dims", "x=gdn:num_k_heads=16,num_v_heads=32,head_k_dim=24,head_v_dim=128", "--read-formats", "nvfp4"],
     "--dims: model 'x' cannot be compiled with --read-formats nvfp4 --window 16: head_k_dim: read_format='nvfp4' "
     "needs a multiple of 16, got 24"),
    (["--dims", "x=mamba2:num_heads=8,head_dim=32,state_dim=48,num_groups=2", "--read-formats", "checkpoint"],
     "state_dim: the triton backend needs a power of two >= 16, got 48"),
    (["--dims", "x=kda:num_k_heads=3,num_v_heads=4,head_k_dim=16,head_v_dim=16"],
     "num_v_heads: expected a multiple of num_k_heads=3"),
    (["--dims", "qwen3.5=gdn:num_k_heads=1,num_v_heads=1,head_k_dim=16,head_v_dim=16", "--models", "qwen3.5"],
     "--dims: model name 'qwen3.5' given twice (--models and --dims)"),
    (["--config", "/nonexistent/config.json"], "argument --config: cannot read a JSON config from"),
])
def test_bad_arguments_are_refused(tmp_path, args, match):
    r = subprocess.run([sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(tmp_path / "out"),
                        *args], env=_env(), capture_output=True, text=True)
    assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()                    # refused before anything was written


def test_config_of_another_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type="llama", hidden_size=64)))
    r = subprocess.run([sys.executable, "-m", "replayssm.integrations.trtllm.aot", "--out", str(tmp_path / "out"),
                        "--config", str(tmp_path)], env=_env(), capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --config: " in r.stderr and "model_type: expected a model with replayed layers" in r.stderr
