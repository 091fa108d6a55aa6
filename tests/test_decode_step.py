"""The decode-step benchmark's stacks on the CPU: replay tracks the conventional step (no timing here)."""

from decode_step import smoke


def test_decode_step_stacks_replay_matches_conventional():
    worst = smoke(steps=20)          # past the first flush: the read copy then holds state
    for name, errs in worst.items():
        # bf16 activations: fp32-level state differences only flip output roundings
        assert errs["replay"] < 1e-2, (name, errs)
        # the NVFP4 read copy is used (its error shows) and stays bounded
        assert errs["replay"] < errs["replay + nvfp4"] < 0.2, (name, errs)
