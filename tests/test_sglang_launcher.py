"""The SGLang launcher and plugin entry point, against the real sglang 0.5.23 that `make test` installs."""

import json
import os

import pytest

pytest.importorskip("sglang")

from replayssm import ReplayConfig  # noqa: E402
from replayssm.integrations.sglang import launch_server, options, plugin  # noqa: E402

MODEL = ["--model-path", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "--device", "cpu"]
SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "1",
        "--speculative-num-steps", "3"]


@pytest.fixture
def environ(monkeypatch):
    env = dict(os.environ)
    env.pop(options.ENV_VAR, None)
    monkeypatch.setattr(os, "environ", env)
    return env


def _dry_run(capsys, args):
    launch_server.main(args + ["--dry-run"])
    return json.loads(capsys.readouterr().out)


def test_dry_run_decode(environ, capsys):
    out = _dry_run(capsys, ["--replay-ssm", "--replay-read-format", "nvfp4", "--replay-window", "8"] + MODEL)
    # SGLang's CUDA graphs stay on (test_sglang_cuda_graph.py)
    assert out["sglang_args"] == MODEL + ["--mamba-ssm-dtype", "float32", "--mamba-radix-cache-strategy", "no_buffer",
                                          "--disable-overlap-schedule", "--linear-attn-decode-backend", "triton",
                                          "--linear-attn-verify-backend", "triton"]
    assert out["replay"] == dict(window=8, max_draft_tokens=0, checkpoint_dtype="float32", read_format="nvfp4",
                                 ring_dtype="bfloat16", seed=0, ring_version=1)
    assert json.loads(environ[options.ENV_VAR]) == out["replay"]
    assert options.from_env() == ReplayConfig(window=8, read_format="nvfp4", ring_dtype="bfloat16")


def test_dry_run_spec_and_checkpoint_dtype(environ, capsys):
    out = _dry_run(capsys, ["--replay-ssm", "--replay-checkpoint-dtype", "float16_sr"] + MODEL + SPEC)
    assert out["replay"]["max_draft_tokens"] == 3
    assert out["sglang_args"][-9:] == ["--mamba-ssm-dtype", "float16", "--mamba-radix-cache-strategy", "no_buffer",
                                       "--disable-overlap-schedule", "--linear-attn-decode-backend", "triton",
                                       "--linear-attn-verify-backend", "triton"]


@pytest.fixture
def gpu_platform(monkeypatch):
    """SGLang resolves extra_buffer only on GPU platforms: its platform predicate, as on a GPU."""
    from sglang.srt.arg_groups import mamba_hook
    monkeypatch.setattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)


def test_dry_run_extra_buffer(environ, capsys, gpu_platform):
    """extra_buffer's track copies read their row mask on the host inside the forward: no CUDA graphs."""
    strategy = ["--mamba-radix-cache-strategy", "extra_buffer"]
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + strategy)
    assert out["sglang_args"] == MODEL + strategy + ["--mamba-ssm-dtype", "float32", "--disable-overlap-schedule",
                                                     "--disable-cuda-graph", "--linear-attn-decode-backend", "triton",
                                                     "--linear-attn-verify-backend", "triton"]


def test_dry_run_extra_buffer_with_speculative_decoding(environ, capsys, gpu_platform):
    """Replay's commit moves SGLang's track slots too (``mamba2.commit_after_verify``)."""
    strategy = ["--mamba-radix-cache-strategy", "extra_buffer"]
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + SPEC + strategy)
    assert out["replay"]["max_draft_tokens"] == 3
    assert out["sglang_args"] == MODEL + SPEC + strategy + [
        "--mamba-ssm-dtype", "float32", "--disable-overlap-schedule", "--disable-cuda-graph",
        "--linear-attn-decode-backend", "triton", "--linear-attn-verify-backend", "triton"]


@pytest.mark.parametrize("flags", [["--enable-hierarchical-cache"], ["--enable-mixed-chunk"],
                                   ["--enable-int8-mamba-checkpoint"], ["--disaggregation-mode", "prefill"],
                                   ["--disaggregation-mode", "decode"]])
def test_dry_run_served_modes(environ, capsys, flags):
    """Served with replay: HiCache's host tier (its backups and loads go through the replay hooks,
    test_sglang_hicache.py), mixed batches (the extend hooks fold the decode rows' rings first,
    test_sglang_mixed.py), the int8 radix store (test_sglang_int8.py) and PD disaggregation (the
    decode side resets the transferred slots, test_sglang_disagg.py)."""
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + flags)
    assert out["sglang_args"][:len(MODEL) + len(flags)] == MODEL + flags
    assert out["replay"]["window"] == 16


def test_replay_off_passes_everything_through(environ, capsys):
    out = _dry_run(capsys, MODEL + ["--mamba-radix-cache-strategy", "extra_buffer"])
    assert out["replay"] is None and out["env"] == {}
    assert out["sglang_args"] == MODEL + ["--mamba-radix-cache-strategy", "extra_buffer"]
    assert options.ENV_VAR not in environ


@pytest.mark.parametrize("args,match", [
    (["--enable-linear-replayssm"], "--enable-linear-replayssm: replayssm replaces SGLang's own replay"),
    (["--speculative-eagle-topk", "2"], "--speculative-eagle-topk: replay verifies a chain of drafts"),
    (["--replay-window", "0"], "--replay-window: expected a positive int"),
    (["--mamba-ssm-dtype", "bfloat16"], "--mamba-ssm-dtype: --replay-checkpoint-dtype float32 stores"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"],
     "--mamba-radix-cache-strategy: replayssm serves no_buffer and extra_buffer; got extra_buffer_lazy"),
    (["--enable-mamba-cache-stochastic-rounding"], "--enable-mamba-cache-stochastic-rounding: not served"),
    (["--linear-attn-decode-backend", "flashinfer"], "--linear-attn-decode-backend: replay routes GDN / KDA"),
])
def test_refusals(environ, args, match):
    with pytest.raises(SystemExit, match=match):
        launch_server.main(["--replay-ssm", "--dry-run"] + MODEL + args)


def test_plugin_loaded_by_sglangs_loader_is_a_no_op_without_replay(environ, monkeypatch):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    monkeypatch.setenv("SGLANG_PLUGINS", "replayssm")
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "replayssm" in found
    func = found["replayssm"][0]
    assert func is plugin.entry_point and func() is None


def test_plugin_with_replay_checks_version_and_installs_the_hooks(environ, monkeypatch):
    import sglang
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

    from replayssm.integrations.sglang import hooks
    environ[options.ENV_VAR] = options.encode(ReplayConfig(window=8))
    monkeypatch.setattr(sglang, "__version__", "0.5.22")
    with pytest.raises(RuntimeError, match=r"serves sglang 0\.5\.17, 0\.5\.23; found 0\.5\.22"):
        plugin.load()
    assert not hooks.installed() and HybridReqToTokenPool.mamba_pool_cls is MambaPool
    monkeypatch.setattr(sglang, "__version__", "0.5.23")
    try:
        plugin.load()
        assert hooks.installed() and HybridReqToTokenPool.mamba_pool_cls.replay_cfg == ReplayConfig(window=8)
        assert issubclass(HybridReqToTokenPool.mamba_pool_cls, MambaPool)
    finally:
        hooks.uninstall()
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool
    environ[options.ENV_VAR] = json.dumps(dict(window=16, ring_version=99))
    with pytest.raises(RuntimeError, match="ring contract version 99"):
        options.from_env()


def test_entry_point_ends_a_process_whose_install_failed():
    """SGLang's loader logs and swallows a plugin's exception: the entry point must end the process
    instead of letting it serve without replay (and return quietly with replay off)."""
    import subprocess
    import sys

    code = ("import sglang; sglang.__version__ = '0.5.20'\n"
            "from replayssm.integrations.sglang import plugin\n"
            "plugin.entry_point()\n"
            "print('still serving')\n")
    env = dict(os.environ)
    env[options.ENV_VAR] = options.encode(ReplayConfig(window=8))
    failed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 3 and "still serving" not in failed.stdout
    assert "serves sglang 0.5.17, 0.5.23; found 0.5.20" in failed.stderr
    env.pop(options.ENV_VAR)
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert off.returncode == 0 and "still serving" in off.stdout


def test_versions_hold_one_seam_table_per_served_release(monkeypatch):
    import sglang

    from replayssm.integrations.sglang import versions
    assert sorted(versions.SEAMS) == ["0.5.17", "0.5.23"]
    assert versions.seams() is versions.Seams0523                 # what `make test` installs
    monkeypatch.setattr(sglang, "__version__", "0.5.17")
    assert versions.seams() is versions.Seams0517
    monkeypatch.setattr(sglang, "__version__", "0.6.0")
    with pytest.raises(RuntimeError, match="serves sglang 0.5.17, 0.5.23; found 0.6.0"):
        versions.seams()
