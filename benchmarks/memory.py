"""SSM memory per running request and layer under speculative decoding: SGLang's per-draft
snapshots against replay's ring.

    python benchmarks/memory.py [--tokens 4 8] [--window 16] [--json OUT]

A verify of T tokens (the bonus token and T - 1 drafts) in SGLang's conventional path keeps, beside
each running request's state, one whole-state snapshot per token (``MambaPool``'s
``intermediate_ssm``, ``[layers, requests + 1, T, *state]`` in the state dtype), from which the
accepted token's state is copied back. Replay allocates none (``ReplayMambaPool``): it keeps a ring
of the last ``window + T - 1`` tokens' inputs, cursors and, optionally, a read copy
(``replayssm.pool.side_bytes_per_slot``; ``tests/test_pool.py`` checks it against a pool's buffers).
Both keep the same state (the replay checkpoint is SGLang's own tensor) and SGLang's conv windows,
which are left out here. Per layer of each model in ``replayssm.spec.MODELS``, with an fp32 state
(``--mamba-ssm-dtype float32``, the replay checkpoint) and a bf16 ring. Computed from the buffers'
shapes; nothing is timed. The last column divides SGLang's state + snapshots by replay's state +
ring + cursors + NVFP4 read copy: how many times as many running requests the same SSM state memory
holds with replay (the conv windows, the same in both, would lower it a little).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from shapes import MODEL_SPECS  # noqa: E402

import replayssm as rs  # noqa: E402
from replayssm.pool import side_bytes_per_slot  # noqa: E402

MIB = 2 ** 20


def rows(tokens: list[int], window: int) -> list[dict]:
    """One row per (model, tokens per verify): bytes per running request and layer."""
    out = []
    for name, spec in MODEL_SPECS.items():
        state = spec.state_numel * 4
        for T in tokens:
            row = dict(model=name, family=spec.family, tokens=T, state=state, sglang_snapshots=T * state)
            for fmt in rs.spec.READ_FORMATS:
                cfg = rs.ReplayConfig(window=window, max_draft_tokens=T - 1, read_format=fmt, ring_dtype="bfloat16")
                row[f"replay_{fmt}"] = sum(side_bytes_per_slot(spec, cfg).values())
            row["requests_ratio_nvfp4"] = (state + row["sglang_snapshots"]) / (state + row["replay_nvfp4"])
            out.append(row)
    return out


def table(data: list[dict]) -> str:
    """The rows as a markdown table (MiB per running request and layer)."""
    lines = ["| model (layer) | tokens per verify | state | SGLang's snapshots | replay: ring + cursors | "
             "+ fp8 read copy | + NVFP4 read copy | per request: SGLang / replay with NVFP4 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in data:
        lines.append(f"| {r['model']} ({r['family']}) | {r['tokens']} | {r['state'] / MIB:.2f} | "
                     f"{r['sglang_snapshots'] / MIB:.2f} | {r['replay_checkpoint'] / MIB:.2f} | "
                     f"{r['replay_fp8'] / MIB:.2f} | {r['replay_nvfp4'] / MIB:.2f} | "
                     f"{r['requests_ratio_nvfp4']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4, 8], help="tokens per verify (T >= 2)")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    if min(args.tokens) < 2:
        ap.error(f"--tokens: expected values >= 2 (a verify of the bonus token and drafts), got {args.tokens}")
    data = rows(args.tokens, args.window)
    print(table(data))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(window=args.window, state_dtype="float32", ring_dtype="bfloat16", rows=data), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
