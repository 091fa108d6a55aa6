"""benchmarks/bench_gating.py: its PyTorch baseline forms the same inputs as replayssm.gating (within
the precision of its fp32 sums), every heads split agrees, and it refuses to time without a GPU."""

import sys
from pathlib import Path

import pytest
import torch

import replayssm as rs
from conftest import DEVICE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gating  # noqa: E402


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_baseline_and_every_heads_split_form_the_same_inputs(family):
    spec = getattr(rs.LayerSpec, family)(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8)
    inp = bench_gating.raw_inputs(spec, 5, DEVICE)
    base = bench_gating.pytorch_gating(**inp)
    first = bench_gating.fused_gating(inp, 0)
    # one bf16 step of k at most (|k| <= 1), fp32 rounding in g and beta
    assert bench_gating.max_difference(first, base) <= 2 ** -8
    assert (first["q_scale"] - base["q_scale"]).abs().max().item() <= 1e-5 * base["q_scale"].abs().max().item()
    for heads in (1, 2, 4):
        again = bench_gating.fused_gating(inp, heads)
        assert all(torch.equal(again[n], first[n]) for n in first)


def test_refuses_unknown_models_and_a_machine_without_a_gpu(monkeypatch):
    with pytest.raises(SystemExit):
        bench_gating.main(["--models", "nemotron-h"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench_gating.main(["--models", "qwen3.5"])
