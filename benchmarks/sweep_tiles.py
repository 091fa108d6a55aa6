"""Tile sweep: candidate ``ops.TILES`` entries timed at one batch, one table per tile kind.

    python benchmarks/sweep_tiles.py [--batch 256] [--models nemotron-h,qwen3.5,kimi-linear]
                                     [--kinds decode,decode_vk,read_fp8,read,verify,verify_read,flush,
                                              flush_replay,verify_flush,verify_fold,flush_replay_vk,
                                              verify_flush_vk]
                                     [--pick 0,-1] [--q-dtype bfloat16|float32] [--verify-tokens 2,4,8]
                                     [--checkpoint-dtype float32|float16_sr|bfloat16] [--json OUT.json]

Per model and kind, each candidate's step time, and the largest output difference from the first
candidate (the candidates must agree):
- decode: the non-flush step (w = 7) and the flush step, fp32 checkpoint, and their amortized
  step (the decode tiles fold the flush rows in the same launch); decode_vk (GDN / KDA): the
  same on a [S, HV, V, K] checkpoint, the layout the SGLang and TRT-LLM adapters bind;
- read_fp8, read: the non-flush step over an fp8 / NVFP4 read copy (read_fp8 tries the decode
  candidates);
- verify, verify_read: a T = 8 verify (a column per T of --verify-tokens) without flush (w = 16 - 1 - 8),
  ring sized for 8 tokens, on the checkpoint / behind an NVFP4 read copy (verify_read tries the
  verify candidates);
- flush (Mamba-2): the non-flush and the flush step behind an NVFP4 read copy, and their amortized
  step (the flush pass is launched at every step; on the checkpoint the decode step's flush is the
  decode launch's fold: the decode kinds; the flush-only launch takes the verify_flush tile);
- flush_replay (GDN / KDA): the same for the flush pass behind an NVFP4 read copy (the window
  replays);
- verify_flush: a T = 8 verify whose rows all flush (8 + 8 entries) or half of them (row r holds
  r mod 16), on the checkpoint and behind an NVFP4 read copy: the verify's flush pass (on the
  checkpoint only with a verify tile of fold=False);
- verify_fold: the same verify on the checkpoint, and one without flush rows, over the verify tiles:
  the tile in use, the same with its fold flipped (fold=True: the verify kernel folds its flush
  rows; fold=False: the flush pass does), then the verify candidates;
- flush_replay_vk, verify_flush_vk (GDN / KDA): flush_replay's columns, then the flush and
  staggered steps behind an fp8 read copy, and verify_flush's behind NVFP4 (all, half), on a
  [S, HV, V, K] checkpoint; the first row is the same step on [S, HV, K, V] at the kv tile in use
  (what the vk rows should match), then the candidates: the tile in use, its key runs, rows / warps,
  stages, row_programs, the read-copy encode's row maxima over the tile (``rows_from_blocks=False``).
A step with flush rows is timed without moving the cursors, so every call folds the same window
into the checkpoint again: there the candidates' outputs drift apart with the number of calls timed,
and the max |dy| column holds that drift too (the kernel tests check the tiles' results).
decode, flush and flush_replay also time the staggered step (row r holds r mod 16 entries, so
1/16 of the rows flush: the serving steady state, where a flush pass's rows are few).
Decode, read and flush size the ring for decode only (no draft tokens), as bench_decode does.
``--json`` also writes every row (model, kind, layout, tile, column times, max |dy|), after each
row. The chosen
entries go into ``kernels/tiles.py`` by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import Layer, timed  # noqa: E402
from replayssm.kernels import ops  # noqa: E402
from shapes import MODEL_SPECS, WINDOW  # noqa: E402

VERIFY_T = 8
CANDIDATES = {
    "mamba2": {
        "decode": [(dict(rows=64, num_warps=1, chunk=64, stages=3, acc=False), 16),
                   (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=False), 16),
                   (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=False), 32),
                   (dict(rows=64, num_warps=4, chunk=32, stages=3, acc=False), 16),
                   (dict(rows=64, num_warps=4, chunk=32, stages=3, acc=False), 32),
                   (dict(rows=32, num_warps=2, chunk=32, stages=3, acc=False), 32),
                   (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True), 32),
                   (dict(rows=64, num_warps=1, chunk=16, stages=4, acc=True), 16),
                   (dict(rows=64, num_warps=2, chunk=16, stages=4, acc=True), 16)],
        "read": [dict(rows=64, num_warps=1, chunk=64, stages=3, acc=True),
                 dict(rows=64, num_warps=1, chunk=64, stages=2, acc=True),
                 dict(rows=32, num_warps=1, chunk=128, stages=2, acc=True),
                 dict(rows=64, num_warps=2, chunk=64, stages=2, acc=False),
                 dict(rows=64, num_warps=2, chunk=64, stages=2, acc=True),
                 dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True),
                 dict(rows=64, num_warps=1, chunk=16, stages=4, acc=True),
                 dict(rows=64, num_warps=4, chunk=64, stages=2, acc=True),
                 dict(rows=64, num_warps=2, chunk=128, stages=2, acc=True)],
        "verify": [dict(rows=64, num_warps=4, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=64, num_warps=4, chunk=32, stages=2, dot="ieee"),
                   dict(rows=64, num_warps=4, chunk=64, stages=2, dot="tf32x3"),
                   dict(rows=32, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=64, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=64, num_warps=1, chunk=32, stages=2, dot="tf32x3")],
        "verify_flush": [dict(rows=r, num_warps=w, chunk=32, stages=2, dot="tf32x3", row_programs=16)
                         for r, w in ((64, 4), (32, 1), (16, 1), (32, 2), (64, 2), (64, 1))],
        "flush": [dict(rows=32, num_warps=2, chunk=32, stages=3, dot="tf32x3", row_programs=r)
                  for r in (4, 16, 64, 256)]
                 + [dict(rows=64, num_warps=4, chunk=32, stages=2, dot="tf32x3", row_programs=16)]
                 + [dict(rows=r, num_warps=1, chunk=32, stages=3, dot="tf32x3", row_programs=rp)
                    for r, rp in ((32, 16), (16, 16), (16, 4), (64, 16))],
    },
    "delta": {
        "decode": [(dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False), 16),
                   (dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False), 32),
                   (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True), 16),
                   (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True), 32),
                   (dict(rows=128, num_warps=4, chunk=32, stages=3, acc=True), 16),
                   (dict(rows=128, num_warps=4, chunk=32, stages=3, acc=True), 32),
                   (dict(rows=128, num_warps=2, chunk=16, stages=4, acc=True), 16),
                   (dict(rows=64, num_warps=1, chunk=16, stages=4, acc=True), 16),
                   (dict(rows=64, num_warps=2, chunk=64, stages=2, acc=False), 16),
                   (dict(rows=64, num_warps=1, chunk=32, stages=2, acc=False), 16)],
        "decode_vk": [(dict(rows=128, num_warps=4, chunk=32, stages=3, acc=True), 16),
                      (dict(rows=128, num_warps=4, chunk=32, stages=3, acc=True), 32),
                      (dict(rows=128, num_warps=2, chunk=32, stages=3, acc=True), 16),
                      (dict(rows=128, num_warps=2, chunk=16, stages=4, acc=True), 16),
                      (dict(rows=64, num_warps=1, chunk=16, stages=4, acc=True), 16),
                      (dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True), 16),
                      (dict(rows=128, num_warps=4, chunk=16, stages=4, acc=True), 16),
                      (dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False), 16),
                      # wider key chunks: each row's read is a longer contiguous run of the [V, K] state (by
                      # ptxas, Triton 3.8, sm_90a: 168 to 239 registers, none spilling); at batch 256 on an H100
                      # all four were slower than the tiles in use (results/sweep-vk-wide-chunks-h100.json)
                      (dict(rows=32, num_warps=2, chunk=64, stages=3, acc=True), 16),
                      (dict(rows=64, num_warps=4, chunk=64, stages=2, acc=True), 16),
                      (dict(rows=16, num_warps=1, chunk=64, stages=3, acc=True), 16),
                      (dict(rows=16, num_warps=1, chunk=128, stages=1, acc=False), 16)],
        "read": [dict(rows=64, num_warps=1, chunk=64, stages=3, acc=True),
                 dict(rows=64, num_warps=1, chunk=64, stages=4, acc=True),
                 dict(rows=64, num_warps=1, chunk=64, stages=2, acc=True),
                 dict(rows=64, num_warps=1, chunk=32, stages=3, acc=False),
                 dict(rows=128, num_warps=2, chunk=64, stages=2, acc=False),
                 dict(rows=64, num_warps=1, chunk=32, stages=3, acc=True),
                 dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True),
                 dict(rows=32, num_warps=1, chunk=32, stages=3, acc=True),
                 dict(rows=128, num_warps=2, chunk=16, stages=4, acc=True),
                 dict(rows=128, num_warps=4, chunk=32, stages=3, acc=True),
                 dict(rows=128, num_warps=4, chunk=16, stages=4, acc=True),
                 dict(rows=128, num_warps=2, chunk=16, stages=3, acc=True),
                 dict(rows=128, num_warps=4, chunk=64, stages=2, acc=True),
                 dict(rows=64, num_warps=2, chunk=64, stages=2, acc=True)],
        "verify": [dict(rows=64, num_warps=4, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=64, num_warps=4, chunk=32, stages=2, dot="ieee"),
                   dict(rows=128, num_warps=8, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=32, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=128, num_warps=4, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=64, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
                   dict(rows=128, num_warps=4, chunk=16, stages=3, dot="tf32x3"),
                   dict(rows=128, num_warps=4, chunk=64, stages=2, dot="tf32x3"),
                   dict(rows=128, num_warps=2, chunk=32, stages=2, dot="tf32x3")],
        "flush_replay": [dict(rows=32, num_warps=2, stages=2, dot="tf32x3", row_programs=r) for r in (4, 16, 64, 256)]
                        + [dict(rows=64, num_warps=4, stages=2, dot="tf32x3", row_programs=16)]
                        # one warp: the replay's per-entry reduction over K stays within the warp (no shared memory)
                        + [dict(rows=r, num_warps=1, stages=2, dot="tf32x3", row_programs=rp)
                           for r, rp in ((32, 4), (16, 4), (16, 16), (8, 4), (8, 16))]
                        + [dict(rows=16, num_warps=1, stages=st, dot="tf32x3", row_programs=4) for st in (1, 3, 4)],
        "verify_flush": [dict(rows=r, num_warps=w, stages=2, dot="tf32x3", row_programs=rp)
                         for r, w, rp in ((32, 8, 16), (16, 1, 16), (16, 1, 4), (32, 1, 16), (32, 2, 16), (32, 4, 16))],
    },
}
# the decode tiles also fold the flush rows (fold_chunk, dot): candidates without spills by ptxas (sm_90a), and
# the tiles that were best before the fold joined the decode launch; last, the chosen tile and the same with
# fold=False (the flush rows take the flush pass instead)
for _fam, _kind in (("mamba2", "decode"), ("delta", "decode"), ("delta", "decode_vk")):
    CANDIDATES[_fam][_kind] = ([dict(t, dot="tf32x3", fold_chunk=fc) for t, fc in CANDIDATES[_fam][_kind]]
                               + [dict(ops.TILES[_fam][_kind]), dict(ops.TILES[_fam][_kind], fold=False)])
# the fold stream's own pipeline depth (fold_stages; default the decode stream's stages)
for _kind in ("decode", "decode_vk"):
    CANDIDATES["delta"][_kind] += ([dict(ops.TILES["delta"][_kind], fold_stages=fs) for fs in (1, 3, 4)]
                                   + [dict(ops.TILES["delta"][_kind], fold_chunk=32, fold_stages=3)])
CANDIDATES["mamba2"]["decode"] += [dict(ops.TILES["mamba2"]["decode"], fold_stages=fs) for fs in (1, 2, 3, 6)]
# the verify's least padded token count (tokens; T pads to a power of two, at least this), on the chosen tiles
for _fam in ("mamba2", "delta"):
    _tile = ops.TILES[_fam]["verify"]
    CANDIDATES[_fam]["verify"] += [dict(_tile, tokens=n) for n in (2, 8, 16) if n != _tile.get("tokens", 2)]
CANDIDATES["delta"]["decode_vk"] += [dict(ops.TILES["kda"]["decode_vk"], fold_stages=fs) for fs in (4, 1, 2, 3)]
# the GDN non-flush step behind NVFP4 takes 254 registers, one warp per program: capped (ptxas: 132 bytes
# spilled at 168)
CANDIDATES["delta"]["read"] += [dict(ops.TILES["delta"]["read"], maxnreg=168)]
# the replay behind a read copy on a [S, HV, V, K] checkpoint: the family's tile in use, its key runs (0: the
# [K, BV] tile, whose lanes all lie along K), then one change at a time from the tile, and the encode's row
# maxima taken over the tile (rows_from_blocks=False); built in sweep() around the family's own entry


def vk_candidates(kind: str, tile: dict) -> list[dict]:
    """The candidates of a _vk kind around ``tile``, the family's tile in use."""
    if kind == "flush_replay_vk":
        return [dict(tile), dict(tile, key_runs=0), dict(tile, key_runs=16), dict(tile, key_runs=64),
                dict(tile, rows=32, num_warps=2), dict(tile, rows=32), dict(tile, stages=1), dict(tile, stages=3),
                dict(tile, row_programs=16), dict(tile, rows_from_blocks=False), *register_caps(tile)]
    return [dict(tile), dict(tile, key_runs=0), dict(tile, key_runs=16), dict(tile, rows=32, num_warps=2),
            dict(tile, row_programs=4), dict(tile, rows_from_blocks=False), *register_caps(tile)]


def register_caps(tile: dict) -> list[dict]:
    """The tile with its registers per thread capped (``maxnreg``), so that more of its warps fit an
    SM: the flush pass behind an NVFP4 read copy takes 255 registers (8 one-warp programs per SM,
    each replaying a chain of dependent entries). By ptxas (Triton 3.6, sm_90a) at a decode's flush
    pass on [S, HV, V, K]: Qwen3.5 spills 4 bytes at 168 registers and 112 at 128; Kimi-Linear 24
    and 172. At 4 row programs a flush of every row has 8 x 32 x 4 = 1024 programs (V / 16 tiles,
    32 heads) for 132 SMs, fewer than the 8 per SM the registers allow already, so the cap is also
    tried with 8 and 16 row programs."""
    caps = [dict(tile, maxnreg=cap) for cap in (168, 128)]
    return caps + [dict(tile, maxnreg=168, row_programs=rp) for rp in (8, 16) if rp > tile["row_programs"]]


# the _vk kinds whose first row is the same step on a [S, HV, K, V] checkpoint at the kv kind's tile in use
KV_ROW = {"flush_replay_vk": "flush_replay", "verify_flush_vk": "verify_flush"}
# kind -> [(column, read format, tokens, fill)]; the _vk kinds run on a [S, HV, V, K] checkpoint (the
# SGLang / TRT-LLM adapters' layout). The amortized column is (15 x w=7 + flush) / 16; a fill of None is
# the staggered step (row r holds r mod 16 entries: 1/16 of the rows flush, the serving steady state).
_DECODE = [("w=7", "checkpoint", 1, 7), ("flush", "checkpoint", 1, WINDOW - 1), ("staggered", "checkpoint", 1, None)]


def verify_setups(tokens=(VERIFY_T,)) -> dict:
    """The verify kinds' columns: a verify of each T in ``tokens`` over the same 16 - 1 - 8 history entries."""
    return {kind: [(f"{fmt} T={t}", fmt, t, WINDOW - 1 - VERIFY_T) for t in tokens]
            for kind, fmt in (("verify", "checkpoint"), ("verify_read", "nvfp4"))}


SETUPS = {"decode": _DECODE, "decode_vk": _DECODE, "read_fp8": [("w=7", "fp8", 1, 7)],
          "read": [("w=7", "nvfp4", 1, 7)], **verify_setups(),
          "flush": [("w=7", "nvfp4", 1, 7), ("flush", "nvfp4", 1, WINDOW - 1), ("staggered", "nvfp4", 1, None)],
          "flush_replay": [("w=7", "nvfp4", 1, 7), ("flush", "nvfp4", 1, WINDOW - 1),
                           ("staggered", "nvfp4", 1, None)],
          # a verify whose rows all flush (8 + 8 entries), or half of them (row r holds r mod 16)
          "verify_flush": [(f"{fmt} {c}", fmt, VERIFY_T, fill) for fmt in ("checkpoint", "nvfp4")
                           for c, fill in (("all", WINDOW - VERIFY_T), ("half", None))],
          "verify_fold": [(c, "checkpoint", VERIFY_T, fill) for c, fill in
                          (("no flush", WINDOW - 1 - VERIFY_T), ("all", WINDOW - VERIFY_T), ("half", None))],
          "flush_replay_vk": [("w=7", "nvfp4", 1, 7), ("flush", "nvfp4", 1, WINDOW - 1),
                              ("staggered", "nvfp4", 1, None), ("fp8 flush", "fp8", 1, WINDOW - 1),
                              ("fp8 staggered", "fp8", 1, None)],
          "verify_flush_vk": [("nvfp4 all", "nvfp4", VERIFY_T, WINDOW - VERIFY_T),
                              ("nvfp4 half", "nvfp4", VERIFY_T, None)]}
ROWS: list[dict] = []   # every timed row, for --json
JSON_PATH: str | None = None
TILES_IN_USE = json.loads(json.dumps(ops.TILES))   # before the sweep sets candidates


def _dump(batch):
    """Write the rows so far to --json (after every row: a run cut short keeps what it timed)."""
    if JSON_PATH:
        with open(JSON_PATH, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           batch=batch, tiles=TILES_IN_USE, rows=ROWS), f, indent=1)


def _time(spec, batch, read_format, T, fill, state_layout="kv", q_dtype=None, checkpoint_dtype="float32"):
    layer = Layer(spec, batch, read_format=read_format, max_draft_tokens=VERIFY_T - 1 if T > 1 else 0,
                  state_layout=state_layout, checkpoint_dtype=checkpoint_dtype)
    inp = layer.inputs(T)
    if q_dtype is not None and "q" in inp:
        inp["q"] = inp["q"].to(q_dtype)
    fn, out = layer.step_fn(inp, committed=T == 1)
    setup = layer.set_staggered if fill is None else lambda: layer.set_fill(fill)
    setup()
    t = timed(fn)
    setup()
    fn()
    return t, out.float()


def sweep(name, batch, kinds, pick=None, q_dtype=None, checkpoint_dtype="float32"):
    spec = MODEL_SPECS[name]
    fam = "mamba2" if spec.family == "mamba2" else "delta"
    table = ops.TILES["kda" if spec.family == "kda" else fam]   # KDA's entries override delta's
    saved = {k: dict(v) for k, v in table.items()}
    print(f"\n{name} batch {batch} (tiles now {saved})")
    for kind in kinds:
        candidates = CANDIDATES[fam].get({"read_fp8": "decode", "verify_read": "verify", "verify_fold": "verify"}
                                         .get(kind, kind))
        key = "verify" if kind == "verify_fold" else kind                   # the ops.TILES entry swept
        if kind == "verify_fold":
            flipped = dict(saved["verify"], fold=not saved["verify"].get("fold", True))
            candidates = [saved["verify"], flipped] + candidates
        if kind in KV_ROW and fam == "delta":    # around the family's own entry (KDA's override delta's)
            candidates = vk_candidates(kind, {**ops.TILES["delta"], **ops.TILES.get(spec.family, {})}[kind])
        if candidates is None:                   # flush_replay and the _vk kinds are the delta families'
            continue
        columns = SETUPS[kind]
        amortized = [c[0] for c in columns][:2] == ["w=7", "flush"]
        heads = [c[0] + " us" for c in columns] + (["amortized us"] if amortized else [])
        print(f"{kind:>7}: " + " ".join(f"{h:>14}" for h in heads) + f" {'max |dy|':>9}  layout tile")
        first = None
        rows = [(tile, "vk" if kind.endswith("_vk") else "kv") for tile in
                (candidates if pick is None else [candidates[j] for j in pick])]
        if kind in KV_ROW:                       # the same step on [S, HV, K, V] at the kv tile in use
            rows.insert(0, (None, "kv"))
        for tile, layout in rows:
            if tile is not None:
                table[key] = tile
            shown = tile if tile is not None else {**ops.TILES[fam], **ops.TILES.get(spec.family, {})}[KV_ROW[kind]]
            try:
                times, ys = zip(*(_time(spec, batch, f, T, fill, layout, q_dtype, checkpoint_dtype)
                                  for _, f, T, fill in columns))
                diff = 0.0 if first is None else max((y - f).abs().max().item() for y, f in zip(ys, first))
                first = ys if first is None else first
                if amortized:
                    times += ((WINDOW - 1) * times[0] + times[1]) / WINDOW,
                print(" " * 9 + " ".join(f"{t:>14.1f}" for t in times) + f" {diff:>9.2e}  {layout:>6} {shown}",
                      flush=True)
                ROWS.append(dict(model=name, batch=batch, kind=kind, layout=layout, tile=shown, max_dy=diff,
                                 checkpoint_dtype=checkpoint_dtype, us=dict(zip(heads, (round(t, 2) for t in times)))))
            except Exception as e:  # a candidate that does not compile is reported, not fatal
                print(" " * 9 + f"failed: {e!r}  {layout:>6} {shown}", flush=True)
                ROWS.append(dict(model=name, batch=batch, kind=kind, layout=layout, tile=shown, failed=repr(e)))
            _dump(batch)
            torch.cuda.empty_cache()
        if key in saved:
            table[key] = saved[key]
        else:                                  # a KDA kind that falls back to delta's entry
            del table[key]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--models", default="nemotron-h,qwen3.5,kimi-linear")
    ap.add_argument("--kinds", default="decode,decode_vk,read_fp8,read,verify,verify_read,flush,flush_replay")
    ap.add_argument("--pick", help="comma-separated candidate indices to time (Python indexing; default all)")
    ap.add_argument("--verify-tokens", default=str(VERIFY_T),
                    help="comma-separated T of the verify kinds (each a column; the history holds 16 - 1 - 8 "
                         "entries and the ring is sized for 8 tokens whatever T)")
    ap.add_argument("--q-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="GDN / KDA queries: bfloat16 as the peers take them (bench_decode), or float32 as the "
                         "adapters pass them (L2-normalised in fp32)")
    ap.add_argument("--checkpoint-dtype", choices=["float32", "float16_sr", "bfloat16"], default="float32",
                    help="the checkpoint's dtype in every timed step (behind a read copy: the replay's state)")
    ap.add_argument("--json", default=None, help="also write every timed row to this file")
    args = ap.parse_args()
    pick = None if args.pick is None else [int(j) for j in args.pick.split(",")]
    tokens = [int(t) for t in args.verify_tokens.split(",")]
    if not all(2 <= t <= VERIFY_T for t in tokens):
        ap.error(f"--verify-tokens: expected token counts in 2..{VERIFY_T}, got {args.verify_tokens!r}")
    SETUPS.update(verify_setups(tokens))
    global JSON_PATH
    JSON_PATH = args.json
    for name in args.models.split(","):
        sweep(name, args.batch, args.kinds.split(","), pick, getattr(torch, args.q_dtype), args.checkpoint_dtype)


if __name__ == "__main__":
    main()
