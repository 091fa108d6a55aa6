"""Tile sweep for the decode step: candidate ``ops.TILES`` entries timed at one batch.

    python benchmarks/sweep_tiles.py [--batch 256] [--models nemotron-h,qwen3.5,kimi-linear]

Prints, per model: for each decode candidate (rows, warps, chunk, stages) the non-flush step
(w = 7) with the fp32 checkpoint and with each --formats read copy; for each flush candidate
(rows, warps) the flush step; and the largest output difference from the first candidate (the
candidates must agree). The chosen entries go into ``ops.TILES`` by hand.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import Layer, bytes_ring_entry, bytes_state, timed  # noqa: E402
from floors import read_floor  # noqa: E402
from replayssm.kernels import ops  # noqa: E402
from shapes import MODEL_SPECS, WINDOW  # noqa: E402

DECODE = {
    "mamba2": [(64, 2, 32, 3), (32, 1, 32, 3), (64, 2, 16, 4), (64, 1, 32, 3)],
    "delta": [(64, 1, 32, 3), (64, 2, 32, 3), (64, 1, 16, 4), (128, 2, 32, 3)],
}
FLUSH = {"mamba2": [(32, 4, None), (16, 2, None)], "delta": [(32, 2, 2), (32, 2, 1)]}


def _time(spec, batch, fill, read_format="checkpoint"):
    layer = Layer(spec, batch, read_format=read_format)
    fn, out = layer.step_fn(layer.inputs(1))
    layer.set_fill(fill)
    t = timed(fn)
    fn()
    return t, out.float()


def sweep(name, batch, formats):
    spec = MODEL_SPECS[name]
    fam = "mamba2" if spec.family == "mamba2" else "delta"
    saved = {k: dict(v) for k, v in ops.TILES[fam].items()}
    S, ring = bytes_state(spec), bytes_ring_entry(spec)
    floor = timed(read_floor(torch.empty(int(batch * S) // 4, device="cuda")))
    print(f"\n{name} batch {batch}: read floor over the state {floor:.1f} us (tiles now {saved})")
    print(f"{'rows':>4} {'warps':>5} {'chunk':>5} {'stages':>6} {'non-flush us':>12} {'GB/s':>7} "
          + " ".join(f"{f + ' us':>9}" for f in formats) + f" {'max |dy|':>9}")
    first = None
    for rows, nw, chunk, stages in DECODE[fam]:
        ops.TILES[fam]["decode"] = dict(rows=rows, num_warps=nw, chunk=chunk, stages=stages)
        try:
            t, y = _time(spec, batch, 7)
            diff = 0.0 if first is None else (y - first).abs().max().item()
            first = y if first is None else first
            fmt_t = [_time(spec, batch, 7, rf)[0] for rf in formats]
            print(f"{rows:>4} {nw:>5} {chunk:>5} {stages:>6} {t:>12.1f} {batch * (S + 8 * ring) / t / 1e3:>7.0f} "
                  + " ".join(f"{x:>9.1f}" for x in fmt_t) + f" {diff:>9.2e}", flush=True)
        except Exception as e:  # a candidate that does not compile is reported, not fatal
            print(f"{rows:>4} {nw:>5} {chunk:>5} {stages:>6} failed: {e!r}", flush=True)
        torch.cuda.empty_cache()
    ops.TILES[fam]["decode"] = saved["decode"]
    print(f"{'rows':>4} {'warps':>5} {'stages':>6} {'flush us':>9} {'max |dy|':>9}")
    first = None
    for rows, nw, stages in FLUSH[fam]:
        ops.TILES[fam]["flush"] = dict(rows=rows, num_warps=nw, **({} if stages is None else dict(stages=stages)))
        try:
            t, y = _time(spec, batch, WINDOW - 1)
            diff = 0.0 if first is None else (y - first).abs().max().item()
            first = y if first is None else first
            print(f"{rows:>4} {nw:>5} {stages or '-':>6} {t:>9.1f} {diff:>9.2e}", flush=True)
        except Exception as e:
            print(f"{rows:>4} {nw:>5} {stages or '-':>6} failed: {e!r}", flush=True)
        torch.cuda.empty_cache()
    ops.TILES[fam].update(saved)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--models", default="nemotron-h,qwen3.5,kimi-linear")
    ap.add_argument("--formats", default="nvfp4")
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    for name in args.models.split(","):
        sweep(name, args.batch, formats)


if __name__ == "__main__":
    main()
