"""Mixed batches (``--enable-mixed-chunk``) under replay on the CPU (or the GPU: ``REPLAYSSM_TEST_DEVICE=cuda``):
SGLang merges running requests into a prefill batch as one-token extends, so its chunk scan (Mamba-2's
``MambaMixer2.forward``, GDN / KDA ``forward_extend``) reads every row's ``temporal`` as the initial state and
writes the final one. The replay hooks fold the rows' rings before and reset them after.

SGLang's pools are real (``HybridReqToTokenPool``, Nemotron-H- and Qwen3-Next-style cache parameters); the
hooks wrap a stand-in for the chunk scan that records the initial states it reads and writes new ones, since
SGLang's prefill kernels are CUDA / sglang-kernel CPU ops run on neither test machine. Checked against the fp64
step recurrence.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import test_sglang_gdn as gdn  # noqa: E402
from conftest import DEVICE  # noqa: E402
from helpers import TOL, rms_ratio, step_oracle  # noqa: E402
from replayssm.integrations.sglang import hooks  # noqa: E402
from test_sglang_replay import LAYERS, Run, _assert_read_copy_is_encoded_checkpoint, _req_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")


def _chunk_scan(read, written):
    """Stand-in for SGLang's chunk scan over ``rows``: records ``temporal[rows]`` (its initial states) in
    ``read`` and writes ``written[layer]`` as the rows' final states."""
    def scan(temporal, rows, layer):
        read[layer] = temporal[rows].clone()
        temporal[rows] = written[layer]
    return scan


def test_mamba2_mixed_batch_scans_whole_states(replay_on):
    gen = torch.Generator().manual_seed(17)
    run = Run(_req_pool(), replay_on, gen)
    mp = run.req_pool.mamba_pool
    running, fresh = (run.req_pool.mamba_allocator.alloc(1) for _ in range(2))
    run.clear(torch.cat((running, fresh)))
    run.prefill(running)
    for _ in range(3):                                           # window 4: the ring holds 3 tokens
        run.decode(running)
    assert mp.replay.cursors["count"][:, running].eq(3).all()
    rows = torch.cat((fresh, running))                           # a mixed batch: the running request last
    want = [torch.stack((torch.zeros_like(run.oracle[layer, running.item()]), run.oracle[layer, running.item()]))
            for layer in range(len(LAYERS))]
    read, written = {}, [torch.randn(2, *want[0].shape[1:], generator=gen) * 0.3 for _ in LAYERS]
    scan = _chunk_scan(read, written)

    def mixer_forward(self, *, layer_cache, metadata):
        scan(layer_cache.temporal, metadata.mamba_cache_indices, self.layer)

    forward = hooks.around_mixer_forward(mixer_forward)
    for layer, layer_id in enumerate(LAYERS):
        forward(SimpleNamespace(layer=layer), layer_cache=run.req_pool.mamba2_layer_cache(layer_id),
                metadata=SimpleNamespace(num_prefills=2, mamba_cache_indices=rows.to(torch.int32)))
        assert rms_ratio(read[layer], want[layer]) < TOL["float32"]
    assert mp.replay.cursors["count"][:, rows].eq(0).all()
    _assert_read_copy_is_encoded_checkpoint(mp, rows)
    run.adopt(rows, written)
    for _ in range(5):                                           # both decode on, through a flush
        assert run.decode(rows) < TOL["fp8"]
    assert run.state_error(rows) < TOL["float32"]


def test_gdn_mixed_batch_extends_whole_states(server_args, replay_on):
    """GDN's ``forward_extend`` hook (KDA's is the same function) around a mixed batch."""
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    gen = torch.Generator().manual_seed(19)
    req_pool = gdn._req_pool()
    mp = req_pool.mamba_pool
    running, fresh = (req_pool.mamba_allocator.alloc(1) for _ in range(2))
    mp.clear_slots(torch.cat((running, fresh)))
    A_log = [torch.randn(gdn.HV, generator=gen) * 0.5 - 1 for _ in gdn.LAYERS]
    dt_bias = [torch.randn(gdn.HV, generator=gen) for _ in gdn.LAYERS]
    oracle = []
    for layer, layer_id in enumerate(gdn.LAYERS):                   # SGLang's [HV, V, K] state
        state = torch.randn(1, gdn.HV, gdn.V, gdn.K, generator=gen) * 0.3
        mp.mamba_cache.temporal[layer][running] = state.to(DEVICE)
        mp.replay.refresh(running, layer=layer)
        oracle.append(state.transpose(-1, -2).double())              # replayssm's [HV, K, V]

    def decode(slots, n):
        for layer, layer_id in enumerate(gdn.LAYERS):
            mixed = torch.randn(n, 2 * gdn.HK * gdn.K + gdn.HV * gdn.V, generator=gen)
            a, b = torch.randn(n, gdn.HV, generator=gen), torch.randn(n, gdn.HV, generator=gen)
            out = TritonGDNKernel().packed_decode(mixed, a, b, A_log=A_log[layer], dt_bias=dt_bias[layer],
                                                  scale=gdn.K ** -0.5,
                                                  ssm_states=req_pool.mamba2_layer_cache(layer_id).temporal,
                                                  cache_indices=slots.to(torch.int32), num_v_heads=gdn.HV,
                                                  head_v_dim=gdn.V, replayssm_d=None, replayssm_k=None,
                                                  replayssm_g=None, replayssm_write_pos=None,
                                                  replayssm_force_flush=None)
            y, oracle[layer] = step_oracle(gdn.SPEC, oracle[layer], dict(gdn._gating(mixed, a, b, A_log[layer],
                                                                                      dt_bias[layer]),
                                                                         scale=gdn.K ** -0.5))
            assert rms_ratio(out[0], y) < TOL["fp8"]

    decode(running, 1)
    decode(running, 1)
    decode(running, 1)
    assert mp.replay.cursors["count"][:, running].eq(3).all()
    rows = torch.cat((fresh, running))
    read, written = {}, [torch.randn(2, gdn.HV, gdn.V, gdn.K, generator=gen) * 0.3 for _ in gdn.LAYERS]
    scan = _chunk_scan(read, written)

    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        scan(self.req_to_token_pool.mamba2_layer_cache(layer.layer_id).temporal,
             self.forward_metadata.mamba_cache_indices, gdn.LAYERS.index(layer.layer_id))

    extend = hooks.around_extend(forward_extend)
    backend = SimpleNamespace(req_to_token_pool=req_pool,
                              forward_metadata=SimpleNamespace(mamba_cache_indices=rows.to(torch.int32)))
    for layer, layer_id in enumerate(gdn.LAYERS):
        extend(backend, SimpleNamespace(layer_id=layer_id), SimpleNamespace(forward_mode=ForwardMode.MIXED),
               None, None, None)
        whole = torch.stack((torch.zeros_like(oracle[layer][0]), oracle[layer][0])).transpose(-1, -2)
        assert rms_ratio(read[layer], whole) < TOL["float32"]
    assert mp.replay.cursors["count"][:, rows].eq(0).all()
    for layer in range(len(gdn.LAYERS)):
        oracle[layer] = written[layer].transpose(-1, -2).double().to(DEVICE)
    for _ in range(5):                                           # both decode on, through a flush
        decode(rows, 2)
    for layer in range(len(gdn.LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, rows), oracle[layer]) < TOL["float32"]
