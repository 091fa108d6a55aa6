"""The decode-step benchmark's stacks on the CPU: replay tracks the conventional step (no timing here)."""

import torch

from decode_step import ACT, STACKS, WINDOW, Model, smoke


def test_decode_step_stacks_replay_matches_conventional():
    worst = smoke(steps=20)          # past the first flush: the read copy then holds state
    for name, errs in worst.items():
        # bf16 activations: fp32-level state differences only flip output roundings
        assert errs["replay"] < 1e-2, (name, errs)
        # the NVFP4 read copy is used (its error shows) and stays bounded
        assert errs["replay"] < errs["replay + nvfp4"] < 0.2, (name, errs)


def test_stagger_brings_row_r_to_r_mod_window_entries():
    st = STACKS["tiny-gdn"]
    n = WINDOW + 5
    model = Model(st, n, 8, "replay", "cpu", {})
    h = torch.randn(n, st.hidden, generator=torch.Generator().manual_seed(2)).to(ACT)
    model.stagger(h)
    fill = torch.arange(n) % WINDOW
    count = model.pool.cursors["count"][:, model.slots]
    assert torch.equal(count, fill.expand_as(count).to(count.dtype))
    assert torch.isfinite(model.step(h).float()).all()
    # the step flushed exactly the rows that held WINDOW - 1 entries
    count = model.pool.cursors["count"][:, model.slots]
    assert torch.equal(count, ((fill + 1) % WINDOW).expand_as(count).to(count.dtype))
