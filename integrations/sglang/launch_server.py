"""``python -m replayssm.integrations.sglang.launch_server --replay-ssm [options] <sglang server args>``

Own options (every other argument goes to SGLang's launcher, ``python -m sglang.launch_server``,
unchanged; ``--sglang-help`` prints SGLang's own options):

| option | meaning |
|---|---|
| ``--replay-ssm`` | turn replay on |
| ``--replay-window L`` | ring window (default 16) |
| ``--replay-checkpoint-dtype`` | float32 (default), float16_sr, bfloat16 |
| ``--replay-read-format`` | checkpoint (default), fp8, nvfp4 |
| ``--dry-run`` | check everything (below) and print the resolved SGLang arguments, replay configuration and per-layer replay plan as JSON; start nothing |
| ``--sglang-help`` | SGLang's launcher's options |

A ``--replay-*`` option without ``--replay-ssm`` is refused (replay stays off unless asked for).
The options travel to every SGLang process in the ``REPLAYSSM_SGLANG`` environment variable
(SGLang spawns its workers); the SGLang flags replay needs are added, and SGLang's own parser
validates the result; the SGLang version is checked first (``plugin.check_version``). A dry run
also reads the model's config as the server will and, with replay on, applies the checks the
plugin applies in the server (``launch_plan``: layers of a family replay routes, dims the read
format and the kernels serve, the state dtype SGLang allocates) and prints the per-layer plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from replayssm.spec import CHECKPOINT_DTYPES, READ_FORMATS, ReplayConfig

from . import options

# SGLang's storage dtype for the checkpoint (``temporal``) per replayssm checkpoint dtype
_SSM_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16_sr": "float16"}
_OWN_REPLAY_FLAGS = ("--enable-linear-replayssm", "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len")
def _flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# the replay options, their defaults and help (None in the parser: "not given")
_OPTIONS = {
    "--replay-window": (16, dict(type=int, metavar="L", help="ring window L in tokens: a decode step flushes "
                                                             "the ring into the checkpoint every L tokens (default: 16)")),
    "--replay-checkpoint-dtype": ("float32", dict(choices=tuple(CHECKPOINT_DTYPES),
                                                  help="dtype of the checkpoint, SGLang's ssm state "
                                                       "(default: float32)")),
    "--replay-read-format": ("checkpoint", dict(choices=READ_FORMATS,
                                                help="what non-flush steps read: the checkpoint itself, or an "
                                                     "fp8 / nvfp4 read copy of it (default: checkpoint)")),
}


def parser() -> argparse.ArgumentParser:
    """The launcher's own options; every other argument is SGLang's."""
    ap = argparse.ArgumentParser(
        prog="python -m replayssm.integrations.sglang.launch_server",
        usage="%(prog)s [--replay-ssm [--replay-* ...]] [--dry-run] <SGLang server arguments>",
        description="SGLang's server with replayssm's replay decoding of Mamba-2, GDN and KDA layers. Every "
                    "argument not listed here goes to SGLang's launcher (python -m sglang.launch_server) unchanged; "
                    "--sglang-help lists SGLang's own.")
    ap.add_argument("--replay-ssm", action="store_true", help="turn replay on (default: off; the other --replay-* "
                                                               "options need it)")
    for flag, (_, kwargs) in _OPTIONS.items():
        ap.add_argument(flag, default=None, **kwargs)
    ap.add_argument("--dry-run", action="store_true",
                    help="resolve the SGLang arguments, read the model's config and apply the checks the server "
                         "applies, print them with the replay configuration and per-layer plan as JSON, and start "
                         "nothing (default: off)")
    ap.add_argument("--sglang-help", action="store_true", help="print the options of SGLang's launcher and exit")
    return ap


def resolve(argv: list[str]) -> tuple[dict | None, list[str], bool]:
    """Split and check the command line: ``(replay config as a dict or None, SGLang args, dry_run)``."""
    own, rest = parser().parse_known_args(argv)
    if own.sglang_help:
        from sglang.srt.server_args import prepare_server_args
        prepare_server_args(["--help"])                      # SGLang's parser prints its help and exits
    if not own.replay_ssm:
        for flag in _OPTIONS:
            if getattr(own, flag[2:].replace("-", "_")) is not None:
                raise SystemExit(f"{flag}: a replay option needs --replay-ssm (without it replay is off and "
                                 "SGLang runs unchanged)")
        return None, rest, own.dry_run
    for flag, (default, _) in _OPTIONS.items():
        if getattr(own, flag[2:].replace("-", "_")) is None:
            setattr(own, flag[2:].replace("-", "_"), default)
    for flag in _OWN_REPLAY_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            raise SystemExit(f"{flag}: replayssm replaces SGLang's own replay; drop it and use --replay-ssm")
    topk = _flag_value(rest, "--speculative-eagle-topk")
    if topk is not None and int(topk) > 1:
        raise SystemExit(f"--speculative-eagle-topk: replay verifies a chain of drafts; expected 1, got {topk}")
    algorithm = _flag_value(rest, "--speculative-algorithm")
    refused = options.refusal(argparse.Namespace(speculative_algorithm=algorithm))   # DFLASH / DSPARK
    if refused is not None:
        raise SystemExit(refused)
    breadth = _flag_value(rest, "--speculative-ngram-max-bfs-breadth")
    if algorithm is not None and algorithm.upper() == "NGRAM" and (breadth is None or int(breadth) > 1):
        # SGLang's NGRAM verifies a draft tree this wide (its default: 10)
        raise SystemExit(f"--speculative-ngram-max-bfs-breadth: replay verifies a chain of drafts; NGRAM needs "
                         f"--speculative-ngram-max-bfs-breadth 1, got {breadth or 'the default 10'}")
    drafts = _flag_value(rest, "--speculative-num-draft-tokens")
    try:
        cfg = ReplayConfig(window=own.replay_window, max_draft_tokens=max(int(drafts or 1) - 1, 0),
                           checkpoint_dtype=own.replay_checkpoint_dtype, read_format=own.replay_read_format,
                           ring_dtype="bfloat16")
    except ValueError as e:
        raise SystemExit(f"--replay-{str(e).split(':')[0].replace('_', '-')}: {str(e).split(':', 1)[1].strip()}")
    sglang_args = list(rest)
    if _flag_value(rest, "--mamba-ssm-dtype") not in (None, _SSM_DTYPE[cfg.checkpoint_dtype]):
        raise SystemExit(f"--mamba-ssm-dtype: --replay-checkpoint-dtype {cfg.checkpoint_dtype} stores the "
                         f"checkpoint as {_SSM_DTYPE[cfg.checkpoint_dtype]}; drop --mamba-ssm-dtype")
    if _flag_value(rest, "--mamba-ssm-dtype") is None:
        sglang_args += ["--mamba-ssm-dtype", _SSM_DTYPE[cfg.checkpoint_dtype]]
    strategy = _flag_value(rest, "--mamba-radix-cache-strategy")
    if strategy not in (None, "no_buffer", "extra_buffer"):
        raise SystemExit(f"--mamba-radix-cache-strategy: replayssm serves no_buffer and extra_buffer; got {strategy}")
    speculative = algorithm is not None
    # a PD decode server keeps no radix tree (SGLang gives it the chunk cache) unless asked for one: no
    # strategy to choose
    no_tree = "--disable-radix-cache" in rest or (
        _flag_value(rest, "--disaggregation-mode") == "decode"
        and not {"--disaggregation-decode-enable-radix-cache", "--enable-hierarchical-cache"} & set(rest))
    if strategy is None and speculative and not no_tree:
        # plain decode keeps SGLang's own choice ("auto": extra_buffer with the overlap scheduler where the
        # model supports it, else no_buffer without it; replay serves both); speculative decoding under
        # extra_buffer would run without CUDA graphs (below), so it gets no_buffer, which keeps them
        sglang_args += ["--mamba-radix-cache-strategy", "no_buffer"]
        strategy = "no_buffer"
    if (strategy == "no_buffer" or strategy == "extra_buffer" and speculative) \
            and "--disable-overlap-schedule" not in rest:
        # SGLang's no_buffer needs it; extra_buffer's verify track commit (mamba2.commit_track) has
        # not been served under the overlap scheduler's lookahead
        sglang_args += ["--disable-overlap-schedule"]
    if strategy == "extra_buffer" and speculative and "--disable-cuda-graph" not in rest:
        # the decode's and the verify's track copies keep their row masks on the device, but no
        # server has run speculative decoding under extra_buffer with CUDA graphs
        sglang_args += ["--disable-cuda-graph"]
    for phase in ("decode", "verify"):                          # GDN / KDA: replay replaces the triton kernels
        flag = f"--linear-attn-{phase}-backend"
        chosen = _flag_value(rest, flag)
        if chosen not in (None, "triton"):
            raise SystemExit(f"{flag}: replay routes GDN / KDA through the triton kernel seam; got {chosen}")
        if chosen is None:
            sglang_args += [flag, "triton"]
    return json.loads(options.encode(cfg)), sglang_args, own.dry_run


def check_server_args(server_args) -> None:
    """SystemExit naming the flag when SGLang's resolved settings combine replay with what it does not
    serve (``options.refusal``)."""
    message = options.refusal(server_args)
    if message is not None:
        raise SystemExit(message)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    replay, sglang_args, dry_run = resolve(argv)
    import sglang
    from sglang.srt.server_args import prepare_server_args

    from . import launch_plan
    from .plugin import check_version

    check_version()
    env = {}
    if replay is not None:
        env[options.ENV_VAR] = json.dumps(replay, sort_keys=True)
        os.environ.update(env)
    server_args = prepare_server_args(sglang_args)          # SGLang's own strict parser
    if replay is not None:
        check_server_args(server_args)
    if dry_run:
        # the model's config as the server will read it, and the plugin's checks on its layers
        model_cfg = launch_plan.model_config(server_args)
        plan = None if replay is None else launch_plan.replay_plan(server_args, options.from_env(), model_cfg)
        print(json.dumps(dict(sglang_args=sglang_args, replay=replay, env=env, model_path=server_args.model_path,
                              sglang=sglang.__version__, plan=plan), indent=1))
        return
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins

    load_plugins()
    run_server(server_args)


if __name__ == "__main__":
    main()
