"""StatePool lifecycle: alloc / free / fork / write / read / flush, padded rows, owned checkpoints, errors."""

import pytest
import torch

import replayssm as rs
from helpers import SPECS, TOL, Driver, make_inputs, rms_ratio

FAMILIES = list(SPECS)


def _driver(family, **cfg):
    cfg = rs.ReplayConfig(**{"window": 4, "max_draft_tokens": 3, **cfg})
    return Driver(SPECS[family], cfg, num_layers=2, num_slots=8, gen=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", FAMILIES)
def test_fork_continues_independently(family):
    d = _driver(family)
    parent = d.alloc(2)
    for _ in range(3):
        d.decode(parent)
    d.verify(parent, 3, torch.tensor([2, 3]))
    child = d.pool.fork(parent)
    for layer in range(2):
        for p, c in zip(parent.tolist(), child.tolist()):
            d.oracle[layer][c] = d.oracle[layer][p].clone()
    for name, buf in d.pool.ring.items():
        assert torch.equal(buf[:, child], buf[:, parent]), name
    for name, cur in d.pool.cursors.items():
        assert torch.equal(cur[:, child], cur[:, parent]), name
    both = torch.cat((parent, child))
    errs = [max(d.decode(both)) for _ in range(6)]
    assert max(errs) < TOL["float32"]
    assert d.state_error(both) < TOL["float32"]
    assert rms_ratio(d.pool.read_state(0, child), d.pool.read_state(0, parent)) > 1e-3  # diverged


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_rows_are_untouched_and_zero(family):
    d = _driver(family)
    slots = d.alloc(2)
    d.decode(slots)
    padded = torch.tensor([slots[0].item(), -1, slots[1].item()])
    snapshot = {k: v.clone() for k, v in d.pool.ring.items()}
    cursors = {k: v.clone() for k, v in d.pool.cursors.items()}
    spec = d.spec
    inp = make_inputs(spec, d.params, 0, 3, None, torch.Generator().manual_seed(2))   # the layer's A, D, dt_bias
    heads, dim = (spec.num_heads, spec.head_dim) if family == "mamba2" else (spec.num_v_heads, spec.head_v_dim)
    out = torch.full((3, heads, dim), float("nan"))
    y = rs.decode(d.pool, 0, padded, out=out, **inp)
    assert y is out
    assert torch.isfinite(out).all()
    assert out[1].eq(0).all()
    # the padded row wrote nothing: only the two real slots' ring entries and cursors moved
    for name, buf in d.pool.ring.items():
        others = [s for s in range(8) if s not in slots.tolist()]
        assert torch.equal(buf[:, others], snapshot[name][:, others]), name
    assert torch.equal(d.pool.cursors["count"][:, 2:], cursors["count"][:, 2:])


@pytest.mark.parametrize("family", FAMILIES)
def test_write_read_flush(family):
    d = _driver(family, read_format="fp8")
    slots = d.alloc(3)
    gen = torch.Generator().manual_seed(3)
    state = torch.randn(3, *d.spec.state_shape, generator=gen)
    d.pool.write_state(1, slots, state)
    assert torch.equal(d.pool.read_state(1, slots), state)
    for s, st in zip(slots.tolist(), state):
        d.oracle[1][s] = st.double()
    d.decode(slots)
    d.decode(slots)
    before = d.pool.read_state(1, slots)
    assert d.pool.cursors["count"][1, slots].tolist() == [2, 2, 2]
    d.pool.flush(slots)
    assert d.pool.cursors["count"][:, slots].eq(0).all()
    after = d.pool.checkpoint[1, slots].float()
    assert rms_ratio(after, before) < 1e-6
    assert d.state_error(slots) < TOL["float32"]
    # the read copy was re-derived from the new checkpoint
    assert rms_ratio(d.pool.decoded_read_copy(1, slots), after) < 0.05


def test_flush_refuses_pending_verify_and_skips_empty_rings():
    d = _driver("gdn")
    slots = d.alloc(2)
    ck = d.pool.checkpoint.clone()
    d.pool.flush(slots)                       # empty rings: nothing written
    assert torch.equal(d.pool.checkpoint, ck)
    assert d.pool.cursors["epoch"][:, slots].eq(0).all()
    inp = make_inputs(d.spec, d.params, 0, 2, 2, d.gen)
    rs.verify(d.pool, 0, slots, **inp)
    with pytest.raises(ValueError, match="uncommitted verify"):
        d.pool.flush(slots)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_flush_of_one_layer_leaves_the_others(backend):
    d = _driver("gdn", read_format="fp8")
    if backend == "triton":
        d.pool = rs.StatePool(d.spec, d.cfg, num_layers=2, num_slots=8, backend="triton")
    slots = d.alloc(2)
    for _ in range(2):
        d.decode(slots)
    ck, count = d.pool.checkpoint.clone(), d.pool.cursors["count"].clone()
    d.pool.flush(slots, layer=1)
    assert d.pool.cursors["count"][1, slots].eq(0).all()
    assert torch.equal(d.pool.cursors["count"][0], count[0]) and count[0, slots].eq(2).all()
    assert torch.equal(d.pool.checkpoint[0], ck[0]) and not torch.equal(d.pool.checkpoint[1], ck[1])
    assert d.state_error(slots) < TOL["float32"]
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 2\)"):
        d.pool.flush(slots, layer=2)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_framework_owned_checkpoint_strided(layout):
    """A framework's [.., V, K] tensor with a padded slot stride is read and written in place."""
    spec = SPECS["kda"]
    NL, S = 2, 5
    HV, K, V = spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    inner = (HV, K, V) if layout == "kv" else (HV, V, K)
    storage = torch.full((NL, S + 1, *inner), float("nan"))       # slot 0 = framework padding
    owned = storage[:, 1:]
    cfg = rs.ReplayConfig(window=3, max_draft_tokens=1)
    d = Driver(spec, cfg, num_layers=NL, num_slots=S, gen=torch.Generator().manual_seed(4),
               checkpoint=owned, state_layout=layout)
    slots = d.alloc(3)
    for _ in range(7):
        d.decode(slots)
    assert d.state_error(slots) < TOL["float32"]
    assert torch.isnan(storage[:, 0]).all()
    view = owned if layout == "kv" else owned.transpose(-1, -2)
    assert torch.equal(view[0, slots], d.pool.checkpoint[0, slots])
    assert d.pool.checkpoint.data_ptr() == owned.data_ptr()


def test_free_and_realloc_resets():
    d = _driver("mamba2")
    slots = d.alloc(8)
    d.decode(slots)
    with pytest.raises(ValueError, match="free slots"):
        d.pool.alloc(1)
    d.pool.free(slots[:2])
    again = d.pool.alloc(2)
    assert sorted(again.tolist()) == sorted(slots[:2].tolist())
    assert d.pool.read_state(0, again).eq(0).all()
    assert d.pool.cursors["count"][:, again].eq(0).all()


def test_bytes_per_slot():
    spec = rs.LayerSpec.mamba2(num_heads=128, head_dim=64, state_dim=128, num_groups=8)
    pool = rs.StatePool(spec, rs.ReplayConfig(window=16, read_format="nvfp4", ring_dtype="bfloat16"),
                        num_layers=1, num_slots=1)
    b = pool.bytes_per_slot()
    assert b["checkpoint"] == 4 * 2 ** 20
    assert b["read_copy"] == 128 * 64 * (64 + 8 + 4)
    assert b["ring"] == 128 * 16 * 64 * 2 + 128 * 16 * 4 + 8 * 16 * 128 * 2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("read_format", ["checkpoint", "fp8", "nvfp4"])
def test_side_bytes_are_what_a_pool_allocates(family, read_format):
    """The per-slot budget a host charges (side_bytes_per_slot) equals the pool's own buffers."""
    from replayssm.pool import side_bytes_per_slot
    spec = SPECS[family]
    cfg = rs.ReplayConfig(window=8, max_draft_tokens=3, read_format=read_format, ring_dtype="bfloat16")
    pool = rs.StatePool(spec, cfg, num_layers=2, num_slots=3)
    per_slot = lambda bufs: sum(b[0, 0].numel() * b.element_size() for b in bufs)  # noqa: E731
    side = side_bytes_per_slot(spec, cfg)
    assert side["ring"] == per_slot(pool.ring.values()) > 0
    assert side["read_copy"] == per_slot(pool.read.values())
    assert side["read_copy"] > 0 if read_format != "checkpoint" else side["read_copy"] == 0
    assert side["cursors"] == sum(c[0, 0].element_size() for c in pool.cursors.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_refresh_after_a_host_write(family):
    """The host overwrites a checkpoint itself (prefill, copy, load): refresh empties the ring of that
    layer only, re-derives the read copy bit for bit, and keeps the checkpoint bytes."""
    d = _driver(family, read_format="nvfp4")
    slots = d.alloc(2)
    d.decode(slots)
    gen = torch.Generator().manual_seed(5)
    state = torch.randn(2, *d.spec.state_shape, generator=gen)
    d.pool.checkpoint[1, slots] = state                       # the host's own write
    epoch = d.pool.cursors["epoch"].clone()
    d.pool.refresh(torch.tensor([slots[0].item(), -1, slots[1].item()]), layer=1)
    assert torch.equal(d.pool.checkpoint[1, slots], state)
    assert d.pool.cursors["count"][1, slots].eq(0).all() and d.pool.cursors["count"][0, slots].eq(1).all()
    assert torch.equal(d.pool.cursors["epoch"][1, slots], epoch[1, slots] + 1)
    fresh = rs.StatePool(d.spec, d.cfg, num_layers=1, num_slots=2)
    fresh.write_state(0, fresh.alloc(2), state)
    for name, buf in d.pool.read.items():
        assert torch.equal(buf[1, slots].view(torch.uint8), fresh.read[name][0].view(torch.uint8)), name
    for s, st in zip(slots.tolist(), state):
        d.oracle[1][s] = st.double()
    assert max(d.decode(slots)) < TOL["nvfp4"]
    assert d.state_error(slots) < TOL["float32"]
    with pytest.raises(ValueError, match="layer: expected an int in"):
        d.pool.refresh(slots, layer=2)
