"""Bad input raises ValueError / TypeError naming the argument and what was expected."""

import pytest
import torch

import replayssm as rs
from helpers import SPECS, Params, make_inputs


def _pool(family, **cfg):
    cfg = rs.ReplayConfig(**{"window": 4, "max_draft_tokens": 2, **cfg})
    pool = rs.StatePool(SPECS[family], cfg, num_layers=1, num_slots=4)
    return pool, pool.alloc(2)


def _inputs(family, n=2, T=None, **over):
    gen = torch.Generator().manual_seed(0)
    inp = make_inputs(SPECS[family], Params(SPECS[family], 1, gen), 0, n, T, gen)
    inp.update(over)
    return inp


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(num_heads=4, head_dim=8, state_dim=16, num_groups=3), ValueError, "num_heads: expected a multiple"),
    (dict(num_heads=0, head_dim=8, state_dim=16, num_groups=1), ValueError, "num_heads: expected a positive"),
])
def test_layer_spec(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        rs.LayerSpec.mamba2(**kwargs)


def test_gdn_spec_and_config():
    with pytest.raises(ValueError, match="num_v_heads: expected a multiple of num_k_heads"):
        rs.LayerSpec.gdn(num_k_heads=3, num_v_heads=4, head_k_dim=16, head_v_dim=16)
    with pytest.raises(ValueError, match="window"):
        rs.ReplayConfig(window=0)
    with pytest.raises(ValueError, match="checkpoint_dtype"):
        rs.ReplayConfig(checkpoint_dtype="float8")
    with pytest.raises(ValueError, match="read_format"):
        rs.ReplayConfig(read_format="int4")
    with pytest.raises(ValueError, match="head_k_dim: read_format='nvfp4' needs a multiple of 16"):
        rs.StatePool(rs.LayerSpec.kda(num_k_heads=1, num_v_heads=1, head_k_dim=24, head_v_dim=8),
                     rs.ReplayConfig(read_format="nvfp4"), num_layers=1, num_slots=1)
    with pytest.raises(ValueError, match="backend"):
        rs.StatePool(SPECS["gdn"], rs.ReplayConfig(), num_layers=1, num_slots=1, backend="cuda")


@pytest.mark.parametrize("family,name,bad,exc,match", [
    ("mamba2", "x", torch.zeros(2, 4, 7), ValueError, r"x: expected shape \[2, 4, 6\]"),
    ("mamba2", "x", torch.zeros(2, 4, 6, dtype=torch.float64), TypeError, "x: expected dtype torch.float32"),
    ("mamba2", "A", torch.zeros(5), ValueError, r"A: expected shape \[4\]"),
    ("mamba2", "B", None, TypeError, "B: required input"),
    ("mamba2", "q", torch.zeros(2), TypeError, "q: not an input of a mamba2 layer"),
    ("gdn", "g", torch.zeros(2, 4, 16), ValueError, r"g: expected shape \[2, 4\]"),
    ("kda", "g", torch.zeros(2, 4), ValueError, r"g: expected shape \[2, 4, 16\]"),
    ("gdn", "beta", torch.zeros(2, 4, dtype=torch.int32), TypeError, "beta: expected a floating-point"),
    ("gdn", "k", [[0.0]], TypeError, "k: expected a torch.Tensor"),
    ("gdn", "scale", -1.0, ValueError, "scale: expected a positive float"),
    ("gdn", "q_scale", torch.ones(2, 4), ValueError, r"q_scale: expected shape \[2, 2\]"),
    ("kda", "q_scale", torch.ones(2, 2, dtype=torch.float16), TypeError, "q_scale: expected dtype torch.float32"),
    ("mamba2", "q_scale", torch.ones(2, 2), TypeError, "q_scale: not an input of a mamba2 layer"),
])
def test_decode_inputs(family, name, bad, exc, match):
    pool, slots = _pool(family)
    with pytest.raises(exc, match=match):
        rs.decode(pool, 0, slots, **_inputs(family, **{name: bad}))


def test_slots_layer_out_and_T():
    pool, slots = _pool("gdn")
    inp = _inputs("gdn")
    with pytest.raises(ValueError, match=r"slots: expected indices in \[0, 4\) or -1, got 9"):
        rs.decode(pool, 0, torch.tensor([0, 9]), **inp)
    with pytest.raises(ValueError, match="slots: slot 3 is not allocated"):
        rs.decode(pool, 0, torch.tensor([0, 3]), **inp)
    with pytest.raises(ValueError, match="slots: expected distinct"):
        rs.decode(pool, 0, torch.tensor([0, 0]), **inp)
    with pytest.raises(ValueError, match="slots: expected an int64"):
        rs.decode(pool, 0, torch.tensor([0, 1], dtype=torch.int32), **inp)
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 1\)"):
        rs.decode(pool, 1, slots, **inp)
    with pytest.raises(TypeError, match="out: expected dtype"):
        rs.decode(pool, 0, slots, out=torch.zeros(2, 4, 5, dtype=torch.float16), **inp)
    with pytest.raises(ValueError, match=r"T: expected 1..3 tokens per verify"):
        rs.verify(pool, 0, slots, **_inputs("gdn", T=4))
    with pytest.raises(ValueError, match="slots: expected a contiguous tensor"):
        rs.decode(pool, 0, torch.tensor([0, 5, 1, 7])[::2], **inp)
    with pytest.raises(ValueError, match="out: expected a buffer of its own, it shares memory with v"):
        rs.decode(pool, 0, slots, out=inp["v"], **inp)
    with pytest.raises(ValueError, match="state: expected shape"):
        pool.write_state(0, slots, torch.zeros(2, 4, 5, 16))


def test_copy_refusals():
    pool, slots = _pool("gdn")
    other = pool.alloc(2)
    with pytest.raises(ValueError, match="dst: expected as many slots as src"):
        pool.copy(slots, other[:1])
    with pytest.raises(ValueError, match=r"src, dst: a padded row \(-1\) must be padded in both"):
        pool.copy(torch.tensor([-1]), other[:1])
    with pytest.raises(ValueError, match=r"src, dst: a padded row \(-1\) must be padded in both"):
        pool.copy(slots[:1], torch.tensor([-1]))
    with pytest.raises(ValueError, match="dst: expected slots none of which is in src"):
        pool.copy(slots, slots.flip(0))
    with pytest.raises(ValueError, match="dst: expected distinct slot indices"):
        pool.copy(slots, other[[0, 0]])


def test_commit_rules():
    pool, slots = _pool("mamba2")
    with pytest.raises(ValueError, match="slots: a slot has no uncommitted verify"):
        pool.commit(slots, torch.tensor([1, 1]))
    rs.verify(pool, 0, slots, **_inputs("mamba2", T=2))
    with pytest.raises(ValueError, match="uncommitted verify in this layer"):
        rs.decode(pool, 0, slots, **_inputs("mamba2"))
    with pytest.raises(ValueError, match=r"num_accepted: expected values in 1..T"):
        pool.commit(slots, torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"num_accepted: expected an int tensor of shape \[2\]"):
        pool.commit(slots, torch.tensor([1.0, 1.0]))
    pool.commit(slots, torch.tensor([2, 1]))
    assert pool.cursors["count"][0, slots].tolist() == [2, 1]
    assert pool.cursors["pending"][0, slots].tolist() == [0, 0]


def _snapshot(pool) -> dict:
    """Every buffer of a pool and its host records, copied."""
    out = {"checkpoint": pool.checkpoint.clone(), "pending": pool.pending.clone(), "allocated": pool.allocated.clone()}
    out.update({f"read.{k}": v.clone() for k, v in pool.read.items()})
    out.update({f"ring.{k}": v.clone() for k, v in pool.ring.items()})
    out.update({f"cursors.{k}": v.clone() for k, v in pool.cursors.items()})
    out.update({f"layer_A.{i}": (None if a is None else a.clone()) for i, a in enumerate(pool.layer_A)})
    return out


def _assert_unchanged(pool, before: dict) -> None:
    after = _snapshot(pool)
    for name, value in before.items():
        if value is None:
            assert after[name] is None, name
        else:
            assert torch.equal(value.view(torch.uint8) if value.dtype.is_floating_point else value,
                               after[name].view(torch.uint8) if value.dtype.is_floating_point else after[name]), name


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_mamba2_A_is_a_layer_constant(backend):
    """The ring folds with the layer's A (``pool.layer_A``): a checked step with other values is
    refused and changes nothing; the same values in another tensor are the layer's A."""
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="fp8")
    pool = rs.StatePool(SPECS["mamba2"], cfg, num_layers=2, num_slots=4, backend=backend)
    slots = pool.alloc(2)
    inp = _inputs("mamba2")
    rs.decode(pool, 0, slots, **inp)
    rs.decode(pool, 0, slots, **dict(inp, A=inp["A"].clone()))
    before = _snapshot(pool)
    other = dict(inp, A=inp["A"] * 1.25)
    with pytest.raises(ValueError, match="A: a layer constant; layer 0 was stepped with another A"):
        rs.decode(pool, 0, slots, **other)
    with pytest.raises(ValueError, match="A: a layer constant; layer 0 was stepped with another A"):
        rs.verify(pool, 0, slots, **_inputs("mamba2", T=2, A=other["A"]))
    _assert_unchanged(pool, before)
    rs.decode(pool, 1, slots, **other)                 # another layer has its own A
    assert torch.equal(pool.layer_A[0], inp["A"]) and torch.equal(pool.layer_A[1], other["A"])


def test_a_step_or_copy_the_kernels_refuse_leaves_the_pool_as_it_was():
    """Refusals that come from the Triton ops, after the API's own checks: a Mamba-2 step with a
    strided A keeps the layer's A as it was, and a copy of a pool whose side buffers the slot copy
    cannot move (not a whole number of 4-byte words per slot) keeps the host's pending mirror."""
    spec = rs.LayerSpec.mamba2(num_heads=2, head_dim=3, state_dim=16, num_groups=1)
    cfg = rs.ReplayConfig(window=4, max_draft_tokens=2, read_format="fp8")
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=4, backend="triton")
    slots = pool.alloc(2)
    gen = torch.Generator().manual_seed(1)
    inp = make_inputs(spec, Params(spec, 1, gen), 0, 2, None, gen)
    strided = torch.stack((inp["A"], inp["A"]), -1)[..., 0]
    with pytest.raises(ValueError, match="A: expected"):
        rs.decode(pool, 0, slots, **dict(inp, A=strided))
    assert pool.layer_A[0] is None
    rs.verify(pool, 0, slots[:1], **make_inputs(spec, Params(spec, 1, gen), 0, 1, 2, gen))
    pending = pool.pending.clone()
    dst = pool.alloc(1)
    with pytest.raises(ValueError, match="bytes per slot"):
        pool.copy(slots[:1], dst)
    assert torch.equal(pool.pending, pending)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_flags_are_bools_and_copy_names_its_slots(backend):
    """A flag given as anything but a bool (a string, 0 / 1, None) is refused by name before anything
    moves, rather than taken by its truthiness; a copy's bad source or destination is named as such."""
    pool, slots = _pool("gdn", read_format="fp8")
    pool = rs.StatePool(SPECS["gdn"], pool.cfg, num_layers=1, num_slots=4, backend=backend)
    slots = pool.alloc(2)
    rs.decode(pool, 0, slots, **_inputs("gdn"))
    before = _snapshot(pool)
    dst = torch.tensor([2, 3])
    for call, flag, value in (
            (lambda v: pool.flush(slots, checked=v), "checked", "no"),
            (lambda v: pool.refresh(slots, checked=v), "checked", 0),
            (lambda v: pool.copy(slots, dst, checked=v), "checked", None),
            (lambda v: pool.copy(slots, dst, checkpoint=v), "checkpoint", 1),
            (lambda v: pool.commit(slots, torch.tensor([1, 1]), checked=v), "checked", "False"),
            (lambda v: rs.decode(pool, 0, slots, checked=v, **_inputs("gdn")), "checked", 1),
            (lambda v: rs.verify(pool, 0, slots, checked=v, **_inputs("gdn", T=2)), "checked", [])):
        with pytest.raises(TypeError, match=f"^{flag}: expected True or False, got {value!r}$".replace("[", r"\[")
                           .replace("]", r"\]")):
            call(value)
    _assert_unchanged(pool, before)
    with pytest.raises(ValueError, match="^dst: slot 2 is not allocated$"):
        pool.copy(slots, dst)
    with pytest.raises(ValueError, match=r"^src: expected indices in \[0, 4\) or -1, got 9$"):
        pool.copy(torch.tensor([9, 1]), pool.alloc(2))
    _assert_unchanged(pool, dict(before, allocated=pool.allocated.clone()))


def test_gating_numbers_and_flags_are_named():
    pool = rs.StatePool(SPECS["kda"], rs.ReplayConfig(window=4), num_layers=1, num_slots=2)
    HK, HV, K = SPECS["kda"].num_k_heads, SPECS["kda"].num_v_heads, SPECS["kda"].head_k_dim
    raw = dict(q=torch.randn(2, HK, K), k=torch.randn(2, HK, K), a=torch.randn(2, HV, K), b=torch.randn(2, HV),
               A_log=torch.randn(HV), dt_bias=torch.randn(HV, K))
    for name, value, match in (("beta_round", 1, "beta_round: expected True or False, got 1"),
                               ("lower_bound", "-5", "lower_bound: expected a number or None, got '-5'"),
                               ("softplus_beta", None, "softplus_beta: expected a number, got None"),
                               ("softplus_threshold", True, "softplus_threshold: expected a number, got True")):
        with pytest.raises(TypeError, match=match):
            rs.gating(pool, **raw, **{name: value})
    assert set(rs.gating(pool, **raw, lower_bound=-5, softplus_beta=1)) == {"q_scale", "k", "g", "beta"}


def test_a_backend_is_registered_by_module_name():
    from replayssm import backend
    for module in (backend, "", "pkg..mod", "pkg.mod-2", 3):
        with pytest.raises(ValueError, match=r"^module: expected a dotted module name"):
            backend.register("mine", module)
    assert "mine" not in backend.BACKENDS
    backend.register("mine", "replayssm.kernels.backend_reference")
    try:
        assert backend.get("mine") is backend.get("reference")
    finally:
        del backend.BACKENDS["mine"]
