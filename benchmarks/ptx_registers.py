"""Registers and spills of every step launch, from ptxas, on a machine without a GPU.

    python benchmarks/ptx_registers.py [--models qwen3.5,kimi-linear] [--arch sm_90a]

Each launch is compiled as the JIT would compile it (``integrations.trtllm.steps.compile_jit``) and
its PTX assembled by the ptxas that ships with Triton (``ptxas -v``); a row per launch: model,
tokens, read format, the ring's draft budget, pass, warps, rows per program, registers per
thread and spill-store bytes. Tile choices in ``kernels/tiles.py`` that were not timed cite it.
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

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="nemotron-h,qwen3.5,kimi-linear")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    print(f"{'model':13s} {'T':>2s} {'read':10s} {'drafts':>6s} {'pass':9s} {'warps':>5s} {'rows':>4s} "
          f"{'regs':>4s} {'spill B':>7s}")
    for model in args.models.split(","):
        if model not in MODEL_SPECS:
            raise SystemExit(f"--models: expected names from {sorted(MODEL_SPECS)}, got {model!r}")
        for tokens, read_format, drafts in STEPS:
            _, plan = steps.plan_for(model, tokens, read_format, "float32", WINDOW, max_draft_tokens=drafts)
            for lc in plan:
                _, compiled = steps.compile_jit(lc, args.arch.rstrip("a"))
                regs, spill = registers(compiled.asm["ptx"], args.arch)
                rows = lc.constexprs.get("BV", lc.constexprs.get("BP"))
                print(f"{model:13s} {tokens:2d} {read_format:10s} {drafts:6d} "
                      f"{'flush' if lc.flush_pass else 'non-flush':9s} {lc.num_warps:5d} {rows:4d} {regs:4d} "
                      f"{spill:7d}", flush=True)


if __name__ == "__main__":
    main()
