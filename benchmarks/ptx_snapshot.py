"""Fingerprints of the compiled kernels, on a machine without a GPU: does a change leave them as they were?

    python benchmarks/ptx_snapshot.py OUT.json                 # fingerprint every launch of this tree
    python benchmarks/ptx_snapshot.py --compare A.json B.json  # the launches whose code differs

Every launch of the step plans at real dims (``benchmarks/shapes.py``: Nemotron-H, Qwen3.5 and
Kimi-Linear; decode on the checkpoint and behind fp8 / NVFP4 read copies, verify of 8 tokens, an
fp16-SR checkpoint; GDN / KDA on both checkpoint layouts) and the store and refresh kernels behind
each read format, compiled as the JIT compiles them for sm_90 (``integrations.trtllm.steps.compile_jit``;
the store and refresh kernels through their ops, whose launches are compiled the same way). A
fingerprint is the SHA-256 of the PTX without its debug lines (``.loc``, ``.file`` and the debug
sections), which record source lines and columns and change when code moves, not what runs. Run it
without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from shapes import MODEL_SPECS, WINDOW  # noqa: E402

# (tokens, read format, checkpoint dtype, draft budget)
STEPS = ((1, "checkpoint", "float32", 0), (1, "fp8", "float32", 0), (1, "nvfp4", "float32", 0),
         (1, "checkpoint", "float32", 7), (8, "checkpoint", "float32", 7), (8, "fp8", "float32", 7),
         (8, "nvfp4", "float32", 7), (1, "checkpoint", "float16_sr", 0), (1, "fp8", "float16_sr", 0),
         (1, "nvfp4", "float16_sr", 0))
MODELS = ("nemotron-h", "qwen3.5", "kimi-linear")


def fingerprint(ptx: str) -> str:
    """SHA-256 (16 hex digits) of ``ptx`` without ``.loc`` / ``.file`` lines and debug sections."""
    kept, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            in_debug = s != "}"
            continue
        if not (s.startswith(".loc") or s.startswith(".file")):
            kept.append(line)
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def step_launches() -> dict[str, str]:
    from replayssm.integrations.trtllm import steps

    out = {}
    for model in MODELS:
        for tokens, read_format, ckpt, drafts in STEPS:
            spec, cfg = steps.model_config(model, tokens, read_format, ckpt, WINDOW, max_draft_tokens=drafts)
            for layout in ("kv", "vk") if spec.is_delta else ("kv",):
                tensors = steps.allocate(steps.step_buffers(spec, cfg, tokens, state_layout=layout), 8, 16)
                for i, lc in enumerate(steps.step_plan(spec, cfg, tensors, committed=tokens == 1, state_layout=layout)):
                    _, compiled = steps.compile_jit(lc, "sm_90")
                    key = f"{model} T={tokens} {read_format} {ckpt} drafts={drafts} {layout} {i}:{lc.kernel.__name__}"
                    out[key] = fingerprint(compiled.asm["ptx"])
                    print(key, out[key], flush=True)
    return out


class _Compile:
    """Stands in for a Triton kernel in ``kernels.ops``: ``kernel[grid](**args)`` compiles the launch
    as the JIT would (``steps.compile_jit``) and records its fingerprint instead of launching."""

    def __init__(self, kernel, tag: str, out: dict):
        self.kernel, self.tag, self.out = kernel, tag, out

    def __getitem__(self, grid):
        def run(num_warps, **kwargs):
            from replayssm.integrations.trtllm import steps
            from replayssm.kernels.plan import Launch

            const = {p.name for p in self.kernel.params if p.is_constexpr}
            lc = Launch.by_name(self.tag, self.kernel, grid, 0, {k: v for k, v in kwargs.items() if k not in const},
                                {k: v for k, v in kwargs.items() if k in const}, num_warps, False)
            _, compiled = steps.compile_jit(lc, "sm_90")
            key = (f"{self.tag} read={kwargs['READ_FMT']} ckpt={kwargs.get('CKPT_FMT', '-')} "
                   f"delta={kwargs['IS_DELTA']} cols={kwargs['COLS']}")
            self.out[key] = fingerprint(compiled.asm["ptx"])
            print(key, self.out[key], flush=True)
        return run


def store_and_refresh() -> dict[str, str]:
    import torch

    import replayssm as rs
    from replayssm.kernels import backend, ops

    out = {}
    saved = ops._store_checkpoint_kernel, ops._refresh_read_copy_kernel
    ops._store_checkpoint_kernel = _Compile(saved[0], "store", out)
    ops._refresh_read_copy_kernel = _Compile(saved[1], "refresh", out)
    try:
        for model in MODELS[:2]:
            spec = MODEL_SPECS[model]
            for read_format, ckpt in (("fp8", "float32"), ("nvfp4", "float16_sr"), ("checkpoint", "bfloat16")):
                cfg = rs.ReplayConfig(window=WINDOW, read_format=read_format, checkpoint_dtype=ckpt)
                pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=4, device="cpu", backend="reference")
                rows = torch.tensor([1, 2])
                backend.store(pool, 0, rows, torch.randn(2, *spec.state_shape))
                if pool.read:
                    backend.refresh(pool, 0, rows)
    finally:
        ops._store_checkpoint_kernel, ops._refresh_read_copy_kernel = saved
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="list the launches whose fingerprints differ")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        only = sorted(a.keys() ^ b.keys())
        for k in differ:
            print(f"differs: {k}")
        for k in only:
            print(f"in one only: {k}")
        print(f"{len(a.keys() & b.keys()) - len(differ)} launches the same, {len(differ)} differ, {len(only)} in one only")
        return 1 if differ or only else 0
    if not args.out:
        ap.error("expected OUT.json or --compare A B")
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        ap.error("TRITON_INTERPRET is set: the kernels would not be compiled")
    prints = {**step_launches(), **store_and_refresh()}
    with open(args.out, "w") as f:
        json.dump(prints, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(prints)} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
