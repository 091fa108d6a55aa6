"""What a prefill costs a replay pool: the slot events a host's extend puts on one layer, at model dims.

    python benchmarks/bench_events.py [--models nemotron-h qwen3.5 kimi-linear] [--rows 1 8 32 64] [--json OUT]

An extend (a prefill chunk; in SGLang ``MambaMixer2.forward`` or a GDN / KDA backend's
``forward_extend``) flushes its rows before it reads their state (``extend start``: fresh requests'
rings are empty) and refreshes them after it wrote their state (``extend end``: rings emptied,
read copy re-derived from the checkpoint). Per (model, read format, rows), on the checkpoint layout
the hosts bind (Mamba-2 ``[S, H, P, N]``, GDN / KDA ``[S, HV, V, K]``), eager as a prefill runs them:

- ``flush``: ``StatePool.flush(checked=False)`` of rows whose rings are empty;
- ``refresh``: ``StatePool.refresh(checked=False)``, the Triton backend;
- ``refresh (PyTorch)``: the same refresh through the reference backend's PyTorch code on the same
  buffers (the peer: what a refresh costs without its kernel);
- ``first flush`` / ``first refresh``: the first call's wall time in this process, compiles included
  (the script runs on an empty Triton cache unless ``--keep-cache``);
- ``floor``: one read of the rows' checkpoint bytes (``floors.read_floor``).

``--pool-layers L`` adds the events a host issues one request at a time over every layer (SGLang's
radix insert after a prefill copies each request's slot; a finished request's slot is flushed): one
slot's flush and refresh over ``L`` layers, eager and through ``VerbGraphs`` (one CUDA graph replay
per event), and the copy of one slot into another as the SGLang pool makes it
(``StatePool.copy(checked=False, checkpoint=False)``: ring, cursors and read copy, every layer at
once; SGLang copies the checkpoint itself) beside the flush and refresh a copy took before.

``--track-batch B`` adds the decode track copy of SGLang's extra_buffer (``track_mamba_states_all_layers``,
inside SGLang's decode CUDA graph) over ``--pool-layers`` layers (default 1): a batch of ``B`` rows
of which 0, 1 or ``B / 16`` are tracked, the others masked out as padded rows, each captured in a
CUDA graph and replayed; the copy the pool makes (``StatePool.copy(checked=False, checkpoint=False)``:
rings, cursors and read copies, one launch) against what the track did before (a flush of the tracked
sources, then a refresh of their track slots). Both graphs first restore the sources' ring counts,
so every replay's flush has the same entries to fold.

Times are medians of ``triton.testing.do_bench`` (milliseconds, launches included: a prefill runs
them outside CUDA graphs). GB/s counts the checkpoint bytes read and the read-copy bytes written
(none without a read copy: the refresh then only empties the rings).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["nemotron-h", "qwen3.5", "kimi-linear"])
    ap.add_argument("--formats", nargs="+", default=["checkpoint", "nvfp4"], choices=["checkpoint", "fp8", "nvfp4"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--keep-cache", action="store_true", help="use the Triton cache as it is (first calls may "
                                                                 "then find their kernels compiled)")
    ap.add_argument("--pool-layers", type=int, default=0,
                    help="also time one slot's flush and refresh over this many layers, eager and through VerbGraphs")
    ap.add_argument("--track-batch", type=int, default=0,
                    help="also time the decode track copy of a batch of this many rows (CUDA graphs)")
    ap.add_argument("--json", default=None, help="write the rows (and the run's versions) here")
    args = ap.parse_args(argv)
    if min(args.rows) < 1:
        ap.error(f"--rows: expected positive counts, got {args.rows}")
    if not args.keep_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="replayssm-events-cache-")

    import torch
    import triton
    from triton.testing import do_bench

    import replayssm as rs
    from floors import read_floor
    from replayssm.kernels import backend_reference
    from shapes import MODEL_SPECS, WINDOW

    unknown = [m for m in args.models if m not in MODEL_SPECS]
    if unknown:
        ap.error(f"--models: expected names of {sorted(MODEL_SPECS)}, got {unknown}")
    dev = "cuda"
    rows_out = []

    def first_call(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    print(f"{'model':12s} {'read':10s} {'rows':>4s} {'first flush':>12s} {'flush':>8s} {'first refresh':>14s} "
          f"{'refresh':>8s} {'GB/s':>7s} {'PyTorch':>8s} {'floor':>7s}   (ms)", flush=True)
    for name in args.models:
        spec = MODEL_SPECS[name]
        layout = "vk" if spec.is_delta else "kv"
        for fmt in args.formats:
            cfg = rs.ReplayConfig(window=WINDOW, read_format=fmt, ring_dtype="bfloat16")
            for n in args.rows:
                S = 2 * n
                gen = torch.Generator(device=dev).manual_seed(n)
                pool = host_pool(spec, cfg, 1, S, dev, gen)
                slots = torch.randperm(S, device=dev, generator=gen)[:n]
                flush = lambda: pool.flush(slots, layer=0, checked=False)          # noqa: E731
                refresh = lambda: pool.refresh(slots, layer=0, checked=False)      # noqa: E731
                first_refresh = first_call(refresh)
                first_flush = first_call(flush)
                t_flush = do_bench(flush, warmup=10, rep=100, return_mode="median")
                t_refresh = do_bench(refresh, warmup=10, rep=100, return_mode="median")
                state_bytes = n * spec.state_numel * 4
                read_bytes = n * sum(b[0, 0].numel() * b.element_size() for b in pool.read.values())
                t_torch = None
                if pool.read:
                    t_torch = do_bench(lambda: backend_reference.refresh(pool, 0, slots), warmup=10, rep=100,
                                       return_mode="median")
                flat = torch.empty(n * spec.state_numel, device=dev)
                t_floor = do_bench(read_floor(flat), warmup=10, rep=100, return_mode="median")
                # without a read copy a refresh moves no state bytes (it empties the rings)
                gbps = (state_bytes + read_bytes) / t_refresh / 1e6 if pool.read else None
                row = dict(model=name, read_format=fmt, layout=layout, rows=n, first_flush_ms=first_flush,
                           flush_ms=t_flush, first_refresh_ms=first_refresh, refresh_ms=t_refresh,
                           refresh_gbps=gbps, refresh_pytorch_ms=t_torch, floor_ms=t_floor)
                rows_out.append(row)
                print(f"{name:12s} {fmt:10s} {n:4d} {first_flush:12.1f} {t_flush:8.3f} {first_refresh:14.1f} "
                      f"{t_refresh:8.3f} {'' if gbps is None else f'{gbps:7.0f}':>7s} "
                      f"{'' if t_torch is None else f'{t_torch:8.3f}':>8s} {t_floor:7.3f}", flush=True)
    pool_rows = pool_events(args, dev) if args.pool_layers > 0 else []
    track_rows = track_events(args, dev, graph_bench) if args.track_batch > 0 else []
    if args.json:
        import importlib.metadata as md
        meta = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__, replayssm=md.version("replayssm"),
                    commit=os.environ.get("REPLAYSSM_COMMIT", "unknown"), window=WINDOW)
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows_out, pool_events=pool_rows, track_events=track_rows), f, indent=1)
            f.write("\n")
    return 0


def host_pool(spec, cfg, layers: int, slots: int, dev: str, gen):
    """A triton-backend pool over a host's checkpoint (Mamba-2 ``[L, S, H, P, N]``, GDN / KDA
    ``[L, S, HV, V, K]``) of random states, as a prefill wrote them, every slot allocated; a Mamba-2
    layer has stepped (a flush folds with its ``A``)."""
    import torch

    import replayssm as rs

    layout = "vk" if spec.is_delta else "kv"
    inner = (*spec.state_shape[:-2], *spec.state_shape[-2:][::-1]) if layout == "vk" else spec.state_shape
    pool = rs.StatePool(spec, cfg, num_layers=layers, num_slots=slots, device=dev, backend="triton",
                        checkpoint=torch.randn(layers, slots, *inner, device=dev, generator=gen) * 0.1,
                        state_layout=layout)
    pool.allocated.fill_(True)
    if spec.family == "mamba2":
        for layer in range(layers):
            pool.layer_A[layer] = -torch.rand(spec.num_heads, device=dev, generator=gen) - 0.5
    return pool


def pool_events(args, dev: str) -> list[dict]:
    """One slot's flush and refresh over ``args.pool_layers`` layers with entries in its rings,
    eager and through ``VerbGraphs``, and one slot's copy (side buffers, every layer); ms per event
    (medians of ``do_bench``)."""
    import torch
    from triton.testing import do_bench

    import replayssm as rs
    from replayssm.graphs import VerbGraphs
    from shapes import MODEL_SPECS, WINDOW

    out = []
    print(f"\n{'model':12s} {'read':10s} {'layers':>6s} {'flush':>8s} {'graphed':>8s} {'refresh':>8s} "
          f"{'graphed':>8s} {'copy':>8s}   (ms per event, one slot)", flush=True)
    for name in args.models:
        spec = MODEL_SPECS[name]
        layout = "vk" if spec.is_delta else "kv"
        for fmt in args.formats:
            cfg = rs.ReplayConfig(window=WINDOW, read_format=fmt, ring_dtype="bfloat16")
            L, S = args.pool_layers, 8
            gen = torch.Generator(device=dev).manual_seed(L)
            pool = host_pool(spec, cfg, L, S, dev, gen)
            graphs = VerbGraphs(pool)
            slot = torch.tensor([3], device=dev)
            t = {}
            for verb in ("flush", "refresh"):
                t[verb] = do_bench(lambda: getattr(pool, verb)(slot, checked=False), warmup=10, rep=100,
                                   return_mode="median")
                t[verb + "_graphed"] = do_bench(lambda: graphs(verb, slot), warmup=10, rep=100, return_mode="median")
            dst = torch.tensor([5], device=dev)
            t["copy"] = do_bench(lambda: pool.copy(slot, dst, checked=False, checkpoint=False), warmup=10, rep=100,
                                 return_mode="median")
            out.append(dict(model=name, read_format=fmt, layout=layout, layers=L, **{k + "_ms": v for k, v in t.items()}))
            print(f"{name:12s} {fmt:10s} {L:6d} {t['flush']:8.3f} {t['flush_graphed']:8.3f} {t['refresh']:8.3f} "
                  f"{t['refresh_graphed']:8.3f} {t['copy']:8.3f}", flush=True)
    return out


def graph_bench(fn) -> float:
    """``fn`` captured in a CUDA graph, its replay's median time (ms)."""
    import torch
    from triton.testing import do_bench

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                  # warm up (compiles) outside the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=10, rep=100, return_mode="median")


def track_events(args, dev: str, bench) -> list[dict]:
    """The decode track copy of one step over ``args.pool_layers`` layers (at least 1): ms per step
    (``bench(fn)``) of the pool's copy and of the flush and refresh it replaced, for 0, 1 and
    ``batch / 16`` tracked rows of ``args.track_batch``."""
    import torch

    import replayssm as rs
    from shapes import MODEL_SPECS, WINDOW

    out, B = [], args.track_batch
    L = max(1, args.pool_layers)
    print(f"\n{'model':12s} {'read':10s} {'layers':>6s} {'batch':>5s} {'tracked':>7s} {'copy':>8s} "
          f"{'flush+refresh':>13s}   (ms per decode step, CUDA graphs)", flush=True)
    for name in args.models:
        spec = MODEL_SPECS[name]
        layout = "vk" if spec.is_delta else "kv"
        for fmt in args.formats:
            cfg = rs.ReplayConfig(window=WINDOW, read_format=fmt, ring_dtype="bfloat16")
            S = 2 * B                                       # the batch's slots and their track slots
            gen = torch.Generator(device=dev).manual_seed(B)
            pool = host_pool(spec, cfg, L, S, dev, gen)
            for buf in pool.ring.values():                  # entries to fold (a flush of zeros costs the same)
                buf.copy_(torch.randn(buf.shape, device=dev, generator=gen).to(buf.dtype) * 0.1)
            count = pool.cursors["count"]
            count[:, :B] = WINDOW // 2                       # the sources' rings hold half a window
            saved = count.clone()
            src, dst = torch.arange(B, device=dev), torch.arange(B, S, device=dev)
            for tracked in sorted({0, 1, B // 16}):
                mask = torch.zeros(B, dtype=torch.bool, device=dev)
                mask[torch.randperm(B, device=dev, generator=gen)[:tracked]] = True
                s, d = (torch.where(mask, rows, -1) for rows in (src, dst))

                def copy():
                    count.copy_(saved)
                    pool.copy(s, d, checked=False, checkpoint=False)

                def fold():
                    count.copy_(saved)
                    pool.flush(s, checked=False)
                    pool.refresh(d, checked=False)

                t_copy, t_fold = bench(copy), bench(fold)
                out.append(dict(model=name, read_format=fmt, layout=layout, layers=L, batch=B, tracked=tracked,
                                copy_ms=t_copy, flush_refresh_ms=t_fold))
                print(f"{name:12s} {fmt:10s} {L:6d} {B:5d} {tracked:7d} {t_copy:8.3f} {t_fold:13.3f}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
