"""Serve token-id prompts through real SGLang servers, one variant after another, and compare the
greedy tokens of replay against SGLang's conventional path.

    python benchmarks/server/check_server.py --models nemotron-h-8b --variants sglang replay-fp32 --out DIR

Each variant starts ``python -m replayssm.integrations.sglang.launch_server`` (SGLang's own HTTP
server; replay on only for ``replay-*``) on a model folder of ``models.py`` with ``--load-format
dummy`` and, by default, ``seeded_weights.py``'s values in place of SGLang's dummy ones (the same in every
variant; SGLang's own give flat logits, tokens that hardly depend on the prompt) and ``--skip-tokenizer-init``,
waits for it, sends the same requests to ``/generate``, and stops it. The requests:

- ``single``: one request alone (batch 1);
- ``wave``: ``--requests`` requests at once, prompts of 5 to 400 tokens and 17 to 90 new tokens each,
  more of them than ``--max-running-requests``: requests finish at different steps and queued ones take
  their slots, so flushes fall at different steps of different rows and slots are reused;
- ``prefix``: ``--prefix-groups`` groups of ``--prefix-requests`` requests whose prompts share a
  ``--prefix-len``-token prefix, 40 new tokens each, sent one at a time twice: first each with the
  radix cache emptied before it (``/flush_cache``: the cache off), then all in a row from an empty
  cache, so that every request after a group's first may start from the cached prefix. Per variant,
  the requests that did (SGLang's ``cached_tokens`` > 0) are compared with themselves with the cache
  off: the cached prefix's state must give the tokens the whole prompt gives.

Every request is greedy (temperature 0) with ``ignore_eos`` and returns its tokens' logprobs. Written to
``DIR/server-<model>.json`` (rewritten as each server finishes): per variant and request the output ids
and logprobs; per variant against the first one the requests whose tokens are identical, the first
differing position and the mean and largest logprob difference over the tokens both produced. Server
logs go to ``DIR/servers.log``, one server's after another.

``--parallel N`` runs up to N servers at once on one GPU (ports ``--port``, ``--port`` + 1, ...), the
(model, variant) pairs taken round-robin over the models; this checks tokens, not speed. Every server
gets explicit pool sizes (``--max-total-tokens``, ``--max-mamba-cache-size``), so what one takes does
not depend on what the others hold when it measures free memory. ``--deadline S`` stops starting
servers, and stops running ones, S seconds after the start; what finished is written.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import pathlib
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import models  # noqa: E402
import seeded_weights  # noqa: E402

SEEDED_INIT = pathlib.Path(__file__).resolve().parent / "seeded_init"

VARIANTS = {
    "sglang": [],
    # the same server again: how far two runs of SGLang's own path differ (the floor of every comparison)
    "sglang-repeat": [],
    # SGLang's own replay (GDN / KDA decode; it requires the triton decode backend and no_buffer)
    "sglang-replay": ["--enable-linear-replayssm"],
    "replay-fp32": ["--replay-ssm"],
    "replay-fp8": ["--replay-ssm", "--replay-read-format", "fp8"],
    "replay-nvfp4": ["--replay-ssm", "--replay-read-format", "nvfp4"],
    "replay-fp16sr-nvfp4": ["--replay-ssm", "--replay-checkpoint-dtype", "float16_sr", "--replay-read-format", "nvfp4"],
    # window 2: a flush every other token, and the checkpoint carries all but the last token or two
    # (SGLang's dummy weights decay a state by about half a token, so at window 16 the checkpoint's
    # share of an output is about 2^-16 and the ring's tokens decide it)
    "replay-fp32-w2": ["--replay-ssm", "--replay-window", "2"],
    "replay-nvfp4-w2": ["--replay-ssm", "--replay-window", "2", "--replay-read-format", "nvfp4"],
    "replay-fp8-w2": ["--replay-ssm", "--replay-window", "2", "--replay-read-format", "fp8"],
}
# variants only some families can serve (the others serve every family)
SERVES = {"sglang-replay": ("gdn", "kda")}


def serves(variant: str, model: str) -> bool:
    """Whether ``variant`` can serve ``model``'s family (SGLang's own replay has no Mamba-2 path)."""
    return models.FAMILIES[model] in SERVES.get(variant, (models.FAMILIES[model],))


# SSM state slots SGLang 0.5.17 reserves per running request under the radix cache (its
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO): with fewer it caps --max-running-requests below the load
SLOTS_PER_REQUEST = 3
# and under extra_buffer its ping-pong track slots more (with 3 per request and the overlap scheduler,
# SGLang 0.5.17 capped a 776-slot pool at 155 running requests: "5 state slots per request")
EXTRA_BUFFER_SLOTS = 2


def slots_per_request(strategy: str) -> int:
    """State slots a server under radix ``strategy`` needs per running request."""
    return SLOTS_PER_REQUEST + EXTRA_BUFFER_SLOTS * (strategy == "extra_buffer")


# the attention kernels of the models' full-attention layers (the kit has no FA3): SGLang 0.5.17 refuses
# its triton backend for NemotronH, whose first layer is not an attention layer, and its torch_native
# backend fails in NemotronH's warm-up, so NemotronH runs FlashInfer's (compiled on first use)
ATTENTION = {"mamba2": "flashinfer", "gdn": "triton", "kda": "triton"}


# every server's context length, in tokens
CONTEXT_LENGTH = 2048


def launcher_command(variant: str) -> list[str]:
    """The launcher and ``variant``'s flags, with SGLang's state dtype: float32 for SGLang's own
    variants; a replay variant's launcher sets the dtype its ``--replay-checkpoint-dtype`` stores
    (and refuses another)."""
    flags = VARIANTS[variant]
    dtype = [] if "--replay-ssm" in flags else ["--mamba-ssm-dtype", "float32"]
    return [sys.executable, "-m", "replayssm.integrations.sglang.launch_server", *flags, *dtype]


def server_args(model_dir: pathlib.Path, family: str, port: int, args) -> list[str]:
    """SGLang flags every variant shares (the launcher adds what replay needs)."""
    flags = ["--model-path", str(model_dir), "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1",
             "--port", str(port), "--attention-backend", ATTENTION[family], "--sampling-backend", "pytorch",
             "--mem-fraction-static", str(args.mem_fraction), "--max-running-requests", str(args.max_running_requests),
             "--max-total-tokens", str(args.max_total_tokens),
             "--max-mamba-cache-size", str(args.max_mamba_cache_size
                                           or slots_per_request(args.radix_strategy) * args.max_running_requests),
             "--cuda-graph-max-bs", str(args.max_running_requests), "--context-length", str(CONTEXT_LENGTH), "--random-seed", "0",
             "--mamba-radix-cache-strategy", args.radix_strategy, *([] if args.overlap else ["--disable-overlap-schedule"]),
             "--log-level", "warning"]
    if args.no_prefill_graph:
        flags += ["--disable-prefill-cuda-graph"]
    if family != "mamba2":
        flags += ["--linear-attn-decode-backend", "triton", "--linear-attn-verify-backend", "triton"]
    return flags + args.sglang_arg


def server_env(args) -> dict:
    """The server's environment: with ``--weights seeded``, ``seeded_init`` first on ``PYTHONPATH`` and
    the seed in ``REPLAYSSM_SEEDED_WEIGHTS`` (see ``seeded_weights.py``)."""
    env = dict(os.environ)
    env.pop(seeded_weights.ENV_VAR, None)
    if args.weights == "seeded":
        env["PYTHONPATH"] = os.pathsep.join([str(SEEDED_INIT), *filter(None, [env.get("PYTHONPATH")])])
        env[seeded_weights.ENV_VAR] = str(args.seed)
    return env


def post(port: int, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def admin(port: int, path: str, request: dict | None = None, timeout: float = 60) -> None:
    """POST ``request`` (JSON; none: an empty body) to SGLang's admin endpoint ``path``
    (``/flush_cache``, ``/freeze_gc``, ``/start_profile``); RuntimeError with the status and the start
    of the answer unless it answers 200 (SGLang refuses with 400, for example a flush while requests
    still run)."""
    data = b"" if request is None else json.dumps(request).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={} if request is None else {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, body = r.status, r.read()[:200]
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()[:200]
    if status != 200:
        raise RuntimeError(f"{path.split('?')[0]} answered {status}: {body!r}")


def flush_cache(port: int, timeout: int = 60) -> None:
    """SGLang's ``POST /flush_cache``: the server drops its radix tree (and the slots it holds), so the
    next request finds no prefix cached; SGLang waits up to ``timeout`` seconds for the requests still
    in the server to finish. RuntimeError unless it answers 200."""
    admin(port, f"/flush_cache?timeout={timeout}", timeout=timeout + 30)


def generated(out: dict) -> dict:
    """What a ``/generate`` answer is compared by: its tokens, their logprobs and the prompt tokens the
    server took from its radix cache."""
    meta = out["meta_info"]
    return dict(output_ids=out["output_ids"], logprobs=[t[0] for t in meta["output_token_logprobs"]],
                cached_tokens=meta.get("cached_tokens", 0))


_ERROR_LINE = re.compile(r"^\s*[A-Za-z_.]*(?:Error|Exception): .+$", re.M)


def server_error(text: str) -> str | None:
    """The last exception line (``ValueError: ...``) in a server's log ``text``, or None."""
    found = _ERROR_LINE.findall(text)
    return found[-1].strip()[:400] if found else None


def wait_ready(proc: subprocess.Popen, port: int, timeout: float, log_path: str | None = None,
               log_start: int = 0) -> None:
    """Return once the server answers ``/health_generate``; a server that exits first raises with the
    last exception line of its log (``log_path`` from byte ``log_start``)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            why = None
            if log_path is not None:
                with open(log_path, "rb") as f:
                    f.seek(log_start)
                    why = server_error(f.read().decode(errors="replace"))
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready"
                               + (f" ({why})" if why else ""))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


def requests_for(vocab: int, n: int, seed: int, prefix_groups: int = 0, prefix_len: int = 600,
                 prefix_requests: int = 3) -> dict[str, list[dict]]:
    """The requests of every wave (module docstring); ``prefix`` only with ``prefix_groups``."""
    rng = random.Random(seed)

    def ids(length: int) -> list[int]:
        return [rng.randrange(100, vocab - 100) for _ in range(length)]

    def one(prompt: list[int], new: int) -> dict:
        return dict(input_ids=prompt, return_logprob=True,
                    sampling_params=dict(temperature=0.0, max_new_tokens=new, ignore_eos=True))

    out = dict(single=[one(ids(37), 80)], wave=[one(ids(rng.randint(5, 400)), rng.randint(17, 90)) for _ in range(n)])
    if prefix_groups:
        prefixes = [ids(prefix_len) for _ in range(prefix_groups)]
        out["prefix"] = [one(p + ids(rng.randint(16, 48)), 40) for p in prefixes for _ in range(prefix_requests)]
    return out


# the servers this process has started and not yet stopped (ended on SIGTERM, see stop_on_sigterm)
LIVE: set[subprocess.Popen] = set()


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def launch(cmd: list[str], port: int, log, env: dict) -> subprocess.Popen:
    """Start a server (``cmd``, in its own process group, output to ``log``) that will listen on
    ``port``; refused if something already listens there (a server left running would answer the
    readiness check and the requests in this one's place)."""
    if not port_free(port):
        raise RuntimeError(f"port {port} is in use: another server listens there; stop it or pick another --port")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    LIVE.add(proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    """End a server started in its own process group: SIGTERM to the group, SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    LIVE.discard(proc)


def stop_on_sigterm() -> None:
    """On SIGTERM (``timeout``, a job's end) stop every live server, then exit with 143: a server
    started in its own process group would otherwise outlive this process and hold its port and GPU."""
    def handler(signum, frame):
        for proc in list(LIVE):
            stop(proc)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


class Deadline:
    """Seconds left before ``--deadline`` (unbounded without one)."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.time() + seconds

    def left(self, cap: float) -> float:
        return cap if self.end is None else max(0.0, min(cap, self.end - time.time()))


def run_variant(name: str, model: str, model_dir: pathlib.Path, reqs: dict, args, port: int, log,
                deadline: Deadline) -> dict:
    """Start one server, send ``reqs`` wave after wave, stop it; server output goes to ``log``."""
    family = models.FAMILIES[model]
    cmd = [*launcher_command(name), *server_args(model_dir, family, port, args)]
    result = dict(command=cmd)
    if deadline.left(60) < 60:
        result["error"] = "not started: the deadline is less than a minute away"
        print(f"  {model} {name}: {result['error']}", flush=True)
        return result
    log.write(f"\n===== {model} {name}: {' '.join(cmd)}\n")
    log.flush()
    server_start = os.path.getsize(log.name)
    t0 = time.time()
    print(f"  {model} {name}: starting on port {port}", flush=True)
    proc = None
    try:
        proc = launch(cmd, port, log, server_env(args))
        wait_ready(proc, port, deadline.left(args.start_timeout), log.name, server_start)
        result["start_s"] = round(time.time() - t0, 1)
        print(f"  {model} {name}: ready in {result['start_s']} s", flush=True)
        for wave, items in reqs.items():
            t1 = time.time()
            if wave == "prefix":                # one at a time: the cache off, then from an empty cache
                cold = []
                for p in items:
                    flush_cache(port)
                    cold.append(generated(post(port, p, timeout=max(1.0, deadline.left(600)))))
                flush_cache(port)
                result["prefix_cache_off"] = cold
                outs = [post(port, p, timeout=max(1.0, deadline.left(600))) for p in items]
            else:
                with concurrent.futures.ThreadPoolExecutor(max_workers=len(items)) as ex:
                    outs = list(ex.map(lambda p: post(port, p, timeout=max(1.0, deadline.left(600))), items))
            result[wave] = [generated(o) for o in outs]
            result[f"{wave}_s"] = round(time.time() - t1, 2)
            print(f"  {model} {name}: {wave} ({len(items)} requests) in {result[f'{wave}_s']} s", flush=True)
    except Exception as e:                      # noqa: BLE001 - recorded and printed; the next variant runs
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"  {model} {name}: FAILED {result['error']}", flush=True)
    finally:
        if proc is not None:
            stop(proc)
    return result


def jobs_in_order(model_names: list[str], variants: list[str]) -> list[tuple[str, str]]:
    """(model, variant) pairs, round-robin over the models: the first variant of every model, then the
    second, ... (so servers running at once are of different models); a variant a model's family
    cannot serve is left out."""
    return [(m, v) for v in variants for m in model_names if serves(v, m)]


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 values at ``x`` (8 significant bits): what one rounding step of a bf16
    logit moves its logprob by, at most."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def compare(ref: dict, got: dict) -> dict:
    """Token agreement and logprob difference of ``got`` against ``ref``, per wave: the requests whose
    tokens are identical, the first differing position of each other one, and over the tokens both
    produced before that position the mean and largest logprob difference and the share of tokens
    within one bf16 step of ``ref``'s logprob."""
    out = {}
    for wave in ("single", "wave", "prefix"):
        if wave not in ref or wave not in got:
            continue
        same, first_diff, diffs, steps = 0, [], [], []
        for a, b in zip(ref[wave], got[wave]):
            n = next((i for i, (x, y) in enumerate(zip(a["output_ids"], b["output_ids"])) if x != y), None)
            if n is None and len(a["output_ids"]) == len(b["output_ids"]):
                same += 1
            else:
                first_diff.append(n)
            common = n if n is not None else len(a["output_ids"])
            for x, y in zip(a["logprobs"][:common], b["logprobs"][:common]):
                diffs.append(abs(x - y))
                steps.append(abs(x - y) / bf16_ulp(x))
        out[wave] = dict(requests=len(ref[wave]), identical=same, first_difference_at=first_diff,
                         tokens_compared=len(diffs), logprob_diff_mean=sum(diffs) / max(len(diffs), 1),
                         logprob_diff_max=max(diffs, default=0.0),
                         within_one_bf16_step=sum(d <= 1.0 for d in steps) / max(len(steps), 1))
    return out


def prefix_cache(result: dict) -> dict | None:
    """One variant's cached-prefix requests against themselves with the cache off (``compare``'s
    fields over the requests that took cached tokens, with those counts), or None without a prefix wave."""
    if "prefix" not in result or "prefix_cache_off" not in result:
        return None
    hits = [i for i, r in enumerate(result["prefix"]) if r.get("cached_tokens", 0) > 0]
    row = compare(dict(prefix=[result["prefix_cache_off"][i] for i in hits]),
                  dict(prefix=[result["prefix"][i] for i in hits]))["prefix"]       # no hits: a row of zeros
    return dict(row, requests_sent=len(result["prefix"]),
                cached_tokens=[result["prefix"][i]["cached_tokens"] for i in hits])


def prefix_table(paths: list[pathlib.Path]) -> str:
    """A markdown table of the prefix wave of ``server-<model>.json`` files, or "" when none has one:
    per model and variant, its cached-prefix requests against the same requests with the cache off."""
    rows = []
    for path in paths:
        data = json.loads(path.read_text())
        for name, result in data["results"].items():
            c = prefix_cache(result)
            if c is None:
                continue
            cached = sorted(c["cached_tokens"])
            first = [x for x in c["first_difference_at"] if x is not None]
            rows.append(f"| {data['model']} | {name} | {c['requests']}/{c['requests_sent']} | "
                        f"{cached[len(cached) // 2] if cached else '–'} | {c['identical']}/{c['requests']} | "
                        f"{min(first) if first else '–'} | {c['logprob_diff_mean']:.3f} / {c['logprob_diff_max']:.3f} |")
    if not rows:
        return ""
    return "\n".join(["| model | variant | requests from a cached prefix | median cached tokens | identical to the "
                      "cache off | earliest difference | logprob diff mean / max |", "|---|---|---|---|---|---|---|",
                      *rows])


def table(paths: list[pathlib.Path]) -> str:
    """A markdown table of ``server-<model>.json`` files: per model and variant, against the first
    variant, batch 1 and the concurrent wave."""
    rows = ["| model | variant | batch 1: first difference | wave: identical | wave: median first difference | "
            "tokens compared | logprob diff mean / max | within one bf16 step |", "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads(path.read_text())
        names = list(data["results"])
        ref = data["results"][names[0]]
        for name in names[1:]:
            c = compare(ref, data["results"][name])
            if "wave" not in c:
                rows.append(f"| {data['model']} | {name} | {data['results'][name].get('error', 'not run')} |"
                            " | | | | |")
                continue
            one, w = c["single"], c["wave"]
            first = [x for x in w["first_difference_at"] if x is not None]
            median = sorted(first)[len(first) // 2] if first else "–"
            at = "identical" if one["identical"] else f"token {one['first_difference_at'][0]}"
            rows.append(f"| {data['model']} | {name} | {at} | {w['identical']}/{w['requests']} | {median} | "
                        f"{w['tokens_compared']} | {w['logprob_diff_mean']:.3f} / {w['logprob_diff_max']:.3f} | "
                        f"{100 * w['within_one_bf16_step']:.0f} % |")
    return "\n".join(rows)


def tree_commit(folder: pathlib.Path) -> str:
    """The short commit of the git tree holding ``folder``, with ``-modified`` when tracked files differ
    from it (a copied tree whose ``.git`` is older than its files), or ``unknown``; ``REPLAYSSM_COMMIT``
    in the environment names the commit instead."""
    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=folder, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no")
    return head if changed == "" else f"{head}-modified"


def run_meta(args) -> dict:
    """Where and with what a run ran: date, GPU, package versions, the tree's commit, the weights."""
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "absent"

    commit = os.environ.get("REPLAYSSM_COMMIT") or tree_commit(pathlib.Path(__file__).parent)
    return dict(date=time.strftime("%Y-%m-%d", time.gmtime()), commit=commit,
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
                weights=f"{args.weights} (seed {args.seed})",
                **{d: version(d) for d in ("sglang", "sglang-kernel", "torch", "triton", "transformers", "replayssm")})


def write_model(out: pathlib.Path, model: str, variants: list[str], results: dict, meta: dict) -> None:
    """``out/server-<model>.json`` from the variants finished so far (compared with the first)."""
    ref = results.get(variants[0], {})
    summary = {name: compare(ref, r) for name, r in results.items() if name != variants[0]}
    for name, r in results.items():
        cache = prefix_cache(r)
        if cache is not None:
            summary.setdefault(name, {})["prefix_cache"] = cache
    (out / f"server-{model}.json").write_text(json.dumps(dict(model=model, meta=meta, config=models.CONFIGS[model],
                                                              results=results, summary=summary)) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(models.CONFIGS), choices=list(models.CONFIGS))
    ap.add_argument("--variants", nargs="+", default=["sglang", "replay-fp32", "replay-nvfp4"], choices=list(VARIANTS),
                    help="the first is the reference the others are compared with")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "build/server")))
    ap.add_argument("--models-dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "replayssm-models",
                    help="where the model folders (config.json each) are written")
    ap.add_argument("--port", type=int, default=30817)
    ap.add_argument("--requests", type=int, default=40, help="requests in the concurrent wave")
    ap.add_argument("--prefix-groups", type=int, default=2,
                    help="groups of the prefix wave (0: no prefix wave); see the module docstring")
    ap.add_argument("--prefix-requests", type=int, default=3, help="prefix wave: requests per group")
    ap.add_argument("--prefix-len", type=int, default=600, help="prefix wave: tokens every request of a group shares")
    ap.add_argument("--max-running-requests", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, default=65536, help="each server's KV pool, in tokens")
    ap.add_argument("--max-mamba-cache-size", type=int, default=None,
                    help="each server's SSM state slots (default: 3 x --max-running-requests, 5 x with extra_buffer, "
                         "whose two ping-pong track slots a request takes too)")
    ap.add_argument("--mem-fraction", type=float, default=0.9)
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--parallel", type=int, default=1, help="servers running at once")
    ap.add_argument("--deadline", type=float, default=None, help="seconds after which nothing more runs")
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed (and the prompts')")
    ap.add_argument("--weights", choices=["seeded", "sglang-dummy"], default="seeded",
                    help="seeded: seeded_weights.py's (a trained model's scale); sglang-dummy: SGLang's own "
                         "dummy values (flat logits: tokens that hardly depend on the prompt)")
    ap.add_argument("--no-prefill-graph", action="store_true",
                    help="every variant without SGLang's prefill CUDA graph (starts faster; decode graphs stay)")
    ap.add_argument("--radix-strategy", choices=["no_buffer", "extra_buffer"], default="no_buffer",
                    help="every server's mamba radix cache strategy (SGLang's own replay serves no_buffer only)")
    ap.add_argument("--overlap", action="store_true",
                    help="keep SGLang's overlap scheduler on (extra_buffer only: no_buffer needs it off)")
    ap.add_argument("--sglang-arg", action="append", default=[], help="one more SGLang flag or value (repeatable)")
    ap.add_argument("--table", nargs="+", type=pathlib.Path, metavar="JSON",
                    help="print the markdown table of these server-<model>.json files and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        extra = prefix_table(args.table)
        if extra:
            print("\n" + extra)
        return 0
    if args.overlap and args.radix_strategy != "extra_buffer":
        ap.error(f"--overlap: SGLang runs its overlap scheduler with extra_buffer only, got --radix-strategy "
                 f"{args.radix_strategy}")
    if args.prefix_groups < 0:
        ap.error(f"--prefix-groups: expected 0 or more, got {args.prefix_groups}")
    if args.prefix_groups and args.prefix_requests < 2:
        ap.error(f"--prefix-requests: expected at least 2 (a group's first request fills the cache), "
                 f"got {args.prefix_requests}")
    if args.prefix_groups and not 1 <= args.prefix_len <= CONTEXT_LENGTH - 48 - 40:
        ap.error(f"--prefix-len: expected 1 to {CONTEXT_LENGTH - 48 - 40} (the servers' context is {CONTEXT_LENGTH} "
                 f"tokens, questions up to 48 and 40 new), got {args.prefix_len}")
    if args.parallel < 1:
        ap.error(f"--parallel: expected at least 1, got {args.parallel}")
    args.out.mkdir(parents=True, exist_ok=True)
    stop_on_sigterm()
    deadline = Deadline(args.deadline)
    model_dirs = {m: models.write(args.models_dir, m) for m in args.models}
    reqs = {m: requests_for(models.CONFIGS[m]["vocab_size"], args.requests, args.seed, args.prefix_groups,
                            args.prefix_len, args.prefix_requests) for m in args.models}
    results: dict[str, dict] = {m: {} for m in args.models}
    jobs = jobs_in_order(args.models, args.variants)
    meta = run_meta(args)
    lock = threading.Lock()
    ports: queue.Queue = queue.Queue()
    for k in range(args.parallel):              # spaced out: SGLang takes a few ports after its own
        ports.put(args.port + 37 * k)

    def one(model: str, name: str) -> dict:
        port = ports.get()
        try:
            with tempfile.TemporaryFile("w+") as log:
                r = run_variant(name, model, model_dirs[model], reqs[model], args, port, log, deadline)
                log.seek(0)
                logged = log.read()
        finally:
            ports.put(port)
        with lock:
            with (args.out / "servers.log").open("a") as all_logs:
                all_logs.write(logged)
            results[model][name] = r
            write_model(args.out, model, args.variants, {v: results[model][v] for v in args.variants
                                                         if v in results[model]}, meta)
        return r

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as ex:
        done = list(ex.map(lambda job: one(*job), jobs))
    for model in args.models:
        s = json.loads((args.out / f"server-{model}.json").read_text())["summary"]
        for name, by_wave in s.items():
            for wave, row in by_wave.items():
                if wave == "prefix_cache":
                    wave = "cached"              # against itself with the cache off
                print(f"{model:14s} {name:20s} {wave:6s} identical {row['identical']}/{row['requests']}  "
                      f"logprob diff mean {row['logprob_diff_mean']:.2e} max {row['logprob_diff_max']:.2e}  "
                      f"first differences {row['first_difference_at'][:8]}", flush=True)
    return 1 if any("error" in r for r in done) else 0


if __name__ == "__main__":
    sys.exit(main())
