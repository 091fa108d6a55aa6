"""GDN decode and verify under SGLang 0.5.23's CUDA-graph metadata: captured once, replayed per step (GPU).

SGLang's graph runner captures a forward once per batch size. Before each replay it refills the
linear-attention backend's static buffers in place (``init_cuda_graph_state``,
``init_forward_metadata_out_graph``): the slots of the batch's requests, then -1 for the rows that
pad the batch up to the captured size. Here the replay seam (``TritonGDNKernel.packed_decode`` /
``target_verify``) reads its slots from those buffers, through SGLang's own backend methods. On a GPU
(``REPLAYSSM_TEST_DEVICE=cuda``) both layers' steps are captured in one ``torch.cuda.CUDAGraph`` and
the graph is replayed at every step, with other requests and paddings each time, across flushes; the
commit after a verify runs outside the graph, as SGLang's does. On the CPU the same steps run
eagerly (Triton's interpreter). Checked against the fp64 step recurrence. The Mamba-2 and KDA seams
are checked for host reads (what a capture cannot take) through their own decode and verify tests.
"""

from array import array
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import replayssm as rs  # noqa: E402
from conftest import DEVICE  # noqa: E402
from helpers import TOL, accepted_states, assert_same_resets, chain_oracle, rms_ratio, step_oracle  # noqa: E402
from replayssm.integrations.sglang import hooks, pool as replay_pool, versions  # noqa: E402
from test_unchecked import HostReads  # noqa: E402
from test_sglang_gdn import HK, HV, K, LAYERS, SPEC, V, _gating, _req_pool, _runner  # noqa: E402

pytestmark = pytest.mark.usefixtures("test_device")
BS = 4                                  # the captured batch size; 3 requests, so at least one row pads
# the requests of each step's batch rows (None: padding, at the end as SGLang pads)
SCHEDULE = [(0, 1, 2, None), (2, 0, None, None), (1, 2, 0, None), (0, None, None, None), (2, 1, 0, None),
            (1, 0, 2, None), (0, 2, None, None), (2, 0, 1, None)]


class Graphed:
    """``fn`` after a warm-up call (kernels compiled, per-layer constants cached): eagerly on the CPU,
    where it must read no device value on the host (``HostReads``: what a capture cannot take); on a
    GPU captured once and replayed. ``fn`` returns the step's outputs, which a replay rewrites in place."""

    def __init__(self, fn, warm_up):
        self.fn, self.graph, self.out = fn, None, None
        warm_up()                                   # every row padded: nothing is read or written
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = fn()

    def __call__(self):
        if self.graph is None:
            with HostReads() as reads:
                self.out = self.fn()
            assert not reads.found, reads.found
        else:
            self.graph.replay()
        return self.out


def _setup(server_args, cfg, gen, draft_tokens=None):
    """SGLang's pool and GDN backend with its CUDA-graph state for batch size BS, three prefilled requests."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams
    hooks.install(cfg, backend="triton")
    req_pool = _req_pool(draft_tokens=draft_tokens)
    linear = GDNAttnBackend(_runner(server_args, req_pool))
    linear.init_cuda_graph_state(BS, BS * (draft_tokens or 1))
    reqs = [Req(f"r{i}", "", array("q", [1, 2, 3]), SamplingParams(max_new_tokens=16)) for i in range(3)]
    assert req_pool.alloc(reqs) is not None
    slots = torch.stack([r.kv.mamba_pool_idx for r in reqs]).to(torch.int64)
    req_pool.mamba_pool.clear_slots(slots)
    oracle = []
    for layer_id in LAYERS:                                   # prefill writes SGLang's [HV, V, K] state
        state = torch.randn(3, HV, V, K, generator=gen) * 0.3
        req_pool.mamba2_layer_cache(layer_id).temporal[slots] = state
        replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, slots)
        oracle.append(state.transpose(-1, -2).double())
    params = [dict(A_log=torch.randn(HV, generator=gen) * 0.5 - 1, dt_bias=torch.randn(HV, generator=gen))
              for _ in LAYERS]
    return req_pool, linear, reqs, slots, oracle, params


def _metadata(linear, reqs, rows, mode, spec_info=None):
    """What SGLang does before a replay: the static slot buffer refilled from the batch's requests."""
    idx = torch.tensor([reqs[r].kv.req_pool_idx if r is not None else 0 for r in rows], dtype=torch.int64)
    pad = sum(r is None for r in rows)
    linear.init_forward_metadata_out_graph(SimpleNamespace(
        batch_size=BS, req_pool_indices=idx, forward_mode=mode, spec_info=spec_info, seq_lens_cpu=None,
        num_padding=pad, mamba_track_indices=None))
    real = [i for i, r in enumerate(rows) if r is not None]
    return real, [rows[i] for i in real], [i for i, r in enumerate(rows) if r is None]


@pytest.mark.parametrize("read_format", ["checkpoint", "nvfp4"])
def test_gdn_decode_replays_under_sglangs_cuda_graph_metadata(server_args, read_format):
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    gen = torch.Generator().manual_seed(21)
    cfg = rs.ReplayConfig(window=4, read_format=read_format, ring_dtype="float32")
    try:
        req_pool, linear, reqs, slots, oracle, params = _setup(server_args, cfg, gen)
        static = [dict(mixed=torch.zeros(BS, 2 * HK * K + HV * V), a=torch.zeros(BS, HV), b=torch.zeros(BS, HV))
                  for _ in LAYERS]

        def forward():
            return [TritonGDNKernel().packed_decode(
                s["mixed"], s["a"], s["b"], **p, scale=K ** -0.5, ssm_states=req_pool.mamba2_layer_cache(lid).temporal,
                cache_indices=linear.forward_metadata.mamba_cache_indices, num_v_heads=HV, head_v_dim=V,
                replayssm_d=None, replayssm_k=None, replayssm_g=None, replayssm_write_pos=None,
                replayssm_force_flush=None) for lid, s, p in zip(LAYERS, static, params)]

        step = Graphed(forward, lambda: _metadata(linear, reqs, (None,) * BS, ForwardMode.DECODE))
        errs = []
        for rows in SCHEDULE:                                 # each request flushes every 4 of its tokens
            real, who, pads = _metadata(linear, reqs, rows, ForwardMode.DECODE)
            for s in static:
                for t in s.values():
                    t.copy_(torch.randn(t.shape, generator=gen))
            outs = step()
            for layer, (s, p, out) in enumerate(zip(static, params, outs)):
                assert out.shape == (1, BS, HV, V) and bool(out[0, pads].eq(0).all())
                ref = _gating(s["mixed"], s["a"], s["b"], p["A_log"], p["dt_bias"])
                y, oracle[layer][who] = step_oracle(SPEC, oracle[layer][who],
                                                    dict({n: t[real] for n, t in ref.items()}, scale=K ** -0.5))
                errs.append(rms_ratio(out[0, real], y))
        assert max(errs) < TOL[read_format if read_format != "checkpoint" else "float32"], errs
        for layer in range(len(LAYERS)):
            assert rms_ratio(req_pool.mamba_pool.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
        # every request took a flush (4 tokens) and the cursors moved on the device only
        tokens = [sum(r in rows for rows in SCHEDULE) for r in range(3)]
        assert req_pool.mamba_pool.replay.cursors["count"][:, slots].eq(torch.tensor(tokens, dtype=torch.int32) % 4).all()
        assert min(tokens) >= 4
    finally:
        hooks.uninstall()


def test_gdn_verify_replays_under_sglangs_cuda_graph_metadata(server_args):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    T = 3
    gen = torch.Generator().manual_seed(22)
    cfg = rs.ReplayConfig(window=4, ring_dtype="float32")
    try:
        req_pool, linear, reqs, slots, oracle, params = _setup(server_args, cfg, gen, draft_tokens=T)
        backend = HybridLinearAttnBackend(TorchNativeAttnBackend(_runner(server_args, req_pool)), linear, [1, 3])
        spec_info = SimpleNamespace(draft_token_num=T, ragged_verify_layout=None)
        static = [dict(mixed=torch.zeros(BS * T, 2 * HK * K + HV * V), a=torch.zeros(BS * T, HV),
                       b=torch.zeros(BS * T, HV)) for _ in LAYERS]
        caches = [req_pool.mamba2_layer_cache(lid) for lid in LAYERS]

        def forward():
            outs = []
            for c, s, p in zip(caches, static, params):       # as GDNAttnBackend.forward_extend splits
                q, k, v = torch.split(s["mixed"], [HK * K, HK * K, HV * V], dim=-1)
                outs.append(TritonGDNKernel().target_verify(
                    **p, q=q.view(1, BS * T, HK, K), k=k.view(1, BS * T, HK, K), v=v.view(1, BS * T, HV, V),
                    a=s["a"], b=s["b"], ssm_states=c.temporal, cache_indices=linear.forward_metadata.mamba_cache_indices,
                    query_start_loc=linear.forward_metadata.query_start_loc, intermediate_states_buffer=c.intermediate_ssm,
                    intermediate_state_indices=torch.arange(BS, dtype=torch.int32), cache_steps=T,
                    retrieve_parent_token=None, stable_rows=False))
            return outs

        verify = ForwardMode.TARGET_VERIFY
        step = Graphed(forward, lambda: _metadata(linear, reqs, (None,) * BS, verify, spec_info))
        rng = torch.Generator().manual_seed(5)
        for rows in SCHEDULE:
            real, who, pads = _metadata(linear, reqs, rows, verify, spec_info)
            for s in static:
                for t in s.values():
                    t.copy_(torch.randn(t.shape, generator=gen))
            outs = step()
            accepted = torch.randint(1, T + 1, (len(real),), generator=rng)
            for layer, (s, p, out) in enumerate(zip(static, params, outs)):
                out = out[0].view(BS, T, HV, V)
                assert bool(out[pads].eq(0).all())
                ref = _gating(s["mixed"], s["a"], s["b"], p["A_log"], p["dt_bias"])
                ref["beta"] = torch.sigmoid(s["b"].double())      # the verify kernel does not round beta
                rows_in = {n: t.view(BS, T, *t.shape[1:])[real].flatten(0, 1) for n, t in ref.items()}
                ys, states = chain_oracle(SPEC, oracle[layer][who], rows_in, len(real), T, K ** -0.5)
                assert rms_ratio(out[real], ys) < TOL["float32"]
                oracle[layer][who] = accepted_states(states, accepted.tolist())
            backend.update_mamba_state_after_mtp_verify(accepted - 1, None, None, model=None)
        for layer in range(len(LAYERS)):
            assert rms_ratio(req_pool.mamba_pool.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
    finally:
        hooks.uninstall()


@pytest.mark.parametrize("family", ["mamba2", "kda"])
def test_every_familys_seam_reads_no_device_value(server_args, monkeypatch, family):
    """What a CUDA graph cannot capture, for the other families' seams (GDN's: the tests above): their
    decode and verify tests run with each seam call under ``HostReads`` (the Triton backend; the
    per-layer stochastic-rounding keys are computed first, once per process, as a warm-up would)."""
    import test_sglang_kda
    import test_sglang_replay
    from replayssm.integrations.sglang import kda, mamba2
    from replayssm.kernels import ops
    for layer in range(4):
        ops.sr_base(0, layer)
    reads, calls = [], []

    def watched(seam):
        def call(*args, **kwargs):
            with HostReads() as found:
                result = seam(*args, **kwargs)
            reads.extend(found.found)
            calls.append(seam.__name__)
            return result
        return call

    if family == "mamba2":
        monkeypatch.setattr(mamba2, "replay_selective_state_update", watched(mamba2.replay_selective_state_update))
        test_sglang_replay.test_decode_through_sglang_call_site_matches_step_recurrence("triton")
        test_sglang_replay.test_verify_and_commit_match_step_recurrence("triton")
    else:
        for name in ("replay_packed_decode", "replay_target_verify"):
            monkeypatch.setattr(kda, name, watched(getattr(kda, name)))
        test_sglang_kda.test_kda_decode_matches_step_recurrence("packed", "triton", None)
        test_sglang_kda.test_kda_verify_and_commit_through_sglangs_backend(server_args, "triton", -5.0)
    assert len(calls) >= 20 and not reads, (calls, reads)


def test_slot_resets_read_no_device_value():
    """On the Triton backend the adapter's ring resets (after a prefill, a HiCache load, an int8 hit,
    a PD transfer's first batch, SGLang's clear) read no device value on the host: a prefill or a
    layer-by-layer load stays asynchronous. Checked against the reference pool's resets."""
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    cfg = rs.ReplayConfig(window=4, read_format="nvfp4", ring_dtype="float32")
    pools = {}
    for backend in ("reference", "triton"):
        hooks.install(cfg, backend=backend)
        try:
            pools[backend] = _req_pool()
        finally:
            hooks.uninstall()
    gen = torch.Generator().manual_seed(21)
    state = torch.randn(2, 3, HV, V, K, generator=gen)
    reads = []
    for backend, req_pool in pools.items():
        mp = req_pool.mamba_pool
        slots = req_pool.mamba_allocator.alloc(3)
        mp.replay.cursors["count"][:, slots] = 2                # rings as decodes leave them
        mp.mamba_cache.temporal[:, slots] = state.to(DEVICE)    # the host writes the checkpoints
        padded = torch.cat((slots[:1], torch.tensor([-1], device=slots.device)))
        (info,) = mp.get_device_pool_infos()
        host_tier = MambaPoolHost(info.buffer_info, 2.0, 0, device_capacity=mp.size, pin_memory=False,
                                  layout="page_first")
        with HostReads() as found:
            replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(LAYERS[0]).temporal, padded)
            replay_pool.on_state("hicache load", versions.seams().host_device_layers(host_tier)[1], slots[1:2])
            replay_pool.on_pool("int8 load", mp, slots[2:])
        if backend == "triton":
            reads.extend(found.found)
        host_tier.destroy()
    assert not reads, reads
    assert_same_resets(pools["reference"].mamba_pool.replay, pools["triton"].mamba_pool.replay)
