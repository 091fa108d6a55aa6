"""Replay (checkpoint + ring) == step recurrence, for every family, window, draft count, precision."""

import pytest
import torch

import replayssm as rs
from helpers import SPECS, TOL, Driver

FAMILIES = list(SPECS)
# (window, max_draft_tokens)
SCHEDULES = [(1, 0), (4, 0), (16, 0), (1, 3), (4, 3), (16, 3), (16, 7)]


def run(driver: Driver, steps: int, n: int, seed: int) -> tuple[list[float], torch.Tensor]:
    """Random mix of decodes and verify+commit over ``steps`` tokens; returns per-step errors."""
    gen = torch.Generator().manual_seed(seed)
    slots = driver.alloc(n)
    errs, done = [], 0
    while done < steps:
        if driver.cfg.max_draft_tokens and torch.rand(1, generator=gen).item() < 0.7:
            T = int(torch.randint(1, driver.cfg.max_tokens + 1, (1,), generator=gen))
            acc = torch.randint(1, T + 1, (n,), generator=gen)
            errs.append(max(driver.verify(slots, T, acc)))
            done += int(acc.float().mean().round())
        else:
            errs.append(max(driver.decode(slots)))
            done += 1
    return errs, slots


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("window,drafts", SCHEDULES, ids=[f"L{w}-d{d}" for w, d in SCHEDULES])
def test_fp32_matches_step_recurrence(family, window, drafts):
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts)
    driver = Driver(SPECS[family], cfg, num_layers=2, num_slots=6, gen=torch.Generator().manual_seed(1))
    errs, slots = run(driver, steps=200, n=3, seed=2)
    assert max(errs) < TOL["float32"], max(errs)
    assert driver.state_error(slots) < TOL["float32"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("read_format", ["fp8", "nvfp4"])
@pytest.mark.parametrize("window,drafts", [(16, 0), (8, 3)], ids=["L16-d0", "L8-d3"])
def test_read_copy_error_is_bounded_and_state_exact(family, read_format, window, drafts):
    """The read copy serves outputs only: outputs within the format's error, state fp32-exact,
    and the output error does not grow with length."""
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts, read_format=read_format)
    driver = Driver(SPECS[family], cfg, num_layers=1, num_slots=4, gen=torch.Generator().manual_seed(3))
    errs, slots = run(driver, steps=240, n=3, seed=4)
    assert max(errs) < TOL[read_format], max(errs)
    assert sum(errs) / len(errs) < TOL[read_format] / 4
    assert max(errs) > 1e-4, "read copy had no effect on outputs"
    assert driver.state_error(slots) < TOL["float32"]
    third = len(errs) // 3
    early, late = sum(errs[:third]) / third, sum(errs[-third:]) / third
    assert late < 2.0 * early, (early, late)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("checkpoint_dtype", ["bfloat16", "float16_sr"])
def test_low_precision_checkpoint(family, checkpoint_dtype):
    cfg = rs.ReplayConfig(window=8, max_draft_tokens=2, checkpoint_dtype=checkpoint_dtype)
    driver = Driver(SPECS[family], cfg, num_layers=1, num_slots=4, gen=torch.Generator().manual_seed(5))
    errs, slots = run(driver, steps=200, n=3, seed=6)
    assert max(errs) < TOL[checkpoint_dtype], max(errs)
    assert driver.state_error(slots) < TOL[checkpoint_dtype]
    # rounding at flushes stays bounded under decay (the first third is the state's warm-up from 0)
    third = len(errs) // 3
    middle, late = sum(errs[third:2 * third]) / third, sum(errs[-third:]) / third
    assert late < 2.0 * middle, (middle, late)
    assert driver.pool.checkpoint.dtype == cfg.torch_checkpoint_dtype


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_ring_inputs(family):
    """Activations in bf16 (as served): the ring stores them losslessly; math stays fp32."""
    cfg = rs.ReplayConfig(window=8, max_draft_tokens=3, ring_dtype="bfloat16")
    driver = Driver(SPECS[family], cfg, num_layers=1, num_slots=4, gen=torch.Generator().manual_seed(7))
    errs, slots = run(driver, steps=100, n=3, seed=8)
    # outputs are rounded to bf16; the oracle sees the same bf16 inputs
    assert max(errs) < 1e-2, max(errs)
    assert driver.state_error(slots) < TOL["float32"]
    assert driver.pool.ring["k" if family != "mamba2" else "x"].dtype == torch.bfloat16


def test_window_one_writes_checkpoint_every_step():
    spec = SPECS["gdn"]
    driver = Driver(spec, rs.ReplayConfig(window=1), num_layers=1, num_slots=2, gen=torch.Generator().manual_seed(9))
    slots = driver.alloc(2)
    for _ in range(5):
        driver.decode(slots)
        # the checkpoint alone is the state: nothing left in the ring
        assert driver.pool.cursors["count"][0, slots].tolist() == [0, 0]
        ck = driver.pool.checkpoint[0, slots].double()
        assert (ck - driver._stack(0, slots)).norm() / ck.norm() < 1e-6
    assert driver.pool.cursors["epoch"][0, slots].tolist() == [5, 5]


@pytest.mark.parametrize("family", FAMILIES)
def test_flush_cadence_and_ring_contents(family):
    """Decode-only: one checkpoint write per window; the ring holds the raw inputs bit-exactly."""
    L = 4
    spec = SPECS[family]
    driver = Driver(spec, rs.ReplayConfig(window=L), num_layers=1, num_slots=2, gen=torch.Generator().manual_seed(10))
    slots = driver.alloc(1)
    pool = driver.pool
    for step in range(1, 11):
        before = pool.checkpoint.clone()
        gen_state = driver.gen.get_state()
        driver.decode(slots)
        flushed = step % L == 0
        assert pool.cursors["count"][0, 0].item() == step % L
        assert pool.cursors["epoch"][0, 0].item() == step // L
        assert torch.equal(pool.checkpoint, before) != flushed
        if not flushed:
            # replay the generator to recover this step's inputs and find them in the ring
            driver.gen.set_state(gen_state)
            from helpers import make_inputs
            inp = make_inputs(spec, driver.params, 0, 1, None, driver.gen)
            pos = (pool.cursors["origin"][0, 0] + step % L - 1) % pool.cfg.capacity
            name = "x" if family == "mamba2" else "v"
            stored = pool.ring[name][0, 0, :, pos]
            assert torch.equal(stored, inp[name][0]), name
