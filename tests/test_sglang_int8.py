"""SGLang 0.5.23's int8 radix store (``--enable-int8-mamba-checkpoint``) under replay on the CPU (or the GPU:
``REPLAYSSM_TEST_DEVICE=cuda``): SGLang's ``MambaCheckpointPool`` beside the replay pool; a decoding slot's
state stored for the tree (``store_from_active``: quantized once) and loaded on a hit into a slot whose ring
holds another request's tokens (``load_to_active``: SGLang's copy-on-write). Checked against the fp64 step
recurrence; the int8 rounding is SGLang's (once per store), within the ``int8`` tolerance.
"""

import pytest
import torch

pytest.importorskip("sglang")

from conftest import DEVICE  # noqa: E402
from helpers import TOL, rms_ratio  # noqa: E402
from test_sglang_replay import H, LAYERS, N, P, Run, _assert_read_copy_is_encoded_checkpoint, _req_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")


def test_slot_state_through_sglangs_int8_store_matches_step_recurrence(replay_on):
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    run = Run(_req_pool(), replay_on, torch.Generator().manual_seed(23))
    mp = run.req_pool.mamba_pool
    store = MambaCheckpointPool(num_layers=len(LAYERS), num_slots=4, num_heads=H, head_v_dim=P, head_k_dim=N,
                                conv_shapes=[tuple(c.shape[2:]) for c in mp.mamba_cache.conv],
                                conv_dtype=mp.mamba_cache.conv[0].dtype, device=DEVICE,
                                temporal_dtype=mp.mamba_cache.temporal.dtype)
    a, c = (run.req_pool.mamba_allocator.alloc(1) for _ in range(2))
    run.started(torch.cat((a, c)), 3)                            # window 4: both rings hold 3 tokens
    want = torch.stack([run.oracle[layer, a.item()] for layer in range(len(LAYERS))])

    ckpt = store.alloc(1)
    store.store_from_active(mp, a, ckpt)                         # the tree takes a's state, in int8
    assert rms_ratio(store.temporal.load(ckpt, torch.float32)[:, 0], want) < TOL["int8"]
    assert mp.replay.cursors["count"][:, a].eq(0).all()

    store.load_to_active(mp, ckpt, c)                            # a hit: copy-on-write into c
    assert mp.replay.cursors["count"][:, c].eq(0).all()          # c's own 3 tokens are gone with its ring
    _assert_read_copy_is_encoded_checkpoint(mp, c)
    loaded = mp.mamba_cache.temporal[:, c[0]].clone()
    assert rms_ratio(loaded, want) < TOL["int8"]
    run.adopt(c, loaded[:, None])
    for _ in range(5):                                           # c decodes on from the loaded state, through a flush
        assert run.decode(c) < TOL["fp8"]
    assert run.state_error(c) < TOL["float32"]
