"""The real-server harness in benchmarks/server (it runs on a GPU machine; these check its parts here):
the kit's stripped wheels are valid wheels, the import probe names every missing module, the runner refuses a missing or altered
kit, and the comparison counts what it says."""

import base64
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "server"))

import check_server  # noqa: E402
import models  # noqa: E402
import kit  # noqa: E402


def _wheel(path: pathlib.Path, members: dict[str, bytes]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as z:
        rows = []
        for name, data in members.items():
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        z.writestr("pkg-1.0.dist-info/RECORD", "\n".join(rows + ["pkg-1.0.dist-info/RECORD,,"]) + "\n")
    return path


def test_stripped_wheel_keeps_every_other_member_and_a_matching_record(tmp_path):
    src = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/__init__.py": b"x = 1\n", "pkg/big/lib.so": b"\x7fELF" * 1000, "pkg/big.py": b"y = 2\n",
        "pkg-1.0.dist-info/METADATA": b"Name: pkg\n"})
    (tmp_path / "out").mkdir()
    out = kit.strip_wheel(src, tmp_path / "out", ("pkg/big/",))
    with zipfile.ZipFile(out) as z:
        names = sorted(z.namelist())
        assert names == ["pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD", "pkg/__init__.py", "pkg/big.py"]
        record = z.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
        for row in record[:-1]:
            name, digest, size = row.split(",")
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert record[-1] == "pkg-1.0.dist-info/RECORD,,"


def test_probe_names_every_missing_module_and_where_it_is_imported(tmp_path):
    (tmp_path / "first.py").write_text("import json\nimport replayssm_no_such_a\nimport replayssm_no_such_b.sub\n")
    (tmp_path / "second.py").write_text("import os\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/server/probe_imports.py"), "--modules", "first",
                          "second"], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert f"missing module: replayssm_no_such_a (imported at {tmp_path / 'first.py'}:2)" in out.stdout
    assert f"missing module: replayssm_no_such_b (imported at {tmp_path / 'first.py'}:3)" in out.stdout
    assert "probe: 2 modules, 2 missing, 0 failed otherwise" in out.stdout
    clean = subprocess.run([sys.executable, str(ROOT / "benchmarks/server/probe_imports.py"), "--modules", "second"],
                           cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""}, capture_output=True, text=True,
                           timeout=120)
    assert clean.returncode == 0 and "0 missing" in clean.stdout


def _runner(tmp_path, kit_files: dict[str, bytes]) -> subprocess.CompletedProcess:
    """gpu_server.sh from a copy of its folder layout, with ``.kit/`` holding ``kit_files``."""
    tree = tmp_path / "tree"
    (tree / "benchmarks" / "server").mkdir(parents=True)
    (tree / "benchmarks" / "server" / "gpu_server.sh").write_text((ROOT / "benchmarks/server/gpu_server.sh").read_text())
    (tree / ".kit").mkdir()
    for name, data in kit_files.items():
        (tree / ".kit" / name).write_bytes(data)
    return subprocess.run(["bash", str(tree / "benchmarks/server/gpu_server.sh")], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"),
                                            "PYTHON": sys.executable, "SITE": str(tmp_path / "site")})


def test_runner_refuses_a_missing_or_altered_kit(tmp_path):
    missing = _runner(tmp_path / "a", {})
    assert missing.returncode == 2 and ".kit/manifest.json and .kit/site.tar.xz are missing" in missing.stdout
    archive = b"not the archive the manifest names"
    manifest = json.dumps(dict(sha256=hashlib.sha256(b"another archive").hexdigest())).encode()
    altered = _runner(tmp_path / "b", {"manifest.json": manifest, "site.tar.xz": archive})
    assert altered.returncode == 2 and "does not match .kit/manifest.json" in altered.stdout


def test_runner_compiles_the_kits_bytecode_when_it_unpacks_it(tmp_path):
    """The kit carries sources only; the runner compiles them as it unpacks them, before any process of
    the run imports them (here the install of the tree after it fails: the copied tree is no project)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, text in (("kitpkg/__init__.py", b""), ("kitpkg/mod.py", b"VALUE = 3\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    archive = buf.getvalue()
    manifest = json.dumps(dict(sha256=hashlib.sha256(archive).hexdigest())).encode()
    ran = _runner(tmp_path, {"manifest.json": manifest, "site.tar.xz": archive})
    assert ran.returncode == 2                                    # the install of the copied tree
    compiled = list((tmp_path / "site" / "kitpkg" / "__pycache__").glob("mod.*.pyc"))
    assert len(compiled) == 1 and (tmp_path / "out" / "compileall.log").exists()


def test_comparison_counts_identical_requests_and_the_first_difference():
    def result(*requests):
        return dict(single=[dict(output_ids=[1, 2, 3], logprobs=[-1.0, -2.0, -3.0])],
                    wave=[dict(output_ids=ids, logprobs=lp) for ids, lp in requests])
    ref = result(([5, 6, 7, 8], [-0.5, -0.5, -0.5, -0.5]), ([9, 9], [-1.0, -1.0]))
    got = result(([5, 6, 0, 8], [-0.5, -0.25, -0.1, -0.5]), ([9, 9], [-1.0, -1.5]))
    out = check_server.compare(ref, got)
    assert out["single"]["identical"] == 1 and out["single"]["logprob_diff_max"] == 0.0
    wave = out["wave"]
    assert wave["requests"] == 2 and wave["identical"] == 1 and wave["first_difference_at"] == [2]
    assert wave["tokens_compared"] == 4                          # 2 before the first difference, then 2
    assert wave["logprob_diff_max"] == 0.5 and wave["logprob_diff_mean"] == pytest.approx((0 + 0.25 + 0 + 0.5) / 4)


PUBLISHED = {"nemotron-h-8b": "nemotron-h", "qwen3-next": "qwen3.5", "kimi-linear": "kimi-linear",
             "qwen3.5-9b": "qwen3.5", "kimi-linear-dense": "kimi-linear"}
SSM_LAYERS = {"nemotron-h-8b": 24, "qwen3-next": 6, "kimi-linear": 6, "qwen3.5-9b": 6, "kimi-linear-dense": 6}


@pytest.mark.parametrize("name", sorted(models.CONFIGS))
def test_model_folders_carry_the_published_ssm_dims_as_sglang_reads_them(tmp_path, monkeypatch, capsys, name):
    """The launcher's dry run reads each folder with SGLang's own config classes: the replay plan's
    layers are the published model's (``benchmarks/shapes.py``), as many as the table says."""
    pytest.importorskip("sglang")
    from replayssm.integrations.sglang import launch_server, options
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from shapes import MODEL_SPECS

    monkeypatch.setattr("os.environ", {k: v for k, v in __import__("os").environ.items() if k != options.ENV_VAR})
    folder = models.write(tmp_path, name)
    # on a CPU SGLang's own "auto" strategy picks extra_buffer for these models and then refuses it
    # (it needs a GPU platform), with or without replay: a CPU run names no_buffer
    launch_server.main(["--replay-ssm", "--replay-read-format", "nvfp4", "--dry-run", "--model-path", str(folder),
                        "--device", "cpu", "--skip-tokenizer-init", "--mamba-radix-cache-strategy", "no_buffer"])
    plan = json.loads(capsys.readouterr().out)["plan"]
    spec = MODEL_SPECS[PUBLISHED[name]]
    assert plan["family"] == spec.family and len(plan["layers"]) == SSM_LAYERS[name]
    assert plan["dims"] == {k: getattr(spec, k) for k in plan["dims"]}


def test_parallel_runs_never_share_a_port_and_write_every_model(tmp_path, monkeypatch):
    """``--parallel 3`` over 2 models x 4 variants: at most 3 servers at once, never two on one port at
    the same time, models interleaved, and each model's JSON compares every variant with the first."""
    import threading
    import time

    live, seen, lock = {}, [], threading.Lock()

    def fake_run(name, model, model_dir, reqs, args, port, log, deadline):
        with lock:
            assert port not in live.values(), f"port {port} taken twice"
            live[(model, name)] = port
            seen.append((model, name, len(live)))
        log.write(f"log of {model} {name}\n")
        time.sleep(0.05)
        with lock:
            del live[(model, name)]
        ids = [hash((model, k)) % 1000 for k in range(4)]
        item = dict(output_ids=ids, logprobs=[-0.5] * 4)
        return dict(single=[item], wave=[item, item])

    monkeypatch.setattr(check_server, "run_variant", fake_run)
    variants = ["sglang", "replay-fp32", "replay-nvfp4", "replay-fp32-w2"]
    rc = check_server.main(["--models", "qwen3-next", "kimi-linear", "--variants", *variants, "--parallel", "3",
                            "--out", str(tmp_path), "--models-dir", str(tmp_path / "models")])
    assert rc == 0
    assert check_server.jobs_in_order(["qwen3-next", "kimi-linear"], variants)[:3] == [
        ("qwen3-next", "sglang"), ("kimi-linear", "sglang"), ("qwen3-next", "replay-fp32")]
    assert {m for m, _, _ in seen[:3]} == {"qwen3-next", "kimi-linear"}
    assert max(n for _, _, n in seen) <= 3 and len(seen) == 8
    for model in ("qwen3-next", "kimi-linear"):
        data = json.loads((tmp_path / f"server-{model}.json").read_text())
        assert sorted(data["results"]) == sorted(variants)
        assert sorted(data["summary"]) == sorted(variants[1:])
        assert all(row["wave"]["identical"] == 2 for row in data["summary"].values())
    log = (tmp_path / "servers.log").read_text()
    assert all(f"log of {m} {v}" in log for m in ("qwen3-next", "kimi-linear") for v in variants)


def test_check_server_runs_extra_buffer_with_the_overlap_scheduler(tmp_path, monkeypatch):
    """--overlap keeps SGLang's overlap scheduler (extra_buffer only) and gives each running request
    its two ping-pong track slots too; no_buffer with --overlap is refused before any server starts."""
    seen = []
    monkeypatch.setattr(check_server, "run_variant", lambda name, model, model_dir, reqs, args, port, log, deadline:
                        seen.append(check_server.server_args(model_dir, "gdn", port, args)) or dict(error="not run"))
    with pytest.raises(SystemExit):
        check_server.main(["--models", "qwen3-next", "--variants", "sglang", "--overlap", "--out", str(tmp_path)])
    assert seen == []
    check_server.main(["--models", "qwen3-next", "--variants", "sglang", "--radix-strategy", "extra_buffer",
                       "--overlap", "--max-running-requests", "16", "--out", str(tmp_path),
                       "--models-dir", str(tmp_path / "models")])
    (flags,) = seen
    assert "--disable-overlap-schedule" not in flags
    assert flags[flags.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert flags[flags.index("--max-mamba-cache-size") + 1] == str(5 * 16)


def test_check_server_leaves_out_variants_a_family_cannot_serve():
    jobs = check_server.jobs_in_order(["nemotron-h-8b", "qwen3.5-9b"], ["sglang", "sglang-replay", "replay-fp32"])
    assert jobs == [("nemotron-h-8b", "sglang"), ("qwen3.5-9b", "sglang"), ("qwen3.5-9b", "sglang-replay"),
                    ("nemotron-h-8b", "replay-fp32"), ("qwen3.5-9b", "replay-fp32")]


def test_seeded_weights_are_a_trained_models_scale_and_the_same_for_the_same_seed():
    import torch

    import seeded_weights

    class Mixer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = torch.nn.Parameter(torch.zeros(1, 1, 32, 1))
            self.A = torch.nn.Parameter(torch.zeros(64))
            self.dt_bias = torch.nn.Parameter(torch.zeros(64))
            self.norm = torch.nn.LayerNorm(256)
            self.in_proj = torch.nn.Linear(256, 512, bias=True)
            self.experts = torch.nn.Parameter(torch.zeros(4, 128, 256, dtype=torch.bfloat16))
            self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))

    def made(seed):
        m = Mixer()
        seeded_weights.initialize(m, seed=seed)
        return m

    a, b, c = made(3), made(3), made(4)
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name]), name
        if t.is_floating_point():
            assert not torch.equal(t, c.state_dict()[name]), name
    A = torch.exp(a.A_log.detach())
    assert 1.0 <= A.min() and A.max() <= 16.0 and A.std() > 2.0
    assert torch.all(-16.0 <= a.A) and torch.all(a.A <= -1.0)
    dt = torch.nn.functional.softplus(a.dt_bias.detach())
    assert 0.99e-3 <= dt.min() and dt.max() <= 0.101
    assert torch.all((a.norm.weight - 1.0).abs() <= 0.1) and torch.all(a.norm.bias.abs() <= 0.02)
    bound = (3.0 / 256) ** 0.5
    w = a.in_proj.weight.detach()
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3 ** 0.5) < 0.01 * bound
    assert a.experts.dtype == torch.bfloat16 and a.experts.float().abs().max() <= bound * 1.01
    assert not torch.equal(a.experts[0], a.experts[1])
    assert torch.equal(a.steps, torch.zeros(3, dtype=torch.int64))


def test_seeded_init_replaces_sglangs_dummy_initializer_only_when_asked(tmp_path):
    """In a fresh interpreter with ``seeded_init`` on the path, SGLang's loader module calls
    ``seeded_weights.initialize`` when the seed is set, and its own function otherwise."""
    pytest.importorskip("sglang")
    probe = ("import sglang.srt.model_loader.loader as L, sglang.srt.model_loader.weight_utils as W, sys\n"
             "print(L.initialize_dummy_weights.__module__, L.initialize_dummy_weights is W.initialize_dummy_weights)\n")
    base = {k: v for k, v in __import__("os").environ.items() if k != "REPLAYSSM_SEEDED_WEIGHTS"}
    base["PYTHONPATH"] = str(ROOT / "benchmarks/server/seeded_init")
    on = subprocess.run([sys.executable, "-c", probe], env={**base, "REPLAYSSM_SEEDED_WEIGHTS": "7"},
                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert on.returncode == 0, on.stderr[-3000:]
    assert on.stdout.split()[-2:] == ["seeded_weights", "False"]
    off = subprocess.run([sys.executable, "-c", probe], env=base, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert off.returncode == 0, off.stderr[-3000:]
    assert off.stdout.split()[-2:] == ["sglang.srt.model_loader.weight_utils", "True"]


def test_bf16_steps_and_the_table_read_what_the_results_say(tmp_path):
    assert check_server.bf16_ulp(-8.0) == 2.0 ** -4 and check_server.bf16_ulp(-7.99) == 2.0 ** -5
    assert check_server.bf16_ulp(0.5) == 2.0 ** -8

    def res(*reqs):
        return dict(single=[dict(output_ids=reqs[0][0], logprobs=reqs[0][1])],
                    wave=[dict(output_ids=i, logprobs=lp) for i, lp in reqs])

    ref = res(([1, 2, 3], [-8.0, -8.0, -8.0]), ([4, 5], [-5.0, -5.0]))
    near = res(([1, 2, 3], [-8.0, -8.0625, -8.0]), ([4, 6], [-5.0625, -5.0]))   # one step; two steps
    c = check_server.compare(ref, near)["wave"]
    assert c["identical"] == 1 and c["first_difference_at"] == [1] and c["tokens_compared"] == 4
    assert c["within_one_bf16_step"] == 0.75 and c["logprob_diff_max"] == 0.0625
    path = tmp_path / "server-m.json"
    path.write_text(json.dumps(dict(model="m", results={"sglang": ref, "replay-fp32": near,
                                                         "replay-nvfp4": dict(error="RuntimeError: boom")})))
    rows = check_server.table([path]).splitlines()
    assert rows[2] == "| m | replay-fp32 | identical | 1/2 | 1 | 4 | 0.031 / 0.062 | 75 % |"
    assert rows[3].startswith("| m | replay-nvfp4 | RuntimeError: boom |")


def test_prefix_wave_compares_cached_prefix_requests_with_the_cache_off(tmp_path, monkeypatch):
    """The prefix wave against a stand-in server with a radix cache of whole prefixes: each request
    first with the cache emptied before it, then all in a row, the later ones of a group from the
    cached prefix. A variant whose cached-prefix tokens differ from its own cache-off tokens is
    counted so (here one that diverges at token 7 after a hit); one that matches is identical."""
    prefix_len, cache, log, current = 300, set(), [], {}

    def launch(cmd, port, log_file, env):
        current["diverges"] = "--replay-ssm" in cmd
        cache.clear()
        return object()

    def post(port, payload, timeout=600):
        prompt = payload["input_ids"]
        key = tuple(prompt[:prefix_len])
        hit = len(prompt) > prefix_len and key in cache
        cache.add(key)
        log.append("hit" if hit else "post")
        n = payload["sampling_params"]["max_new_tokens"]
        ids = [(sum(prompt) + i) % 1000 for i in range(n)]
        if hit and current["diverges"]:
            ids[7:] = [0] * (n - 7)
        return dict(output_ids=ids, meta_info=dict(output_token_logprobs=[[-1.0, t, None] for t in ids],
                                                   cached_tokens=256 if hit else 0))

    def flush(port, timeout=60):
        cache.clear()
        log.append("flush")

    monkeypatch.setattr(check_server, "launch", launch)
    monkeypatch.setattr(check_server, "wait_ready", lambda *a, **k: None)
    monkeypatch.setattr(check_server, "stop", lambda proc: None)
    monkeypatch.setattr(check_server, "post", post)
    monkeypatch.setattr(check_server, "flush_cache", flush)
    rc = check_server.main(["--models", "qwen3.5-9b", "--variants", "sglang", "replay-nvfp4", "--requests", "4",
                            "--prefix-len", str(prefix_len), "--out", str(tmp_path / "out"),
                            "--models-dir", str(tmp_path / "models")])
    assert rc == 0
    # per server: single and wave, then each of the 2 x 3 prefix requests after a flush, a flush, the 6 in a row
    prefix = ["flush", "post"] * 6 + ["flush"] + ["post", "hit", "hit"] * 2
    assert log == (["post"] * 5 + prefix) * 2
    data = json.loads((tmp_path / "out" / "server-qwen3.5-9b.json").read_text())
    same, diverged = data["summary"]["sglang"]["prefix_cache"], data["summary"]["replay-nvfp4"]["prefix_cache"]
    assert same["requests"] == 4 and same["identical"] == 4 and same["cached_tokens"] == [256] * 4
    assert diverged["requests"] == 4 and diverged["identical"] == 0 and diverged["first_difference_at"] == [7] * 4
    assert data["summary"]["replay-nvfp4"]["prefix"]["identical"] == 2      # against SGLang's: the group's firsts
    rows = check_server.prefix_table([tmp_path / "out" / "server-qwen3.5-9b.json"]).splitlines()
    assert rows[2] == "| qwen3.5-9b | sglang | 4/6 | 256 | 4/4 | – | 0.000 / 0.000 |"
    assert rows[3] == "| qwen3.5-9b | replay-nvfp4 | 4/6 | 256 | 0/4 | 7 | 0.000 / 0.000 |"
    for bad in (["--prefix-groups", "-1"], ["--prefix-requests", "1"], ["--prefix-len", "1961"]):
        with pytest.raises(SystemExit):
            check_server.main([*bad, "--out", str(tmp_path / "refused")])


def test_serving_tokenizer_round_trips_every_id_through_transformers(tmp_path):
    from transformers import AutoTokenizer

    import bench_serving

    bench_serving.write_tokenizer(tmp_path, 1000)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 1000
    ids = [0, 1, 7, 999, 512, 512]
    text = tok.decode(ids)
    assert text == "t0 t1 t7 t999 t512 t512"
    assert tok.encode(text, add_special_tokens=False) == ids


@pytest.mark.parametrize("workload", ["decode", "prefix"])
@pytest.mark.parametrize("tree", ["installed", "0.5.17"])
def test_serving_client_command_is_one_sglangs_client_accepts(tmp_path, workload, tree):
    """SGLang's own client parses the command and gets as far as waiting for the server (none runs); the
    decode command asks for unstreamed responses (``--no-stream``). The client's dataset package imports
    Hugging Face ``datasets`` for datasets these commands do not use; where it is not installed, a module
    that raises on use stands in for it."""
    pytest.importorskip("sglang")
    import importlib.util

    import bench_serving

    env = dict(__import__("os").environ)
    path = []
    if importlib.util.find_spec("datasets") is None:
        (tmp_path / "stand_in" / "datasets").mkdir(parents=True)
        (tmp_path / "stand_in" / "datasets" / "__init__.py").write_text(
            "def load_dataset(*args, **kwargs):\n    raise NotImplementedError('datasets is not installed')\n")
        path.append(str(tmp_path / "stand_in"))
    if tree == "0.5.17":
        site = ROOT / "build" / "sglang-0.5.17"
        if not (site / "sglang" / "benchmark" / "serving.py").exists():
            pytest.skip("build/sglang-0.5.17 is built by make")
        path.insert(0, str(site))
    env["PYTHONPATH"] = __import__("os").pathsep.join(path + [env.get("PYTHONPATH", "")])
    bench_serving.write_tokenizer(tmp_path, 5000)
    args = bench_serving.main.__globals__["argparse"].Namespace(
        workload=workload, seed=0, waves=2, input_len=64, output_len=16, groups=2, prompts_per_group=2,
        prefix_len=64, question_len=8, request_rate=32.0, no_stream=workload == "decode")
    cmd = bench_serving.client_command(1, tmp_path, 4, tmp_path / "out.jsonl", args) + ["--ready-check-timeout-sec", "1"]
    assert cmd[cmd.index("--request-rate") + 1] == "32.0"
    assert ("--disable-stream" in cmd) == (workload == "decode")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    text = out.stdout + out.stderr
    assert "unrecognized arguments" not in text and "invalid choice" not in text, text[-3000:]
    assert "benchmark_args=" in out.stdout, text[-3000:]
    assert out.returncode != 0 and not (tmp_path / "out.jsonl").exists()


def test_serving_refuses_a_request_rate_that_is_not_positive_and_finite(tmp_path):
    import bench_serving

    for rate in ("0", "-1", "inf"):
        with pytest.raises(SystemExit):
            bench_serving.main(["--request-rate", rate, "--out", str(tmp_path / "refused")])


def test_serving_runs_each_variant_its_family_serves_and_writes_rows(tmp_path, monkeypatch):
    import bench_serving

    calls = []

    def fake(model, model_dir, variant, strategy, args, log, deadline, emit, overlap=False, placement=None):
        calls.append((model, variant, strategy, overlap))
        assert (model_dir / "tokenizer.json").exists() and (model_dir / "config.json").exists()
        return [dict(model=model, variant=variant, radix=strategy, overlap=overlap, workload=args.workload,
                     concurrency=c, output_throughput=100.0 * c, **placement) for c in args.concurrency]

    monkeypatch.setattr(bench_serving, "serve_and_measure", fake)
    monkeypatch.setattr(bench_serving.models, "CONFIGS", dict(bench_serving.models.CONFIGS))
    for name in ("nemotron-h-8b", "kimi-linear"):
        bench_serving.models.CONFIGS[name] = dict(bench_serving.models.CONFIGS[name], vocab_size=300)
    rc = bench_serving.main(["--models", "nemotron-h-8b", "kimi-linear", "--variants", "sglang", "sglang-replay",
                             "replay-nvfp4", "--concurrency", "1", "4", "--out", str(tmp_path / "out"),
                             "--models-dir", str(tmp_path / "models")])
    assert rc == 0
    # SGLang's own defaults for these models: extra_buffer with the overlap scheduler; SGLang's replay at no_buffer
    assert calls == [("nemotron-h-8b", "sglang", "extra_buffer", True),
                     ("nemotron-h-8b", "replay-nvfp4", "extra_buffer", True),
                     ("kimi-linear", "sglang", "extra_buffer", True), ("kimi-linear", "sglang-replay", "no_buffer", False),
                     ("kimi-linear", "replay-nvfp4", "extra_buffer", True)]
    data = json.loads((tmp_path / "out" / "serving-kimi-linear.json").read_text())
    assert [(r["variant"], r["concurrency"], r["round"], r["position"]) for r in data["rows"]] == [
        ("sglang", 1, 1, 1), ("sglang", 4, 1, 1), ("sglang-replay", 1, 1, 2), ("sglang-replay", 4, 1, 2),
        ("replay-nvfp4", 1, 1, 3), ("replay-nvfp4", 4, 1, 3)]
    assert "sglang" in data["meta"] and (tmp_path / "out" / "serving.png").stat().st_size > 1000


def test_both_orders_runs_the_variants_again_in_reverse_and_the_table_cancels_the_order(tmp_path, monkeypatch):
    """--both-orders starts every server a second time in the reverse order (rows carry round and
    position); the table compares each load with SGLang's of its own round, and the second table's
    geometric mean of the two rounds cancels a factor a server's place within its round puts on it."""
    import bench_serving

    calls = []
    # a run in which the server that runs second serves 1.5x, and reaches its first token 1.25x sooner
    late = {1: 1.0, 2: 1.5}

    def fake(model, model_dir, variant, strategy, args, log, deadline, emit, overlap=False, placement=None):
        calls.append((variant, placement))
        speed = (1.2 if variant == "replay-nvfp4" else 1.0) * late[(placement["position"] - 1) % 2 + 1]
        return [dict(model=model, variant=variant, radix=strategy, overlap=overlap, workload=args.workload,
                     concurrency=c, load=1, output_throughput=1000.0 * speed, median_itl_ms=1.0, p99_itl_ms=2.0,
                     decode_tokens_per_s=(1.1 if variant == "replay-nvfp4" else 1.0) * 40000.0,
                     median_ttft_ms=1000.0 / (1.25 if (placement["position"] - 1) % 2 else 1.0), **placement)
                for c in args.concurrency]

    monkeypatch.setattr(bench_serving, "serve_and_measure", fake)
    monkeypatch.setattr(bench_serving.models, "CONFIGS", dict(bench_serving.models.CONFIGS))
    bench_serving.models.CONFIGS["qwen3.5-9b"] = dict(bench_serving.models.CONFIGS["qwen3.5-9b"], vocab_size=300)
    assert bench_serving.main(["--models", "qwen3.5-9b", "--variants", "sglang", "replay-nvfp4", "--concurrency",
                               "256", "--both-orders", "--out", str(tmp_path / "out"),
                               "--models-dir", str(tmp_path / "models")]) == 0
    assert calls == [("sglang", dict(round=1, position=1)), ("replay-nvfp4", dict(round=1, position=2)),
                     ("replay-nvfp4", dict(round=2, position=3)), ("sglang", dict(round=2, position=4))]
    lines = bench_serving.table([tmp_path / "out" / "serving-qwen3.5-9b.json"]).splitlines()
    # within a round: 1.2 x 1.5 with replay second, 1.2 / 1.5 with replay first
    row = "| qwen3.5-9b | replay-nvfp4 | extra_buffer, overlap | 256 | 1, round {} | {} |"
    assert lines[3].startswith(row.format(1, "1800 | 1.80x")) and lines[4].startswith(row.format(2, "1200 | 0.80x"))
    summary = lines[lines.index("") + 3]
    assert summary == ("| qwen3.5-9b | replay-nvfp4 | extra_buffer, overlap | 256 | 1 | 1.80x / 0.80x / 1.20x |  "
                       "| 1.10x / 1.10x / 1.10x |  | 0.80x / 1.25x / 1.00x |")
    # the same run split in two, round 2 alone with --reverse-round, the files merged: the same comparison
    calls.clear()
    for name, extra in (("first", []), ("second", ["--reverse-round"])):
        assert bench_serving.main(["--models", "qwen3.5-9b", "--variants", "sglang", "replay-nvfp4", "--concurrency",
                                   "256", *extra, "--out", str(tmp_path / name),
                                   "--models-dir", str(tmp_path / "models")]) == 0
    assert calls == [("sglang", dict(round=1, position=1)), ("replay-nvfp4", dict(round=1, position=2)),
                     ("replay-nvfp4", dict(round=2, position=1)), ("sglang", dict(round=2, position=2))]
    merged = tmp_path / "merged.json"
    assert bench_serving.main(["--merge", str(tmp_path / "first" / "serving-qwen3.5-9b.json"),
                               str(tmp_path / "second" / "serving-qwen3.5-9b.json"), "--merged", str(merged)]) == 0
    split = bench_serving.table([merged]).splitlines()
    assert split[split.index("") + 3] == summary
    with pytest.raises(SystemExit):
        bench_serving.main(["--both-orders", "--reverse-round", "--out", str(tmp_path / "refused")])
    # a run in one order has no second table
    one_order = ROOT / "benchmarks/results/serving-qwen3.5-9b-prefix-frozen-h100.json"
    assert "geometric mean" not in bench_serving.table([one_order])


def test_serving_overlap_runs_where_sglang_allows_it(tmp_path, monkeypatch):
    """With --overlap every extra_buffer server keeps SGLang's overlap scheduler; SGLang's own replay
    runs once, at no_buffer without it (what SGLang serves it with), and no_buffer never overlaps."""
    import bench_serving

    calls = []

    def fake(model, model_dir, variant, strategy, args, log, deadline, emit, overlap=False, placement=None):
        calls.append((variant, strategy, overlap))
        return [dict(model=model, variant=variant, radix=strategy, overlap=overlap, workload=args.workload,
                     concurrency=c, load=1, output_throughput=100.0 * c * (2 if overlap else 1), median_itl_ms=1.0,
                     p99_itl_ms=2.0, median_ttft_ms=3.0) for c in args.concurrency]

    monkeypatch.setattr(bench_serving, "serve_and_measure", fake)
    monkeypatch.setattr(bench_serving.models, "CONFIGS", dict(bench_serving.models.CONFIGS))
    bench_serving.models.CONFIGS["kimi-linear"] = dict(bench_serving.models.CONFIGS["kimi-linear"], vocab_size=300)
    rc = bench_serving.main(["--models", "kimi-linear", "--variants", "sglang", "sglang-replay", "replay-nvfp4",
                             "--radix-strategies", "no_buffer", "extra_buffer", "--overlap", "--concurrency", "8",
                             "--out", str(tmp_path / "out"), "--models-dir", str(tmp_path / "models")])
    assert rc == 0
    assert calls == [("sglang", "no_buffer", False), ("sglang", "extra_buffer", True),
                     ("sglang-replay", "no_buffer", False),
                     ("replay-nvfp4", "no_buffer", False), ("replay-nvfp4", "extra_buffer", True)]
    text = bench_serving.table([tmp_path / "out" / "serving-kimi-linear.json"])
    assert "| kimi-linear | replay-nvfp4 | extra_buffer, overlap | 8 | 1 | 1600 |" in text
    # a variant capped below the largest load: only its loads up to the cap, its server sized for them
    sized = []

    def sizing(model, model_dir, variant, strategy, args, *rest, **kw):
        flags = bench_serving.server_flags(model_dir, "gdn", 30000, strategy, args)
        sized.append((variant, args.concurrency, flags[flags.index("--max-running-requests") + 1]))
        return []

    monkeypatch.setattr(bench_serving, "serve_and_measure", sizing)
    assert bench_serving.main(["--models", "kimi-linear", "--variants", "sglang", "replay-nvfp4", "--concurrency", "8",
                               "16", "--max-concurrency", "sglang=12", "--out", str(tmp_path / "capped"),
                               "--models-dir", str(tmp_path / "models")]) == 0
    assert sized == [("sglang", [8], "8"), ("replay-nvfp4", [8, 16], "16")]      # --max-running-requests
    for bad in ("sglang=0", "nope=4", "sglang", "sglang=4"):
        with pytest.raises(SystemExit):
            bench_serving.main(["--models", "kimi-linear", "--variants", "sglang", "--concurrency", "8",
                                "--max-concurrency", bad, "--out", str(tmp_path / "refused")])
    monkeypatch.setattr(bench_serving, "serve_and_measure", fake)
    calls.clear()
    assert bench_serving.main(["--models", "kimi-linear", "--variants", "sglang", "replay-nvfp4", "--no-overlap",
                               "--concurrency", "8", "--out", str(tmp_path / "off"),
                               "--models-dir", str(tmp_path / "models")]) == 0
    assert calls == [("sglang", "extra_buffer", False), ("replay-nvfp4", "extra_buffer", False)]
    flags = bench_serving.server_flags(tmp_path, "gdn", 30000, "extra_buffer", bench_serving.main.__globals__[
        "argparse"].Namespace(concurrency=[8], input_len=16, output_len=16, workload="decode", mem_fraction=0.5,
                              no_prefill_graph=False, sglang_arg=[], speculative="none", server_log_level="info"),
        overlap=True)
    assert "--disable-overlap-schedule" not in flags
    assert flags[flags.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"


def test_serving_server_flags_are_sglang_0517s_and_capture_the_loads_batch_sizes(tmp_path):
    """SGLang 0.5.17's own parser takes every flag the serving benchmark gives its servers."""
    site = ROOT / "build" / "sglang-0.5.17"
    if not (site / "sglang" / "srt" / "server_args.py").exists():
        pytest.skip("build/sglang-0.5.17 is built by make")
    import bench_serving

    args = bench_serving.main.__globals__["argparse"].Namespace(
        concurrency=[1, 48, 256], input_len=512, output_len=256, workload="decode", mem_fraction=0.88,
        no_prefill_graph=True, sglang_arg=[], groups=8, prompts_per_group=32, prefix_len=2048, question_len=128,
        speculative="none", draft_tokens=4, server_log_level="info")
    flags = bench_serving.server_flags(tmp_path, "gdn", 30000, "no_buffer", args)
    assert flags[flags.index("--log-level") + 1] == "info"
    i = flags.index("--cuda-graph-bs-decode")
    assert flags[i + 1:i + 11] == ["1", "2", "4", "8", "16", "32", "48", "64", "128", "256"]
    # SGLang keeps state slots per running request under the radix cache: fewer would cap the load
    ratio = subprocess.run([sys.executable, "-c", "from sglang.srt.mem_cache.kv_cache_configurator import "
                            "MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO as r; print(r)"], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(site)})
    assert ratio.returncode == 0, ratio.stderr[-3000:]
    assert check_server.SLOTS_PER_REQUEST == int(ratio.stdout.split()[-1])
    assert int(flags[flags.index("--max-mamba-cache-size") + 1]) >= check_server.SLOTS_PER_REQUEST * 256
    args.speculative = "mtp"
    args.port = 30000
    command = bench_serving.server_command("sglang-replay", tmp_path, "gdn", "no_buffer", args)
    assert command[:3] == check_server.launcher_command("sglang-replay")[:3]
    spec = command[3:]                                     # what the launcher hands SGLang
    # parsed, then SGLang's own check of its linear-attention flags (it refuses the plain-decode replay
    # flag beside the spec flag)
    probe = ("import sys, argparse\nfrom sglang.srt.server_args import ServerArgs\n"
             "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
             "a = p.parse_args(sys.argv[1:])\n"
             "try:\n    ServerArgs._handle_linear_attn_backend(a)\n"
             "except ValueError as e:\n    print('refused:', e)\n    sys.exit(0)\n"
             "print(a.cuda_graph_bs_decode, a.mamba_radix_cache_strategy, a.speculative_algorithm, "
             "a.speculative_num_draft_tokens, a.enable_linear_replayssm_spec, a.gc_warning_threshold_secs)\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    # (the HTTP process logs its garbage collections longer than LONG_GC_S)
    gc_s = str(bench_serving.LONG_GC_S)
    for given, printed in ((flags, ["256]", "no_buffer", "None", "None", "False", gc_s]),
                           (spec, ["256]", "no_buffer", "NEXTN", "4", "True", gc_s]),
                           (["--enable-linear-replayssm", *spec], None)):
        out = subprocess.run([sys.executable, "-c", probe, *given], capture_output=True, text=True, timeout=300,
                             env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        if printed is None:
            assert "refused:" in out.stdout and "mutually exclusive" in out.stdout, out.stdout[-2000:]
        else:
            assert "refused:" not in out.stdout, out.stdout[-2000:]
            assert out.stdout.split()[-6:] == printed


def test_launch_refuses_a_port_something_listens_on(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        live = set(check_server.LIVE)
        with open(tmp_path / "log", "w") as log, pytest.raises(RuntimeError, match=f"port {port} is in use"):
            check_server.launch([sys.executable, "-c", "pass"], port, log, dict(os.environ))
        assert check_server.LIVE == live
    assert check_server.port_free(port)


def test_sigterm_stops_the_servers_a_runner_started(tmp_path):
    """A runner killed by SIGTERM (``timeout``) ends the servers it started in their own process groups,
    which would otherwise keep their ports and answer the next run's requests."""
    script = tmp_path / "runner.py"
    script.write_text(f"""
import sys, time
sys.path.insert(0, {str(ROOT / 'benchmarks' / 'server')!r})
import check_server
check_server.stop_on_sigterm()
proc = check_server.launch([sys.executable, "-c", "import time; time.sleep(120)"], 1, open({str(tmp_path / 'log')!r}, "w"), {{}})
print(proc.pid, flush=True)
time.sleep(120)
""")
    runner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server_pid = int(runner.stdout.readline())
    os.killpg(server_pid, 0)                    # the server's group is alive
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)


def serving_args(**overrides):
    """``bench_serving`` arguments for a serve_and_measure test on fake servers and clients."""
    import bench_serving

    return bench_serving.argparse.Namespace(**dict(
        port=1, concurrency=[1, 4], input_len=8, output_len=4, workload="decode", no_prefill_graph=False,
        mem_fraction=0.5, sglang_arg=[], seed=0, waves=1, start_timeout=5, load_timeout=5, weights="sglang-dummy",
        speculative="none", repeat=1, server_log_level="warning", request_rate=None, profile_steps=0,
        profile_prefill=0, profile_host=False, freeze_gc=False, no_stream=False) | overrides)


def fake_client(monkeypatch, result: dict, on_start=lambda cmd: None) -> None:
    """SGLang's client replaced by one that calls ``on_start`` with its command and writes ``result`` as
    its output line at once."""
    import bench_serving

    class Client:
        def __init__(self, cmd, **kw):
            on_start(cmd)
            pathlib.Path(cmd[cmd.index("--output-file") + 1]).write_text(json.dumps(result) + "\n")
            self.returncode = 0

        def poll(self):
            return self.returncode

    monkeypatch.setattr(bench_serving.subprocess, "Popen", Client)


def fake_servers(monkeypatch) -> list:
    """Servers launched as sleeping processes (``start_new_session``: each leads its own process group),
    always ready; the list of them."""
    servers = []
    real_popen = subprocess.Popen

    def launch(cmd, port, log, env):
        servers.append(real_popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True))
        return servers[-1]

    monkeypatch.setattr(check_server, "launch", launch)
    monkeypatch.setattr(check_server, "wait_ready", lambda *a: None)
    return servers


def test_serving_writes_each_load_as_measured_and_keeps_to_the_deadline(tmp_path, monkeypatch):
    import bench_serving

    args = serving_args(repeat=2)
    servers = fake_servers(monkeypatch)

    class Client:
        def __init__(self, cmd, **kw):
            out = pathlib.Path(cmd[cmd.index("--output-file") + 1])
            c = int(cmd[cmd.index("--max-concurrency") + 1])
            out.write_text(json.dumps(dict(output_throughput=10.0 * c, median_itl_ms=2.0)) + "\n")
            for rate in (f"{c}.0", f"{c}.5"):
                kw["stdout"].write(f"Decode batch, #running-req: {c}, #full token: 9, gen throughput (token/s): {rate}, "
                                   "x\n")
            if c == 4:                                            # SGLang 0.5.17's long-collection warning
                kw["stdout"].write("[2026-12-06 22:15:51] LONG GARBAGE COLLECTION DETECTED | Generation 2 | "
                                   "Duration: 0.4712s | # Objects: gen0=1, gen1=2, gen2=3 | This may cause latency "
                                   "jitter.\n")
                kw["stdout"].write("{:<40} {:<10.2f}\n".format("Max ITL (ms):", 512.45))   # the client's report
            kw["stdout"].flush()
            self.returncode = 0

        def poll(self):
            return self.returncode

    monkeypatch.setattr(bench_serving.subprocess, "Popen", Client)
    # the host's listen counters, read before and after each load: 3 overflows in the second load
    counts = iter([0, 0, 0, 3, 3, 3, 3, 3])
    monkeypatch.setattr(bench_serving, "host_listen_state", lambda: dict(
        ListenOverflows=(n := next(counts)), ListenDrops=n + 1, somaxconn=128))
    emitted = []
    with open(tmp_path / "log", "w") as log:
        rows = bench_serving.serve_and_measure("kimi-linear", tmp_path, "replay-nvfp4", "no_buffer", args, log,
                                               check_server.Deadline(None), emit=lambda r: emitted.append(list(r)))
        assert [(r["listen_overflows"], r["listen_drops"], r["somaxconn"]) for r in rows] == [
            (0, 0, 128), (3, 3, 128), (0, 0, 128), (0, 0, 128)]
        # every concurrency's loads in turn on the one server
        assert [(r["concurrency"], r["load"], r["output_throughput"]) for r in rows] == [
            (1, 1, 10.0), (1, 2, 10.0), (4, 1, 40.0), (4, 2, 40.0)]
        # each load's server rates, long collections and longest gap between tokens come from its own part of
        # the log, not an earlier load's
        assert [r["decode_tokens_per_s"] for r in rows] == [1.5, 1.5, 4.5, 4.5]
        gc = dict(generation=2, s=0.4712, objects=6, at="2026-12-06 22:15:51", during_decode=True)
        assert [r["long_collections"] for r in rows] == [[], [], [gc], [gc]]
        assert [r.get("max_itl_ms") for r in rows] == [None, None, 512.45, 512.45]
        assert [len(r) for r in emitted] == [1, 2, 3, 4] and servers[-1].poll() is not None
        late = bench_serving.serve_and_measure("kimi-linear", tmp_path, "sglang", "no_buffer", args, log,
                                               check_server.Deadline(10), emit=lambda r: None)
    assert len(servers) == 1 and late[0]["error"].startswith("not started")


def test_a_long_collection_says_whether_it_fell_while_every_request_decoded():
    import bench_serving

    def prefill(running, queued):
        return (f"[2026-12-07 12:10:26] Prefill batch, #new-seq: 16, #new-token: 8192, #cached-token: 0, full token "
                f"usage: 0.13, mamba usage: 0.15, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, "
                "cuda graph: True, input throughput (token/s): 148550.90\n")

    def decode(running):
        return (f"[2026-12-07 12:10:27] Decode batch, #running-req: {running}, #full token: 150532, full token usage: "
                "0.74, mamba num: 1024, mamba usage: 0.80, cuda graph: True, gen throughput (token/s): 43952.60, "
                "#queue-req: 0\n")

    def collection(s):
        return (f"[2026-12-07 12:10:27] LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: {s}s | # Objects: "
                "gen0=5, gen1=0, gen2=840556 | This may cause latency jitter.\n")

    # the warm-up's decode (8 running) does not count; one collection among the prefill batches, one after
    # the first decode batch of all 256
    text = (decode(8) + prefill(3, 221) + collection(0.3219) + prefill(19, 205) + decode(256) + collection(0.3143)
            + decode(256))
    got = bench_serving.long_collections(text, 256)
    assert [(c["s"], c["during_decode"]) for c in got] == [(0.3219, False), (0.3143, True)]
    assert bench_serving.long_collections(text, 512)[1]["during_decode"] is False   # never all 512 running
    assert bench_serving.long_collections(decode(256), 256) == []


def test_freeze_gc_freezes_each_server_once_it_is_ready_and_the_rows_say_so(tmp_path, monkeypatch):
    import bench_serving

    fake_servers(monkeypatch)
    frozen = []
    monkeypatch.setattr(bench_serving, "freeze_gc", lambda port: frozen.append(port))

    def started(cmd):
        assert frozen == [7]                    # the server was frozen before the load's client started

    fake_client(monkeypatch, dict(output_throughput=1.0, median_itl_ms=2.0), started)
    with open(tmp_path / "log", "w") as log:
        rows = bench_serving.serve_and_measure("kimi-linear", tmp_path, "sglang", "no_buffer",
                                               serving_args(port=7, freeze_gc=True), log, check_server.Deadline(None))
        assert frozen == [7] and [r["freeze_gc"] for r in rows] == [True, True]
        rows = bench_serving.serve_and_measure("kimi-linear", tmp_path, "sglang", "no_buffer",
                                               serving_args(port=7), log, check_server.Deadline(None))
    assert frozen == [7] and not any("freeze_gc" in r for r in rows)


def test_no_stream_asks_for_whole_responses_and_the_table_compares_like_with_like(tmp_path, monkeypatch):
    """--no-stream runs SGLang's client with --disable-stream and the rows say so; the table prints no
    inter-token latency or time to first token for them (the client's TTFT is then the whole request)
    and compares them only with rows of unstreamed loads."""
    import bench_serving

    fake_servers(monkeypatch)
    commands = []

    fake_client(monkeypatch, dict(output_throughput=30000.0, median_itl_ms=0.0, p99_itl_ms=0.0, median_ttft_ms=2900.0,
                                  mean_tpot_ms=0.0, median_e2e_latency_ms=2900.0, concurrency=251.3), commands.append)
    with open(tmp_path / "log", "w") as log:
        whole = bench_serving.serve_and_measure("kimi-linear", tmp_path, "replay-nvfp4", "extra_buffer",
                                                serving_args(concurrency=[256], no_stream=True), log,
                                                check_server.Deadline(None))
        streamed = bench_serving.serve_and_measure("kimi-linear", tmp_path, "sglang", "extra_buffer",
                                                   serving_args(concurrency=[256]), log, check_server.Deadline(None))
    assert ["--disable-stream" in cmd for cmd in commands] == [True, False]
    assert [r["stream"] for r in whole + streamed] == [False, True]
    # the client's request latency is kept; its mean concurrency does not replace the load's
    assert [(r["median_e2e_latency_ms"], r["concurrency"]) for r in whole] == [(2900.0, 256)]
    path = tmp_path / "serving-kimi-linear.json"
    path.write_text(json.dumps(dict(rows=[dict(r, decode_tokens_per_s=50000.0) for r in streamed + whole])))
    lines = bench_serving.table([path]).splitlines()
    assert lines[3] == ("| kimi-linear | replay-nvfp4 | extra_buffer | 256 | 1 | 30000 |  |  | not streamed |  |  |  "
                        "| - / 50,000 | - / - |  |  |")
    # SGLang's streamed row: an ITL of 0 ms would be a token interval ratio of 0.00, not a comparison
    assert lines[2].split(" | ")[10] == "0.00"


def test_each_prefix_load_starts_with_the_radix_cache_flushed(tmp_path, monkeypatch):
    """Under --workload prefix every load, the repeats included, begins on an empty radix tree: the flush
    comes before that load's client starts; the decode workload never flushes."""
    import bench_serving

    fake_servers(monkeypatch)
    events = []
    monkeypatch.setattr(check_server, "flush_cache", lambda port: events.append(("flush", port)))

    fake_client(monkeypatch, dict(output_throughput=1.0, median_itl_ms=2.0, cache_report=dict(cache_hit_rate_pct=80.0)),
                lambda cmd: events.append(("client", int(cmd[cmd.index("--max-concurrency") + 1]))))
    with open(tmp_path / "log", "w") as log:
        prefix = serving_args(port=7, workload="prefix", repeat=2, concurrency=[4], groups=2, prompts_per_group=2,
                              prefix_len=8, question_len=4)
        rows = bench_serving.serve_and_measure("qwen3.5-9b", tmp_path, "replay-nvfp4", "extra_buffer", prefix, log,
                                               check_server.Deadline(None))
        assert events == [("flush", 7), ("client", 4), ("flush", 7), ("client", 4)]
        assert [(r["load"], r["cache_flushed"], r["cache_hit_rate_pct"]) for r in rows] == [(1, True, 80.0),
                                                                                           (2, True, 80.0)]
        events.clear()
        rows = bench_serving.serve_and_measure("qwen3.5-9b", tmp_path, "replay-nvfp4", "extra_buffer",
                                               serving_args(port=7, repeat=2, concurrency=[4]), log,
                                               check_server.Deadline(None))
    assert events == [("client", 4), ("client", 4)] and not any("cache_flushed" in r for r in rows)


@pytest.mark.parametrize("status", [200, 400])
def test_sglangs_admin_posts_and_a_refused_one_is_an_error(status):
    """``flush_cache`` posts to SGLang's /flush_cache with a wait for running requests, ``freeze_gc`` an
    empty body, ``start_profile`` its request as JSON; SGLang answers 400 when requests stayed in the
    server, which ends the load (or the check) with the answer."""
    import http.server
    import threading

    import bench_serving

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            data = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, self.headers.get("Content-Type") == "application/json", data))
            body = b"done." if status == 200 else b"There are running requests."
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_port
    calls = [("/flush_cache", lambda: check_server.flush_cache(port)),
             ("/freeze_gc", lambda: bench_serving.freeze_gc(port)),
             ("/start_profile", lambda: bench_serving.start_profile(port, dict(num_steps=3, profile_id="decode")))]
    try:
        for path, call in calls:
            if status == 200:
                call()
            else:
                with pytest.raises(RuntimeError, match=f"^{path} answered 400: b'There are running requests.'$"):
                    call()
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/flush_cache?timeout=60", False, b""), ("/freeze_gc", False, b""),
                    ("/start_profile", True, b'{"num_steps": 3, "profile_id": "decode"}')]


def test_a_profile_that_never_starts_keeps_the_loads_row(tmp_path, monkeypatch):
    """A load whose log never shows what its profile waits for is measured as usual; its row says
    which profile was missed (the profile is lost, not the load)."""
    import bench_serving

    args = serving_args(concurrency=[4], profile_prefill=2, server_log_level="info")
    servers = fake_servers(monkeypatch)

    class Client:
        def __init__(self, cmd, **kw):
            out = pathlib.Path(cmd[cmd.index("--output-file") + 1])
            out.write_text(json.dumps(dict(output_throughput=40.0, median_itl_ms=2.0)) + "\n")
            kw["stdout"].write("Prefill batch, #new-seq: 4, #new-token: 8, #cached-token: 0, #running-req: 0, "
                               "#queue-req: 0, input throughput (token/s): 1.0\n")
            kw["stdout"].flush()
            self.returncode = 0

        def poll(self):
            return self.returncode

    def start_profile(port, request):
        raise AssertionError("no prefill batch had a queue: the profile must not start")

    monkeypatch.setattr(bench_serving.subprocess, "Popen", Client)
    monkeypatch.setattr(bench_serving, "start_profile", start_profile)
    with open(tmp_path / "log", "w") as log:
        rows = bench_serving.serve_and_measure("kimi-linear", tmp_path, "replay-nvfp4", "no_buffer", args, log,
                                               check_server.Deadline(None))
    assert servers[-1].poll() is not None
    assert len(rows) == 1 and "error" not in rows[0] and rows[0]["output_throughput"] == 40.0
    assert "profile_prefill" not in rows[0]
    assert rows[0]["profile_missed"] == ("--profile-prefill: the server logged no prefill batch with at least 2 "
                                         "requests queued")


def test_serving_records_a_failed_loads_concurrency_and_says_when_the_deadline_cut_it(tmp_path, monkeypatch):
    import bench_serving

    args = serving_args(concurrency=[2, 4], load_timeout=600)
    servers = fake_servers(monkeypatch)

    class Client:
        """Finishes its load at concurrency 2 and never ends the one at 4."""

        def __init__(self, cmd, **kw):
            self.c = int(cmd[cmd.index("--max-concurrency") + 1])
            out = pathlib.Path(cmd[cmd.index("--output-file") + 1])
            if self.c == 2:
                out.write_text(json.dumps(dict(output_throughput=20.0, median_itl_ms=2.0)) + "\n")
            self.returncode = 0 if self.c == 2 else None

        def poll(self):
            return self.returncode

        def kill(self):
            self.returncode = -9

        def wait(self):
            return self.returncode

    class Deadline:
        """Time to start the server and both loads, then 0.3 s for each load's client."""

        def left(self, cap):
            return cap if cap in (30, 60, args.start_timeout) else 0.3

    monkeypatch.setattr(bench_serving.subprocess, "Popen", Client)
    with open(tmp_path / "log", "w") as log:
        rows = bench_serving.serve_and_measure("kimi-linear", tmp_path, "replay-nvfp4", "no_buffer", args, log,
                                               Deadline())
    assert servers[-1].poll() is not None
    assert [(r["concurrency"], r["load"], r.get("output_throughput")) for r in rows] == [(2, 1, 20.0), (4, 1, None)]
    assert rows[1]["error"] == ("RuntimeError: the client ran past 0 s (what --deadline left of --load-timeout) at "
                                "concurrency 4")
    rerun = dict({k: v for k, v in rows[1].items() if k != "error"}, output_throughput=40.0)
    first, later = tmp_path / "first.json", tmp_path / "later.json"
    for path, run_rows in ((first, rows), (later, [rerun])):
        path.write_text(json.dumps(dict(model="kimi-linear", meta={}, config={}, args={}, rows=run_rows)))
    # the failed load's row names its load, so a later run of that load replaces it
    assert [(r["concurrency"], r["output_throughput"]) for r in bench_serving.merge([first, later])["rows"]] == [
        (2, 20.0), (4, 40.0)]


def test_listen_counters_read_the_kernels_tcpext_pair_of_lines():
    import bench_serving

    netstat = ("TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\n"
               "TcpExt: 1 17 19 4\n"
               "IpExt: InNoRoutes ListenOverflows\n"
               "IpExt: 5 6\n")
    assert bench_serving.listen_counters(netstat) == dict(ListenOverflows=17, ListenDrops=19)
    assert bench_serving.listen_counters("IpExt: ListenOverflows ListenDrops\nIpExt: 1 2\n") == {}
    assert bench_serving.listen_fields({}, dict(ListenOverflows=1, ListenDrops=1, somaxconn=4096)) == {}
    # this host's own counters, where it has them, have the same form
    state = bench_serving.host_listen_state()
    assert not state or (set(state) == {"ListenOverflows", "ListenDrops", "somaxconn"} and state["somaxconn"] > 0)


def test_server_rates_read_full_prefill_batches_and_full_decode_batches():
    import bench_serving

    line = ("[t] Prefill batch, #new-seq: {s}, #new-token: {n}, #cached-token: 0, full token usage: 0.00, mamba usage: "
            "0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): {x}")
    dec = ("[t] Decode batch, #running-req: {r}, #full token: 131584, full token usage: 0.64, mamba num: 512, mamba "
           "usage: 0.66, cuda graph: True, gen throughput (token/s): {x}, #queue-req: 0")
    log = "\n".join([line.format(s=1, n=512, x=22.2), line.format(s=16, n=8192, x=26000.0),
                     line.format(s=16, n=8192, x=26400.5), line.format(s=16, n=8192, x=25000.0),
                     line.format(s=3, n=1536, x=30000.0), dec.format(r=256, x=5.87), dec.format(r=256, x=8461.9),
                     dec.format(r=256, x=8449.1), dec.format(r=200, x=9000.0), dec.format(r=256, x=8500.0),
                     "[t] Profiling starts. Traces will be saved to: /tmp/p", dec.format(r=256, x=100.0),
                     "[t] Stop profiling...", "[t] Profiling done. Traces are saved to: /tmp/p",
                     line.format(s=1, n=512, x=22.2), dec.format(r=256, x=50.0)])
    # the first full decode batch (its interval reaches into the prefill), the partial ones and those of the
    # profiled stretch are left out: the median of the other three is the middle one
    assert bench_serving.server_rates(log, 256) == dict(prefill_tokens_per_s=26000.0, decode_tokens_per_s=8461.9)
    assert bench_serving.server_rates(log, 64) == dict(prefill_tokens_per_s=26000.0)
    assert bench_serving.server_rates("no rates at warning level", 256) == {}


def test_server_memory_reads_what_each_server_allocated_at_start(tmp_path):
    """SGLang 0.5.17's mamba pool and scheduler lines (its f-strings' formats) and replayssm's pool line
    (the one a replay pool logs: tests/test_sglang_replay.py) into a row's ``memory``, and its table."""
    import bench_serving

    sglang = ("[t] Mamba Cache is allocated. max_mamba_cache_size: 769, conv_state size: 0.45GB, ssm_state size: "
              "9.63GB intermediate_ssm_state_cache size: 12.85GB intermediate_conv_window_cache size: 0.60GB \n"
              "[t] max_total_num_tokens=1234567, chunked_prefill_size=8192, max_prefill_tokens=16384, "
              "max_running_requests=256, context_len=262144, available_gpu_mem=12.34 GB\n")
    replay = ("[t] replayssm pool: 770 slots x 24 layers, window 16, 3 draft tokens, read format nvfp4: ring, read "
              "copy and cursors 1.87 GB beside SGLang's state; no per-draft state snapshots\n")
    assert bench_serving.server_memory(sglang) == dict(
        mamba_slots=769, conv_state_gb=0.45, ssm_state_gb=9.63, draft_snapshots_gb=12.85, draft_conv_windows_gb=0.6,
        max_total_num_tokens=1234567, max_running_requests=256)
    plain = sglang.replace("9.63GB intermediate_ssm_state_cache size: 12.85GB intermediate_conv_window_cache size: "
                           "0.60GB ", "9.63GB ")
    assert bench_serving.server_memory(plain + replay) == dict(
        mamba_slots=769, conv_state_gb=0.45, ssm_state_gb=9.63, max_total_num_tokens=1234567,
        max_running_requests=256, replay_side_gb=1.87)
    assert bench_serving.server_memory("warning level: nothing logged") == {}
    rows = [dict(model="m", variant="sglang", radix="no_buffer", workload="decode", speculative="mtp", concurrency=8,
                 error="x", memory=bench_serving.server_memory(sglang)),
            dict(model="m", variant="replay-nvfp4", radix="no_buffer", workload="decode", speculative="mtp",
                 concurrency=8, error="x", memory=bench_serving.server_memory(plain + replay))]
    path = tmp_path / "serving-m.json"
    path.write_text(json.dumps(dict(model="m", rows=rows)))
    lines = bench_serving.memory_table([path]).splitlines()
    assert lines[2] == "| m | sglang | no_buffer | mtp | 256 | 1,234,567 | 769 | 9.63 | 12.85 | 0.60 |  |"
    assert lines[3] == "| m | replay-nvfp4 | no_buffer | mtp | 256 | 1,234,567 | 769 | 9.63 |  |  | 1.87 |"
    assert lines[0] in bench_serving.table([path])


def test_serving_table_compares_each_load_with_sglangs(tmp_path):
    import bench_serving

    def row(variant, c, tok, itl, load=1, ttft=50.0, **rates):
        return dict(model="m", variant=variant, radix="no_buffer", workload="decode", concurrency=c, load=load,
                    output_throughput=tok, median_itl_ms=itl, p99_itl_ms=2 * itl, median_ttft_ms=ttft, **rates)

    path = tmp_path / "serving-m.json"
    path.write_text(json.dumps(dict(rows=[row("sglang", 64, 3000.0, 12.0, decode_tokens_per_s=8000.0),
                                          row("sglang", 64, 2000.0, 16.0, load=2),
                                          row("sglang-replay", 64, 2400.0, 10.0, decode_tokens_per_s=12000.0),
                                          row("replay-fp32", 64, 3600.0, 8.0, ttft=75.0, prefill_tokens_per_s=26431.5,
                                              decode_tokens_per_s=14391.0),
                                          row("replay-fp32", 64, 3000.0, 8.0, load=2, decode_tokens_per_s=9000.0),
                                          row("replay-fp32", 256, 4000.0, 10.0),
                                          dict(model="m", variant="replay-nvfp4", radix="no_buffer",
                                               workload="decode", error="RuntimeError: boom")])))
    lines = bench_serving.table([path]).splitlines()
    # ITL / server token interval: 10 ms against 64 requests' tokens at 12,000 tok/s, one per 5.33 ms
    assert lines[4] == ("| m | sglang-replay | no_buffer | 64 | 1 | 2400 | 0.80x |  | 10.00 / 20.00 | 1.20x "
                        "| 1.88 | 50 (1.00x) "
                        "| - / 12,000 | 1.50x / - |  |  |")
    # each load against SGLang's and SGLang's replay's load of the same number on its server
    assert lines[5] == ("| m | replay-fp32 | no_buffer | 64 | 1 | 3600 | 1.20x | 1.50x | 8.00 / 16.00 | 1.50x "
                        "| 1.80 | 75 (1.50x) "
                        "| 26,432 / 14,391 | 1.80x / 1.20x |  |  |")
    assert lines[6] == ("| m | replay-fp32 | no_buffer | 64 | 2 | 3000 | 1.50x |  | 8.00 / 16.00 | 2.00x "
                        "| 1.12 | 50 (1.00x) "
                        "| - / 9,000 | - / - |  |  |")
    assert lines[7] == ("| m | replay-fp32 | no_buffer | 256 | 1 | 4000 |  |  | 10.00 / 20.00 |  |  | 50 | - / - "
                        "| - / - |  |  |")
    assert "RuntimeError: boom" in lines[8] and lines[8].count("|") == lines[7].count("|")


def test_serving_merge_keeps_every_runs_rows_and_meta_and_drops_a_load_a_later_run_measured(tmp_path):
    import bench_serving

    def run(name, commit, rows):
        path = tmp_path / name
        path.write_text(json.dumps(dict(model="m", meta=dict(commit=commit), config=dict(x=1), args=dict(a=name),
                                        rows=rows)))
        return path

    base = dict(model="m", radix="extra_buffer", workload="prefix", speculative="none", concurrency=256, load=1)
    first = run("a.json", "c1", [dict(base, variant="sglang", output_throughput=9000.0),
                                 dict(base, variant="replay-nvfp4", error="not run: the deadline is less than 30 s away"),
                                 dict(base, variant="replay-fp32", error="RuntimeError: boom")])
    second = run("b.json", "c2", [dict(base, variant="replay-nvfp4", output_throughput=5667.0)])
    merged = bench_serving.merge([first, second])
    assert [(r["variant"], r["run"]) for r in merged["rows"]] == [("sglang", 0), ("replay-fp32", 0),
                                                                   ("replay-nvfp4", 1)]
    assert [r["meta"]["commit"] for r in merged["runs"]] == ["c1", "c2"]
    assert merged["model"] == "m" and merged["config"] == dict(x=1)
    out = tmp_path / "merged.json"
    assert bench_serving.main(["--merge", str(first), str(second), "--merged", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(merged))
    other = run("c.json", "c3", [])
    other.write_text(other.read_text().replace('"model": "m"', '"model": "n"'))
    with pytest.raises(ValueError, match="one model"):
        bench_serving.merge([first, other])
    with pytest.raises(SystemExit):
        bench_serving.main(["--merge", str(first)])


def test_serving_speculative_mtp_flags_and_model_folders(tmp_path, monkeypatch):
    import bench_serving

    commands = []

    def fake(model, model_dir, variant, strategy, args, log, deadline, emit, overlap=False, placement=None):
        config = json.loads((model_dir / "config.json").read_text())
        commands.append((model_dir.name, variant, config.get("mtp_num_hidden_layers"),
                         bench_serving.server_command(variant, model_dir, "gdn", strategy, args)))
        return []

    monkeypatch.setattr(bench_serving, "serve_and_measure", fake)
    monkeypatch.setattr(bench_serving, "plot", lambda *a: None)
    monkeypatch.setattr(bench_serving.models, "CONFIGS", dict(bench_serving.models.CONFIGS))
    bench_serving.models.CONFIGS["qwen3.5-9b"] = dict(bench_serving.models.CONFIGS["qwen3.5-9b"], vocab_size=300)
    out = tmp_path / "out"
    assert bench_serving.main(["--models", "qwen3.5-9b", "--variants", "sglang", "sglang-replay", "--speculative",
                               "mtp", "--draft-tokens", "3", "--out", str(out), "--models-dir", str(tmp_path)]) == 0
    assert [c[:3] for c in commands] == [("qwen3.5-9b-mtp", "sglang", 1), ("qwen3.5-9b-mtp", "sglang-replay", 1)]
    flags = commands[1][3]
    assert "--enable-linear-replayssm-spec" in flags and "--enable-linear-replayssm" not in flags
    assert not {"--enable-linear-replayssm-spec", "--enable-linear-replayssm"} & set(commands[0][3])
    i = flags.index("--speculative-algorithm")
    assert flags[i:i + 8] == ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2",
                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    assert (out / "serving-qwen3.5-9b-mtp.json").exists()
    assert "mtp_num_hidden_layers" not in json.loads(models.write(tmp_path, "qwen3.5-9b").joinpath(
        "config.json").read_text())
    with pytest.raises(SystemExit):
        bench_serving.main(["--models", "nemotron-h-8b", "--speculative", "mtp", "--out", str(out)])


@pytest.mark.parametrize("variant", sorted(check_server.VARIANTS))
def test_every_variant_gets_one_state_dtype_the_launcher_accepts(variant):
    """SGLang's own variants store float32 states; a replay variant's launcher sets the dtype of its
    checkpoint (fp16-SR: float16) and refuses another, so the harness passes none there."""
    from replayssm.integrations.sglang import launch_server

    flags = check_server.VARIANTS[variant]
    command = check_server.launcher_command(variant)
    assert command[:3] == [sys.executable, "-m", "replayssm.integrations.sglang.launch_server"]
    cfg, sglang_args, _ = launch_server.resolve([*command[3:], "--model-path", "m"])
    dtypes = [sglang_args[i + 1] for i, a in enumerate(sglang_args) if a == "--mamba-ssm-dtype"]
    assert dtypes == ["float16" if "float16_sr" in flags else "float32"]
    assert (cfg is None) == ("--replay-ssm" not in flags)


def test_profile_summary_groups_kernels_and_counts_busy_time_once():
    import profile_trace

    def k(name, ts, dur):
        return dict(cat="kernel", name=name, ts=ts, dur=dur)

    trace = dict(traceEvents=[
        k("_delta_decode_kernel", 0.0, 10.0), k("_delta_flush_kernel", 5.0, 10.0),   # overlapping: busy 0..15
        k("void at::native::vectorized_elementwise_kernel<4>", 20.0, 2.0),
        k("fused_recurrent_gated_delta_rule_packed_decode_kernel", 30.0, 8.0),
        k("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", 40.0, 6.0),
        dict(cat="cuda_runtime", name="cudaGraphLaunch", ts=0.0, dur=50.0)])
    s = profile_trace.summarize(trace, steps=2)
    assert s["kernels"] == 5
    assert s["per_step"] == dict(kernel_us=18.0, busy_us=15.5, span_us=23.0, launches=2.5)
    assert s["groups"]["replayssm"] == dict(us=10.0, launches=1.0, share=20.0 / 36.0)
    assert s["groups"]["sglang ssm"]["us"] == 4.0
    assert s["groups"]["gemm"]["us"] == 3.0
    assert s["groups"]["pytorch elementwise / reduce"]["launches"] == 0.5
    assert s["top"][0]["name"] == "_delta_decode_kernel" and s["top"][0]["group"] == "replayssm"
    with pytest.raises(ValueError, match="steps"):
        profile_trace.summarize(trace, steps=0)
    with pytest.raises(ValueError, match="no kernel events"):
        profile_trace.summarize(dict(traceEvents=[]), steps=1)


def test_host_summary_charges_replayssm_its_own_time_and_finds_who_waited_for_the_device(tmp_path, capsys):
    import profile_trace

    def py(name, ts, dur, tid=1):
        return dict(cat="python_function", name=name, ts=ts, dur=dur, pid=7, tid=tid)

    def sync(ts, dur, tid=1, name="cudaStreamSynchronize"):
        return dict(cat="cuda_runtime", name=name, ts=ts, dur=dur, pid=7, tid=tid)

    pool, hooks = "replayssm/integrations/sglang/pool.py", "replayssm/integrations/sglang/hooks.py"
    trace = dict(traceEvents=[
        py("sglang/srt/managers/scheduler.py(900): run_batch", 0.0, 100.0),
        py("sglang/srt/managers/scheduler.py(950): run_batch", 1.0, 50.0),        # nested: counted once
        py(f"{pool}(243): on_event", 10.0, 30.0),                                  # 10 of its own
        py("replayssm/graphs.py(70): __call__", 12.0, 20.0),                      # 20, with the torch call
        py("torch/cuda/streams.py(10): synchronize", 14.0, 5.0),
        sync(15.0, 4.0),                                                          # torch frame: its caller
        py(f"{hooks}(190): method", 55.0, 40.0),                                   # a hook around SGLang's:
        py(f"{pool}(300): forward_starts", 56.0, 6.0),                             # 4 of its own
        py("sglang/srt/model_executor/model_runner.py(1500): _forward_raw", 62.0, 30.0),
        py("torch/nn/modules/module.py(1): _call_impl", 63.0, 20.0),              # SGLang's, not replay's
        sync(70.0, 9.0),
        dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=80.0, dur=3.0, pid=7, tid=1),   # no wait
        py("sglang/srt/managers/scheduler.py(1200): process_batch_result", 100.0, 40.0),
        py(f"{pool}(243): on_event", 0.0, 8.0, tid=2),                              # another thread
        py(f"{pool}(243): on_event", 0.0, 10.0, tid=4),                             # a frame that overruns
        py("sglang/srt/managers/scheduler.py(10): event_loop", 5.0, 20.0, tid=4),  # it is not its callee
        sync(0.0, 2.0, tid=3),
        dict(cat="kernel", name="_delta_flush_kernel", ts=0.0, dur=5.0)])
    h = profile_trace.summarize_host(trace, steps=2)
    assert h["per_step"] == dict(replayssm_us=29.0, sync_us=7.5, syncs=1.5)
    assert h["stages"] == dict(run_batch=50.0, process_batch_result=20.0)
    assert h["replayssm"] == [dict(name=f"{pool}: on_event", us=14.0, calls=1.5),
                              dict(name="replayssm/graphs.py: __call__", us=10.0, calls=0.5),
                              dict(name=f"{pool}: forward_starts", us=3.0, calls=0.5),
                              dict(name=f"{hooks}: method", us=2.0, calls=0.5)]
    assert h["syncs"] == [dict(at="sglang/srt/model_executor/model_runner.py(1500): _forward_raw", us=4.5, count=0.5),
                          dict(at="replayssm/graphs.py(70): __call__", us=2.0, count=0.5),
                          dict(at="(no Python frame)", us=1.0, count=0.5)]
    # the command line summarizes a trace's host side when it holds Python frames
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps(trace))
    assert profile_trace.main([str(path), "--steps", "2", "--json", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["host"] == h
    assert "host per step: replayssm 29 us, waits for the device 8 us (1.5)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="steps"):
        profile_trace.summarize_host(trace, steps=0)
    with pytest.raises(ValueError, match="python_function"):
        profile_trace.summarize_host(dict(traceEvents=[sync(0.0, 1.0)]), steps=1)


def test_profile_regroup_moves_top_kernels_to_the_group_their_name_has_now():
    import profile_trace

    # SGLang's Mamba-2 decode kernel; summaries written before its pattern counted it as "other"
    assert profile_trace.group_of("_selective_scan_update_kernel") == "sglang ssm"
    old = dict(per_step=dict(kernel_us=20.0, busy_us=19.0, span_us=21.0, launches=4.0),
               groups={"other": dict(us=15.0, launches=2.0, share=0.75), "gemm": dict(us=5.0, launches=2.0,
                                                                                   share=0.25)},
               top=[dict(name="_selective_scan_update_kernel", group="other", us=14.0, launches=1.0),
                    dict(name="nvjet_sm90_tst_128x64", group="gemm", us=5.0, launches=2.0),
                    dict(name="some_kernel", group="other", us=1.0, launches=1.0)])
    new = profile_trace.regroup(old)
    assert new["groups"] == {"sglang ssm": dict(us=14.0, launches=1.0, share=0.7),
                             "gemm": dict(us=5.0, launches=2.0, share=0.25),
                             "other": dict(us=1.0, launches=1.0, share=0.05)}
    assert [k["group"] for k in new["top"]] == ["sglang ssm", "gemm", "other"]
    assert old["groups"]["other"]["us"] == 15.0 and old["top"][0]["group"] == "other"     # the input is kept
    assert profile_trace.regroup(new) == new


def fake_start_profile(log: pathlib.Path, asked: list, events, note=lambda request: request):
    """A stand-in for ``bench_serving.start_profile``: it appends ``note(request)`` to ``asked``, writes a
    trace of ``events(request)`` where the request asks, and logs the server's "Profiling done" line."""
    def start_profile(port, request):
        asked.append(note(request))
        folder = pathlib.Path(request["output_dir"])
        folder.mkdir(parents=True)
        (folder / "x-TP-0.trace.json").write_text(json.dumps(dict(traceEvents=events(request))))
        log.write_text(log.read_text() + "Profiling done. Traces are saved to: prof\n")

    return start_profile


def kernel_event(name: str, dur: float) -> dict:
    return dict(cat="kernel", name=name, ts=0.0, dur=dur)


def test_profile_waits_for_a_decode_batch_of_every_request():
    import bench_serving

    log = ("Decode batch, #running-req: 200, #token: 1, token usage: 0.01, gen throughput (token/s): 100.0\n"
           "Decode batch, #running-req: 256, #token: 1, token usage: 0.01, gen throughput (token/s): 200.0\n")
    assert bench_serving.running_decode(log, 256)
    assert not bench_serving.running_decode(log, 512)


def test_profiled_load_starts_the_profile_once_every_request_runs(tmp_path, monkeypatch):
    import bench_serving

    args = bench_serving.argparse.Namespace(profile_steps=2, profile_prefill=0, concurrency=[1, 4], port=1,
                                            workload="decode", profile_host=False)
    log = tmp_path / "log"
    log.write_text("Decode batch, #running-req: 4, #full token: 9, gen throughput (token/s): 1.0, x\n")
    start = log.stat().st_size
    asked = []

    class Client:
        polls = 0
        returncode = None

        def poll(self):
            self.polls += 1
            if self.polls == 3:             # the load's own lines: first 2 requests, then all 4 running
                log.write_text(log.read_text() + "Decode batch, #running-req: 2, gen throughput (token/s): 1.0\n")
            if self.polls == 5:
                log.write_text(log.read_text() + "Decode batch, #running-req: 4, gen throughput (token/s): 1.0\n")
            if self.polls == 8:
                self.returncode = 0
            return self.returncode

    monkeypatch.setattr(bench_serving, "start_profile",
                        fake_start_profile(log, asked, lambda request: [kernel_event("_delta_decode_kernel", 4.0)]))
    monkeypatch.setattr(bench_serving.time, "sleep", lambda s: None)
    client = Client()
    got = bench_serving.profile_load(client, args, 4, 1, str(log), start, tmp_path / "prof", 60)
    assert len(asked) == 1 and asked[0]["num_steps"] == 2 and asked[0]["activities"] == ["GPU"]
    assert client.polls >= 5 and list(got) == ["decode"] and got["decode"]["per_step"]["kernel_us"] == 2.0
    # not the largest concurrency, or a later load: no profile
    assert bench_serving.profile_load(Client(), args, 1, 1, str(log), start, tmp_path / "p2", 60) == {}
    assert bench_serving.profile_load(Client(), args, 4, 2, str(log), start, tmp_path / "p3", 60) == {}


def test_a_host_profile_records_python_stacks_and_summarizes_the_host(tmp_path, monkeypatch, capsys):
    import bench_serving

    args = bench_serving.argparse.Namespace(profile_steps=2, profile_prefill=0, concurrency=[4], port=1,
                                            workload="decode", profile_host=True)
    log = tmp_path / "log"
    log.write_text("")
    asked = []
    Client = scripted_client(log, {2: "Decode batch, #running-req: 4, gen throughput (token/s): 1.0\n"}, end=5)

    frame = dict(cat="python_function", name="replayssm/integrations/sglang/gdn.py(40): replay_packed_decode",
                 ts=0.0, dur=6.0, pid=1, tid=1)
    monkeypatch.setattr(bench_serving, "start_profile", fake_start_profile(
        log, asked, lambda request: [kernel_event("_delta_decode_kernel", 4.0), frame]))
    monkeypatch.setattr(bench_serving.time, "sleep", lambda s: None)
    got = bench_serving.profile_load(Client(), args, 4, 1, str(log), 0, tmp_path / "prof", 60)
    assert asked[0]["activities"] == ["CPU", "GPU"] and asked[0]["with_stack"] is True
    assert got["decode"]["per_step"]["kernel_us"] == 2.0
    assert got["decode"]["host"]["per_step"]["replayssm_us"] == 3.0
    # --profile-host records the profiles it names: alone it is refused
    with pytest.raises(SystemExit):
        bench_serving.main(["--profile-host", "--server-log-level", "info"])
    assert "--profile-host: expected --profile-steps or --profile-prefill" in capsys.readouterr().err


def scripted_client(log: pathlib.Path, lines: dict, end: int):
    """A load's client class for ``profile_load``: its poll number ``n`` appends ``lines[n]`` to the server's
    ``log``, and it exits at poll ``end``."""
    class Client:
        polls = 0
        returncode = None

        def poll(self):
            self.polls += 1
            if self.polls in lines:
                log.write_text(log.read_text() + lines[self.polls])
            if self.polls == end:
                self.returncode = 0
            return self.returncode

    return Client


def test_a_prefill_profile_starts_behind_a_queue_and_the_decode_profile_after_it(tmp_path, monkeypatch):
    """--profile-prefill waits for a prefill batch with half the load still queued, --profile-steps then
    for every request running, and each phase's trace is summarized over its own steps."""
    import bench_serving

    args = bench_serving.argparse.Namespace(profile_steps=4, profile_prefill=2, concurrency=[8], port=1,
                                            workload="decode", profile_host=False)
    log = tmp_path / "log"
    log.write_text("")
    asked = []
    lines = {2: "Prefill batch, #new-seq: 2, #new-token: 8, #queue-req: 3, input throughput (token/s): 1.0\n",
             4: "Prefill batch, #new-seq: 2, #new-token: 8, #queue-req: 4, input throughput (token/s): 1.0\n",
             9: "Decode batch, #running-req: 8, gen throughput (token/s): 1.0\n"}

    Client = scripted_client(log, lines, end=14)

    def events(request):
        name = "_mamba2_flush_kernel" if request["profile_id"] == "prefill" else "_mamba2_decode_kernel"
        return [kernel_event(name, 8.0)]

    monkeypatch.setattr(bench_serving, "start_profile", fake_start_profile(
        log, asked, events, note=lambda request: (client.polls, request["profile_id"], request["num_steps"])))
    monkeypatch.setattr(bench_serving.time, "sleep", lambda s: None)
    client = Client()
    got = bench_serving.profile_load(client, args, 8, 1, str(log), 0, tmp_path / "prof", 60)
    # 3 of 8 queued is not half; 4 is; the decode profile waits for 8 running
    assert [(phase, n) for _, phase, n in asked] == [("prefill", 2), ("decode", 4)]
    assert asked[0][0] == 4 and asked[1][0] == 9
    assert got["prefill"]["per_step"]["kernel_us"] == 4.0 and got["decode"]["per_step"]["kernel_us"] == 2.0
    assert got["prefill"]["top"][0]["name"] == "_mamba2_flush_kernel"
    # a load whose prefill never queues half its requests: the prefill profile is reported missed, the decode
    # profile behind it did not start, and the load still counts
    log.write_text("")
    lines.pop(4)
    asked.clear()
    got = bench_serving.profile_load(Client(), args, 8, 1, str(log), 0, tmp_path / "prof2", 60)
    assert asked == [] and set(got) == {"missed"}
    assert got["missed"] == ("--profile-prefill: the server logged no prefill batch with at least 4 requests queued; "
                             "--profile-steps did not start behind it")


def test_a_prefix_workload_profiles_a_prefill_batch_that_reuses_the_cache(tmp_path, monkeypatch):
    """Under --workload prefix no queue builds up: the prefill profile waits for a batch with cached
    tokens and a quarter of the load running instead, and is reported missing without one."""
    import bench_serving

    args = bench_serving.argparse.Namespace(profile_steps=0, profile_prefill=2, concurrency=[8], port=1,
                                            workload="prefix", profile_host=False)
    log = tmp_path / "log"
    log.write_text("")
    asked = []
    batch = ("Prefill batch, #new-seq: 1, #new-token: 4, #cached-token: {}, full token usage: 0.01, "
             "#running-req: {}, #queue-req: 0, cuda graph: True, input throughput (token/s): 1.0\n")
    lines = {2: batch.format(0, 5), 3: batch.format(16, 1), 5: batch.format(16, 2)}

    Client = scripted_client(log, lines, end=9)

    monkeypatch.setattr(bench_serving, "start_profile", fake_start_profile(
        log, asked, lambda request: [kernel_event("_delta_flush_kernel", 8.0)],
        note=lambda request: (client.polls, request["profile_id"])))
    monkeypatch.setattr(bench_serving.time, "sleep", lambda s: None)
    client = Client()
    got = bench_serving.profile_load(client, args, 8, 1, str(log), 0, tmp_path / "prof", 60)
    # no cached tokens at 5 running, cached at 1 running (under a quarter of 8): neither; cached at 2 running: yes
    assert asked == [(5, "prefill")]
    assert got["prefill"]["per_step"]["kernel_us"] == 4.0
    # the decode workload keeps waiting for a queue, which this log never shows
    log.write_text("")
    got = bench_serving.profile_load(Client(), bench_serving.argparse.Namespace(**dict(vars(args), workload="decode")),
                                     8, 1, str(log), 0, tmp_path / "prof2", 60)
    assert got == {"missed": "--profile-prefill: the server logged no prefill batch with at least 4 requests queued"}
    log.write_text("")
    lines.pop(5)
    got = bench_serving.profile_load(Client(), args, 8, 1, str(log), 0, tmp_path / "prof3", 60)
    assert got == {"missed": "--profile-prefill: the server logged no prefill batch reusing cached tokens with at "
                             "least 2 requests running"}


def test_server_rates_leave_out_a_profiled_prefill_stretch():
    import bench_serving

    line = "Prefill batch, #new-seq: 16, #new-token: 8192, #queue-req: {q}, input throughput (token/s): {x}\n"
    dec = "Decode batch, #running-req: 8, gen throughput (token/s): {x}\n"
    log = (line.format(q=100, x=20000.0)
           + "Profiling starts. Traces will be saved to: /tmp/p (with profile id: prefill)\n"
           + line.format(q=84, x=9000.0) + "Profiling done. x\n" + line.format(q=68, x=12000.0)
           + line.format(q=52, x=26000.0) + line.format(q=36, x=27000.0)
           + dec.format(x=1.0) + dec.format(x=700.0) + dec.format(x=800.0)
           + "Profiling starts. Traces will be saved to: /tmp/p (with profile id: decode)\n" + dec.format(x=5.0)
           + "Profiling done. x\n" + line.format(q=0, x=1000.0) + dec.format(x=50.0) + dec.format(x=900.0))
    # the profiled prefill batch and the prefill line after it are left out, and everything from the decode
    # profile's start through the decode line after it: prefill 20000, 26000, 27000; decode 700, 800, 900
    assert bench_serving.server_rates(log, 8) == {"prefill_tokens_per_s": 26000.0, "decode_tokens_per_s": 800.0}


def test_run_meta_marks_a_tree_whose_files_differ_from_its_commit(tmp_path):
    def git(*cmd):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    git("add", "f.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    assert check_server.tree_commit(tmp_path) == head
    (tmp_path / "f.py").write_text("a = 2\n")
    assert check_server.tree_commit(tmp_path) == f"{head}-modified"
    assert check_server.tree_commit(pathlib.Path("/")) == "unknown"


def test_profile_plot_draws_every_profiled_row_and_refuses_files_without_one(tmp_path):
    pytest.importorskip("matplotlib")
    import profile_trace

    prof = dict(per_step=dict(kernel_us=10.0, busy_us=9.0, span_us=20.0, launches=3.0),
                groups={"replayssm": dict(us=4.0, launches=1.0, share=0.4), "gemm": dict(us=6.0, launches=2.0,
                                                                                         share=0.6)}, top=[])
    rows = [dict(model="m", variant="sglang", profile=prof), dict(model="m", variant="replay-nvfp4", profile=prof),
            dict(model="m", variant="replay-fp32", output_throughput=1.0)]
    rows[1]["concurrency"] = 256
    path = tmp_path / "serving-m-run1.json"
    path.write_text(json.dumps(dict(model="m", rows=rows)))
    labels = [label for label, _ in profile_trace.profiled_rows([path])]
    assert labels == ["m\nrun1\nsglang", "m\nrun1\nreplay-nvfp4, 256 running"]
    assert profile_trace.main([str(path), "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    bare = tmp_path / "serving-m.json"
    bare.write_text(json.dumps(dict(model="m", rows=rows[2:])))
    with pytest.raises(SystemExit):
        profile_trace.main([str(bare), "--plot", str(tmp_path / "q.png")])


def test_a_failed_profile_ends_the_loads_client(tmp_path, monkeypatch):
    import bench_serving

    args = bench_serving.argparse.Namespace(profile_steps=2, profile_prefill=0, concurrency=[4], port=1,
                                            workload="decode", profile_host=False)
    log = tmp_path / "log"
    log.write_text("Decode batch, #running-req: 4, gen throughput (token/s): 1.0\n")

    class Client:
        returncode = None
        killed = False

        def poll(self):
            return self.returncode

        def kill(self):
            self.killed, self.returncode = True, -9

        def wait(self):
            return self.returncode

    def refused(port, request):
        raise RuntimeError("/start_profile answered 500")

    monkeypatch.setattr(bench_serving, "start_profile", refused)
    client = Client()
    with pytest.raises(RuntimeError, match="answered 500"):
        bench_serving.profile_load(client, args, 4, 1, str(log), 0, tmp_path / "prof", 60)
    assert client.killed


def test_a_server_that_exits_before_it_is_ready_is_reported_with_its_own_error(tmp_path):
    """The runner's message names the exception the server logged (SGLang's own sizing refusal
    here, as a server at 1288 Nemotron-H-8B state slots logs it), not only its exit code."""
    with socket.socket() as s:                  # a port nothing answers on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "servers.log"
    log.write_text("===== an earlier server\nValueError: an earlier server's error\n")
    start = log.stat().st_size
    server = ("import sys\n"
              "print('[2026-12-05] Scheduler hit an exception: Traceback (most recent call last):')\n"
              "print('  File \"kv_cache_configurator.py\", line 1782, in _resolve_memory_pool_config')\n"
              "print('ValueError: Loaded weights leave no GPU memory for the KV cache under "
              "--mem-fraction-static=0.88.')\n"
              "print('[2026-12-05] Received sigquit from a child process.')\n"
              "sys.exit(3)\n")
    with open(log, "a") as f:
        proc = subprocess.Popen([sys.executable, "-c", server], stdout=f, stderr=subprocess.STDOUT)
        with pytest.raises(RuntimeError, match=r"^server exited with 3 before it was ready \(ValueError: Loaded "
                                               r"weights leave no GPU memory for the KV cache under "
                                               r"--mem-fraction-static=0\.88\.\)$"):
            check_server.wait_ready(proc, port, 60, str(log), start)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"])
    with pytest.raises(RuntimeError, match=r"^server exited with 1 before it was ready$"):
        check_server.wait_ready(proc, port, 60, str(log), log.stat().st_size)


@pytest.mark.skipif(not pathlib.Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_watch_http_samples_the_connections_a_busy_server_has_not_taken(tmp_path):
    """``watch_http.sh`` beside a listener that accepts nothing: the connections made to it wait in
    its listen queue, and the samples count them; the host's limits are written down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # a stand-in for the server's process (its command line names launch_server and the port), busy
    server = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                               "s.bind(('127.0.0.1', int(sys.argv[3]))); s.listen(8); print(flush=True); "
                               "time.sleep(30)", "launch_server", "--port", str(port)], stdout=subprocess.PIPE)
    clients = []
    try:
        server.stdout.readline()                                  # listening
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        subprocess.run(["bash", str(ROOT / "benchmarks" / "server" / "watch_http.sh"), str(port), str(tmp_path)],
                       env=dict(os.environ, STOP_AFTER="2"), timeout=30, check=True)
    finally:
        server.kill()
        server.wait()
        for c in clients:
            c.close()
    samples = [line.split() for line in (tmp_path / "listen.tsv").read_text().splitlines()]
    assert samples and all(len(s) == 3 and float(s[0]) > 0 for s in samples)
    assert {s[1] for s in samples} == {"3"}                       # three waiting, in every sample
    host = (tmp_path / "host.txt").read_text()
    assert "net/core/somaxconn " in host and "kernel " in host
    if shutil.which("py-spy"):                                    # the stand-in's stacks, under their headers
        assert f"launch_server --port {port}" in (tmp_path / "http-stacks.txt").read_text()
    else:
        assert not (tmp_path / "http-stacks.txt").exists()
