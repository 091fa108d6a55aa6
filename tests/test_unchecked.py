"""``checked=False`` steps: the same results as checked steps, and no read of a device value.

A CUDA graph cannot capture a step that reads a device value on the host (``.item()``, ``bool()``,
``.cpu()``, data-dependent shapes). ``HostReads`` flags the aten ops that do so on CUDA, outside
replayssm's own custom ops (whose kernels the interpreter runs on the host here), so the check
runs on a CPU too. On a GPU the steps are also captured and replayed in a CUDA graph.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import replayssm as rs
from helpers import PER_LAYER, SPECS, Params, assert_same_resets, make_inputs

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# aten ops that read device values on the host or have data-dependent output shapes
READS = {"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select",
         "equal", "is_nonzero"}


class HostReads(TorchDispatchMode):
    """Records ops that would synchronize a CUDA stream with the host, outside ``replayssm::`` ops."""

    def __init__(self):
        super().__init__()
        self.found, self.depth = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns, name = func.namespace, func.__name__.split(".")[0]
        if ns == "replayssm":
            self.depth += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.depth -= 1
        if self.depth == 0:
            device_to_host = name == "_to_copy" and kwargs.get("device") == torch.device("cpu") \
                and any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args)
            bool_index = name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                 for i in (args[1] if len(args) > 1 else ()) if i is not None)
            if name in READS or device_to_host or bool_index:
                self.found.append(str(func))
        return func(*args, **kwargs)


def _pools(family, spec=None, **cfg):
    spec = SPECS[family] if spec is None else spec
    config = rs.ReplayConfig(window=4, max_draft_tokens=2, **cfg)
    pools = [rs.StatePool(spec, config, num_layers=2, num_slots=5, device=DEVICE, backend="triton") for _ in range(2)]
    return spec, pools, [p.alloc(3) for p in pools]


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_unchecked_steps_equal_checked_steps_and_read_no_device_value(family):
    spec, (checked, free), (sc, sf) = _pools(family, read_format="nvfp4")
    pad = lambda s: torch.stack((s[0], torch.tensor(-1, device=DEVICE), s[2]))  # noqa: E731
    gen = torch.Generator().manual_seed(4)
    params = Params(spec, 2, gen)
    for step in range(7):
        T = None if step % 3 else 1 + step % 3
        fn = rs.decode if T is None else rs.verify
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 3, T, gen, device=DEVICE)
            y_c = fn(checked, layer, pad(sc), **inp)
            with HostReads() as mode:
                y_f = fn(free, layer, pad(sf), checked=False, **inp)
            assert mode.found == [], mode.found
            assert torch.equal(y_c, y_f)
        if T is not None:
            acc = torch.tensor([T, 1, max(1, T - 1)], device=DEVICE)
            with HostReads() as mode:
                free.commit(pad(sf), acc, checked=False)
            assert mode.found == [], mode.found
            checked.commit(pad(sc), acc.cpu())
    for name in checked.ring:
        assert torch.equal(checked.ring[name], free.ring[name]), name
    for name in checked.cursors:
        assert torch.equal(checked.cursors[name], free.cursors[name]), name
    assert torch.equal(checked.checkpoint, free.checkpoint)


def test_an_unchecked_commit_keeps_counts_within_the_verify():
    """A host's bad accept counts reach the unchecked commit as they are: a negative count, one past
    the verify's T, an int64 that truncates to -1 as int32, a second commit and a commit without a
    verify keep the nearest end of ``[0, T]``, so no count leaves the ring's entries."""
    spec, (checked, free), (sc, sf) = _pools("gdn")
    gen = torch.Generator().manual_seed(8)
    params = Params(spec, 2, gen)
    for layer in range(2):                                 # one decode (count 1), then a verify of T = 2
        rs.decode(free, layer, sf, checked=False, **make_inputs(spec, params, layer, 3, None, gen, device=DEVICE))
        rs.verify(free, layer, sf, checked=False, **make_inputs(spec, params, layer, 3, 2, gen, device=DEVICE))
    assert free.cursors["count"][:, sf].tolist() == [[1, 1, 1]] * 2 and free.cursors["pending"][:, sf].eq(2).all()
    free.commit(sf, torch.tensor([-5, 3, 2 ** 32 - 1], device=DEVICE), checked=False)
    assert free.cursors["count"][:, sf].tolist() == [[1, 3, 3]] * 2
    assert free.cursors["pending"][:, sf].eq(0).all()
    free.commit(sf, torch.tensor([2, 2, 2], device=DEVICE), checked=False)     # nothing pending: no change
    assert free.cursors["count"][:, sf].tolist() == [[1, 3, 3]] * 2


@pytest.mark.parametrize("family, fmt", [("mamba2", {}), ("gdn", {}), ("kda", {}), ("gdn", dict(read_format="nvfp4")),
                                         ("kda", dict(read_format="fp8", checkpoint_dtype="float16_sr")),
                                         ("mamba2", dict(read_format="nvfp4", checkpoint_dtype="bfloat16"))])
def test_unchecked_flush_folds_on_the_device_like_the_checked_flush(family, fmt):
    """``flush(checked=False)``: the flush kernel alone (a T = 0 launch) folds every committed entry,
    reading no device value; the state and what later steps compute match the host's flush."""
    from replayssm.formats import quantize
    from replayssm.pool import to_read_layout
    spec, (checked, free), (sc, sf) = _pools(family, **fmt)
    pad = lambda s: torch.stack((s[0], torch.tensor(-1, device=DEVICE), s[2], s[1]))  # noqa: E731
    gen = torch.Generator().manual_seed(7)
    params = Params(spec, 2, gen)
    tol = 1e-5 if checked.cfg.checkpoint_dtype == "float32" else 2e-2

    def run(steps):
        for step in range(steps):
            T = 3 if step == 1 else None
            for layer in range(2):
                inp = make_inputs(spec, params, layer, 3, T, gen, device=DEVICE)
                fn = rs.decode if T is None else rs.verify
                outs = [fn(pool, layer, slots, **inp) for pool, slots in ((checked, sc), (free, sf))]
                assert (outs[1].float() - outs[0].float()).norm() <= 5e-2 * outs[0].float().norm()
            if T is not None:
                for pool, slots in ((checked, sc), (free, sf)):
                    pool.commit(slots, torch.tensor([3, 1, 2], device=DEVICE).cpu())

    run(3)
    assert free.cursors["count"][:, sf].gt(0).any()           # there is something to fold
    states = [free.read_state(layer, sf) for layer in range(2)]
    checked.flush(sc)
    with HostReads() as mode:
        free.flush(pad(sf), checked=False)
    assert mode.found == [], mode.found
    for name in ("count", "pending", "epoch"):
        assert torch.equal(checked.cursors[name], free.cursors[name]), name
    assert free.cursors["count"][:, sf].eq(0).all()
    for name in checked.ring:                                  # the flush appends nothing
        assert torch.equal(checked.ring[name], free.ring[name]), name
    for layer in range(2):
        stored = free.checkpoint[layer, sf].float()
        assert (stored - checked.checkpoint[layer, sc].float()).norm() <= tol * stored.norm()
        assert (free.read_state(layer, sf) - states[layer]).norm() <= tol * states[layer].norm()
        if free.read:
            codes, _, _ = quantize(to_read_layout(spec, stored), free.cfg.read_format)
            assert torch.equal(free.read["codes"][layer, sf].view(torch.uint8), codes.view(torch.uint8))
    run(3)                                                     # and the steps after agree


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_unchecked_refresh_equals_checked_refresh_and_reads_no_device_value(fmt):
    """``refresh(checked=False)`` (the SGLang adapter's after a prefill, a load, a copy): rings
    emptied and read copies re-derived as the host's refresh does, padded rows writing nothing new,
    no device value read; also a step of padded rows only."""
    spec, (checked, free), (sc, sf) = _pools("kda", read_format=fmt)
    gen = torch.Generator().manual_seed(12)
    params = Params(spec, 2, gen)
    for _ in range(2):                                         # rings that hold entries
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 3, None, gen, device=DEVICE)
            for pool, slots in ((checked, sc), (free, sf)):
                rs.decode(pool, layer, slots, **inp)
    state = torch.randn(2, 2, *checked.checkpoint.shape[2:], generator=gen).to(DEVICE)
    checked.checkpoint[:, sc[1:]] = state                      # the host writes two rows' checkpoints
    free.checkpoint[:, sf[1:]] = state
    checked.refresh(sc[1:])
    with HostReads() as mode:
        free.refresh(torch.stack((torch.tensor(-1, device=DEVICE), sf[1], torch.tensor(-1, device=DEVICE), sf[2])),
                     checked=False)
        free.refresh(torch.full((2,), -1, dtype=torch.int64, device=DEVICE), layer=1, checked=False)
        free.refresh(torch.empty(0, dtype=torch.int64, device=DEVICE), checked=False)
    assert mode.found == [], mode.found
    assert free.cursors["count"][:, sf[1:]].eq(0).all() and free.cursors["count"][:, sf[0]].gt(0).all()
    assert_same_resets(checked, free)


@pytest.mark.parametrize("family, fmt", [("mamba2", "nvfp4"), ("gdn", "fp8")])
def test_unchecked_copy_equals_checked_copy_and_reads_no_device_value(family, fmt):
    """``copy(checked=False)`` (the SGLang adapter's ``copy_from``): the same bytes as the checked
    copy in every buffer (rings mid-window travel, nothing is flushed), a source copied into two
    slots at once, no device value read; ``checkpoint=False`` leaves the checkpoint alone."""
    spec, (checked, free), (sc, sf) = _pools(family, read_format=fmt)
    gen = torch.Generator().manual_seed(21)
    params = Params(spec, 2, gen)
    for _ in range(3):                                         # count 3 of window 4: rings hold tokens
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 3, None, gen, device=DEVICE)
            for pool, slots in ((checked, sc), (free, sf)):
                rs.decode(pool, layer, slots, **inp)
    dst_c, dst_f = checked.alloc(2), free.alloc(2)
    src_c, src_f = sc[[1, 1]], sf[[1, 1]]
    checked.copy(src_c, dst_c)
    with HostReads() as mode:
        free.copy(src_f, dst_f, checked=False)
    assert mode.found == [], mode.found
    _assert_same_buffers(_buffers(checked), _buffers(free))
    assert free.cursors["count"][:, dst_f].eq(3).all()
    for layer in range(2):
        assert torch.equal(free.read_state(layer, dst_f[:1]), free.read_state(layer, sf[1:2]))
    free.checkpoint[:, dst_f] = 0.5                            # the host's own checkpoint copy is its own
    free.copy(src_f, dst_f, checked=False, checkpoint=False)
    assert free.checkpoint[:, dst_f].eq(0.5).all()
    with pytest.raises(ValueError, match="dst: expected as many slots as src"):
        free.copy(src_f, dst_f[:1], checked=False)
    with pytest.raises(ValueError, match="src: expected an int64 tensor"):
        free.copy(src_f.to(torch.int32), dst_f, checked=False)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_unchecked_copy_of_a_host_checkpoint(layout):
    """``copy(checked=False)`` with the checkpoint (a framework's tensor, ``[.., V, K]`` with a padded
    slot stride): the same bytes as the reference backend's checked copy in every buffer, the
    framework's padding slot (NaN) untouched; a padded row copies nothing."""
    spec = SPECS["gdn"]
    NL, S = 2, 5
    HV, K, V = spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    inner = (HV, K, V) if layout == "kv" else (HV, V, K)
    gen = torch.Generator().manual_seed(5)
    state = torch.randn(NL, S, *inner, generator=gen)
    cfg = rs.ReplayConfig(window=4, read_format="nvfp4")
    pools, storages = [], []
    for backend in ("reference", "triton"):
        storage = torch.full((NL, S + 1, *inner), float("nan"), device=DEVICE)   # slot 0: the framework's padding
        pool = rs.StatePool(spec, cfg, num_layers=NL, num_slots=S, device=DEVICE, backend=backend,
                            checkpoint=storage[:, 1:], state_layout=layout)
        pool.alloc(S)
        storage[:, 1:] = state.to(DEVICE)                           # the framework writes its states
        side = torch.Generator().manual_seed(6)                     # the same side bytes in both pools
        for buf in (*pool.read.values(), *pool.ring.values(), *pool.cursors.values()):
            buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape, generator=side))
        pools.append(pool)
        storages.append(storage)
    ref, tri = pools
    ref.copy(torch.tensor([3, -1, 0], device=DEVICE), torch.tensor([1, -1, 4], device=DEVICE))
    with HostReads() as mode:
        tri.copy(torch.tensor([3, 2, 0], device=DEVICE), torch.tensor([1, -1, 4], device=DEVICE), checked=False)
    assert mode.found == [], mode.found
    _assert_same_buffers(_buffers(ref), _buffers(tri))
    assert torch.isnan(storages[1][:, 0]).all() and not torch.isnan(storages[1][:, 1:]).any()
    assert torch.equal(storages[0][:, 1:], storages[1][:, 1:])
    copied = state.to(DEVICE).clone()
    copied[:, 1], copied[:, 4] = state[:, 3], state[:, 0]
    assert torch.equal(storages[1][:, 1:], copied)


class _Ops(TorchDispatchMode):
    """Counts the aten ops run under it that launch work on a GPU (views and detaches excluded)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in ("view", "_unsafe_view", "detach"):
            self.names.append(f"{func.namespace}::{name}")
        return func(*args, **(kwargs or {}))


def test_a_copy_is_one_launch_for_any_number_of_layers():
    """SGLang copies one request's slot per radix insert, and its track copy the masked rows of a
    decode batch every step: ``copy(checked=False, checkpoint=False)`` is one launch for every side
    buffer and layer (no flush, no refresh, nothing per layer or buffer)."""
    counts = []
    for layers in (1, 4):
        pool = rs.StatePool(SPECS["mamba2"], rs.ReplayConfig(window=4, read_format="nvfp4"), num_layers=layers,
                            num_slots=5, device=DEVICE, backend="triton")
        src, dst = pool.alloc(1), pool.alloc(1)
        with _Ops() as ops:
            pool.copy(src, dst, checked=False, checkpoint=False)
        counts.append(ops.names)
    assert counts == [["replayssm::copy_slots"]] * 2, counts


# slot indices outside a pool of 5 slots: below -1, at and past the end, past int32
OUTSIDE = (-2, 5, 6, 2 ** 40)


def _buffers(pool) -> dict:
    """Every buffer of a pool, the padding column of the cursors included, as bytes."""
    out = {"checkpoint": pool.checkpoint}
    out.update({f"read.{k}": v for k, v in pool.read.items()})
    out.update({f"ring.{k}": v for k, v in pool.ring.items()})
    out.update({f"cursors.{k}": v for k, v in pool.cursors.items()})
    return {k: v.contiguous().view(torch.uint8).clone() for k, v in out.items()}


def _assert_same_buffers(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


FORMATS = [("mamba2", {}), ("gdn", {}), ("kda", dict(read_format="fp8")), ("mamba2", dict(read_format="nvfp4")),
           ("gdn", dict(read_format="nvfp4"))]
# the models' dims (benchmarks' Nemotron-H, Qwen3.5, Kimi-Linear): the kernels' real tiles
REAL = {"mamba2": rs.LayerSpec.mamba2(num_heads=128, head_dim=64, state_dim=128, num_groups=8),
        "gdn": rs.LayerSpec.gdn(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
        "kda": rs.LayerSpec.kda(num_k_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128)}


@pytest.mark.parametrize("family, fmt", FORMATS)
def test_unchecked_slots_outside_the_pool_are_padded_rows(family, fmt):
    """``checked=False`` with slot indices outside ``[0, num_slots)``: the step, advance, commit and
    flush kernels and the unchecked refresh take them as padded rows, as they take -1: zero output
    rows, nothing of the pool read or written. Every buffer (cursors' padding column included) ends
    bit for bit as a checked run's with -1 in those rows, through flushing decodes, verify + commit,
    a flush and a refresh, reading no device value."""
    _outside_the_pool(family, None, fmt)


@pytest.mark.skipif(not CUDA, reason="the models' dims take minutes per step in Triton's interpreter")
@pytest.mark.parametrize("family, fmt", FORMATS + [("kda", {})])
def test_unchecked_slots_outside_the_pool_at_real_dims(family, fmt):
    """As above at the models' dims, with the kernels' real tiles (on a GPU)."""
    _outside_the_pool(family, REAL[family], fmt)


def _outside_the_pool(family, spec, fmt):
    spec, (checked, free), (sc, sf) = _pools(family, spec, **fmt)
    gen = torch.Generator().manual_seed(21)
    params = Params(spec, 2, gen)

    def rows(slots, pads):                   # two padded rows between the pool's three
        return torch.cat((slots[:2], torch.tensor(pads, dtype=torch.int64, device=DEVICE), slots[2:]))

    for step in range(6):
        bad = [OUTSIDE[step % 4], OUTSIDE[(step + 1) % 4]]
        T = 2 + step % 2 if step in (2, 5) else None
        fn = rs.decode if T is None else rs.verify
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 5, T, gen, device=DEVICE)
            y_c = fn(checked, layer, rows(sc, [-1, -1]), **inp)
            with HostReads() as mode:
                y_f = fn(free, layer, rows(sf, bad), checked=False, **inp)
            assert mode.found == [], mode.found
            assert torch.equal(y_c, y_f) and y_f[2:4].eq(0).all()
        if T is not None:
            acc = torch.tensor([T, 1, 0, 0, max(1, T - 1)], device=DEVICE)
            checked.commit(rows(sc, [-1, -1]), acc.cpu())
            with HostReads() as mode:
                free.commit(rows(sf, bad), acc, checked=False)
            assert mode.found == [], mode.found
        _assert_same_buffers(_buffers(checked), _buffers(free))
    assert free.cursors["count"][:, sf].gt(0).any()            # the flush below has something to fold
    checked.flush(rows(sc, [-1, -1]))
    with HostReads() as mode:
        free.flush(rows(sf, OUTSIDE[:2]), checked=False)
    assert mode.found == [], mode.found
    _assert_same_buffers(_buffers(checked), _buffers(free))
    state = torch.randn(2, 3, *checked.checkpoint.shape[2:], generator=gen).to(DEVICE)
    for pool, slots in ((checked, sc), (free, sf)):            # the host writes the checkpoints
        pool.checkpoint[:, slots] = state.to(pool.checkpoint.dtype)
    checked.refresh(torch.cat((torch.tensor([-1, -1], device=DEVICE), sc)))
    checked.refresh(torch.full((4,), -1, dtype=torch.int64, device=DEVICE), layer=1)
    with HostReads() as mode:
        free.refresh(torch.cat((torch.tensor(OUTSIDE[2:], device=DEVICE), sf)), checked=False)
        free.refresh(torch.tensor(OUTSIDE, device=DEVICE), layer=1, checked=False)     # no row in the pool
    assert mode.found == [], mode.found
    _assert_same_buffers(_buffers(checked), _buffers(free))
    # a masked copy (SGLang's track copy): a row with either slot outside the pool copies nothing
    dc, df = checked.alloc(2), free.alloc(2)
    pad = torch.tensor([-1], device=DEVICE)
    src_c, dst_c = torch.cat((sc[:1], pad, sc[2:], pad)), torch.cat((dc[:1], pad, dc[1:], pad))
    src_f = torch.cat((sf[:1], torch.tensor([OUTSIDE[0]], device=DEVICE), sf[2:], sf[1:2]))
    dst_f = torch.cat((df[:1], sf[1:2], df[1:], torch.tensor([OUTSIDE[3]], device=DEVICE)))
    checked.copy(src_c, dst_c)
    checked.copy(src_c.flip(0), dst_c.flip(0), layer=1)
    with HostReads() as mode:
        free.copy(src_f, dst_f, checked=False)
        free.copy(src_f.flip(0), dst_f.flip(0), checked=False, layer=1)
    assert mode.found == [], mode.found
    _assert_same_buffers(_buffers(checked), _buffers(free))


def test_unchecked_duplicate_slots_stay_in_their_slot():
    """Duplicate slots under ``checked=False`` are the caller's error (not checked): the duplicated
    slot's state is undefined, but no other slot, and nothing outside the pool, is touched: the
    other slots end bit for bit as in a run without the duplicate rows."""
    spec, (alone, dup), (sa, sd) = _pools("gdn", read_format="nvfp4")
    gen = torch.Generator().manual_seed(5)
    params = Params(spec, 2, gen)
    for step in range(5):
        for layer in range(2):
            inp = make_inputs(spec, params, layer, 3, None, gen, device=DEVICE)
            twice = {k: (torch.cat((v, v[:1])) if isinstance(v, torch.Tensor) and k not in PER_LAYER else v)
                     for k, v in inp.items()}
            y_a = rs.decode(alone, layer, sa, checked=False, **inp)
            y_d = rs.decode(dup, layer, torch.cat((sd, sd[:1])), checked=False, **twice)
            assert torch.equal(y_a[1:], y_d[1:3])
    others = _buffers(alone), _buffers(dup)
    for name in others[0]:
        a, d = (b.view(alone.num_layers, -1) for b in (others[0][name], others[1][name]))
        width = a.shape[1] // (alone.num_slots + (1 if name.startswith("cursors") else 0))
        keep = [s for s in range(a.shape[1] // width) if s != int(sa[0])]
        for s in keep:
            assert torch.equal(a[:, s * width:(s + 1) * width], d[:, s * width:(s + 1) * width]), (name, s)


def test_host_reads_detector_sees_a_checked_step():
    spec, (pool, _), (slots, _) = _pools("gdn")
    inp = make_inputs(spec, Params(spec, 2, torch.Generator().manual_seed(1)), 0, 3, None,
                      torch.Generator().manual_seed(2), device=DEVICE)
    with HostReads() as mode:
        rs.decode(pool, 0, slots, **inp)
    assert mode.found, "the checked step validates slot values on the host; the detector must see it"


def test_unchecked_needs_the_triton_backend_and_device_counts():
    spec = SPECS["gdn"]
    pool = rs.StatePool(spec, rs.ReplayConfig(window=4, max_draft_tokens=1), num_layers=1, num_slots=2,
                        device=DEVICE, backend="reference")
    slots = pool.alloc(1)
    inp = make_inputs(spec, Params(spec, 1, torch.Generator().manual_seed(1)), 0, 1, None,
                      torch.Generator().manual_seed(2), device=DEVICE)
    with pytest.raises(ValueError, match="checked: False needs the triton backend"):
        rs.decode(pool, 0, slots, checked=False, **inp)
    with pytest.raises(ValueError, match="checked: False needs the triton backend"):
        pool.commit(slots, torch.ones(1, dtype=torch.int64), checked=False)
    _, (tri, _), (ts, _) = _pools("gdn")
    with pytest.raises(ValueError, match="slots: expected an int64"):
        rs.decode(tri, 0, ts.int(), checked=False, **make_inputs(
            SPECS["gdn"], Params(SPECS["gdn"], 2, torch.Generator().manual_seed(1)), 0, 3, None,
            torch.Generator().manual_seed(2), device=DEVICE))
    with pytest.raises(ValueError, match="num_accepted: expected a contiguous int tensor of shape \\[3\\]"):
        tri.commit(ts, torch.ones(2, dtype=torch.int64, device=DEVICE), checked=False)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_unchecked_decode_is_captured_in_a_cuda_graph():
    spec, (eager, graphed), (se, sg) = _pools("kda", read_format="fp8")
    gen = torch.Generator().manual_seed(9)
    params = Params(spec, 2, gen)
    inp = make_inputs(spec, params, 0, 3, None, gen, device=DEVICE)
    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    out = torch.empty(3, spec.num_v_heads, spec.head_v_dim, dtype=inp["v"].dtype, device=DEVICE)
    rs.decode(graphed, 0, sg, out=out, checked=False, **static)     # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rs.decode(graphed, 0, sg, out=out, checked=False, **static)
    rs.decode(eager, 0, se, **inp)
    for _ in range(6):
        nxt = make_inputs(spec, params, 0, 3, None, gen, device=DEVICE)
        for k, v in nxt.items():
            if isinstance(v, torch.Tensor):
                static[k].copy_(v)
        graph.replay()
        y = rs.decode(eager, 0, se, **nxt)
        assert torch.equal(out, y)
    assert torch.equal(eager.ring["k"], graphed.ring["k"]) and torch.equal(eager.cursors["count"],
                                                                           graphed.cursors["count"])
