"""``VerbGraphs``: the unchecked flush and refresh replayed from CUDA graphs leave every buffer as
the verbs themselves do (on a GPU, through recorded graphs; on a CPU, in the interpreter, the verbs run eagerly).

Two pools take the same steps and host writes; one runs each event's verb, the other the verb
through ``VerbGraphs``, with row counts that share a bucket (a replay whose padded tail must not
act), every layer and one layer, and a Mamba-2 ``A`` that moves to a new address (recorded again).
"""

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

    def steps(count):
        for _ in range(count):
            for layer in range(2):
                inp = make_inputs(spec, params, layer, 7, None, gen, device=DEVICE)
                if A is not None:
                    inp["A"] = A[layer]
                for pool, s in zip(pools, slots):
                    rs.decode(pool, layer, s, checked=False, **inp)

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
