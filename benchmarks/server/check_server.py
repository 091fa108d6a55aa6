"""Serve token-id prompts through real SGLang servers, one variant after another, and compare the
greedy tokens of replay against SGLang's conventional path.

    python benchmarks/server/check_server.py --models nemotron-h-8b --variants sglang replay-fp32 --out DIR

Each variant starts ``python -m replayssm.integrations.sglang.launch_server`` (SGLang's own HTTP
server; replay on only for ``replay-*``) on a model folder of ``models.py`` with ``--load-format
dummy`` (SGLang's seeded dummy weights: the same in every variant) and ``--skip-tokenizer-init``,
waits for it, sends the same requests to ``/generate``, and stops it. The requests:

- ``single``: one request alone (batch 1);
- ``wave``: ``--requests`` requests at once, prompts of 5 to 400 tokens and 17 to 90 new tokens each,
  more of them than ``--max-running-requests``: requests finish at different steps and queued ones take
  their slots, so flushes fall at different steps of different rows and slots are reused.

Every request is greedy (temperature 0) with ``ignore_eos`` and returns its tokens' logprobs. Written to
``DIR/server-<model>.json``: per variant and request the output ids and logprobs; per variant against
the first one the requests whose tokens are identical, the first differing position and the mean and
largest logprob difference over the tokens both produced. Server logs go to ``DIR/servers.log``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import models  # noqa: E402

VARIANTS = {
    "sglang": [],
    "replay-fp32": ["--replay-ssm"],
    "replay-fp8": ["--replay-ssm", "--replay-read-format", "fp8"],
    "replay-nvfp4": ["--replay-ssm", "--replay-read-format", "nvfp4"],
    "replay-fp16sr-nvfp4": ["--replay-ssm", "--replay-checkpoint-dtype", "float16_sr", "--replay-read-format", "nvfp4"],
    # window 2: a flush every other token, and the checkpoint carries all but the last token or two
    # (SGLang's dummy weights decay a state by about half a token, so at window 16 the checkpoint's
    # share of an output is about 2^-16 and the ring's tokens decide it)
    "replay-fp32-w2": ["--replay-ssm", "--replay-window", "2"],
    "replay-nvfp4-w2": ["--replay-ssm", "--replay-window", "2", "--replay-read-format", "nvfp4"],
}


# the attention kernels of the models' full-attention layers (the kit has no FA3): SGLang 0.5.17 refuses
# its triton backend for NemotronH, whose first layer is not an attention layer, and its torch_native
# backend fails in NemotronH's warm-up, so NemotronH runs FlashInfer's (compiled on first use)
ATTENTION = {"mamba2": "flashinfer", "gdn": "triton", "kda": "triton"}


def server_args(model_dir: pathlib.Path, family: str, port: int, args) -> list[str]:
    """SGLang flags every variant shares (the launcher adds what replay needs)."""
    flags = ["--model-path", str(model_dir), "--load-format", "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1",
             "--port", str(port), "--attention-backend", ATTENTION[family], "--sampling-backend", "pytorch",
             "--mem-fraction-static", str(args.mem_fraction), "--max-running-requests", str(args.max_running_requests),
             "--cuda-graph-max-bs", str(args.max_running_requests), "--context-length", "2048", "--random-seed", "0",
             "--mamba-ssm-dtype", "float32", "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
             "--log-level", "warning"]
    if args.no_prefill_graph:
        flags += ["--disable-prefill-cuda-graph"]
    if family != "mamba2":
        flags += ["--linear-attn-decode-backend", "triton", "--linear-attn-verify-backend", "triton"]
    return flags + args.sglang_arg


def post(port: int, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(proc: subprocess.Popen, port: int, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


def requests_for(vocab: int, n: int, seed: int) -> dict[str, list[dict]]:
    rng = random.Random(seed)

    def one(prompt_len: int, new: int) -> dict:
        return dict(input_ids=[rng.randrange(100, vocab - 100) for _ in range(prompt_len)], return_logprob=True,
                    sampling_params=dict(temperature=0.0, max_new_tokens=new, ignore_eos=True))

    return dict(single=[one(37, 80)], wave=[one(rng.randint(5, 400), rng.randint(17, 90)) for _ in range(n)])


def run_variant(name: str, model: str, model_dir: pathlib.Path, reqs: dict, args, log) -> dict:
    family = models.FAMILIES[model]
    cmd = [sys.executable, "-m", "replayssm.integrations.sglang.launch_server", *VARIANTS[name],
           *server_args(model_dir, family, args.port, args)]
    log.write(f"\n===== {model} {name}: {' '.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    result = dict(command=cmd)
    try:
        wait_ready(proc, args.port, args.start_timeout)
        result["start_s"] = round(time.time() - t0, 1)
        print(f"  {model} {name}: ready in {result['start_s']} s", flush=True)
        for wave, items in reqs.items():
            t1 = time.time()
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(items)) as ex:
                outs = list(ex.map(lambda p: post(args.port, p), items))
            result[wave] = [dict(output_ids=o["output_ids"],
                                 logprobs=[t[0] for t in o["meta_info"]["output_token_logprobs"]]) for o in outs]
            result[f"{wave}_s"] = round(time.time() - t1, 2)
            print(f"  {model} {name}: {wave} ({len(items)} requests) in {result[f'{wave}_s']} s", flush=True)
    except Exception as e:                      # noqa: BLE001 - recorded and printed; the next variant runs
        result["error"] = f"{type(e).__name__}: {e}"
        print(f"  {model} {name}: FAILED {result['error']}", flush=True)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return result


def compare(ref: dict, got: dict) -> dict:
    """Token agreement and logprob difference of ``got`` against ``ref``, per wave."""
    out = {}
    for wave in ("single", "wave"):
        if wave not in ref or wave not in got:
            continue
        same, first_diff, diffs = 0, [], []
        for a, b in zip(ref[wave], got[wave]):
            n = next((i for i, (x, y) in enumerate(zip(a["output_ids"], b["output_ids"])) if x != y), None)
            if n is None and len(a["output_ids"]) == len(b["output_ids"]):
                same += 1
            else:
                first_diff.append(n)
            common = n if n is not None else len(a["output_ids"])
            diffs += [abs(x - y) for x, y in zip(a["logprobs"][:common], b["logprobs"][:common])]
        out[wave] = dict(requests=len(ref[wave]), identical=same, first_difference_at=first_diff,
                         tokens_compared=len(diffs), logprob_diff_mean=sum(diffs) / max(len(diffs), 1),
                         logprob_diff_max=max(diffs, default=0.0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(models.CONFIGS), choices=list(models.CONFIGS))
    ap.add_argument("--variants", nargs="+", default=["sglang", "replay-fp32", "replay-nvfp4"], choices=list(VARIANTS),
                    help="the first is the reference the others are compared with")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "build/server")))
    ap.add_argument("--port", type=int, default=30817)
    ap.add_argument("--requests", type=int, default=40, help="requests in the concurrent wave")
    ap.add_argument("--max-running-requests", type=int, default=16)
    ap.add_argument("--mem-fraction", type=float, default=0.8)
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-prefill-graph", action="store_true",
                    help="every variant without SGLang's prefill CUDA graph (starts faster; decode graphs stay)")
    ap.add_argument("--sglang-arg", action="append", default=[], help="one more SGLang flag or value (repeatable)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    with (args.out / "servers.log").open("a") as log:
        for model in args.models:
            model_dir = models.write(args.out / "models", model)
            reqs = requests_for(models.CONFIGS[model]["vocab_size"], args.requests, args.seed)
            results = {}
            for name in args.variants:
                results[name] = run_variant(name, model, model_dir, reqs, args, log)
                failed |= "error" in results[name]
            ref = results[args.variants[0]]
            summary = {name: compare(ref, r) for name, r in results.items() if name != args.variants[0]}
            (args.out / f"server-{model}.json").write_text(json.dumps(dict(model=model, config=models.CONFIGS[model],
                                                                           results=results, summary=summary)) + "\n")
            for name, s in summary.items():
                for wave, row in s.items():
                    print(f"{model:14s} {name:20s} {wave:6s} identical {row['identical']}/{row['requests']}  "
                          f"logprob diff mean {row['logprob_diff_mean']:.2e} max {row['logprob_diff_max']:.2e}  "
                          f"first differences {row['first_difference_at'][:8]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
