"""The SGLang launcher and plugin entry point, against the real sglang 0.5.23 that `make test` installs.

The models are tiny configs in local directories (SGLang resolves them offline): the launcher reads
a model's config as the server does and applies the plugin's checks."""

import dataclasses
import json
import os

import pytest

pytest.importorskip("sglang")

import replayssm as rs  # noqa: E402
from replayssm import ReplayConfig  # noqa: E402
from replayssm.integrations.sglang import launch_plan, launch_server, options, plugin  # noqa: E402

SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4", "--speculative-eagle-topk", "1",
        "--speculative-num-steps", "3"]
# tiny configs of each replayed family and of a model without SSM layers (SGLang's config classes read them)
TINY = {
    "nemotron_h": dict(architectures=["NemotronHForCausalLM"], model_type="nemotron_h", hidden_size=64, vocab_size=128,
                       num_hidden_layers=4, hybrid_override_pattern="M*M-", mamba_num_heads=4, mamba_head_dim=6,
                       n_groups=2, ssm_state_size=16, conv_kernel=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, max_position_embeddings=256, chunk_size=8),
    "qwen3_next": dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=64, vocab_size=128,
                       num_hidden_layers=4, full_attention_interval=4, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                       max_position_embeddings=256, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32),
    "kimi_linear": dict(architectures=["KimiLinearForCausalLM"], model_type="kimi_linear", hidden_size=64,
                        vocab_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                        intermediate_size=128, max_position_embeddings=256, kv_lora_rank=16, qk_nope_head_dim=16,
                        qk_rope_head_dim=16, v_head_dim=16,
                        linear_attn_config=dict(num_heads=4, head_dim=16, kda_layers=[1, 2, 3], full_attn_layers=[4],
                                                short_conv_kernel_size=4)),
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, vocab_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                  max_position_embeddings=256),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """``model_dir(name, **overrides)``: a directory holding ``TINY[name]`` (with overrides) as config.json."""
    made = {}

    def make(name, **overrides):
        key = (name, json.dumps(overrides, sort_keys=True))
        if key not in made:
            path = tmp_path_factory.mktemp(name)
            (path / "config.json").write_text(json.dumps({**TINY[name], **overrides}))
            made[key] = str(path)
        return made[key]
    return make


@pytest.fixture
def MODEL(model_dir):
    return ["--model-path", model_dir("nemotron_h"), "--device", "cpu"]


@pytest.fixture
def environ(monkeypatch):
    env = dict(os.environ)
    for name in (options.ENV_VAR, "SGLANG_MAMBA_SSM_DTYPE"):
        env.pop(name, None)
    env["HF_HUB_OFFLINE"] = "1"
    monkeypatch.setattr(os, "environ", env)
    return env


@pytest.fixture(autouse=True)
def gpu_platform(monkeypatch):
    """SGLang's platform predicate for extra_buffer, as on a GPU: the strategy SGLang's "auto" picks for
    these models there (0.5.17 has no such predicate)."""
    try:
        from sglang.srt.arg_groups import mamba_hook
    except ImportError:
        return
    monkeypatch.setattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)


def _dry_run(capsys, args):
    launch_server.main(args + ["--dry-run"])
    return json.loads(capsys.readouterr().out)


def test_dry_run_decode(environ, capsys, MODEL):
    out = _dry_run(capsys, ["--replay-ssm", "--replay-read-format", "nvfp4", "--replay-window", "8"] + MODEL)
    # SGLang's own radix strategy ("auto": extra_buffer with its overlap scheduler on a GPU) and its CUDA
    # graphs (test_sglang_cuda_graph.py) stay as they are
    assert out["sglang_args"] == MODEL + ["--mamba-ssm-dtype", "float32", "--linear-attn-decode-backend", "triton",
                                          "--linear-attn-verify-backend", "triton"]
    assert out["replay"] == dict(window=8, max_draft_tokens=0, checkpoint_dtype="float32", read_format="nvfp4",
                                 ring_dtype="bfloat16", seed=0, ring_version=1)
    assert json.loads(environ[options.ENV_VAR]) == out["replay"]
    assert options.from_env() == ReplayConfig(window=8, read_format="nvfp4", ring_dtype="bfloat16")
    # the plan: Nemotron-H's mamba layers ("M*M-": 0 and 2), their dims and bytes per slot as a StatePool keeps them
    spec = rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=16, num_groups=2)
    per_layer = _bytes_per_slot(spec, options.from_env())
    assert out["sglang"] == "0.5.23"
    assert {k: v for k, v in out["plan"].items() if k not in ("layers", "bytes_per_slot")} == dict(
        family="mamba2", attn_tp_size=1, dims=dict(num_heads=4, head_dim=6, state_dim=16, num_groups=2),
        state_dtype="float32", backend="reference", max_draft_tokens=0, capacity=8,
        total_bytes_per_slot=2 * sum(per_layer.values()),
        sglang_conv_bytes_per_slot=2 * (4 * 6 + 2 * 2 * 16) * 3 * 2)   # 2 layers' [H*P + 2GN, width 4 - 1] in bf16
    assert out["plan"]["layers"] == [dict(layer=i, family="mamba2", dims=out["plan"]["dims"], bytes_per_slot=per_layer)
                                     for i in (0, 2)]
    assert out["plan"]["bytes_per_slot"] == {k: 2 * v for k, v in per_layer.items()}


def _bytes_per_slot(spec, cfg) -> dict:
    """Bytes per slot and layer of a StatePool's buffers (one layer, one slot, as it allocates them)."""
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=1)
    return dict(pool.bytes_per_slot(), cursors=sum(c[0, 0].element_size() for c in pool.cursors.values()))


def test_dry_run_spec_and_checkpoint_dtype(environ, capsys, MODEL):
    out = _dry_run(capsys, ["--replay-ssm", "--replay-checkpoint-dtype", "float16_sr"] + MODEL + SPEC)
    assert out["replay"]["max_draft_tokens"] == 3
    assert out["sglang_args"][-9:] == ["--mamba-ssm-dtype", "float16", "--mamba-radix-cache-strategy", "no_buffer",
                                       "--disable-overlap-schedule", "--linear-attn-decode-backend", "triton",
                                       "--linear-attn-verify-backend", "triton"]


@pytest.mark.parametrize("name,flags,spec,layers", [
    ("nemotron_h", ["--tp-size", "2"], rs.LayerSpec.mamba2(num_heads=2, head_dim=6, state_dim=16, num_groups=1),
     [0, 2]),
    ("qwen3_next", [], rs.LayerSpec.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16), [0, 1, 2]),
    ("qwen3_next", ["--tp-size", "2"], rs.LayerSpec.gdn(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16),
     [0, 1, 2]),
    ("kimi_linear", ["--tp-size", "2"], rs.LayerSpec.kda(num_k_heads=2, num_v_heads=2, head_k_dim=16, head_v_dim=16),
     [0, 1, 2]),
])
def test_dry_run_plan_per_family_and_rank(environ, capsys, model_dir, name, flags, spec, layers):
    """The plan holds the dims of one tensor-parallel rank (SGLang's cache parameters under the
    server arguments' parallel context) and every replayed layer."""
    cfg = ReplayConfig(window=4, read_format="fp8", checkpoint_dtype="bfloat16", ring_dtype="bfloat16")
    out = _dry_run(capsys, ["--replay-ssm", "--replay-window", "4", "--replay-read-format", "fp8",
                            "--replay-checkpoint-dtype", "bfloat16", "--model-path", model_dir(name), "--device", "cpu"]
                   + flags)
    plan, per_layer = out["plan"], _bytes_per_slot(spec, cfg)
    assert plan["family"] == spec.family and plan["attn_tp_size"] == (2 if flags else 1) and plan["state_dtype"] == "bfloat16"
    assert [layer["layer"] for layer in plan["layers"]] == layers
    assert all(layer["bytes_per_slot"] == per_layer for layer in plan["layers"])
    assert rs.LayerSpec(spec.family, **plan["dims"]) == spec
    assert plan["total_bytes_per_slot"] == len(layers) * sum(per_layer.values())


def test_dry_run_plan_with_drafts(environ, capsys, MODEL):
    """The verify budget of the plan is SGLang's resolved number of draft tokens: the ring holds a verify."""
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + SPEC)
    cfg = ReplayConfig(max_draft_tokens=3, ring_dtype="bfloat16")
    assert out["plan"]["max_draft_tokens"] == 3 and out["plan"]["capacity"] == cfg.capacity == 19
    per_layer = _bytes_per_slot(rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=16, num_groups=2), cfg)
    assert out["plan"]["layers"][0]["bytes_per_slot"] == per_layer
    # SGLang's snapshots of a 4-token verify, which replay does not allocate: 4 states per layer and request
    assert out["plan"]["sglang_snapshot_bytes_per_request"] == 4 * per_layer["checkpoint"] * len(out["plan"]["layers"])


@pytest.mark.parametrize("flag,value", [("--replay-window", "8"), ("--replay-checkpoint-dtype", "bfloat16"),
                                        ("--replay-read-format", "fp8")])
def test_replay_options_need_replay_ssm(environ, MODEL, flag, value):
    with pytest.raises(SystemExit, match=f"{flag}: a replay option needs --replay-ssm"):
        launch_server.main([flag, value, "--dry-run"] + MODEL)
    assert options.ENV_VAR not in environ


@pytest.mark.parametrize("replay", [["--replay-ssm"], []])
def test_dry_run_refuses_a_model_that_does_not_resolve(environ, replay):
    with pytest.raises(SystemExit, match="--model-path: SGLang cannot load the config of './does-not-exist'"):
        launch_server.main(replay + ["--dry-run", "--model-path", "./does-not-exist", "--device", "cpu"])


def test_dry_run_applies_the_read_format_and_kernel_checks(environ, capsys, model_dir):
    """A GDN model with head_k_dim 24: no fp8 / NVFP4 read copy (blocks of 16); on a GPU no Triton
    kernel (a power of two); on the CPU's reference backend the checkpoint serves it."""
    model = ["--model-path", model_dir("qwen3_next", linear_key_head_dim=24)]
    with pytest.raises(SystemExit, match=r"--replay-read-format: nvfp4 cannot serve this model's layers \(head_k_dim: "
                                         r"read_format='nvfp4' needs a multiple of 16, got 24\)"):
        launch_server.main(["--replay-ssm", "--replay-read-format", "nvfp4", "--dry-run", "--device", "cpu"] + model)
    with pytest.raises(SystemExit, match=r"--replay-ssm: the Triton kernels do not take this model's layers "
                                         r"\(head_k_dim: the triton backend needs a power of two >= 16, got 24\)"):
        launch_server.main(["--replay-ssm", "--dry-run", "--device", "cuda"] + model)
    out = _dry_run(capsys, ["--replay-ssm", "--device", "cpu"] + model)
    assert out["plan"]["dims"]["head_k_dim"] == 24 and out["plan"]["backend"] == "reference"


def test_dry_run_refuses_a_model_without_replayed_layers(environ, model_dir):
    with pytest.raises(SystemExit, match="--replay-ssm: LlamaConfig has no SSM / linear-attention layers"):
        launch_server.main(["--replay-ssm", "--dry-run", "--model-path", model_dir("llama"), "--device", "cpu"])


def test_plan_refuses_a_state_dtype_that_is_not_the_checkpoint_dtype(environ, model_dir):
    """SGLang allocates the ssm state in the config's ``mamba_ssm_dtype`` when no --mamba-ssm-dtype is
    given (the launcher always gives one): the pool would refuse a checkpoint dtype other than that."""
    from sglang.srt.server_args import prepare_server_args
    args = prepare_server_args(["--model-path", model_dir("nemotron_h", mamba_ssm_dtype="bfloat16"), "--device", "cpu",
                                "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"])
    with pytest.raises(SystemExit, match="--replay-checkpoint-dtype: SGLang stores this model's ssm state as "
                                         "torch.bfloat16 .*checkpoint dtype float32 needs torch.float32"):
        launch_plan.replay_plan(args, ReplayConfig())
    assert launch_plan.replay_plan(args, ReplayConfig(checkpoint_dtype="bfloat16"))["state_dtype"] == "bfloat16"


def test_dry_run_checks_the_sglang_version(environ, monkeypatch, MODEL):
    import sglang
    monkeypatch.setattr(sglang, "__version__", "0.4.0")
    with pytest.raises(RuntimeError, match="0.4.0"):
        launch_server.main(["--replay-ssm", "--dry-run"] + MODEL)


def test_help_describes_the_options_and_reaches_sglangs(capsys):
    with pytest.raises(SystemExit) as done:
        launch_server.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for part in ("Every argument not listed here goes to SGLang's launcher (python -m sglang.launch_server) unchanged",
                 "--sglang-help", "turn replay on (default: off", "(default: 16)", "(default: float32)",
                 "(default: checkpoint)", "--dry-run"):
        assert part in text, part
    with pytest.raises(SystemExit) as done:
        launch_server.main(["--sglang-help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--model-path" in text and "--mamba-ssm-dtype" in text




def test_dry_run_extra_buffer(environ, capsys, MODEL):
    """extra_buffer's decode track copy keeps its row mask on the device: SGLang's CUDA graphs and its
    overlap scheduler stay on (its ping-pong track slots are what extra_buffer is for)."""
    strategy = ["--mamba-radix-cache-strategy", "extra_buffer"]
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + strategy)
    assert out["sglang_args"] == MODEL + strategy + ["--mamba-ssm-dtype", "float32",
                                                     "--linear-attn-decode-backend", "triton",
                                                     "--linear-attn-verify-backend", "triton"]
    off = ["--disable-overlap-schedule"]
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + strategy + off)
    assert out["sglang_args"] == MODEL + strategy + off + ["--mamba-ssm-dtype", "float32",
                                                           "--linear-attn-decode-backend", "triton",
                                                           "--linear-attn-verify-backend", "triton"]


def test_dry_run_extra_buffer_with_speculative_decoding(environ, capsys, MODEL):
    """Replay's commit moves SGLang's track slots too (``mamba2.commit_track``); speculative decoding
    under extra_buffer has not been served with CUDA graphs or the overlap scheduler: both off."""
    strategy = ["--mamba-radix-cache-strategy", "extra_buffer"]
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + SPEC + strategy)
    assert out["replay"]["max_draft_tokens"] == 3
    assert out["sglang_args"] == MODEL + SPEC + strategy + [
        "--mamba-ssm-dtype", "float32", "--disable-overlap-schedule", "--disable-cuda-graph",
        "--linear-attn-decode-backend", "triton", "--linear-attn-verify-backend", "triton"]


@pytest.mark.parametrize("flags", [["--enable-hierarchical-cache"], ["--enable-mixed-chunk"],
                                   ["--enable-int8-mamba-checkpoint"], ["--disaggregation-mode", "prefill"],
                                   ["--disaggregation-mode", "decode"],
                                   ["--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"]])
def test_dry_run_served_modes(environ, capsys, flags, MODEL):
    """Served with replay: HiCache's host tier (its backups and loads go through the replay hooks,
    test_sglang_hicache.py), mixed batches (the extend hooks fold the decode rows' rings first,
    test_sglang_mixed.py), the int8 radix store (test_sglang_int8.py) and PD disaggregation (the
    decode side resets the transferred slots, test_sglang_disagg.py)."""
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + flags)
    assert out["sglang_args"][:len(MODEL) + len(flags)] == MODEL + flags
    assert out["replay"]["window"] == 16
    # plain decode: SGLang's own radix strategy and overlap scheduler, with or without a tree
    assert "--mamba-radix-cache-strategy" not in out["sglang_args"]
    assert "--disable-overlap-schedule" not in out["sglang_args"]
    # speculative decoding: no_buffer (CUDA graphs kept), except on a PD decode server without a tree
    out = _dry_run(capsys, ["--replay-ssm"] + MODEL + flags + SPEC)
    tree = flags != ["--disaggregation-mode", "decode"]
    assert ("--mamba-radix-cache-strategy" in out["sglang_args"]) == tree
    assert ("--disable-overlap-schedule" in out["sglang_args"]) == tree


def test_replay_off_passes_everything_through(environ, capsys, MODEL):
    out = _dry_run(capsys, MODEL + ["--mamba-radix-cache-strategy", "extra_buffer"])
    assert out["replay"] is None and out["env"] == {}
    assert out["sglang_args"] == MODEL + ["--mamba-radix-cache-strategy", "extra_buffer"]
    assert options.ENV_VAR not in environ


@pytest.mark.parametrize("args,match", [
    (["--enable-linear-replayssm"], "--enable-linear-replayssm: replayssm replaces SGLang's own replay"),
    (["--speculative-eagle-topk", "2"], "--speculative-eagle-topk: replay verifies a chain of drafts"),
    (["--speculative-algorithm", "NGRAM"], "--speculative-ngram-max-bfs-breadth: replay verifies a chain of drafts; "
                                           "NGRAM needs --speculative-ngram-max-bfs-breadth 1, got the default 10"),
    (["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "4"],
     "--speculative-ngram-max-bfs-breadth: .* got 4"),
    (["--replay-window", "0"], "--replay-window: expected a positive int"),
    (["--mamba-ssm-dtype", "bfloat16"], "--mamba-ssm-dtype: --replay-checkpoint-dtype float32 stores"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"],
     "--mamba-radix-cache-strategy: replayssm serves no_buffer and extra_buffer; got extra_buffer_lazy"),
    (["--enable-mamba-cache-stochastic-rounding"], "--enable-mamba-cache-stochastic-rounding: not served"),
    (["--linear-attn-decode-backend", "flashinfer"], "--linear-attn-decode-backend: replay routes GDN / KDA"),
    (["--speculative-algorithm", "DFLASH"], "--speculative-algorithm: replay verifies a dense chain of drafts; DFLASH"),
    # refused once SGLang has parsed the arguments: a strategy SGLang's parser takes on a CPU (its own
    # "auto" picks extra_buffer for these models and refuses it off a GPU; 0.5.17 has no predicate to patch)
    (["--enable-lmcache", "--mamba-radix-cache-strategy", "no_buffer"], "--enable-lmcache: not served with --replay-ssm"),
])
def test_refusals(environ, args, match, MODEL):
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
