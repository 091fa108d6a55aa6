"""The tile table: hand-picked tiles of every step pass, by family and kind (no autotuning: these
kernels mutate state). Chosen with ``benchmarks/sweep_tiles.py`` on an H200 at real dims
(N = K = 128); the sweeps behind each entry, and the alternatives measured for it, are in
``docs/kernel-design.md`` (the Mamba-2 flush pass's, timed alone, with
``benchmarks/sweep_flush_pass.py``). ``kernels/plan.py`` turns a step into launches with these tiles.

Families: ``"mamba2"``, ``"delta"`` (GDN) and ``"kda"``, whose entries override delta's.

Kinds: ``decode`` (a decode on the checkpoint, one launch that also folds its flush rows;
``decode_vk`` on a ``[S, HV, V, K]`` checkpoint), ``read_fp8`` / ``read`` (a decode over an fp8 /
NVFP4 read copy), ``flush`` (the flush pass of the other steps: Mamba-2 streams it like decode;
delta: the flush-only launch, ``flush_vk`` on a ``[S, HV, V, K]`` checkpoint), ``flush_replay``
(delta behind a read copy: replays the window instead of folding the cached d), ``verify`` (T > 1
tokens, the state streamed once; ``verify_read`` behind a read copy, fp8 included), ``verify_flush``
(its flush pass, and the flush-only launch's), ``flush_replay_vk`` / ``verify_flush_vk`` (the
replay behind a read copy on a ``[S, HV, V, K]`` checkpoint), ``gating`` (``delta_gating``: a step's
inputs from a host's raw projections).

Keys: ``rows`` (P or V rows per program), ``num_warps``; ``chunk`` (state columns streamed at a
time; a verify raises it to 16 words for ``tl.dot``), ``stages`` (pipeline depth; the delta flush:
its replay loop's), ``acc`` (the chunks' products reduced once after the stream), ``dot`` (the
products' precision); ``fold_chunk`` / ``fold_stages`` (the decode's fold of its flush rows:
columns and depth, default ``stages``); ``row_programs`` (programs per (tile, head) sharing a
flush pass's rows; tiles not swept take 16); ``tokens`` (a verify pads its T tokens to a power of
two at least this, default 2); ``rows_from_blocks`` (the delta flush pass's read-copy encode takes the row maxima over the block
maxima, so that its divisions are not repeated in every lane along K; default False);
``key_runs`` (the delta flush pass behind a read copy: its checkpoint tile as runs of this many key
channels, value rows across the lanes, kept in that shape through the replay, so that each entry's
reduction over K stays mostly within a thread on a ``[S, HV, V, K]`` checkpoint; default 0, one
``[K, BV]`` tile); ``fold=False`` (sweeps and tests only: a step on the checkpoint takes the flush
pass instead); ``heads`` (``gating``: value heads per program, a power of two, 0 for all of a
token's heads); ``maxnreg`` (registers per thread the compiler may use, Triton's launch option;
default uncapped: a cap buys warps per SM at the price of spills).
"""

TILES = {
    "mamba2": {"decode": dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False, fold_chunk=16, fold_stages=4,
                              dot="tf32x3"),
               "read_fp8": dict(rows=64, num_warps=1, chunk=16, stages=4, acc=True),
               "read": dict(rows=64, num_warps=1, chunk=64, stages=3, acc=True),
               "flush": dict(rows=64, num_warps=2, chunk=16, stages=4, dot="tf32x3", row_programs=16,
                            maxnreg=128),
               "verify": dict(rows=64, num_warps=1, chunk=32, stages=2, dot="tf32x3"),
               "verify_read": dict(rows=64, num_warps=1, chunk=32, stages=2, dot="tf32x3"),
               "verify_flush": dict(rows=64, num_warps=2, chunk=32, stages=2, dot="tf32x3", row_programs=16)},
    "delta": {"decode": dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False, fold_chunk=16, fold_stages=1,
                             dot="tf32x3"),
              "decode_vk": dict(rows=64, num_warps=2, chunk=32, stages=3, acc=True, fold_chunk=16, fold_stages=1,
                                dot="tf32x3"),
              "read_fp8": dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False),
              "read": dict(rows=64, num_warps=1, chunk=64, stages=3, acc=True),
              "flush": dict(rows=32, num_warps=4, stages=2, dot="tf32x3", row_programs=16),
              "flush_vk": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=16),
              "flush_replay": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=4),
              "flush_replay_vk": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=4, key_runs=32,
                                     rows_from_blocks=True),
              "verify": dict(rows=128, num_warps=2, chunk=32, stages=2, dot="tf32x3", tokens=8),
              "verify_read": dict(rows=128, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
              "verify_flush": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=16),
              "verify_flush_vk": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=16, key_runs=16,
                                     rows_from_blocks=True),
              # profiled in SGLang's server: 31 µs per Qwen3.5 decode step of 6 layers at batch 256
              "gating": dict(heads=0, num_warps=2)},
    "kda": {"decode": dict(rows=64, num_warps=1, chunk=64, stages=2, acc=False, fold_chunk=16, fold_stages=3,
                           dot="tf32x3"),
            "decode_vk": dict(rows=128, num_warps=2, chunk=16, stages=4, acc=True, fold_chunk=16, dot="tf32x3"),
            "read": dict(rows=128, num_warps=2, chunk=16, stages=3, acc=True),
            "flush": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=16),
            # the verify folds its flush rows (unpipelined, through the decode's _fold_rows)
            "verify": dict(rows=128, num_warps=2, chunk=32, stages=2, dot="tf32x3"),
            "verify_read": dict(rows=128, num_warps=4, chunk=32, stages=2, dot="tf32x3"),
            "flush_replay_vk": dict(rows=16, num_warps=1, stages=2, dot="tf32x3", row_programs=4, key_runs=64,
                                   rows_from_blocks=True),
            "verify_flush_vk": dict(rows=32, num_warps=2, stages=2, dot="tf32x3", row_programs=16, key_runs=32,
                                   rows_from_blocks=True),
            # by ptxas (Triton 3.6, sm_90a) all 32 heads per program at 4 warps take 255 registers and
            # spill 1028 bytes, 8 heads 138 registers, 4 heads 80, none spilling; profiled in the server
            # (Kimi-Linear, 6 KDA layers, batch 256) all heads took 186 µs per step and 4 heads 79.5
            # (BENCHMARKS.md); benchmarks/bench_gating.py times every split against the PyTorch operations
            "gating": dict(heads=4, num_warps=4)},
}

# refresh_read_copy (a read copy re-derived from the stored checkpoint: every extend, under SGLang),
# by where the loaded tile's lanes lie: "cols" where the read copy's columns are contiguous in the
# checkpoint (Mamba-2 [P, N], delta [S, HV, V, K]), "rows" where its rows are (delta [S, HV, K, V]).
# rows: read rows per program; rows_from_blocks (default: lanes along the columns) as in the delta
# flush pass. Chosen with benchmarks/sweep_refresh.py (every candidate writes the same bytes).
REFRESH_TILES = {"cols": dict(rows=16, num_warps=2), "rows": dict(rows=32, num_warps=2)}
