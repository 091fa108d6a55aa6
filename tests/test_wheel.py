"""Run by `make test-wheel` against the built wheel: the package and its data files are complete."""

import importlib.resources
import os

import torch

import replayssm as rs


def test_imported_from_the_wheel():
    if os.environ.get("PYTHONPATH", "").find("build/site") < 0:
        import pytest
        pytest.skip("run by `make test-wheel` against the built wheel")
    assert "build/site" in rs.__file__


def test_wheel_contents_and_a_step():
    assert "version 1" in importlib.resources.files("replayssm").joinpath("RING.md").read_text()
    import replayssm.integrations.sglang  # noqa: F401
    import replayssm.integrations.trtllm  # noqa: F401
    import replayssm.integrations.transformers.demo  # noqa: F401
    from replayssm.kernels.mamba2 import reference  # noqa: F401
    import replayssm.kernels.backend  # noqa: F401  (every kernel module)
    spec = rs.LayerSpec.gdn(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=8)
    pool = rs.StatePool(spec, rs.ReplayConfig(window=2, read_format="nvfp4"), num_layers=1, num_slots=2)
    slots = pool.alloc(2)
    gen = torch.Generator().manual_seed(0)
    o = rs.decode(pool, 0, slots, q=torch.randn(2, 1, 16, generator=gen),
                  k=torch.nn.functional.normalize(torch.randn(2, 1, 16, generator=gen), dim=-1),
                  v=torch.randn(2, 2, 8, generator=gen), g=-torch.rand(2, 2, generator=gen),
                  beta=torch.rand(2, 2, generator=gen))
    assert o.shape == (2, 2, 8) and torch.isfinite(o).all() and o.abs().sum() > 0
