"""GPU half of the conformance suite: its vectors through the compiled Triton kernels and through the
TensorRT plugin layers' PTX on CUDA.

    python benchmarks/gpu_conformance.py [--device cuda] [--families mamba2,gdn,kda]

Every family x mode of ``tests/conformance/vectors.py`` runs through two paths:

- ``triton-cuda``: ``StatePool(backend="triton", device="cuda")``, checked as the CPU suite checks
  its interpreter run: outputs within ``helpers.TOL`` of the fp64 step recurrence, outputs and
  checkpoint within the pair tolerance of the CPU reference pool, raw ring entries and cursors bit
  for bit.
- ``trt-ptx``: each decode / verify as its three TensorRT plugin layers' PTX (built for the GPU's
  arch, loaded with ``cuModuleLoadData``, launched with ``cuLaunchKernel`` in TensorRT's parameter
  order: ``replayssm.integrations.trtllm.ptx_launch``) over a pool's buffers, commit / fork / flush
  through the pool as the host does between engine runs (``paths.run_trt_ptx``). Outputs within
  ``helpers.TOL`` of the recurrence, and the same kernels as ``triton-cuda``: outputs, rings,
  cursors, checkpoint and read-copy bytes bit for bit.

Prints the matrix path x family x mode (pass / FAIL, worst error vs the recurrence; ``n/a`` with its
reason in a footnote where a path cannot run a case) and every failure; exits 1 on a failure.
``--device cpu`` with ``TRITON_INTERPRET=1`` runs the Triton path in Triton's interpreter (what the
CPU suite already covers; a smoke test of the script); ``trt-ptx`` is then n/a.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "conformance")]

import torch  # noqa: E402

from checks import check_identical, check_kernels_vs_reference, check_outputs  # noqa: E402
from paths import run_oracle, run_pool, run_trt_ptx, trt_ptx_uncovered  # noqa: E402
from vectors import FAMILIES, MODES, make_case  # noqa: E402

TRT_NOTE = ("trt-ptx: decode / verify as the plugin layers' PTX through the CUDA driver; commit "
            "(torch.ops.replayssm.commit), fork and flush through the pool, as the host does between engine runs")


def _error(e: Exception) -> str:
    """An exception as one line: its type and its root cause's last line (Triton's compile errors chain)."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    lines = str(root).strip().splitlines() or [""]
    return f"{type(e).__name__}" + ("" if type(root) is type(e) else f" ({type(root).__name__})") + f": {lines[-1]}"


def _trt_unavailable(device: str) -> str | None:
    """Why the PTX cannot run on ``device`` at all, or None."""
    if torch.device(device).type != "cuda":
        return f"no CUDA (--device {device}): the PTX is launched through the CUDA driver"
    from replayssm.integrations.trtllm import ptx_launch
    try:
        ptx_launch.driver()
    except ImportError as e:
        return str(e)
    return None


def _triton(c, oracle, device: str, problems: list):
    """The Triton pool on ``device``: (trace or None, worst error vs the recurrence)."""
    try:
        t = run_pool(c, "triton", device=device)
        worst = check_outputs(c, t.outputs, oracle, problems)
        check_kernels_vs_reference(c, t, run_pool(c, "reference"), problems)
        return t, worst
    except Exception as e:  # one cell fails, the matrix goes on
        problems.append(_error(e))
        return None, math.nan


def _trt(c, oracle, device: str, base, problems: list) -> float:
    """The plugin layers' PTX on ``device`` vs the recurrence and, bit for bit, the Triton trace ``base``."""
    try:
        t = run_trt_ptx(c, device=device)
        worst = check_outputs(c, t.outputs, oracle, problems)
    except Exception as e:  # one cell fails, the matrix goes on
        problems.append(_error(e))
        return math.nan
    if base is None:
        problems.append("no triton trace to compare with")
    else:
        check_identical(c, t, base, problems)
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The conformance vectors through the Triton kernels and the "
                                             "TensorRT plugin PTX on a device.")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset (runs can go in parallel)")
    args = ap.parse_args(argv)
    device, families = args.device, args.families.split(",")
    for family in families:
        if family not in FAMILIES:
            ap.error(f"--families: expected names from {FAMILIES}, got {family!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_conformance: no CUDA device", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(device) if device.startswith('cuda') else device}")
    triton_path = f"triton-{torch.device(device).type}"
    unavailable = _trt_unavailable(device)
    cells, notes, failed = {}, [], []
    for family in families:
        for mode in MODES:
            c = make_case(family, mode)
            oracle = run_oracle(c)
            problems = []
            base, worst = _triton(c, oracle, device, problems)
            cells[triton_path, family, mode] = f"{'pass' if not problems else 'FAIL'} {worst:.0e}"
            failed += [f"{triton_path} {c.name}: {p}" for p in problems]
            reason = trt_ptx_uncovered(c) or unavailable
            if reason is not None:
                notes += [reason] if reason not in notes else []
                cells["trt-ptx", family, mode] = f"n/a [{notes.index(reason) + 1}]"
                continue
            problems = []
            worst = _trt(c, oracle, device, base, problems)
            cells["trt-ptx", family, mode] = f"{'pass' if not problems else 'FAIL'} {worst:.0e}"
            failed += [f"trt-ptx {c.name}: {p}" for p in problems]
    print(f"{'path':<13}{'family':<8}" + "".join(f"{m:>13}" for m in MODES))
    for path in (triton_path, "trt-ptx"):
        for family in families:
            print(f"{path:<13}{family:<8}" + "".join(f"{cells[path, family, m]:>13}" for m in MODES))
    for i, reason in enumerate(notes):
        print(f"[{i + 1}] {reason}")
    print(TRT_NOTE)
    for line in failed:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
