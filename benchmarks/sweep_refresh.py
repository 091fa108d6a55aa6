"""``refresh_read_copy`` (a read copy re-derived from the stored checkpoint) over candidate tiles.

    python benchmarks/sweep_refresh.py [--slots 16,64] [--json OUT.json]

SGLang's integration refreshes the rows of every extend (a prefill) at every SSM layer, and
extra_buffer's extend track refreshes its track slots too, so this op runs twice per layer per
prefill batch. For each layer of Nemotron-H (Mamba-2 ``[P, N]``), Qwen3.5 (GDN) and Kimi-Linear
(KDA) on both checkpoint layouts (``[S, HV, K, V]`` and the hosts' ``[S, HV, V, K]``), each
checkpoint dtype and read format below, and each count of refreshed slots: the op's time with the
tile in use (``kernels/tiles.py``: ``REFRESH_TILES``, first row of each group), with the other
choice of ``rows_from_blocks`` at that tile, and with candidate (rows, warps). Each row records
whether the candidate wrote the same bytes as the tile in use (``same``), the microseconds
(median of CUDA-graph replays) and the GB/s over the bytes moved (checkpoint read, read copy
written). The pick goes into ``REFRESH_TILES`` by hand. ``REPLAYSSM_COMMIT`` names the commit in the JSON.
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
from bench_decode import timed  # noqa: E402
from shapes import MODEL_SPECS  # noqa: E402

import replayssm as rs  # noqa: E402
from replayssm.kernels import ops  # noqa: E402
from replayssm.kernels.backend import READ_CODES, layer_state  # noqa: E402

# (model, checkpoint dtype, read format, state layout)
CASES = [("nemotron-h", "float16_sr", "nvfp4", "kv"), ("nemotron-h", "float32", "nvfp4", "kv"),
         ("nemotron-h", "float32", "fp8", "kv"), ("qwen3.5", "float32", "nvfp4", "vk"),
         ("qwen3.5", "float32", "nvfp4", "kv"), ("kimi-linear", "float32", "nvfp4", "vk")]
CANDIDATES = [(rows, warps) for rows in (8, 16, 32, 64) for warps in (2, 4)] + [(64, 8)]
NUM_SLOTS = 320


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", default="16,64", help="refreshed slots per launch (a prefill batch's requests)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    in_use = {k: dict(v) for k, v in ops.REFRESH_TILES.items()}
    rows_out = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model, ckpt_dtype, read_format, layout in CASES:
        spec = MODEL_SPECS[model]
        cfg = rs.ReplayConfig(seed=1, checkpoint_dtype=ckpt_dtype, read_format=read_format)
        shape = tuple(spec.state_shape)
        if layout == "vk":
            shape = shape[:-2] + (shape[-1], shape[-2])
        state = (torch.randn(1, NUM_SLOTS, *shape, device="cuda", generator=gen)
                 * torch.logspace(-3, 2, shape[-1], device="cuda"))
        pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=NUM_SLOTS, device="cuda", backend="triton",
                            checkpoint=state.to(cfg.torch_checkpoint_dtype), state_layout=layout)
        del state
        buffers = layer_state(pool, 0)
        along = "cols" if ops._cols_contiguous(buffers["checkpoint"], spec.is_delta) else "rows"
        tile0 = in_use[along]
        tiles = [tile0, dict(tile0, rows_from_blocks=along == "rows")]
        tiles += [dict(rows=r, num_warps=w) for r, w in CANDIDATES if dict(rows=r, num_warps=w) != tile0]

        def refresh(slots):
            ops.refresh_read_copy(checkpoint=buffers["checkpoint"], slots=slots, read_codes=buffers["read_codes"],
                                  read_block_scale=buffers["read_block_scale"],
                                  read_row_scale=buffers["read_row_scale"], is_delta=spec.is_delta,
                                  read_format=READ_CODES[read_format])

        per_slot = (buffers["checkpoint"][0].numel() * buffers["checkpoint"].element_size()
                    + sum(v[0, 0].numel() * v.element_size() for v in pool.read.values()))
        for n in (int(x) for x in args.slots.split(",")):
            slots = torch.randperm(NUM_SLOTS, device="cuda", generator=gen)[:n]
            want = None
            for tile in tiles:
                ops.REFRESH_TILES[along] = tile
                try:
                    for v in pool.read.values():
                        v.view(torch.uint8).fill_(0xA5)
                    refresh(slots)
                    got = {k: v.clone() for k, v in pool.read.items()}
                    want = want or got
                    same = all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
                    us = timed(lambda: refresh(slots))
                finally:
                    ops.REFRESH_TILES[along] = in_use[along]
                row = dict(model=model, checkpoint_dtype=ckpt_dtype, read_format=read_format, layout=layout,
                           slots=n, tile=tile, in_use=tile is tile0, same=same, us=round(us, 2),
                           gbps=round(n * per_slot / us / 1e3, 1))
                print(json.dumps(row), flush=True)
                rows_out.append(row)
        del pool, buffers
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, triton=triton.__version__,
                           commit=os.environ.get("REPLAYSSM_COMMIT", "unknown"),
                           command=" ".join(sys.argv), rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
