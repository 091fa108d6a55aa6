"""The Mamba-2 flush pass behind an NVFP4 read copy, timed alone, over candidate ``flush`` tiles.

    python benchmarks/sweep_flush_pass.py [--model nemotron-h] [--batch 256]
                                          [--checkpoint-dtypes float16_sr,float32] [--json OUT.json]

``sweep_tiles.py --kinds flush`` times whole steps; this times each launch of a decode step alone
(each replayed from its own CUDA graph), so that the flush pass's share is not hidden in the step:
- ``stag_flush_us``: the flush pass of the staggered step (row r holds r mod 16 entries, so 1/16 of the
  rows flush: the serving steady state), and ``stag_decode_us``, the same step's non-flush pass;
- ``all_flush_us``: the flush pass of a step whose rows all flush;
- ``regs``, ``spills``, ``smem``: the compiled flush kernel's registers per thread, spilled registers
  and shared memory (bytes), which bound how many of its programs an SM holds.
The tile in use comes first; the candidates vary rows per program, warps, chunk columns, pipeline
stages, row programs and the register cap (``maxnreg``). The flush pass re-folds the same window at
every replay (the cursors do not move), which changes no timing. The pick goes into
``kernels/tiles.py`` by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import Layer, timed  # noqa: E402
from replayssm.kernels import ops  # noqa: E402
from replayssm.kernels.tiles import TILES  # noqa: E402
from shapes import MODEL_SPECS  # noqa: E402

# (rows, num_warps, chunk, stages, row_programs, maxnreg or 0)
CANDIDATES = [(32, 2, 32, 3, 16, 0), (32, 2, 16, 4, 16, 0), (32, 2, 16, 3, 16, 0), (32, 2, 16, 6, 16, 0),
              (32, 2, 16, 2, 16, 0), (64, 2, 16, 4, 16, 0), (64, 4, 16, 4, 16, 0), (64, 2, 16, 3, 16, 0),
              (32, 1, 16, 4, 16, 0), (16, 1, 16, 4, 16, 0), (32, 4, 16, 4, 16, 0), (32, 2, 16, 4, 16, 96),
              (32, 2, 32, 3, 16, 128), (32, 2, 32, 3, 16, 96), (64, 2, 32, 3, 16, 128), (64, 2, 16, 4, 16, 128),
              (32, 2, 16, 4, 4, 0), (32, 2, 16, 4, 64, 0), (64, 4, 16, 4, 16, 96)]


def step_launches(layer: Layer, staggered: bool) -> list:
    """The launches (``plan.Launch``) of one committed decode step of ``layer``, its cursors set to the
    staggered fill or to every row flushing; the step runs once."""
    captured = []
    run = ops.launch

    def capture(plan):
        captured[:] = plan
        run(plan)

    layer.set_staggered() if staggered else layer.set_fill(15)
    fn, _ = layer.step_fn(layer.inputs(1))
    ops.launch = capture
    try:
        fn()
    finally:
        ops.launch = run
    torch.cuda.synchronize()
    return captured


def candidates() -> list[dict]:
    in_use = dict(TILES["mamba2"]["flush"])
    out = [in_use]
    for rows, warps, chunk, stages, rp, cap in CANDIDATES:
        tile = {k: v for k, v in in_use.items() if k != "maxnreg"}
        tile.update(rows=rows, num_warps=warps, chunk=chunk, stages=stages, row_programs=rp)
        if cap:
            tile["maxnreg"] = cap
        if tile not in out:
            out.append(tile)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nemotron-h", choices=[k for k, s in MODEL_SPECS.items() if s.family == "mamba2"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--checkpoint-dtypes", default="float16_sr,float32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    spec = MODEL_SPECS[args.model]
    in_use = dict(TILES["mamba2"]["flush"])
    rows = []
    for dtype in args.checkpoint_dtypes.split(","):
        layer = Layer(spec, args.batch, read_format="nvfp4", checkpoint_dtype=dtype)
        for tile in candidates():
            TILES["mamba2"]["flush"] = tile
            row = dict(model=args.model, batch=args.batch, ckpt=dtype, tile=tile)
            try:
                for name, staggered in (("stag", True), ("all", False)):
                    plan = step_launches(layer, staggered)
                    flush = next(lc for lc in plan if lc.flush_pass)
                    kernel = flush.run()
                    row[name + "_flush_us"] = round(timed(flush.run), 2)
                    if staggered:
                        rest = next(lc for lc in plan if not lc.flush_pass)
                        row["stag_decode_us"] = round(timed(rest.run), 2)
                        row.update(regs=kernel.n_regs, spills=kernel.n_spills, smem=kernel.metadata.shared)
            except Exception as e:  # a candidate that does not compile is reported, not fatal
                row["error"] = repr(e)[:300]
            finally:
                TILES["mamba2"]["flush"] = in_use
            print(json.dumps(row), flush=True)
            rows.append(row)
        del layer
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=triton.__version__, command=" ".join(sys.argv),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
