"""Registers, spills and machine code of every step launch, from ptxas, on a machine without a GPU.

    python benchmarks/ptx_registers.py [--models qwen3.5,kimi-linear] [--arch sm_90a] [--layout vk]

Each launch is compiled as the JIT would compile it (``integrations.trtllm.steps.compile_jit``) and
its PTX assembled by the ptxas that ships with Triton (``ptxas -v``); a row per launch: model,
tokens, read format, the ring's draft budget, pass, warps, rows per program, registers per
thread, spill-store bytes, and from the cubin (``cuobjdump -sass``) the SASS instructions, butterfly
shuffles and calls (an IEEE division's slow path is a call). ``--layout vk``: the GDN / KDA
checkpoint as ``[S, HV, V, K]`` (the hosts' layout). Tile choices in ``kernels/tiles.py`` that were
not timed cite it. The code is the installed Triton's: to read what a GPU with another Triton runs,
install that release into a folder put first on ``PYTHONPATH`` (Triton 3.6's compile read this way
has the instruction count ``ncu`` reports for the same launch on the H200).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton

sys.path.insert(0, os.path.dirname(__file__))
from shapes import MODEL_SPECS, WINDOW  # noqa: E402

from replayssm.integrations.trtllm import steps  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = os.path.join(BIN, "ptxas")
# (tokens, read format, ring draft budget) of the steps a deployment runs
STEPS = ((1, "checkpoint", 0), (1, "nvfp4", 0), (1, "checkpoint", 7), (8, "checkpoint", 7), (8, "nvfp4", 7))


def registers(ptx: str, arch: str) -> tuple[int, int]:
    """(registers per thread, spill-store bytes) ptxas reports for ``ptx``."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        err = subprocess.run([PTXAS, "-v", f"-arch={arch}", f.name, "-o", os.devnull], capture_output=True,
                             text=True, check=True).stderr
    finally:
        os.unlink(f.name)
    return int(re.search(r"Used (\d+) registers", err).group(1)), int(re.search(r"(\d+) bytes spill stores",
                                                                                 err).group(1))


def sass_counts(cubin: bytes) -> tuple[int, int, int]:
    """(SASS instructions, SHFL.BFLY, CALL) of a cubin's code, from ``cuobjdump -sass``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(f.name)
    code = [line for line in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s", line)]
    return len(code), sum("SHFL.BFLY" in line for line in code), sum(re.search(r"\sCALL\.", line) is not None
                                                                     for line in code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="nemotron-h,qwen3.5,kimi-linear")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--layout", choices=["kv", "vk"], default="kv",
                    help="GDN / KDA checkpoint layout: [S, HV, K, V] (kv) or [S, HV, V, K] (vk)")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, {args.arch}, checkpoint layout {args.layout}")
    print(f"{'model':13s} {'T':>2s} {'read':10s} {'drafts':>6s} {'pass':9s} {'warps':>5s} {'rows':>4s} "
          f"{'regs':>4s} {'spill B':>7s} {'SASS':>6s} {'SHFL':>5s} {'CALL':>5s}")
    for model in args.models.split(","):
        if model not in MODEL_SPECS:
            raise SystemExit(f"--models: expected names from {sorted(MODEL_SPECS)}, got {model!r}")
        for tokens, read_format, drafts in STEPS:
            spec, cfg = steps.model_config(model, tokens, read_format, "float32", WINDOW, max_draft_tokens=drafts)
            layout = args.layout if spec.is_delta else "kv"
            tensors = steps.allocate(steps.step_buffers(spec, cfg, tokens, state_layout=layout), 8, 16)
            for lc in steps.step_plan(spec, cfg, tensors, committed=tokens == 1, state_layout=layout):
                _, compiled = steps.compile_jit(lc, args.arch.rstrip("a"))
                regs, spill = registers(compiled.asm["ptx"], args.arch)
                n_sass, shfl, calls = sass_counts(compiled.asm["cubin"])
                rows = lc.constexprs.get("BV", lc.constexprs.get("BP"))
                print(f"{model:13s} {tokens:2d} {read_format:10s} {drafts:6d} "
                      f"{'flush' if lc.flush_pass else 'non-flush':9s} {lc.num_warps:5d} {rows:4d} {regs:4d} "
                      f"{spill:7d} {n_sass:6d} {shfl:5d} {calls:5d}", flush=True)


if __name__ == "__main__":
    main()
