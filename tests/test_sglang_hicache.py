"""A slot's replay state through SGLang 0.5.23's hierarchical cache (HiCache) host tier on the CPU (or the
GPU: ``REPLAYSSM_TEST_DEVICE=cuda``): SGLang's ``MambaPoolHost`` built on the replay pool's checkpoint
buffers, moved by SGLang's ``L2TransferEngine`` (backup of every layer, then the layer-by-layer load the
forward waits on). Checked against the fp64 step recurrence.

The engine runs with ``io_backend="kernel_ascend"``: SGLang's own torch indexing copies for the
page-first host layout. On CUDA also with ``io_backend="kernel"``, SGLang's JIT-built mamba transfer
kernel, where it builds (skipped, with the build error, where it does not); the ``direct`` backend is an
sglang-kernel op, installed on neither test machine. The replay hooks sit on ``MambaPoolHost``'s backup
/ load methods, whichever backend moves the bytes.
"""

import contextlib

import pytest
import torch

pytest.importorskip("sglang")

from conftest import DEVICE  # noqa: E402
from helpers import TOL, rms_ratio  # noqa: E402
from test_sglang_replay import LAYERS, Run, _assert_read_copy_is_encoded_checkpoint, _req_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")


@contextlib.contextmanager
def _host_tier(mp, io_backend):
    """SGLang's host pool over ``mp``: pinned (registered with CUDA) for the ``kernel`` backend, whose
    device kernel reads host memory; unregistered again afterwards (``destroy``), or the next host pool
    of the process could land on a range CUDA still holds registered."""
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    (info,) = mp.get_device_pool_infos()
    host = MambaPoolHost(info.buffer_info, 2.0, 0, device_capacity=mp.size, pin_memory=io_backend == "kernel",
                         layout="page_first")
    try:
        yield host
    finally:
        host.destroy()


def _transfer(host, mp, host_idx, device_idx):
    from sglang.srt.mem_cache.l2_transfer import L2Transfer

    return [L2Transfer(host_pool=host, device_pool=mp, host_indices=host_idx, device_indices=device_idx)]


def _io_backends():
    return ["kernel_ascend"] + (["kernel"] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("io_backend", _io_backends())
def test_slot_state_through_sglangs_host_tier_matches_step_recurrence(replay_on, io_backend):
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine

    if io_backend == "kernel":
        from sglang.kernels.ops.mamba.transfer_mamba import _jit_transfer_mamba_module
        try:
            _jit_transfer_mamba_module()
        except Exception as e:                                   # noqa: BLE001 (the JIT build's own error)
            pytest.skip(f"SGLang's mamba transfer kernel does not build here: {type(e).__name__}: {e}")

    run = Run(_req_pool(), replay_on, torch.Generator().manual_seed(11))
    with _host_tier(run.req_pool.mamba_pool, io_backend) as host:
        _round_trip(run, host, L2TransferEngine(io_backend=io_backend))


def _round_trip(run, host, engine):
    mp = run.req_pool.mamba_pool
    a, c = (run.req_pool.mamba_allocator.alloc(1) for _ in range(2))
    run.started(torch.cat((a, c)), 3)                            # window 4: both rings hold 3 tokens
    assert mp.replay.cursors["count"][:, torch.cat((a, c))].eq(3).all()
    want = [run.oracle[layer, a.item()].clone() for layer in range(len(LAYERS))]

    host_idx = host.alloc(1)                                     # a retracted request's live slot, say
    done = engine.submit_device_to_host(_transfer(host, mp, host_idx, a.to(DEVICE)))
    done.finish_event.synchronize()
    for layer in range(len(LAYERS)):                             # the host holds the whole state at token 3
        assert rms_ratio(host.temporal_buffer[host_idx[0], layer, 0].to(DEVICE), want[layer]) < TOL["float32"]
        assert rms_ratio(mp.mamba_cache.temporal[layer, a[0]], want[layer]) < TOL["float32"]
    assert mp.replay.cursors["count"][:, a].eq(0).all()

    loaded = []
    done = engine.submit_host_to_device(_transfer(host, mp, host_idx, c.to(DEVICE)), transfer_layer_id_max=len(LAYERS),
                                        on_layer_done=loaded.append)
    done.finish_event.synchronize()
    assert loaded == list(range(len(LAYERS)))
    assert mp.replay.cursors["count"][:, c].eq(0).all()          # c's own 3 tokens are gone with its ring
    assert torch.equal(mp.mamba_cache.temporal[:, c[0]], host.temporal_buffer[host_idx[0], :, 0].to(DEVICE))
    _assert_read_copy_is_encoded_checkpoint(mp, c)
    run.adopt(c, torch.stack(want)[:, None])
    assert run.state_error(c) < TOL["float32"]
    for _ in range(5):                                           # c decodes on from a's state, through a flush
        assert run.decode(c) < TOL["fp8"]
    assert run.state_error(c) < TOL["float32"]
