"""CUDA graphs of a pool's slot verbs (``StatePool.flush`` and ``refresh``, unchecked).

A serving framework issues these verbs per slot event, often one request at a time (SGLang copies
each prefilled request's state into its radix tree, and flushes each finished request's slot). A
verb over every layer is two or three launches per layer, so on the host such an event costs far
more than on the GPU. ``VerbGraphs`` records each (verb, layer, stream, rows bucket) once into a
CUDA graph and replays it: one launch per event, with the same results as the verb itself.

- Rows are padded with -1 to the bucket (a power of two up to ``max_rows``); a padded row is a
  no-op of both verbs (``StatePool.flush`` / ``refresh``, ``checked=False``).
- The first call of a key runs the verb itself (this compiles its kernels) and then records it;
  later calls copy the rows into the graph's static rows and replay.
- ``prepare`` records every key of a stream at once (both verbs, each layer and all layers, each
  bucket), so that a server's warm-up pays for the recordings rather than its traffic; with
  ``ahead=True`` a stream's first call prepares it.
- A Mamba-2 flush folds with the layer's ``A`` (``pool.layer_A``), which the graph reads by
  address: a key is recorded again whenever an ``A`` tensor has changed since.
- Eager where a graph cannot serve: a pool off CUDA or on a backend without unchecked verbs, more
  rows than ``max_rows``, and a call inside another capture (the verb then joins that graph); and
  everywhere with ``REPLAYSSM_VERB_GRAPHS=0`` in the environment.

Graphs of one stream share one memory pool (they hold only temporaries, and run in stream order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .pool import StatePool
from .validate import check_slot_tensor

VERBS = ("flush", "refresh")


@dataclass
class _Recorded:
    graph: torch.cuda.CUDAGraph
    rows: torch.Tensor          # int64 [bucket]: the graph's slots
    a_ptrs: tuple               # the Mamba-2 A addresses the graph reads


class VerbGraphs:
    """``pool.flush`` / ``pool.refresh`` with ``checked=False``, replayed from CUDA graphs.

    Args:
        pool: the StatePool (its buffers are the graphs' and must not be reallocated).
        max_rows: the largest rows bucket recorded; larger calls run eagerly.
        ahead: the first call on a stream ``prepare``s it (records its every key).
    Attributes:
        enabled: whether calls may replay graphs (see the module docs).
        replays: calls served by a graph replay (a count; recorded calls are not included).
    """

    def __init__(self, pool: StatePool, max_rows: int = 256, ahead: bool = False):
        if not isinstance(pool, StatePool):
            raise TypeError(f"pool: expected a StatePool, got {type(pool).__name__}")
        if max_rows < 1 or max_rows & (max_rows - 1):
            raise ValueError(f"max_rows: expected a power of two >= 1, got {max_rows}")
        self.pool, self.max_rows, self.ahead, self.replays = pool, max_rows, ahead, 0
        self._recorded: dict[tuple, _Recorded] = {}
        self._prepared: set[int] = set()            # streams whose every key is recorded
        self._mempools: dict[int, tuple] = {}
        self.enabled = (pool.device.type == "cuda" and pool.backend_ops.supports_unchecked
                        and os.environ.get("REPLAYSSM_VERB_GRAPHS", "1") != "0")

    def __call__(self, verb: str, slots: torch.Tensor, layer: int | None = None) -> None:
        """``getattr(pool, verb)(slots, layer=layer, checked=False)``: ``slots`` int64 ``[n]`` on the
        pool's device, distinct, -1 = padding; the pool updated in place."""
        if verb not in VERBS:
            raise ValueError(f"verb: expected one of {VERBS}, got {verb!r}")
        check_slot_tensor(slots, self.pool.device)
        if layer is not None:
            self.pool.check_layer(layer)
        run = getattr(StatePool, verb)
        n = slots.numel()
        if not self.enabled or n == 0 or n > self.max_rows or torch.cuda.is_current_stream_capturing():
            run(self.pool, slots, layer=layer, checked=False)
            return
        stream = torch.cuda.current_stream(self.pool.device)
        if self.ahead and stream.cuda_stream not in self._prepared:
            self.prepare(stream)
        key = (verb, layer, stream.cuda_stream, 1 << (n - 1).bit_length())
        a_ptrs = self._a_ptrs(verb, layer)
        rec = self._recorded.get(key)
        if rec is None or rec.a_ptrs != a_ptrs:
            run(self.pool, slots, layer=layer, checked=False)
            self._recorded[key] = self._record(run, layer, key[3], stream, a_ptrs)
            return
        rec.rows[:n].copy_(slots)
        rec.rows[n:].fill_(-1)
        rec.graph.replay()
        self.replays += 1

    def prepare(self, stream: torch.cuda.Stream | None = None) -> int:
        """Record every key of ``stream`` (default: the current stream) not recorded yet: ``flush``
        and ``refresh``, in each layer and in every layer, for each rows bucket up to ``max_rows``.
        Each runs its verb first on padding rows only (a no-op that compiles its kernels). A Mamba-2
        flush waits for its layers' ``A`` (``pool.layer_A``, set by their first step): until each is
        known, those keys are left out and a later call records them. Returns how many keys were
        recorded: 0 where graphs are not enabled, inside a capture, or once the stream's every key
        is recorded. The pool's buffers are not changed."""
        if not self.enabled or torch.cuda.is_current_stream_capturing():
            return 0
        stream = torch.cuda.current_stream(self.pool.device) if stream is None else stream
        if stream.cuda_stream in self._prepared:
            return 0
        recorded, waiting = 0, False
        buckets = [1 << i for i in range(self.max_rows.bit_length())]
        with torch.cuda.stream(stream):
            for verb in VERBS:
                run = getattr(StatePool, verb)
                for layer in (None, *range(self.pool.num_layers)):
                    a_ptrs = self._a_ptrs(verb, layer)
                    if 0 in a_ptrs:
                        waiting = True
                        continue
                    for bucket in buckets:
                        key = (verb, layer, stream.cuda_stream, bucket)
                        rec = self._recorded.get(key)
                        if rec is not None and rec.a_ptrs == a_ptrs:
                            continue
                        run(self.pool, torch.full((bucket,), -1, dtype=torch.int64, device=self.pool.device),
                            layer=layer, checked=False)
                        self._recorded[key] = self._record(run, layer, bucket, stream, a_ptrs)
                        recorded += 1
        if not waiting:
            self._prepared.add(stream.cuda_stream)
        return recorded

    def _a_ptrs(self, verb: str, layer: int | None) -> tuple:
        if verb != "flush" or self.pool.spec.family != "mamba2":
            return ()
        layers = range(self.pool.num_layers) if layer is None else (layer,)
        return tuple(0 if self.pool.layer_A[i] is None else self.pool.layer_A[i].data_ptr() for i in layers)

    def _record(self, run, layer: int | None, bucket: int, stream: torch.cuda.Stream, a_ptrs: tuple) -> _Recorded:
        """Record ``run`` of ``bucket`` rows (all -1 until a replay's copy) on a side stream."""
        dev = self.pool.device
        rows = torch.full((bucket,), -1, dtype=torch.int64, device=dev)
        graph = torch.cuda.CUDAGraph()
        side, mempool = self._mempools.setdefault(stream.cuda_stream,
                                                  (torch.cuda.Stream(dev), torch.cuda.graph_pool_handle()))
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            graph.capture_begin(pool=mempool, capture_error_mode="thread_local")
            try:
                run(self.pool, rows, layer=layer, checked=False)
            finally:
                graph.capture_end()
        stream.wait_stream(side)
        return _Recorded(graph, rows, a_ptrs)
