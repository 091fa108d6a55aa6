"""Serving throughput of real SGLang servers, replay against SGLang's own paths, measured with SGLang's
own benchmark client (``python -m sglang.benchmark.serving``).

    python benchmarks/server/bench_serving.py --models nemotron-h-8b --variants sglang replay-fp32 replay-nvfp4 \
        --concurrency 1 64 256 --out DIR

For each model, each variant's server is started in turn (``launch_server``, the same flags and
seeded weights in every variant, ``check_server.py``'s model folders and weights), warmed up, driven
at each concurrency by the client with random token-id prompts (``--dataset-name random-ids
--tokenize-prompt``: ``--input-len`` tokens in, ``--output-len`` out, ``ignore_eos``) and stopped.
``--request-rate R`` sends the requests as Poisson arrivals at R per second instead of all at once,
so their rings flush at different steps as in serving. Only one server runs at a time, so each has
the GPU to itself. The model folder gets a word-level tokenizer of the model's vocabulary (``t0 t1
...``) so that the client and the server have one.

``--speculative mtp`` serves every variant with speculative decoding, the model's MTP layer drafting a
chain of ``--draft-tokens`` (SGLang's ``NEXTN``, topk 1; Qwen3.5 and Qwen3-Next, whose folders then
declare the layer), SGLang's own replay with its replay verify (``--enable-linear-replayssm-spec``);
the rows carry the client's acceptance length, arbitrary under random weights, so variants are
compared at the acceptance they measured.

By default every server runs what SGLang itself picks for these models: the ``extra_buffer`` radix
strategy with the overlap scheduler on (the scheduler prepares the next batch while the GPU runs the
current one). ``--radix-strategies`` names others (``no_buffer`` runs without the overlap scheduler,
as SGLang requires) and ``--no-overlap`` turns the scheduler off everywhere; SGLang's own replay,
which serves ``no_buffer`` only, runs there whatever ``--radix-strategies`` asks. The rows record both.

``--max-concurrency VARIANT=N`` runs a variant's loads only up to N concurrent requests, its server sized
for them: a variant whose state does not fit the largest load (SGLang's fp32 Nemotron-H state under
``extra_buffer`` at 256 requests) is measured at the largest one it fits, beside the others.

``--workload prefix`` instead sends ``--groups`` groups of ``--prompts-per-group`` requests that
share a ``--prefix-len``-token prefix (the client's ``generated-shared-prefix`` dataset, with its
cache report), for each radix strategy of ``--radix-strategies``. Each of its loads starts with SGLang's
``/flush_cache``, so that every load of ``--repeat`` finds the radix tree empty, as the first one does
(its rows carry ``cache_flushed``).

Written to ``DIR/serving-<model>.json`` (``serving-<model>-mtp.json`` with ``--speculative mtp``): one
row per (variant, radix strategy, concurrency) with output tokens/s, median and p99 inter-token
latency and time to first token, mean time per output token, median request latency, the client's
cache hit rate where reported, the server's own prefill and decode rates during the load (with
``--server-log-level info``; see ``server_rates``), the
connections the host's kernel dropped during the load because a listen queue was full
(``listen_overflows``, with the host's ``somaxconn``: the client's retry of such a connection
waits a second or more), the garbage collections longer than 50 ms in the server's HTTP process
during the load (``long_collections``: each holds every request that process serves), and the
run's versions; ``DIR/serving.png`` plots tokens/s against
concurrency per model; server logs go to ``DIR/servers.log``. A variant a model's family cannot
serve (SGLang's own replay on Mamba-2) is skipped, and a server that fails is recorded with its
error.

``--profile-steps N`` (with ``--server-log-level info``) profiles N decode steps of the first load at the
largest concurrency once all its requests run (SGLang's ``/start_profile``, GPU kernels only) and adds
to its row the kernels' time per step by group (``profile_trace.py``); ``--profile-prefill N`` profiles N
prefill batches of that load the same way (``profile_prefill`` in its row), started once the server
logs a prefill batch with at least half the load's requests still queued, so that more full batches
follow (under ``--workload prefix``, whose requests arrive a few per batch without a queue, once it logs
a prefill batch that reuses cached tokens with a quarter of the load running). The profiler's own cost
falls on that load's figures; the server's rates leave out the profiled batches. ``--profile-host``
records these profiles with CPU activity and Python stacks too, and adds to each profiled phase's
summary (``host``) where the scheduler's host time went (``profile_trace.summarize_host``).

``--freeze-gc`` freezes each server's garbage collector once it is ready (SGLang's ``/freeze_gc``,
what SGLang advises after warm-up): without it a full collection in the server's HTTP process
(SGLang 0.5.23's imports alone leave some 730,000 objects to walk: half a second on a slow CPU)
can fall inside a load and hold every arriving request.

``--both-orders`` runs the variants once more in the reverse order, each server started afresh: a
server's place in a run can favor it (the shared-prefix runs in BENCHMARKS.md). In the geometric mean
of the two rounds' ratios, which ``--table`` gives, a factor that a server's place within its round
puts on its figures cancels; a cost that only the run's first server or first load pays does not, and
the second loads of ``--repeat 2`` leave it out. ``--reverse-round`` runs the second round alone, so
that a both-orders run can be split in two (its files joined with ``--merge``).

``--table JSON...`` prints the rows as markdown with their ratios to SGLang's and SGLang's replay's;
``--merge JSON... --merged FILE`` joins several runs of one model into one file (each row keeps its
run's versions and commit).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_server  # noqa: E402
import models  # noqa: E402
import profile_trace  # noqa: E402

VARIANTS = {
    "sglang": [],
    # SGLang's own replay (GDN / KDA decode; it requires the triton decode backend and no_buffer)
    "sglang-replay": ["--enable-linear-replayssm"],
    "replay-fp32": ["--replay-ssm"],
    "replay-nvfp4": ["--replay-ssm", "--replay-read-format", "nvfp4"],
    "replay-fp16sr-nvfp4": ["--replay-ssm", "--replay-checkpoint-dtype", "float16_sr", "--replay-read-format", "nvfp4"],
}
ROW_KEYS = ("output_throughput", "median_itl_ms", "p99_itl_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "median_e2e_latency_ms", "completed", "duration", "total_output_tokens", "accept_length")
# with --speculative mtp, a variant's flag replaced by its speculative form: SGLang's own replay verifies
# with its replay spec path (without it SGLang's recurrent verify keeps a snapshot per draft token);
# SGLang refuses the two flags together (they drive one ring with different cursor protocols)
SPEC_VARIANT = {"sglang-replay": {"--enable-linear-replayssm": "--enable-linear-replayssm-spec"}}


def schedule(variant: str, strategy: str, overlap: bool) -> tuple[str, bool]:
    """``(radix strategy, overlap scheduler on)`` a variant's server runs when ``strategy`` and
    ``--overlap`` are asked for: SGLang's own replay serves no_buffer only, and no_buffer runs without
    the overlap scheduler (SGLang refuses both otherwise)."""
    if variant == "sglang-replay":
        strategy = "no_buffer"
    return strategy, overlap and strategy == "extra_buffer"


def write_tokenizer(folder: pathlib.Path, vocab_size: int) -> None:
    """A word-level tokenizer of ``vocab_size`` tokens ``t0 ... t{vocab_size-1}`` in ``folder``
    (``tokenizer.json`` and ``tokenizer_config.json``): id ``i`` decodes to ``t{i}`` and a text of such
    words encodes back to the same ids."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    tok = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", model_max_length=32768, unk_token="t0", pad_token="t0")) + "\n")


# a garbage collection in the server's HTTP process longer than this is logged (SGLang's
# --gc-warning-threshold-secs) and recorded in the load's row (``long_collections``)
LONG_GC_S = 0.05


def server_flags(model_dir: pathlib.Path, family: str, port: int, strategy: str, args, overlap: bool = False) -> list[str]:
    """SGLang flags every variant shares at one radix strategy, with SGLang's overlap scheduler on or off
    (the launcher adds what replay needs)."""
    running = max(args.concurrency)
    # decode graphs for the loads' batch sizes and the powers of two below (batches between pad up)
    graph_bs = sorted({1 << i for i in range(running.bit_length()) if 1 << i <= running} | set(args.concurrency))
    tokens = running * (args.input_len + args.output_len) + 8192
    if args.workload == "prefix":
        tokens = max(tokens, args.groups * (args.prefix_len + args.prompts_per_group * (args.question_len
                                                                                          + args.output_len)))
    flags = ["--model-path", str(model_dir), "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(port),
             "--attention-backend", check_server.ATTENTION[family], "--mem-fraction-static", str(args.mem_fraction),
             "--max-running-requests", str(running), "--cuda-graph-bs-decode", *map(str, graph_bs),
             "--max-total-tokens", str(tokens),
             "--max-mamba-cache-size", str(check_server.slots_per_request(strategy) * running + 8),
             "--context-length", str(args.prefix_len + args.question_len + args.output_len + 64
                                     if args.workload == "prefix" else args.input_len + args.output_len + 64),
             "--random-seed", "0", "--mamba-radix-cache-strategy", strategy,
             "--gc-warning-threshold-secs", str(LONG_GC_S),
             *([] if overlap else ["--disable-overlap-schedule"]), "--log-level", args.server_log_level]
    if args.no_prefill_graph:
        flags += ["--disable-prefill-cuda-graph"]
    if family != "mamba2":
        flags += ["--linear-attn-decode-backend", "triton", "--linear-attn-verify-backend", "triton"]
    if args.speculative == "mtp":               # a chain of drafts from the model's MTP layer (topk 1)
        flags += ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(args.draft_tokens - 1),
                  "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(args.draft_tokens)]
    return flags + args.sglang_arg


def server_command(variant: str, model_dir: pathlib.Path, family: str, strategy: str, args,
                   overlap: bool = False) -> list[str]:
    """The launcher command of ``variant``'s server: its flags (in their speculative form with
    ``--speculative mtp``, ``SPEC_VARIANT``) and the flags every variant shares."""
    swap = SPEC_VARIANT.get(variant, {}) if args.speculative == "mtp" else {}
    return [*(swap.get(flag, flag) for flag in check_server.launcher_command(variant)),
            *server_flags(model_dir, family, args.port, strategy, args, overlap)]


def client_command(port: int, model_dir: pathlib.Path, concurrency: int, out_file: pathlib.Path, args) -> list[str]:
    """SGLang's benchmark client at one concurrency (``--num-prompts``: ``--waves`` requests per slot),
    sending requests at ``--request-rate`` per second (Poisson arrivals; None: all at once); with
    ``--no-stream`` each request asks for its tokens in one response (the client's ``--disable-stream``)."""
    common = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host", "127.0.0.1",
              "--port", str(port), "--tokenizer", str(model_dir), "--model", str(model_dir), "--request-rate",
              "inf" if args.request_rate is None else str(args.request_rate),
              "--max-concurrency", str(concurrency), "--seed", str(args.seed), "--output-file", str(out_file),
              "--disable-tqdm", "--warmup-requests", str(min(concurrency, 8))]
    if args.no_stream:                          # each request's tokens in one response at its end
        common.append("--disable-stream")
    if args.workload == "prefix":
        return common + ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(args.groups),
                         "--gsp-prompts-per-group", str(args.prompts_per_group), "--gsp-system-prompt-len",
                         str(args.prefix_len), "--gsp-question-len", str(args.question_len), "--gsp-output-len",
                         str(args.output_len), "--gsp-range-ratio", "1.0", "--cache-report"]
    return common + ["--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len", str(args.input_len),
                     "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
                     "--num-prompts", str(max(concurrency * args.waves, 8))]


_PREFILL = re.compile(r"Prefill batch, .*#new-token: (\d+),.* input throughput \(token/s\): ([\d.]+)")
_DECODE = re.compile(r"Decode batch, #running-req: (\d+),.* gen throughput \(token/s\): ([\d.]+)")
_QUEUED = re.compile(r"Prefill batch, .*#queue-req: (\d+),")
_CACHED = re.compile(r"Prefill batch, .*#cached-token: (\d+),.*#running-req: (\d+),")
# a profiled stretch: from "Profiling starts" through the first batch line of the profiled kind after "Profiling
# done" (its interval held profiled steps); a prefill profile names its profile id ("prefill") in its first line
_PROFILED_PREFILL = re.compile(r"Profiling starts[^\n]*profile id: prefill\).*?Profiling done[^\n]*\n(?:[^\n]*\n)*?"
                               r"[^\n]*Prefill batch[^\n]*(?:\n|$)", re.S)
_PROFILED = re.compile(r"Profiling starts.*?Profiling done[^\n]*\n(?:[^\n]*\n)*?[^\n]*Decode batch[^\n]*(?:\n|$)", re.S)


def server_rates(log_text: str, concurrency: int) -> dict:
    """The server's own rates during one load, from its INFO log lines (``--server-log-level info``):
    ``prefill_tokens_per_s``, the median "input throughput" of the load's full prefill batches (those
    of the most new tokens), and ``decode_tokens_per_s``, the median "gen throughput" of its decode
    batches with all ``concurrency`` requests running but the first (whose interval reaches back into the
    prefill). Lines logged while SGLang's profiler ran (and the first line of the profiled batches' kind
    after it, whose interval held profiled steps) are left out, as is a rate with no line."""
    rates = {}
    log_text = _PROFILED.sub("", _PROFILED_PREFILL.sub("", log_text))
    prefill = [(int(n), float(x)) for n, x in _PREFILL.findall(log_text)]
    if prefill:
        full = max(n for n, _ in prefill)
        rates["prefill_tokens_per_s"] = statistics.median(x for n, x in prefill if n == full)
    decode = [float(x) for r, x in _DECODE.findall(log_text) if int(r) == concurrency][1:]
    if decode:
        rates["decode_tokens_per_s"] = statistics.median(decode)
    return rates


_LONG_GC = re.compile(r"(?:^\[([^\]\n]*)\][^\n]*?)?LONG GARBAGE COLLECTION DETECTED \| Generation (\d) \| "
                      r"Duration: ([\d.]+)s(?: \| # Objects: gen0=(\d+), gen1=(\d+), gen2=(\d+))?", re.M)


_MAX_ITL = re.compile(r"^Max ITL \(ms\):\s+([\d.]+)", re.M)


def max_itl(log_text: str) -> dict:
    """``max_itl_ms``: the longest gap between two tokens of one request in a load, from the report
    SGLang's client prints (its JSON leaves it out); {} without one. With every request sent at once it
    is mostly the first admitted requests' wait between their first and second tokens while SGLang
    prefills the others (no decode step runs between its prefill batches); a pause that stalls every
    stream (a full collection in the server's HTTP process) shows here too, not in the p99."""
    found = _MAX_ITL.findall(log_text)
    return {"max_itl_ms": float(found[-1])} if found else {}


def long_collections(log_text: str, concurrency: int) -> list[dict]:
    """The garbage collections longer than ``LONG_GC_S`` the server's HTTP process logged (SGLang's
    long-collection warning), in log order: each ``{"generation", "s", "objects", "at", "during_decode"}``:
    its duration, the objects the collector tracked after it (None where the line does not say), the
    line's time stamp (None without one), and whether the scheduler had logged a decode batch with all
    ``concurrency`` requests running before it (False: it fell while the requests arrived or were
    prefilled, when no token streams)."""
    return [dict(generation=int(m[2]), s=float(m[3]), objects=int(m[4]) + int(m[5]) + int(m[6]) if m[4] else None,
                 at=m[1] or None, during_decode=running_decode(log_text[:m.start()], concurrency))
            for m in _LONG_GC.finditer(log_text)]


# what a server allocated at start (its INFO log: SGLang 0.5.17's mamba pool and scheduler lines,
# replayssm's pool line)
_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, "
                    r"ssm_state size: ([\d.]+)GB(?: intermediate_ssm_state_cache size: ([\d.]+)GB)?"
                    r"(?: intermediate_conv_window_cache size: ([\d.]+)GB)?")
_SIZES = re.compile(r"max_total_num_tokens=(\d+), .*?max_running_requests=(\d+)")
_REPLAY_POOL = re.compile(r"replayssm pool: .*?ring, read copy and cursors ([\d.]+) GB")


def server_memory(log_text: str) -> dict:
    """What a server allocated at start, from its INFO log (``--server-log-level info``): the mamba
    pool's slots and GB of conv state, ssm state, per-draft ssm snapshots and conv windows (SGLang's
    line), the running requests and KV tokens it sized for (its scheduler's line) and replay's ring,
    read copy and cursors (replayssm's pool line); keys only for what was logged."""
    out = {}
    mamba = _MAMBA.search(log_text)
    if mamba:
        out["mamba_slots"] = int(mamba[1])
        for key, value in zip(("conv_state_gb", "ssm_state_gb", "draft_snapshots_gb", "draft_conv_windows_gb"),
                              mamba.groups()[1:]):
            if value is not None:
                out[key] = float(value)
    sizes = _SIZES.search(log_text)
    if sizes:
        out["max_total_num_tokens"], out["max_running_requests"] = int(sizes[1]), int(sizes[2])
    replay = _REPLAY_POOL.search(log_text)
    if replay:
        out["replay_side_gb"] = float(replay[1])
    return out


def running_decode(log_text: str, concurrency: int) -> bool:
    """Whether the server has logged a decode batch with all ``concurrency`` requests running."""
    return any(int(r) == concurrency for r, _ in _DECODE.findall(log_text))


def queued_prefill(log_text: str, concurrency: int) -> bool:
    """Whether the server has logged a prefill batch with at least half of ``concurrency`` requests still
    queued (more full prefill batches follow it)."""
    return any(2 * int(q) >= concurrency for q in _QUEUED.findall(log_text))


def cached_prefill(log_text: str, concurrency: int) -> bool:
    """Whether the server has logged a prefill batch that reused cached tokens with at least a quarter of
    ``concurrency`` requests running: the prefix workload's steady state, whose requests arrive a few per
    prefill batch beside the running ones' decode, so that no queue builds up."""
    return any(int(c) > 0 and 4 * int(r) >= concurrency for c, r in _CACHED.findall(log_text))


def freeze_gc(port: int) -> None:
    """SGLang's ``POST /freeze_gc``: the server's HTTP, scheduler and detokenizer processes move every
    object they hold to Python's permanent generation (``gc.freeze``), so that a full collection
    no longer walks them; RuntimeError unless it answers 200."""
    check_server.admin(port, "/freeze_gc")


def start_profile(port: int, request: dict) -> None:
    """SGLang's ``POST /start_profile`` (its ``ProfileReq`` fields); RuntimeError unless it answers 200."""
    check_server.admin(port, "/start_profile", request)


def profile_load(client: subprocess.Popen, args, concurrency: int, load: int, log_name: str, log_start: int,
                 folder: pathlib.Path, timeout: float) -> dict:
    """Wait for the load's ``client``; during the first load at the largest concurrency, profile its
    prefill (``--profile-prefill N``: N prefill batches, once ``queued_prefill``), then its decode
    (``--profile-steps N``: N decode steps, once all requests run, ``running_decode``): each a
    ``POST /start_profile`` (GPU kernels only unless ``--profile-host``, stopped by the server after N
    steps) once the server's log (``--server-log-level info``) shows its batches. Returns
    ``{"prefill": ..., "decode": ...}``: each profiled phase's ``profile_trace.summarize`` (with its
    ``summarize_host`` as ``host`` under ``--profile-host``; empty when nothing was profiled), and under
    ``"missed"`` what the log never showed where a phase never started: the load itself still counts."""
    try:
        return _profile_load(client, args, concurrency, load, log_name, log_start, folder, timeout)
    except BaseException:
        if client.poll() is None:               # the server is about to stop: end its client with it
            client.kill()
            client.wait()
        raise


# each profiled phase: its flag, the argument holding its step count, when it may start (on the load's log and
# concurrency), and what it waits for; the prefix workload's prefill waits for a batch that reuses the cache
_PHASES = {
    "prefill": ("--profile-prefill", "profile_prefill", queued_prefill,
                lambda c: f"prefill batch with at least {(c + 1) // 2} requests queued"),
    "decode": ("--profile-steps", "profile_steps", running_decode, lambda c: f"decode batch of {c} running requests"),
}
_PREFIX_PREFILL = ("--profile-prefill", "profile_prefill", cached_prefill,
                   lambda c: f"prefill batch reusing cached tokens with at least {(c + 3) // 4} requests running")


def _profile_load(client, args, concurrency, load, log_name, log_start, folder, timeout):
    phases = dict(_PHASES, prefill=_PREFIX_PREFILL) if args.workload == "prefix" else _PHASES
    first = concurrency == max(args.concurrency) and load == 1
    steps = {phase: getattr(args, attr) for phase, (_, attr, _, _) in phases.items()}
    pending = [phase for phase in phases if first and steps[phase] > 0]
    results: dict[str, dict] = {}
    active, done_before = None, 0

    def log_text() -> str:
        with open(log_name, "rb") as f:
            f.seek(log_start)
            return f.read().decode(errors="replace")

    def finished(text: str) -> dict | None:
        traces = sorted((folder / active).glob("*.trace.json*"))
        if text.count("Profiling done") > done_before and traces:
            trace = profile_trace.load(traces[0])
            summary = profile_trace.summarize(trace, steps[active])
            if args.profile_host:
                summary["host"] = profile_trace.summarize_host(trace, steps[active])
            return summary
        return None

    t0 = time.time()
    while client.poll() is None:
        if time.time() - t0 > timeout:
            cut = " (what --deadline left of --load-timeout)" if timeout < args.load_timeout else ""
            raise RuntimeError(f"the client ran past {timeout:.0f} s{cut} at concurrency {concurrency}")
        if active is not None:
            if (summary := finished(log_text())) is not None:
                results[active], active = summary, None
        elif pending and phases[pending[0]][2](text := log_text(), concurrency):
            active, done_before = pending.pop(0), text.count("Profiling done")
            start_profile(args.port, dict(output_dir=str(folder / active), num_steps=steps[active],
                                          activities=["CPU", "GPU"] if args.profile_host else ["GPU"],
                                          with_stack=args.profile_host, record_shapes=False, profile_id=active))
        time.sleep(0.2)
    for _ in range(300 if active is not None else 0):   # "Profiling done" is logged once the trace is written
        if (summary := finished(log_text())) is not None:
            results[active], active = summary, None
            break
        time.sleep(0.2)
    if active is not None:
        raise RuntimeError(f"{phases[active][0]}: no finished trace in {folder / active} 60 s after the load")
    if pending:
        flag, _, _, waits_for = phases[pending[0]]
        behind = "".join(f"; {phases[p][0]} did not start behind it" for p in pending[1:])
        results["missed"] = f"{flag}: the server logged no {waits_for(concurrency)}{behind}"
    return results


def listen_counters(netstat: str) -> dict:
    """The kernel's ``TcpExt`` counters ``ListenOverflows`` (connections that found a listen queue
    full) and ``ListenDrops`` (those and the others a listening socket dropped) from the text of
    ``/proc/net/netstat`` (pairs of lines, ``TcpExt:`` names then ``TcpExt:`` values); {} where the
    text has no such pair."""
    lines = [line.split() for line in netstat.splitlines() if line.startswith("TcpExt:")]
    for names, values in zip(lines[::2], lines[1::2]):
        found = dict(zip(names[1:], values[1:]))
        if "ListenOverflows" in found and "ListenDrops" in found:
            return {k: int(found[k]) for k in ("ListenOverflows", "ListenDrops")}
    return {}


def host_listen_state() -> dict:
    """``listen_counters`` of this host and its ``net.core.somaxconn`` (the cap on a listen queue's
    length) as ``somaxconn``; {} where ``/proc`` does not have them."""
    try:
        state = listen_counters(pathlib.Path("/proc/net/netstat").read_text())
        state["somaxconn"] = int(pathlib.Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return {}
    return state if "ListenOverflows" in state else {}


def listen_fields(before: dict, after: dict) -> dict:
    """A load's row fields from ``host_listen_state`` before and after it: ``listen_overflows`` and
    ``listen_drops`` over the load (host-wide; the server is the only listener the load connects
    to) and the host's ``somaxconn``; {} where either state is missing."""
    if not before or not after:
        return {}
    return dict(listen_overflows=after["ListenOverflows"] - before["ListenOverflows"],
                listen_drops=after["ListenDrops"] - before["ListenDrops"], somaxconn=after["somaxconn"])


def row_from(out_file: pathlib.Path) -> dict:
    """The measurements of the client's last result line in ``out_file``."""
    result = json.loads(out_file.read_text().strip().splitlines()[-1])
    row = {k: result[k] for k in ROW_KEYS if k in result}
    if "cache_report" in result:
        row["cache_hit_rate_pct"] = result["cache_report"].get("cache_hit_rate_pct")
    return row


def serve_and_measure(model: str, model_dir: pathlib.Path, variant: str, strategy: str, args, log,
                      deadline: check_server.Deadline, emit=lambda rows: None, overlap: bool = False,
                      placement: dict | None = None) -> list[dict]:
    """Start ``variant``'s server (radix ``strategy``, SGLang's overlap scheduler on with ``overlap``),
    run the client at each concurrency, stop it; each load's row is passed to ``emit`` (with the rows
    so far) as soon as it is measured. A load the deadline leaves no time for is recorded as not run; a
    load that fails is recorded with its concurrency and load, so a later run of it replaces it in ``merge``.
    ``placement`` (``round``, ``position``: where this server ran in the run) goes into every row."""
    family = models.FAMILIES[model]
    cmd = server_command(variant, model_dir, family, strategy, args, overlap)
    base = dict(model=model, variant=variant, radix=strategy, overlap=overlap, workload=args.workload,
                speculative=args.speculative, stream=not args.no_stream, **(placement or {}))
    label = strategy + (", overlap" if overlap else "")
    rows: list[dict] = []
    if deadline.left(60) < 60:
        rows.append(dict(base, error="not started: the deadline is less than a minute away"))
        print(f"{model} {variant} ({label}): {rows[-1]['error']}", flush=True)
        emit(rows)
        return rows
    log.write(f"\n===== {model} {variant} {label}: {' '.join(cmd)}\n")
    log.flush()
    server_start = os.path.getsize(log.name)
    t0 = time.time()
    print(f"{model} {variant} ({label}): starting", flush=True)
    proc = None
    current: dict = {}                          # the load in progress, for its error row
    try:
        proc = check_server.launch(cmd, args.port, log, check_server.server_env(args))
        check_server.wait_ready(proc, args.port, deadline.left(args.start_timeout), log.name, server_start)
        print(f"{model} {variant} ({label}): ready in {time.time() - t0:.0f} s", flush=True)
        if args.freeze_gc:
            freeze_gc(args.port)
            base["freeze_gc"] = True
        with open(log.name, "rb") as f:
            f.seek(server_start)
            memory = server_memory(f.read().decode(errors="replace"))
        if memory:
            base["memory"] = memory
            print(f"{model} {variant} ({label}): {memory}", flush=True)
        for c, load in ((c, load) for c in args.concurrency for load in range(1, args.repeat + 1)):
            if deadline.left(30) < 30:
                rows.append(dict(base, concurrency=c, load=load, error="not run: the deadline is less than 30 s away"))
                emit(rows)
                continue
            current = dict(concurrency=c, load=load)
            if args.workload == "prefix":
                check_server.flush_cache(args.port)     # each load finds the tree empty, as the first one does
            log.write(f"\n===== {model} {variant} {label}: concurrency {c}, load {load}\n")
            log.flush()
            log_start = os.path.getsize(log.name)
            with tempfile.TemporaryDirectory() as tmp:
                out_file = pathlib.Path(tmp) / "result.jsonl"
                t1 = time.time()
                listen = host_listen_state()
                client = subprocess.Popen(client_command(args.port, model_dir, c, out_file, args), stdout=log,
                                          stderr=subprocess.STDOUT)
                profiled = profile_load(client, args, c, load, log.name, log_start, pathlib.Path(tmp) / "profile",
                                        deadline.left(args.load_timeout))
                if client.returncode != 0 or not out_file.exists():
                    raise RuntimeError(f"the client exited with {client.returncode} at concurrency {c}")
                row = dict(base, concurrency=c, load=load, **row_from(out_file),
                           **({"cache_flushed": True} if args.workload == "prefix" else {}),
                           **listen_fields(listen, host_listen_state()))
                if "decode" in profiled:
                    row["profile"] = profiled["decode"]
                if "prefill" in profiled:
                    row["profile_prefill"] = profiled["prefill"]
                if "missed" in profiled:
                    row["profile_missed"] = profiled["missed"]
                    print(f"{model} {variant} ({label}) concurrency {c} load {load}: not profiled: "
                          f"{profiled['missed']}", flush=True)
            with open(log.name, "rb") as f:
                f.seek(log_start)
                text = f.read().decode(errors="replace")
            row |= server_rates(text, c) | max_itl(text)
            row["long_collections"] = long_collections(text, c)
            rows.append(row)
            emit(rows)
            latency = (f", ITL median {row.get('median_itl_ms', 0):.2f} ms, TTFT median "
                       f"{row.get('median_ttft_ms', 0):.0f} ms" if row["stream"] else ", not streamed")
            print(f"{model} {variant} ({label}) concurrency {c} load {load}: "
                  f"{row.get('output_throughput', 0):.0f} tok/s{latency} ({time.time() - t1:.0f} s)"
                  + (f"; {row['listen_overflows']} connections found the listen queue full (somaxconn "
                     f"{row['somaxconn']})" if row.get("listen_overflows") else ""), flush=True)
    except Exception as e:                      # noqa: BLE001 - recorded; the next variant runs
        rows.append(dict(base, **current, error=f"{type(e).__name__}: {e}"))
        emit(rows)
        print(f"{model} {variant} ({label}): FAILED {rows[-1]['error']}", flush=True)
    finally:
        if proc is not None:
            check_server.stop(proc)
    return rows


def radix(row: dict) -> str:
    """A row's radix strategy, with ", overlap" where SGLang's overlap scheduler ran."""
    return row["radix"] + (", overlap" if row.get("overlap") else "")


def table(paths: list[pathlib.Path]) -> str:
    """A markdown table of ``serving-<model>.json`` files: a row per measured load, with output
    tokens/s against SGLang conventional's (variant ``sglang``) and SGLang's own replay's
    (``sglang-replay``), median inter-token latency against SGLang conventional's and median time to
    first token as a multiple of SGLang conventional's, each on the same workload, concurrency and load
    number of its server, where those were measured in the same file, and the server's own prefill and
    decode rates during the load (``server_rates``) where logged, the decode rate against SGLang's and
    SGLang's replay's (a load's output tokens/s also carries its prefill; the decode rate is the steps
    alone). Rows of a ``--both-orders`` run are compared within their round, and a second table gives,
    per load, both rounds' ratios and their geometric mean.

    "ITL / server token interval" is the median inter-token latency the client saw over the interval
    at which the server made each request's tokens (``concurrency`` over its decode rate): about 1 where
    the streamed tokens reach the client as fast as the server makes them, above 1 where their delivery
    (SGLang's detokenizer and HTTP processes and the client, each one Python thread) is slower than the
    server's decode, so that the output tokens/s measures the delivery. Rows of a ``--no-stream`` run
    (``stream`` false) have no inter-token latency or time to first token, and are compared only with
    such rows."""
    out = ["| model | variant | radix | concurrency | load | output tok/s | vs SGLang | vs SGLang's replay "
           "| ITL median / p99 ms | ITL vs SGLang | ITL / server token interval | TTFT median ms (x SGLang's) "
           "| server prefill / decode tok/s | decode vs SGLang / SGLang's replay | cache hit | accept length |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        data = json.loads(path.read_text())
        ok = [r for r in data["rows"] if "output_throughput" in r]

        def by_load(variant: str) -> dict:
            return {(r["workload"], r["concurrency"], r.get("load", 1), r.get("round", 1), r.get("stream", True)): r
                    for r in ok if r["variant"] == variant}

        base, replay = by_load("sglang"), by_load("sglang-replay")
        rounds = any(r.get("round", 1) > 1 for r in data["rows"])
        for r in data["rows"]:
            if "output_throughput" not in r:
                out.append(f"| {r['model']} | {r['variant']} | {radix(r)} | {r.get('concurrency', '')} | "
                           f"{r.get('load', '')}{_round(r, rounds)} | {r['error']} | | | | | | | | | | |")
                continue
            streamed = r.get("stream", True)
            key = (r["workload"], r["concurrency"], r.get("load", 1), r.get("round", 1), streamed)
            b, s = base.get(key), replay.get(key)
            tok = f"{r['output_throughput'] / b['output_throughput']:.2f}x" if b and r is not b else ""
            vs_replay = f"{r['output_throughput'] / s['output_throughput']:.2f}x" if s and r is not s else ""
            if streamed:
                latency = f"{r['median_itl_ms']:.2f} / {r['p99_itl_ms']:.2f}"
                itl = f"{b['median_itl_ms'] / r['median_itl_ms']:.2f}x" if b and r is not b else ""
                lag = (f"{r['median_itl_ms'] * r['decode_tokens_per_s'] / (1000.0 * r['concurrency']):.2f}"
                       if r.get("decode_tokens_per_s") else "")
                ttft = f"{r['median_ttft_ms']:.0f}" + (f" ({r['median_ttft_ms'] / b['median_ttft_ms']:.2f}x)"
                                                       if b and r is not b else "")
            else:
                latency, itl, lag, ttft = "not streamed", "", "", ""
            rates = " / ".join(f"{r[k]:,.0f}" if k in r else "-" for k in ("prefill_tokens_per_s",
                                                                          "decode_tokens_per_s"))
            decode = " / ".join(f"{r['decode_tokens_per_s'] / o['decode_tokens_per_s']:.2f}x"
                                if o and r is not o and "decode_tokens_per_s" in r and "decode_tokens_per_s" in o
                                else "-" for o in (b, s))
            hit, accept = r.get("cache_hit_rate_pct"), r.get("accept_length")
            out.append(f"| {r['model']} | {r['variant']} | {radix(r)} | {r['concurrency']} | {r.get('load', 1)}"
                       f"{_round(r, rounds)} | "
                       f"{r['output_throughput']:.0f} | {tok} | {vs_replay} | {latency} | {itl} | {lag} | {ttft} | "
                       f"{rates} | {decode} | "
                       f"{'' if hit is None else f'{hit:.1f} %'} | {'' if accept is None else f'{accept:.2f}'} |")
    orders = both_orders_table(paths)
    memory = memory_table(paths)
    return "\n".join(out + (["", orders] if orders else []) + (["", memory] if memory else []))


def _round(row: dict, rounds: bool) -> str:
    """The load cell's round, in a file of a ``--both-orders`` run."""
    return f", round {row.get('round', 1)}" if rounds else ""


def both_orders_table(paths: list[pathlib.Path]) -> str:
    """For the files of ``--both-orders`` runs: per (model, variant, radix strategy, concurrency, load)
    measured in both rounds, output tokens/s against SGLang's and SGLang's replay's, the server's
    decode rate against the same two (where the rows carry it) and the median TTFT as a multiple of
    SGLang's, each in round 1, in round 2 and their geometric mean. Each pair of
    servers ran in both orders, so a factor that a server's place within its round puts on its figures
    cancels in the mean. Empty without such rows."""
    out = []
    for path in paths:
        ok = [r for r in json.loads(path.read_text())["rows"] if "output_throughput" in r]
        at = {(r["variant"], r["workload"], r["concurrency"], r.get("load", 1), r.get("stream", True),
               r.get("round", 1)): r for r in ok}

        def ratios(r: dict, other: str, field: str) -> str:
            got = []
            for rnd in (1, 2):
                load = (r["workload"], r["concurrency"], r.get("load", 1), r.get("stream", True), rnd)
                mine, ref = at.get((r["variant"], *load)), at.get((other, *load))
                if mine is None or ref is None or mine is ref or not mine.get(field) or not ref.get(field):
                    return ""
                got.append(mine[field] / ref[field])
            return " / ".join(f"{x:.2f}x" for x in (*got, math.sqrt(got[0] * got[1])))

        for r in ok:
            if r.get("round", 1) != 1 or r["variant"] == "sglang":
                continue
            cells = (ratios(r, "sglang", "output_throughput"), ratios(r, "sglang-replay", "output_throughput"),
                     ratios(r, "sglang", "decode_tokens_per_s"), ratios(r, "sglang-replay", "decode_tokens_per_s"),
                     ratios(r, "sglang", "median_ttft_ms") if r.get("stream", True) else "")
            if any(cells):
                workload = "" if r["workload"] == "decode" else f" ({r['workload']})"
                out.append(f"| {r['model']}{workload} | {r['variant']} | {radix(r)} | {r['concurrency']} | "
                           f"{r.get('load', 1)} | " + " | ".join(cells) + " |")
    if not out:
        return ""
    return "\n".join(["| model | variant | radix | concurrency | load | output vs SGLang: round 1 / round 2 / "
                      "geometric mean | vs SGLang's replay: the same | server decode rate vs SGLang: the same | "
                      "server decode rate vs SGLang's replay: the same | TTFT median, x SGLang's: the same |",
                      "|---|---|---|---|---|---|---|---|---|---|"] + out)


_MEMORY_KEYS = ("max_running_requests", "max_total_num_tokens", "mamba_slots", "ssm_state_gb", "draft_snapshots_gb",
                "draft_conv_windows_gb", "replay_side_gb")


def memory_table(paths: list[pathlib.Path]) -> str:
    """A markdown table of what each server of ``serving-<model>.json`` files allocated at start
    (``server_memory``; one row per model, variant, radix strategy and speculative mode), or "" when
    no row carries it."""
    servers = {}
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            if "memory" in r:
                servers.setdefault((r["model"], r["variant"], radix(r), r.get("speculative") or "none"), r["memory"])
    if not servers:
        return ""
    out = ["| model | variant | radix | speculative | max running requests | KV tokens | mamba slots | ssm state GB "
           "| per-draft ssm snapshots GB | per-draft conv windows GB | replay ring, read copy, cursors GB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, variant, rad, spec), mem in servers.items():
        cells = ["" if mem.get(k) is None else f"{mem[k]:,}" if isinstance(mem[k], int) else f"{mem[k]:.2f}"
                 for k in _MEMORY_KEYS]
        out.append(f"| {model} | {variant} | {rad} | {spec} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def merge(paths: list[pathlib.Path]) -> dict:
    """One ``serving-<model>.json`` of the rows of several runs of the same model, in the order given:
    each row gains ``run`` (its file's index in ``runs``, which keeps every file's ``meta`` and
    ``args``). A row that records a load as not run or failed is left out when a later file measured
    the same (variant, radix strategy, workload, speculative, streaming, concurrency, load, round). Raises ValueError
    for files of different models."""
    files = [json.loads(p.read_text()) for p in paths]
    names = sorted({f["model"] for f in files})
    if len(names) != 1:
        raise ValueError(f"merge: expected files of one model, got {names} in {[str(p) for p in paths]}")

    def key(r: dict) -> tuple:
        return (r["variant"], r["radix"], r.get("overlap", False), r["workload"], r.get("speculative"),
                r.get("stream", True), r.get("concurrency"), r.get("load"), r.get("round", 1))

    rows = [dict(r, run=i) for i, f in enumerate(files) for r in f["rows"]]
    last_measured = {key(r): i for i, r in enumerate(rows) if "output_throughput" in r}
    kept = [r for i, r in enumerate(rows) if "output_throughput" in r or last_measured.get(key(r), -1) < i]
    return dict(model=names[0], config=files[0]["config"],
                runs=[dict(meta=f["meta"], args=f["args"], file=str(p)) for p, f in zip(paths, files)], rows=kept)


def plot(rows_by_model: dict[str, list[dict]], path: pathlib.Path) -> None:
    """Output tokens/s against concurrency, one panel per model, one line per (variant, radix strategy),
    at each concurrency the last load on the server (a warm one with ``--repeat``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows_by_model), figsize=(5 * len(rows_by_model), 4), squeeze=False)
    for ax, (model, rows) in zip(axes[0], rows_by_model.items()):
        lines: dict[str, dict] = {}
        for r in rows:                          # rows are in load order: a later load replaces an earlier
            if "output_throughput" in r:
                lines.setdefault(f"{r['variant']} ({radix(r)})", {})[r["concurrency"]] = r["output_throughput"]
        for label, by_c in lines.items():
            pts = sorted(by_c.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(model)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
        if lines:                               # a model whose every server failed has none
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["nemotron-h-8b", "qwen3-next", "kimi-linear"],
                    choices=list(models.CONFIGS))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--workload", choices=["decode", "prefix"], default="decode")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 64, 256])
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--waves", type=int, default=2, help="requests per concurrency slot")
    ap.add_argument("--request-rate", type=float, default=None,
                    help="requests per second, Poisson arrivals (default: every request at once); a rate "
                         "staggers the requests' starts, so their rings flush at different steps, as in serving")
    ap.add_argument("--max-concurrency", action="append", default=[], metavar="VARIANT=N",
                    help="run VARIANT's loads only at the concurrencies up to N, its server sized for the largest of "
                         "them (a variant whose state does not fit the largest load); repeatable")
    ap.add_argument("--repeat", type=int, default=1,
                    help="loads per concurrency on the same server (rows carry 'load' 1..N: the first runs the "
                         "server's first-use work, the later ones a warm server; under --workload prefix each "
                         "load starts with the radix cache flushed)")
    ap.add_argument("--both-orders", action="store_true",
                    help="run the variants in the order given, then once more in the reverse order, each server "
                         "started afresh (rows carry 'round' 1 and 2 and 'position', the server's place in the run); "
                         "--table compares each load with SGLang's of its round and gives the geometric mean of "
                         "the two rounds' ratios, in which an advantage of a place within the round cancels (with "
                         "--repeat 2, compare the second loads: a cost the run's first server pays does not cancel)")
    ap.add_argument("--reverse-round", action="store_true",
                    help="run only the reverse order, as round 2 of --both-orders (a both-orders run split in two: "
                         "run round 1 without this flag, round 2 with it, join the files with --merge; --table "
                         "then gives the same comparison)")
    ap.add_argument("--server-log-level", default="warning", choices=["warning", "info", "debug"],
                    help="the servers' --log-level; info logs each prefill batch and replayssm's first launch of each "
                         "kernel variant to servers.log")
    ap.add_argument("--radix-strategies", nargs="+", default=["extra_buffer"], choices=["no_buffer", "extra_buffer"],
                    help="each variant's server at each (default: extra_buffer, SGLang's own choice for these models; "
                         "SGLang's own replay at no_buffer only)")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="SGLang's overlap scheduler on where the radix strategy allows it (extra_buffer; SGLang's "
                         "default for these models, and this benchmark's): no_buffer runs without it")
    ap.add_argument("--speculative", choices=["none", "mtp"], default="none",
                    help="mtp: speculative decoding with the model's MTP layer as the draft (NEXTN, a chain of "
                         "--draft-tokens; qwen3.5-9b and qwen3-next); with random weights acceptance is arbitrary "
                         "(the rows report it)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="profile this many decode steps of the first load at the largest concurrency, with all its "
                         "requests running (needs --server-log-level info); the row carries the kernels' time per "
                         "step by group (profile_trace.py). A multiple of the replay window (32) profiles the same "
                         "number of flush steps in every variant")
    ap.add_argument("--profile-prefill", type=int, default=0,
                    help="profile this many prefill batches of the first load at the largest concurrency, once at "
                         "least half its requests wait behind a logged prefill batch (--workload prefix: once a logged "
                         "prefill batch reuses cached tokens with a quarter of the load running; needs "
                         "--server-log-level info); "
                         "the row's profile_prefill carries the kernels' time per batch by group")
    ap.add_argument("--profile-host", action="store_true",
                    help="record the profiles with CPU activity and Python stacks as well: each profiled phase's "
                         "summary gains the host time of replayssm's calls, of SGLang's scheduler stages and of the "
                         "waits for the device (profile_trace.summarize_host); the Python tracer slows the host "
                         "through the profiled steps")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="once each server is ready (after its warm-up request), freeze its processes' garbage "
                         "collector (SGLang's /freeze_gc): a full collection of the HTTP process's objects takes "
                         "a few hundred ms, during which it takes no request (the rows record it)")
    ap.add_argument("--no-stream", action="store_true",
                    help="each request gets its tokens in one response at its end (the client's --disable-stream) "
                         "instead of a response chunk per token, which SGLang's HTTP process writes and the client "
                         "parses: the output tokens/s without them, where a server's decode outruns their delivery "
                         "(the table's 'ITL / server token interval' above 1); the rows carry stream false and no "
                         "inter-token latency or time to first token")
    ap.add_argument("--draft-tokens", type=int, default=4, help="tokens per verify, the bonus token included")
    ap.add_argument("--groups", type=int, default=8, help="prefix workload: distinct shared prefixes")
    ap.add_argument("--prompts-per-group", type=int, default=32)
    ap.add_argument("--prefix-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "build/serving")))
    ap.add_argument("--models-dir", type=pathlib.Path,
                    default=pathlib.Path(tempfile.gettempdir()) / "replayssm-serving-models")
    ap.add_argument("--port", type=int, default=30917)
    ap.add_argument("--mem-fraction", type=float, default=0.88)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--load-timeout", type=float, default=600, help="seconds one client run may take")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which no server starts and no load runs (what finished is written)")
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed (and the prompts')")
    ap.add_argument("--weights", choices=["seeded", "sglang-dummy"], default="seeded")
    ap.add_argument("--no-prefill-graph", action="store_true")
    ap.add_argument("--sglang-arg", action="append", default=[], help="one more SGLang flag or value (repeatable)")
    ap.add_argument("--table", nargs="+", type=pathlib.Path, metavar="JSON",
                    help="print the markdown table of these serving-<model>.json files and exit")
    ap.add_argument("--merge", nargs="+", type=pathlib.Path, metavar="JSON",
                    help="write the rows of these runs of one model to --merged as one file (see merge) and exit")
    ap.add_argument("--merged", type=pathlib.Path, help="with --merge: the file to write")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.merge:
        if args.merged is None:
            ap.error("--merge: expected --merged FILE, the file to write")
        try:
            args.merged.write_text(json.dumps(merge(args.merge), default=str) + "\n")
        except ValueError as e:
            ap.error(str(e))
        return 0
    if args.reverse_round and args.both_orders:
        ap.error("--reverse-round: runs round 2 of --both-orders alone; expected one of the two flags")
    if args.repeat < 1:
        ap.error(f"--repeat: expected a positive count, got {args.repeat}")
    if args.request_rate is not None and not 0 < args.request_rate < float("inf"):
        ap.error(f"--request-rate: expected a positive finite rate (leave it out for every request at once), "
                 f"got {args.request_rate}")
    if args.profile_steps < 0 or args.profile_steps and args.server_log_level == "warning":
        ap.error(f"--profile-steps: expected a positive count with --server-log-level info (the decode batches the "
                 f"profile waits for are logged at info), got {args.profile_steps} at {args.server_log_level}")
    if args.profile_host and not (args.profile_steps or args.profile_prefill):
        ap.error("--profile-host: expected --profile-steps or --profile-prefill (the profiles it records)")
    if args.profile_prefill < 0 or args.profile_prefill and args.server_log_level == "warning":
        ap.error(f"--profile-prefill: expected a positive count with --server-log-level info (the prefill batches the "
                 f"profile waits for are logged at info), got {args.profile_prefill} at {args.server_log_level}")
    if min(args.concurrency) < 1:
        ap.error(f"--concurrency: expected positive counts, got {args.concurrency}")
    caps = {}
    for item in args.max_concurrency:
        variant, _, n = item.partition("=")
        if variant not in args.variants or not n.isdigit() or int(n) < 1:
            ap.error(f"--max-concurrency: expected VARIANT=N with VARIANT among --variants {args.variants} and N a "
                     f"positive count, got {item!r}")
        if not any(c <= int(n) for c in args.concurrency):
            ap.error(f"--max-concurrency: {item} leaves {variant} none of --concurrency {args.concurrency}")
        caps[variant] = int(n)
    if args.speculative == "mtp":
        if args.draft_tokens < 2:
            ap.error(f"--draft-tokens: expected at least 2 (one draft and the bonus token), got {args.draft_tokens}")
        if any(m not in models.MTP for m in args.models):
            ap.error(f"--speculative mtp: the models with an MTP draft are {sorted(models.MTP)}, got "
                     f"{[m for m in args.models if m not in models.MTP]}")
    args.out.mkdir(parents=True, exist_ok=True)
    check_server.stop_on_sigterm()
    deadline = check_server.Deadline(args.deadline)
    meta = check_server.run_meta(args)
    rows_by_model: dict[str, list[dict]] = {}
    with (args.out / "servers.log").open("a") as log:
        for model in args.models:
            model_dir = models.write(args.models_dir, model, mtp=args.speculative == "mtp")
            write_tokenizer(model_dir, models.CONFIGS[model]["vocab_size"])
            rows = rows_by_model.setdefault(model, [])

            path = args.out / f"serving-{model}{'-mtp' if args.speculative == 'mtp' else ''}.json"

            def write(current: list[dict], done: list[dict] = rows, model: str = model, path=path) -> None:
                path.write_text(json.dumps(dict(
                    model=model, meta=meta, config=models.CONFIGS[model], args=vars(args) | dict(
                        out=str(args.out), models_dir=str(args.models_dir)), rows=done + current), default=str) + "\n")

            position = 0
            # (round, variants): the order given, then (--both-orders) the reverse; --reverse-round the reverse alone
            rounds = ([] if args.reverse_round else [(1, args.variants)]) + (
                [(2, args.variants[::-1])] if args.both_orders or args.reverse_round else [])
            for run_round, variants in rounds:
                for variant in variants:
                    if not check_server.serves(variant, model):
                        continue
                    # a capped variant's loads and server: only its concurrencies up to the cap
                    vargs = args if variant not in caps else argparse.Namespace(
                        **(vars(args) | dict(concurrency=[c for c in args.concurrency if c <= caps[variant]])))
                    for strategy, overlap in dict.fromkeys(schedule(variant, s, args.overlap)
                                                           for s in args.radix_strategies):
                        position += 1
                        rows += serve_and_measure(model, model_dir, variant, strategy, vargs, log, deadline,
                                                  emit=write, overlap=overlap,
                                                  placement=dict(round=run_round, position=position))
                        write([])
    plot(rows_by_model, args.out / "serving.png")
    return 1 if any("error" in r for rows in rows_by_model.values() for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
