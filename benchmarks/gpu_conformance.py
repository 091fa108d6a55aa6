"""GPU half of the conformance suite: its vectors through the compiled Triton kernels on CUDA.

    python benchmarks/gpu_conformance.py [--device cuda]

Every family x mode of ``tests/conformance/vectors.py`` runs through
``StatePool(backend="triton", device="cuda")`` and is checked as the CPU suite checks its
interpreter run: outputs within ``helpers.TOL`` of the fp64 step recurrence, outputs and
checkpoint within the pair tolerance of the CPU reference pool, raw ring entries and cursors bit
for bit. Prints the matrix (pass / FAIL, worst error vs the recurrence); exits 1 on a failure.
``--device cpu`` with ``TRITON_INTERPRET=1`` runs the same script in Triton's interpreter (what
the CPU suite already covers; a smoke test of the script). Not covered: the TensorRT path's PTX
loaded through the driver.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "conformance")]

import torch  # noqa: E402

from checks import check_kernels_vs_reference, check_outputs  # noqa: E402
from paths import run_oracle, run_pool  # noqa: E402
from vectors import FAMILIES, MODES, make_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The conformance vectors through the Triton kernels on a device.")
    ap.add_argument("--device", default="cuda")
    device = ap.parse_args(argv).device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_conformance: no CUDA device", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(device) if device.startswith('cuda') else device}")
    print(f"{'family':<8}" + "".join(f"{m:>13}" for m in MODES))
    failed = []
    for family in FAMILIES:
        cells = []
        for mode in MODES:
            c, problems = make_case(family, mode), []
            t = run_pool(c, "triton", device=device)
            worst = check_outputs(c, t.outputs, run_oracle(c), problems)
            check_kernels_vs_reference(c, t, run_pool(c, "reference"), problems)
            cells.append(f"{'pass' if not problems else 'FAIL'} {worst:.0e}")
            failed += [f"{c.name}: {p}" for p in problems]
        print(f"{family:<8}" + "".join(f"{x:>13}" for x in cells))
    for line in failed:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
