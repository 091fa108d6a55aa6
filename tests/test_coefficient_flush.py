"""The coefficient ring's flush (benchmarks/sweep_coefficient_flush.py): ``delta_window_coefficients``
against the window's solved d, and ``_coefficient_flush_kernel`` (Triton's interpreter on a CPU)
against the flush pass in use and the fp64 step recurrence, on both checkpoint layouts."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import SPECS, TOL, Params, f64, make_inputs, rms_ratio, step_oracle

import replayssm as rs
from conftest import DEVICE
from replayssm.kernels import ops
from replayssm.kernels.backend import _advance, _formats, layer_state
from replayssm.kernels.delta.reference import delta_window, delta_window_coefficients, delta_window_d
from replayssm.kernels.formats.triton import READ_CODES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sweep_coefficient_flush as scf  # noqa: E402


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_coefficients_give_the_windows_d(family):
    """``M (V - X)`` is the d that ``delta_window_d`` solves; M is lower triangular, and its leading
    rows are those of a shorter window (row j needs only the entries up to j)."""
    gen = torch.Generator().manual_seed(11)
    n, HK, HV, K, V, m = 3, 2, 4, 16, 5, 7
    k = torch.nn.functional.normalize(torch.randn(n, HK, m, K, generator=gen), dim=-1)
    g = -torch.exp(torch.rand((n, HV, m) if family == "gdn" else (n, HV, m, K), generator=gen) * 6.2 - 6.9)
    beta = torch.sigmoid(torch.randn(n, HV, m, generator=gen))
    S0 = torch.randn(n, HV, K, V, generator=gen)
    v = torch.randn(n, HV, m, V, generator=gen)
    kh, gam = delta_window(k, g, HV, K)
    M = delta_window_coefficients(kh, gam, beta)
    assert M.shape == (n, HV, m, m)
    assert torch.equal(M.triu(1), torch.zeros_like(M))
    assert torch.equal(torch.diagonal(M, dim1=-2, dim2=-1), beta)
    X = torch.einsum("nhkv,nhjk->nhjv", S0, torch.exp(gam) * kh)
    assert rms_ratio(M @ (v - X), delta_window_d(S0, kh, v, beta, gam)) < 1e-6
    head = delta_window_coefficients(kh[:, :, :4], gam[:, :, :4], beta[:, :, :4])
    torch.testing.assert_close(head, M[:, :, :4, :4], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family,layout,read_format", [
    ("gdn", "kv", "nvfp4"), ("gdn", "vk", "fp8"), ("kda", "kv", "fp8"), ("kda", "vk", "nvfp4")])
def test_coefficient_flush_matches_the_replay_and_the_recurrence(family, layout, read_format):
    """Two pools take the same steps; at the step where three rows flush (one row does not, one is
    padded), one runs the flush pass in use (the replay), the other the coefficient flush from the
    ring's rows of M. Outputs and checkpoints agree with each other and with the fp64 recurrence,
    rings (but the fp32 d cache) and cursors are bit-exact, the coefficient rows appended are the
    reference's, and the read copy is the encoding of the checkpoint it stored."""
    spec = SPECS[family]
    HV, K, V = spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    cfg = rs.ReplayConfig(window=5, read_format=read_format)
    S, n = 7, 5

    def make():
        if layout == "kv":
            return rs.StatePool(spec, cfg, num_layers=1, num_slots=S, device=DEVICE, backend="triton")
        storage = torch.zeros(1, S, HV, V, K, device=DEVICE)
        return rs.StatePool(spec, cfg, num_layers=1, num_slots=S, device=DEVICE, backend="triton",
                            checkpoint=storage, state_layout="vk")

    pools = [make(), make()]
    slots = pools[0].alloc(n)
    assert torch.equal(pools[1].alloc(n), slots)
    gen = torch.Generator().manual_seed(3)
    state = torch.randn(n, *spec.state_shape, generator=gen) * 0.3
    for p in pools:
        p.write_state(0, slots, state.to(DEVICE))
    oracle = state.double()
    params = Params(spec, 1, gen)
    for step in range(cfg.window - 1):                       # fills 4, 4, 4, 2, 1
        keep = torch.tensor([True, True, True, step % 2 == 0, step == 0])
        inp = make_inputs(spec, params, 0, n, None, gen, device=DEVICE)
        for p in pools:
            rs.decode(p, 0, torch.where(keep.to(DEVICE), slots, -1), **inp)
        oracle = torch.where(keep[:, None, None, None], step_oracle(spec, oracle, f64(inp))[1], oracle)

    rows = slots.clone()
    rows[4] = -1
    inp = make_inputs(spec, params, 0, n, None, gen, device=DEVICE)
    y_want, s_want = step_oracle(spec, oracle, f64(inp))
    outs, ring_m = [], None
    origin = pools[1].cursors["origin"][0].clone()
    for which, p in enumerate(pools):
        out = torch.full((n, 1, HV, V), float("nan"), device=DEVICE)
        plan = ops.delta_plan(**layer_state(p, 0), slots=rows, **{x: inp[x][:, None] for x in "qkv"},
                              g=inp["g"][:, None], beta=inp["beta"][:, None], out=out, scale=K ** -0.5,
                              window=cfg.window, committed=True, **_formats(cfg, 0))
        assert [lc.flush_pass for lc in plan] == [False, True]
        if which == 0:
            ops.launch(plan)
        else:
            ring, cur = {x: b[0] for x, b in p.ring.items()}, p.cursors
            ring_m = torch.full((S, *ring["d"].shape[1:3], plan[1].constexprs["BM"]), float("nan"), device=DEVICE)
            scf.fill_coefficients(ring_m, ring["k"], ring["g"], ring["beta"], cur["count"][0], cur["origin"][0], rows)
            plan[0].run()
            scf.coefficient_flush(plan[1], ring_m, rows=16, num_warps=1)
        _advance(p, 0, rows, 1, True)
        outs.append(out[:, 0])
    replayed, coeff = pools

    assert torch.isfinite(outs[1]).all(), "kernel left outputs unwritten"
    assert rms_ratio(outs[1], outs[0]) < 1e-5
    assert rms_ratio(outs[1][:4], y_want[:4]) < TOL[read_format]          # the non-flush row reads the copy
    assert rms_ratio(outs[1][:3], y_want[:3]) < TOL["float32"]            # the flush rows, the exact state
    for name in replayed.cursors:
        assert torch.equal(replayed.cursors[name], coeff.cursors[name]), name
    for name in replayed.ring:
        if name != "d":
            assert torch.equal(replayed.ring[name], coeff.ring[name]), name
    assert rms_ratio(coeff.ring["d"], replayed.ring["d"]) < 1e-5
    flushed = slots[:3]
    assert rms_ratio(coeff.read_state(0, flushed), replayed.read_state(0, flushed)) < 1e-5
    assert rms_ratio(coeff.read_state(0, flushed), s_want[:3]) < TOL["float32"]
    assert torch.equal(coeff.checkpoint[0, slots[3:]], replayed.checkpoint[0, slots[3:]])
    # the token's row of M, appended where its raw inputs went, is the reference's of the window
    ring = {x: b[0] for x, b in coeff.ring.items()}
    want_m = torch.full_like(ring_m, float("nan"))
    window = torch.zeros_like(origin)
    window[flushed] = cfg.window
    scf.fill_coefficients(want_m, ring["k"], ring["g"], ring["beta"], window, origin, flushed)
    for sl in flushed.tolist():
        pos = (int(origin[sl]) + cfg.window - 1) % ring_m.shape[2]
        torch.testing.assert_close(ring_m[sl, :, pos], want_m[sl, :, pos], rtol=1e-5, atol=1e-6)
    codes = {x: b[0].clone() for x, b in coeff.read.items()}
    ops.refresh_read_copy(checkpoint=layer_state(coeff, 0)["checkpoint"], slots=flushed, read_codes=codes["codes"],
                          read_block_scale=codes["block_scale"], read_row_scale=codes["row_scale"], is_delta=True,
                          read_format=READ_CODES[read_format])
    for x in codes:
        assert torch.equal(codes[x], coeff.read[x][0]), x


def test_coefficient_flush_refuses_a_ring_of_another_shape():
    spec = SPECS["gdn"]
    cfg = rs.ReplayConfig(window=4, read_format="nvfp4")
    pool = rs.StatePool(spec, cfg, num_layers=1, num_slots=3, device=DEVICE, backend="triton")
    slots = pool.alloc(2)
    inp = make_inputs(spec, Params(spec, 1, torch.Generator().manual_seed(0)), 0, 2, 1, torch.Generator(),
                      device=DEVICE)
    out = torch.empty(2, 1, spec.num_v_heads, spec.head_v_dim, device=DEVICE)
    plan = ops.delta_plan(**layer_state(pool, 0), slots=slots, **inp, out=out, scale=1.0, window=cfg.window,
                          committed=True, **_formats(cfg, 0))
    bm = plan[1].constexprs["BM"]
    ring_m = torch.zeros(3, spec.num_v_heads, cfg.capacity, bm // 2, device=DEVICE)
    with pytest.raises(ValueError, match="ring_m: expected contiguous fp32"):
        scf.coefficient_flush(plan[1], ring_m, rows=16, num_warps=1)
