"""Ahead-of-time PTX of the replayssm TensorRT plugin layers, with the manifests they launch from.

    python -m replayssm.integrations.trtllm.aot --arch sm_90 --out DIR [--models qwen3.5,...]
        [--config [NAME=]PATH] [--dims NAME=FAMILY:key=value,...] [--tokens 1,4]
        [--read-formats checkpoint,nvfp4] [--checkpoint-dtype float32] [--window 16] [--gate]

Models: the built-in ``MODELS`` by name (``--models``; all of them when no model is named), a
Hugging Face ``config.json`` of a served family (``--config``: ``dims_from_config``), or explicit
dims (``--dims``: ``parse_dims``); ``--config`` and ``--dims`` repeat. For every model x T x read
format it writes one step directory ``DIR/<model>.<op>.T<T>.<read format>/`` (``op`` decode for
T = 1, verify for T > 1) with ``ptx_launch.save_step``: the PTX of the step's three plugin layers
(``plugin_desc.describe_step``, compiled by ``plugin_desc.compile_kernel``: the kernels the torch
ops' launches run, parameters in TensorRT's order) and their ``manifest.json`` (entry names,
TensorRT's arguments in order (inputs, int32 extra args with their values, outputs) with shapes
and dtypes, grid, block, shared memory, ring contract version; ``ptx_launch`` module docstring),
which ``ptx_launch.load_step`` reads back. Steps are layer 0's (``sr_base`` of seed 0, layer 0)
with the bf16 ring, the ``[S, HV, K, V]`` checkpoint and, for Mamba-2, the gate ``z`` an input only
with ``--gate``. Compiling needs Triton only; no GPU. Every argument is checked (dims against the
read format and the kernels) before anything compiles; a bad one is an argparse error.

``DIR/manifest.json`` indexes them: ``ring_contract_version``, ``arch``, ``triton`` (the version
that compiled the PTX) and ``steps``, each with ``dir``, ``model``, ``dims`` (``family`` and the
``LayerSpec`` dims), ``family``, ``op``, ``tokens``, ``max_draft_tokens`` (the pool's draft
budget: every step sizes the ring for the largest ``tokens``), ``read_format``,
``checkpoint_dtype``, ``window`` and ``has_z``.

The library behind it (buffers, plans, models, compilation) is ``steps``.
"""

from __future__ import annotations

import argparse
import json
import os
import re

from . import ptx_launch
from .steps import (CONFIG_FAMILIES, FAMILY_DIMS, MODELS, TEXT_CONFIGS, check_model, dims_from_config, model_config,
                    parse_dims)


def compile_all(out: str, arch: str, models, tokens, read_formats, checkpoint_dtype: str, window: int, *,
                has_z: bool = False) -> dict:
    """Write every requested step's plugin layers to ``out`` (module docstring); returns the index
    (also written as ``out/manifest.json``).

    ``models``: ``MODELS`` names, or a dict name -> dims (as ``MODELS`` holds them); ``has_z``:
    Mamba-2 steps take the gate ``z`` as an input (ignored for GDN / KDA models)."""
    import triton

    from replayssm.ring import RING_VERSION

    if not tokens or any(not isinstance(T, int) or T < 1 for T in tokens):
        raise ValueError(f"tokens: expected ints >= 1, got {list(tokens)!r}")
    if not isinstance(models, dict):
        models = {m: m for m in models}
    drafts = max(tokens) - 1
    steps = []
    for name, model in models.items():
        for T in tokens:
            op = "decode" if T == 1 else "verify"
            for rf in read_formats:
                spec, cfg = model_config(model, T, rf, checkpoint_dtype, window, max_draft_tokens=drafts)
                z = has_z and spec.family == "mamba2"
                step = f"{name}.{op}.T{T}.{rf}"
                ptx_launch.save_step(ptx_launch.build_step(spec, cfg, op=op, tokens=T, has_z=z, arch=arch),
                                     os.path.join(out, step))
                dims = dict(family=spec.family, **{k: getattr(spec, k) for k in FAMILY_DIMS[spec.family]})
                steps.append(dict(dir=step, model=name, dims=dims, family=spec.family, op=op, tokens=T,
                                  max_draft_tokens=drafts, read_format=rf, checkpoint_dtype=checkpoint_dtype,
                                  window=window, has_z=z))
    index = dict(ring_contract_version=RING_VERSION, arch=arch, triton=triton.__version__, steps=steps)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, ptx_launch.MANIFEST), "w") as f:
        json.dump(index, f, indent=1)
    return index


def _list(parse, what: str):
    """An argparse ``type``: comma-separated values, each through ``parse`` (ValueError: refused)."""
    def convert(text: str) -> list:
        try:
            items = [parse(t) for t in text.split(",")]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} ({e})") from None
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"expected {what} without repeats, got {text!r}")
        return items
    return convert


def _one_of(choices):
    def parse(t: str) -> str:
        if t not in choices:
            raise ValueError(f"unknown {t!r}; expected some of {', '.join(choices)}")
        return t
    return parse


def _token_count(t: str) -> int:
    if not t.strip().isdigit() or int(t) < 1:
        raise ValueError(f"{t!r} is not an int >= 1")
    return int(t)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return int(text)


def _arch(text: str) -> str:
    if not re.fullmatch(r"sm_\d+a?", text):
        raise argparse.ArgumentTypeError(f"expected sm_<major><minor> such as sm_90 or sm_100, got {text!r}")
    return text


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _named(text: str) -> tuple[str | None, str]:
    """``NAME=VALUE`` or ``VALUE`` (no ``=`` before a ``:`` or ``/``) of a repeated flag; the name must
    be usable as a directory name."""
    name, eq, value = text.partition("=")
    if not eq or ":" in name or "/" in name:
        return None, text
    if not _NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"NAME must be letters, digits, '.', '_' or '-', got {name!r}")
    return name, value


def _config(text: str) -> tuple[str, dict]:
    """``--config [NAME=]PATH``: a config.json (or a directory holding one); NAME defaults to its directory's name."""
    name, path = _named(text)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"cannot read a JSON config from {file!r}: {e}") from None
    try:
        dims = dims_from_config(config)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{file}: {e}") from None
    name = name or os.path.basename(os.path.dirname(os.path.abspath(file)))
    if not _NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"{file}: its directory name {name!r} is no step name; use NAME=PATH")
    return name, dims


def _dims(text: str) -> tuple[str, dict]:
    """``--dims NAME=FAMILY:key=value,...``."""
    name, value = _named(text)
    if name is None:
        raise argparse.ArgumentTypeError(f"expected NAME=FAMILY:key=value,..., got {text!r}")
    try:
        return name, parse_dims(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    from replayssm.spec import CHECKPOINT_DTYPES, READ_FORMATS

    ap = argparse.ArgumentParser(
        prog="python -m replayssm.integrations.trtllm.aot",
        description="Compile the replayssm TensorRT plugin layers to PTX with their launch manifests: one step "
                    "directory per model x tokens x read format, indexed by OUT/manifest.json.",
        epilog="Models come from --models, --config and --dims together; with none of them, every built-in model. "
               "Built-in dims: " + "; ".join(f"{m}: " + ", ".join(f"{k}={v}" for k, v in d.items())
                                             for m, d in MODELS.items()) + ".")
    ap.add_argument("--arch", type=_arch, default="sm_90", help="GPU architecture, sm_90, sm_100, ... (default: sm_90)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--models", type=_list(_one_of(tuple(MODELS)), "comma-separated built-in models"),
                    help=f"comma-separated built-in models, some of {', '.join(MODELS)} (default: all of them "
                         "when neither --config nor --dims is given)")
    ap.add_argument("--config", type=_config, action="append", default=[], metavar="[NAME=]PATH",
                    help="a Hugging Face config.json (or its directory) of a model type "
                         f"{', '.join(sorted([*CONFIG_FAMILIES, *TEXT_CONFIGS]))}; NAME (default: the "
                         "file's directory name) names its steps; repeatable")
    ap.add_argument("--dims", type=_dims, action="append", default=[], metavar="NAME=FAMILY:key=value,...",
                    help="explicit dims, e.g. mine=gdn:num_k_heads=16,num_v_heads=32,head_k_dim=128,head_v_dim=128 "
                         "(mamba2: num_heads, head_dim, state_dim, num_groups); repeatable")
    ap.add_argument("--tokens", type=_list(_token_count, "comma-separated ints >= 1"), default=[1, 4],
                    help="tokens per step, comma-separated: 1 = decode, T > 1 = verify (default: 1,4)")
    ap.add_argument("--read-formats", type=_list(_one_of(READ_FORMATS), "comma-separated read formats"),
                    default=list(READ_FORMATS),
                    help=f"comma-separated, some of {', '.join(READ_FORMATS)} (default: all)")
    ap.add_argument("--checkpoint-dtype", choices=tuple(CHECKPOINT_DTYPES), default="float32",
                    help="checkpoint dtype (default: float32)")
    ap.add_argument("--window", type=_positive, default=16, help="ring window L in tokens (default: 16)")
    ap.add_argument("--gate", action="store_true", help="Mamba-2 steps take the gate z as an input (default: off)")
    return ap


def main(argv=None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    models, sources = {}, {}
    named = [(m, m, "--models") for m in a.models or ()]
    named += [(n, d, "--config") for n, d in a.config] + [(n, d, "--dims") for n, d in a.dims]
    if not named:
        named = [(m, m, "--models") for m in MODELS]
    for name, model, flag in named:
        if name in models:
            ap.error(f"{flag}: model name {name!r} given twice ({sources[name]} and {flag})")
        models[name], sources[name] = model, flag
    for name, model in models.items():
        try:
            check_model(model, a.tokens, a.read_formats, a.checkpoint_dtype, a.window)
        except ValueError as e:
            ap.error(f"{sources[name]}: model {name!r} cannot be compiled with --read-formats {','.join(a.read_formats)}"
                     f" --window {a.window}: {e}")
    index = compile_all(a.out, a.arch, models, a.tokens, a.read_formats, a.checkpoint_dtype, a.window,
                        has_z=a.gate)
    print(f"wrote {len(index['steps'])} steps for {a.arch} to {a.out}")


if __name__ == "__main__":
    main()
