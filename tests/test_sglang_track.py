"""SGLang 0.5.23's extra_buffer track copies on a replay pool, on the CPU (or the GPU:
``REPLAYSSM_TEST_DEVICE=cuda``): the decode track (``track_mamba_states_if_needed`` per layer,
``track_mamba_states_all_layers`` at once) and the extend track (``_track_mamba_state_extend``), as
SGLang's attention backends call them, with SGLang's own copy kernels. A track slot must hold the
whole state at the tracked token: SGLang's copy of the checkpoint, and beside it the source's ring,
cursors and read copy byte for byte (the decode track folds nothing); and a request continued from
it must match the fp64 step recurrence.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from conftest import DEVICE  # noqa: E402
from helpers import TOL  # noqa: E402
from test_sglang_replay import LAYERS, Run, _req_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")


def _decoded(run, slots, steps):
    for _ in range(steps):
        assert run.decode(slots) < TOL["fp8"]


def _tracked(run, src, dst):
    """The oracle of the track slots ``dst``: the states of ``src`` now."""
    for layer in range(len(LAYERS)):
        for s, d in zip(src.tolist(), dst.tolist()):
            run.oracle[layer, d] = run.oracle[layer, s].clone()


@pytest.fixture(params=["reference", "triton"])
def replay_backend(request):
    """The hooks of ``replay_on`` on each StatePool backend (the Triton kernels in Triton's
    interpreter on a CPU: the track copy is then one unchecked launch over the masked rows)."""
    import replayssm as rs
    from replayssm.integrations.sglang import hooks
    cfg = rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32")
    hooks.install(cfg, backend=request.param)
    yield cfg
    hooks.uninstall()


@pytest.mark.parametrize("all_layers", [False, True])
def test_decode_track_copies_the_whole_state(server_args, replay_backend, all_layers, monkeypatch):
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

    from replayssm.kernels.ring import triton as ring_triton
    launches, launch = [], ring_triton.copy_slots

    def counted(*args, **kwargs):
        launches.append(args)
        return launch(*args, **kwargs)
    monkeypatch.setattr(ring_triton, "copy_slots", counted)

    req_pool = _req_pool()
    run = Run(req_pool, replay_backend, torch.Generator().manual_seed(11))
    mp, alloc = req_pool.mamba_pool, req_pool.mamba_allocator.alloc
    slots, tracks = alloc(2), alloc(2)
    run.clear(torch.cat([slots, tracks]))
    run.prefill(slots)
    _decoded(run, slots, 6)                                # window 4: each ring holds 2 tokens
    assert mp.replay.cursors["count"][:, slots].eq(2).all()
    before = mp.mamba_cache.temporal[:, tracks[1]].clone()
    side = (*mp.replay.read.values(), *mp.replay.ring.values(), *mp.replay.cursors.values())
    side_before = [buf[:, tracks[1:]].clone() for buf in side]
    mask = torch.tensor([True, False], device=DEVICE)
    if all_layers:
        hlab.track_mamba_states_all_layers(mp.mamba_cache.conv[0], mp.mamba_cache.temporal, slots, mask, tracks, 2)
    else:
        for layer_id in LAYERS:
            cache = req_pool.mamba2_layer_cache(layer_id)
            hlab.track_mamba_states_if_needed(cache.conv[0], cache.temporal, slots, mask, tracks, 2)
    if mp.replay.backend == "triton":                        # one launch per track call, every buffer at once
        assert len(launches) == (1 if all_layers else len(LAYERS)), len(launches)
    _tracked(run, slots[:1], tracks[:1])
    assert run.state_error(tracks[:1]) < TOL["float32"]      # the ring's tokens are in the tracked state
    assert run.state_error(slots) < TOL["float32"]           # the sources keep their states
    assert mp.replay.cursors["count"][:, slots].eq(2).all()  # nothing folded: the ring travels with the copy
    for buf in side:
        assert torch.equal(buf[:, tracks[:1]].view(torch.uint8), buf[:, slots[:1]].view(torch.uint8))
    assert torch.equal(mp.mamba_cache.temporal[:, tracks[1]], before)    # an unmasked row: nothing copied
    for buf, was in zip(side, side_before):
        assert torch.equal(buf[:, tracks[1:]].view(torch.uint8), was.view(torch.uint8))
    # a later request continues from the track slot (the tree's copy-on-write into its own slot)
    new = alloc(1)
    req_pool.copy_mamba_state(tracks[:1], new)
    _tracked(run, tracks[:1], new)
    _decoded(run, torch.cat([new, slots]), 5)
    assert run.state_error(torch.cat([new, slots])) < TOL["float32"]


def test_extend_track_leaves_track_slots_with_empty_rings(server_args, replay_on):
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

    req_pool = _req_pool()
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(12))
    mp, alloc = req_pool.mamba_pool, req_pool.mamba_allocator.alloc
    slot, track = alloc(1), alloc(1)
    run.clear(torch.cat([slot, track]))
    run.prefill(torch.cat([slot, track]))
    _decoded(run, track, 3)                                 # the track slot's ring holds entries
    run.prefill(slot)                                        # a chunked prefill ends on a chunk boundary
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    meta = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_src=empty, track_ssm_h_dst=empty,
                           track_ssm_recompute_dst=None, track_ssm_final_src=slot, track_ssm_final_dst=track)
    for layer_id in LAYERS:                                  # SGLang copies the final state to the track slot
        hlab.MambaAttnBackendBase._track_mamba_state_extend(None, None, None,
                                                            req_pool.mamba2_layer_cache(layer_id).temporal, meta)
    _tracked(run, slot, track)
    assert mp.replay.cursors["count"][:, track].eq(0).all()
    assert run.state_error(track) < TOL["float32"]
    _decoded(run, torch.cat([track, slot]), 4)
    assert run.state_error(torch.cat([track, slot])) < TOL["float32"]


def test_extend_track_slots_read_no_device_value():
    """The slots the extend track refreshes are found without reading a device value: on the meta
    device (tensors without data, where a value read such as a deduplication raises) they come out
    as SGLang's parts in order, int64, so an extend under extra_buffer adds no host synchronization
    per layer."""
    from replayssm.integrations.sglang import pool

    def part(n, dtype=torch.int64):
        return torch.empty(n, dtype=dtype, device="meta")

    meta = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_dst=part(3, torch.int32),
                           track_ssm_recompute_dst=part(2), track_ssm_final_dst=part(4))
    got = pool.track_extend_slots(meta)
    assert got.device.type == "meta" and got.dtype == torch.int64 and got.shape == (9,)
    values = SimpleNamespace(has_mamba_track_mask=True, track_ssm_h_dst=torch.tensor([7, 3], dtype=torch.int32),
                             track_ssm_final_dst=torch.tensor([5]))         # 0.5.17: no recompute part
    assert pool.track_extend_slots(values).tolist() == [7, 3, 5]
    assert pool.track_extend_slots(SimpleNamespace(has_mamba_track_mask=False)) is None
