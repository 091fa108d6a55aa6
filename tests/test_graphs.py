"""``VerbGraphs``: the unchecked flush and refresh replayed from CUDA graphs leave every buffer as
the verbs themselves do (on a GPU, through recorded graphs; on a CPU, in the interpreter, the verbs run eagerly).

Two pools take the same steps and host writes; one runs each event's verb, the other the verb
through ``VerbGraphs``, with row counts that share a bucket (a replay whose padded tail must not
act), every layer and one layer, and a Mamba-2 ``A`` that moves to a new address (recorded again).
"""

import functools

import pytest
import torch

import replayssm as rs
from helpers import SPECS, Params, assert_same_resets, make_inputs
from replayssm.graphs import VerbGraphs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _same(a: rs.StatePool, b: rs.StatePool) -> None:
    assert_same_resets(a, b)
    for name in a.ring:
        assert torch.equal(a.ring[name], b.ring[name]), name
    assert torch.equal(a.checkpoint, b.checkpoint)


def _steps(pools, slots, spec, params, gen, A, count: int) -> None:
    """``count`` unchecked decode steps of both layers, the same random inputs on every pool (its
    ``slots``); Mamba-2 with the per-layer ``A`` tensors given (None otherwise)."""
    for _ in range(count):
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 7, None, gen, device=DEVICE)
            if A is not None:
                inp["A"] = A[layer]
            for pool, s in zip(pools, slots):
                rs.decode(pool, layer, s, checked=False, **inp)


# on a CPU the graphs do not run (the eager fallback, in the interpreter): one case
CASES = [("mamba2", "nvfp4"), ("gdn", "nvfp4"), ("kda", "fp8"), ("gdn", "checkpoint")] if CUDA else [("gdn", "nvfp4")]


@pytest.mark.parametrize("family, fmt", CASES)
def test_graphed_verbs_equal_the_verbs(family, fmt):
    spec = SPECS[family]
    cfg = rs.ReplayConfig(window=4, read_format=fmt)
    pools = [rs.StatePool(spec, cfg, num_layers=2, num_slots=9, device=DEVICE, backend="triton") for _ in range(2)]
    slots = [p.alloc(7) for p in pools]
    eager, graphed = pools
    graphs = VerbGraphs(graphed, max_rows=8)
    gen = torch.Generator().manual_seed(21)
    params = Params(spec, 2, gen)
    A = [params.A[layer].to(DEVICE) for layer in range(2)] if family == "mamba2" else None

    steps = functools.partial(_steps, pools, slots, spec, params, gen, A)

    def event(verb, rows, layer=None):
        getattr(eager, verb)(slots[0][rows], layer=layer, checked=False)
        graphs(verb, slots[1][rows], layer)
        _same(eager, graphed)

    steps(2)
    assert eager.cursors["count"][:, slots[0]].gt(0).any()        # rings that hold entries
    event("flush", [3])                                           # every layer, bucket 1: recorded
    steps(3)
    event("flush", [5])                                           # replayed (1)
    event("flush", [0, 6, 2], layer=1)                            # bucket 4: recorded, then replayed with 4 rows
    steps(1)
    event("flush", [1, 4, 5, 6], layer=1)                         # replayed (2)
    event("flush", [2, 3], layer=1)                               # bucket 2
    state = torch.randn(2, 3, *eager.checkpoint.shape[2:], generator=gen).to(DEVICE, eager.checkpoint.dtype)
    for rows in ([0, 2, 4], [1, 5, 6]):                           # the host writes rows, then refreshes them
        for pool, s in zip(pools, slots):
            pool.checkpoint[:, s[rows]] = state
        event("refresh", rows)                                    # recorded, then replayed (3)
    steps(2)
    if A is not None:                                             # a step with A at another address
        A = [a.clone() for a in A]
        steps(1)
        before = graphs.replays
        event("flush", [6])                                       # recorded again, not replayed
        assert graphs.replays == before
        steps(1)
        event("flush", [0])                                       # replayed (4)
    event("flush", list(range(7)))                                # bucket 8: recorded
    steps(2)
    assert graphs.replays == ((4 if A is not None else 3) if CUDA else 0)
    assert graphs.enabled == CUDA


@pytest.mark.parametrize("family", ["mamba2", "gdn"] if CUDA else ["gdn"])
def test_a_prepared_stream_replays_every_event_from_its_first(family):
    """``prepare`` records every (verb, layer, bucket) of the stream without changing the pool; a
    Mamba-2 flush waits for its layers' A. Every event after it, on every layer and bucket, is a
    replay that leaves the pool as the verb does."""
    spec = SPECS[family]
    pools = [rs.StatePool(spec, rs.ReplayConfig(window=4, read_format="nvfp4"), num_layers=2, num_slots=9,
                          device=DEVICE, backend="triton") for _ in range(2)]
    slots = [p.alloc(7) for p in pools]
    eager, graphed = pools
    graphs = VerbGraphs(graphed, max_rows=8)
    gen = torch.Generator().manual_seed(5)
    params = Params(spec, 2, gen)
    A = [params.A[layer].to(DEVICE) for layer in range(2)] if family == "mamba2" else None   # one address each

    steps = functools.partial(_steps, pools, slots, spec, params, gen, A)

    keys = 2 * 3 * 4                                              # verbs x (every layer, 0, 1) x buckets 1..8
    first = graphs.prepare()
    if family == "mamba2":                                        # before a step no layer has its A
        assert first == (keys // 2 if CUDA else 0)
    steps(2)
    second = graphs.prepare()
    assert first + second == (keys if CUDA else 0) and graphs.prepare() == 0
    _same(eager, graphed)
    events = [("flush", [3], None), ("flush", [0, 6, 2], 1), ("refresh", [1, 4], 0), ("flush", list(range(7)), 0),
              ("refresh", [2, 3, 5, 6, 0], None), ("flush", [1, 2], None)]
    if not CUDA:                                                  # the eager fallback, in the interpreter
        events = events[:2]
    for verb, rows, layer in events:
        getattr(eager, verb)(slots[0][rows], layer=layer, checked=False)
        graphs(verb, slots[1][rows], layer)
        _same(eager, graphed)
        steps(1)
    assert graphs.replays == (len(events) if CUDA else 0)


def test_ahead_prepares_a_stream_at_its_first_call():
    spec = SPECS["gdn"]
    pool = rs.StatePool(spec, rs.ReplayConfig(window=4), num_layers=2, num_slots=4, device=DEVICE, backend="triton")
    graphs = VerbGraphs(pool, max_rows=4, ahead=True)
    graphs("flush", pool.alloc(1))
    # the call itself replayed, from the keys recorded ahead of it; nothing is left to record
    assert graphs.replays == (1 if CUDA else 0) and graphs.prepare() == 0


def test_graphed_verbs_refuse_what_the_verbs_do_not_take():
    spec = SPECS["gdn"]
    pool = rs.StatePool(spec, rs.ReplayConfig(window=4), num_layers=1, num_slots=4, device=DEVICE, backend="triton")
    with pytest.raises(ValueError, match="max_rows"):
        VerbGraphs(pool, max_rows=6)
    with pytest.raises(TypeError, match="pool"):
        VerbGraphs(object())
    with pytest.raises(ValueError, match="verb"):
        VerbGraphs(pool)("commit", torch.zeros(1, dtype=torch.int64, device=DEVICE))
    # a non-tensor and a layer outside the pool are named, as the verbs name them (a Mamba-2 flush reads
    # the layer's A before it runs)
    mamba = rs.StatePool(SPECS["mamba2"], rs.ReplayConfig(window=4), num_layers=1, num_slots=4, device=DEVICE,
                         backend="triton")
    for p in (pool, mamba):
        with pytest.raises(TypeError, match=r"slots: expected an int64 torch\.Tensor of shape \[n\]"):
            VerbGraphs(p)("flush", [0])
        with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 1\), got 3"):
            VerbGraphs(p)("flush", torch.zeros(1, dtype=torch.int64, device=DEVICE), 3)
