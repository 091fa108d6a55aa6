"""KDA decode through SGLang 0.5.23's kernel seam (``TritonKDAKernel.packed_decode`` and the unpacked
``decode`` taken for safe-gate layers) on the CPU (or the GPU: ``REPLAYSSM_TEST_DEVICE=cuda``), on a pool built by
SGLang's own ``HybridReqToTokenPool`` with Kimi-Linear cache parameters.

The reference is the fp64 step recurrence fed with the gating SGLang's KDA kernels compute (q, k
L2-normalised; per-channel ``g = -exp(A_log) softplus(a + dt_bias)``, or
``lower_bound * sigmoid(exp(A_log) (a + dt_bias))`` with a safe gate; ``beta = sigmoid(b)``).
"""

import pytest
import torch

pytest.importorskip("sglang")

import replayssm as rs  # noqa: E402
from conftest import DEVICE  # noqa: E402
from helpers import TOL, accepted_states, chain_oracle, commit_with_tracks, rms_ratio, step_oracle  # noqa: E402
from replayssm.integrations.sglang import hooks, pool as replay_pool  # noqa: E402

HK, HV, D = 2, 4, 16                       # Kimi-Linear: K = V = head_dim
LAYERS = [0, 3]
SPEC = rs.LayerSpec.kda(num_k_heads=HK, num_v_heads=HV, head_k_dim=D, head_v_dim=D)

pytestmark = pytest.mark.usefixtures("test_device")


def _req_pool(draft_tokens=None):
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape, Mamba2StateDType
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=HV, head_dim=D, num_k_heads=HK, head_k_dim=D,
                                        conv_kernel_size=4)
    params = KimiLinearCacheParams(shape=shape, layers=LAYERS,
                                   dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    return HybridReqToTokenPool(size=8, mamba_size=6, mamba_spec_state_size=8, max_context_len=64, device=DEVICE,
                                enable_memory_saver=False, cache_params=params, mamba_layer_ids=LAYERS,
                                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=draft_tokens)


def _gating(mixed, a, b, A_log, dt_bias, lower_bound):
    """The per-token inputs SGLang's KDA kernels form, in fp64."""
    n = mixed.shape[0]
    q, k, v = mixed.double().split([HK * D, HK * D, HV * D], dim=-1)
    norm = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    x = a.double().view(n, HV, D) + dt_bias.double().view(HV, D)
    rate = torch.exp(A_log.double()).view(HV, 1)
    if lower_bound is None:
        g = -rate * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    else:
        g = lower_bound * torch.sigmoid(rate * x)
    return dict(q=norm(q.view(n, HK, D)), k=norm(k.view(n, HK, D)), v=v.view(n, HV, D), g=g,
                beta=torch.sigmoid(b.double().reshape(n, HV)))


@pytest.mark.parametrize("path,backend,lower_bound", [("packed", "reference", None), ("packed", "triton", None),
                                                       ("unpacked", "reference", -5.0)])
def test_kda_decode_matches_step_recurrence(path, backend, lower_bound):
    """Both seams of KDA decode, both StatePool backends (Triton's interpreter on a CPU)."""
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
    hooks.install(rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32"), backend=backend)
    try:
        gen = torch.Generator().manual_seed(21)
        req_pool = _req_pool()
        mp = req_pool.mamba_pool
        assert mp.replay.spec == SPEC and mp.replay.backend == backend
        slots = req_pool.mamba_allocator.alloc(3)
        mp.clear_slots(slots)
        A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
        dt_bias = [torch.randn(HV * D, generator=gen) for _ in LAYERS]
        oracle = []
        for layer, layer_id in enumerate(LAYERS):                   # prefill writes SGLang's [HV, V, K] state
            state = torch.randn(3, HV, D, D, generator=gen) * 0.3
            mp.mamba_cache.temporal[layer][slots] = state
            replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, slots)
            oracle.append(state.transpose(-1, -2).double())
        batch = torch.cat((slots[:1], torch.tensor([-1]), slots[1:])).to(torch.int32)
        real = batch >= 0
        errs = []
        for _ in range(10):                                           # flushes at tokens 4 and 8
            for layer, layer_id in enumerate(LAYERS):
                mixed = torch.randn(4, 2 * HK * D + HV * D, generator=gen)
                a, b = torch.randn(4, HV * D, generator=gen), torch.randn(1, 4, HV, generator=gen)
                ssm_states = req_pool.mamba2_layer_cache(layer_id).temporal
                common = dict(A_log=A_log[layer], dt_bias=dt_bias[layer], ssm_states=ssm_states,
                              cache_indices=batch, lower_bound=lower_bound)
                if path == "packed":
                    out = TritonKDAKernel().packed_decode(mixed, a, b, scale=D ** -0.5, num_v_heads=HV, head_v_dim=D,
                                                          replayssm_d=None, **common)
                else:                                                 # as KDAAttnBackend.forward_decode splits
                    q, k, v = mixed.split([HK * D, HK * D, HV * D], dim=-1)
                    out = TritonKDAKernel().decode(q.unflatten(-1, (-1, D)).unsqueeze(0),
                                                   k.unflatten(-1, (-1, D)).unsqueeze(0),
                                                   v.unflatten(-1, (-1, D)).unsqueeze(0), a, b,
                                                   query_start_loc=torch.arange(5, dtype=torch.int32), **common)
                assert out.shape == (1, 4, HV, D) and bool(out[0, ~real].eq(0).all())
                ref = _gating(mixed, a, b, A_log[layer], dt_bias[layer], lower_bound)
                rows = {name: t[real] for name, t in ref.items()}
                y, oracle[layer] = step_oracle(SPEC, oracle[layer], dict(rows, scale=D ** -0.5))
                errs.append(rms_ratio(out[0, real], y))
        assert max(errs) < TOL["fp8"] and sum(errs) / len(errs) < TOL["fp8"] / 4, errs
        for layer in range(len(LAYERS)):
            assert rms_ratio(mp.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
        assert mp.replay.cursors["count"][:, slots].eq(2).all()
    finally:
        hooks.uninstall()


def _runner(server_args, req_pool):
    """ModelRunner needs a loaded model: a namespace with the fields the backends' constructors read."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
    return SimpleNamespace(server_args=server_args, device=DEVICE, is_draft_worker=False, req_to_token_pool=req_pool,
                           token_to_kv_pool=None, linear_attn_backends=resolve_linear_attn_backends())


@pytest.mark.parametrize("backend,lower_bound", [("reference", None), ("triton", -5.0)])
def test_kda_verify_and_commit_through_sglangs_backend(server_args, backend, lower_bound):
    """Verify through ``TritonKDAKernel.target_verify`` with the arguments KDAAttnBackend's chain verify
    passes, commit through SGLang's real HybridLinearAttnBackend over a real KDAAttnBackend, with
    extra_buffer track slots taking the state at the step SGLang names."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    hooks.install(rs.ReplayConfig(window=4, ring_dtype="float32"), backend=backend)
    try:
        gen = torch.Generator().manual_seed(22)
        req_pool = _req_pool(draft_tokens=3)
        runner = _runner(server_args, req_pool)
        hybrid = HybridLinearAttnBackend(TorchNativeAttnBackend(runner), KDAAttnBackend(runner), [1, 2])
        mp = req_pool.mamba_pool
        assert mp.replay.cfg.max_draft_tokens == 2 and mp.replay.backend == backend
        assert hybrid.linear_attn_backend._can_run_fused_chain_verify() is False
        slots, track = req_pool.mamba_allocator.alloc(2), req_pool.mamba_allocator.alloc(2)
        mp.clear_slots(torch.cat((slots, track)))
        A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
        dt_bias = [torch.randn(HV * D, generator=gen) for _ in LAYERS]
        oracle = []
        for layer, layer_id in enumerate(LAYERS):
            state = torch.randn(2, HV, D, D, generator=gen) * 0.3
            mp.mamba_cache.temporal[layer][slots] = state
            replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, slots)
            oracle.append(state.transpose(-1, -2).double())
        T = 3
        for accepted, to_track in (([2, 3], [1, -1]), ([3, 1], [-1, 0]), ([1, 2], [0, 1]), ([3, 3], [-1, -1])):
            candidates = []
            for layer, layer_id in enumerate(LAYERS):
                mixed = torch.randn(2 * T, 2 * HK * D + HV * D, generator=gen)
                a, b = torch.randn(2 * T, HV * D, generator=gen), torch.randn(1, 2 * T, HV, generator=gen)
                q, k, v = mixed.split([HK * D, HK * D, HV * D], dim=-1)   # as _forward_target_verify splits
                out = TritonKDAKernel().target_verify(
                    A_log=A_log[layer], dt_bias=dt_bias[layer], q=q.unflatten(-1, (-1, D)).unsqueeze(0),
                    k=k.unflatten(-1, (-1, D)).unsqueeze(0), v=v.unflatten(-1, (-1, D)).unsqueeze(0), a=a, b=b,
                    ssm_states=req_pool.mamba2_layer_cache(layer_id).temporal, cache_indices=slots.to(torch.int32),
                    query_start_loc=torch.arange(3, dtype=torch.int32) * T,
                    intermediate_states_buffer=req_pool.mamba2_layer_cache(layer_id).intermediate_ssm,
                    intermediate_state_indices=torch.arange(2, dtype=torch.int32), cache_steps=T,
                    retrieve_parent_token=None, lower_bound=lower_bound)
                assert out.shape == (1, 2 * T, HV, D)
                ref = _gating(mixed, a, b, A_log[layer], dt_bias[layer], lower_bound)
                ys, states = chain_oracle(SPEC, oracle[layer], ref, 2, T, D ** -0.5)
                assert rms_ratio(out[0].view(2, T, HV, D), ys) < TOL["float32"]
                candidates.append(states)
            hybrid.linear_attn_backend.forward_metadata = ForwardMetadata(
                query_start_loc=torch.arange(3, dtype=torch.int32) * T, mamba_cache_indices=slots.to(torch.int32))
            commit_with_tracks(hybrid, mp.replay, track, accepted, to_track, candidates)
            oracle = [accepted_states(states, accepted) for states in candidates]
        for layer in range(len(LAYERS)):
            assert rms_ratio(mp.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
        assert mp.replay.pending[:, slots.cpu()].eq(0).all()             # the host mirror
    finally:
        hooks.uninstall()


def test_kda_refusals(server_args):
    import importlib

    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
    from sglang.srt.layers.attention.linear.utils import LinearAttnBackends, LinearAttnKernelBackend
    from replayssm.integrations.sglang import versions

    fused = [importlib.import_module(name) for name in versions.seams().kda_fused_decode_modules]
    assert len(fused) == (3 if versions.seams().version == "0.5.23" else 1)   # 0.5.23: ROCm gfx950's two
    covered = [m.covered for m in fused]
    hooks.install(rs.ReplayConfig(window=4, ring_dtype="float32"))
    try:
        for m in fused:                                                  # K3's fused decodes stay off
            assert m.covered() is False, m.__name__
        req_pool = _req_pool()
        runner = _runner(server_args, req_pool)
        backend = KDAAttnBackend(runner)
        # 0.5.23's breakable prefill CUDA graphs would capture the extend past the extend hooks
        assert getattr(backend, "supports_prefill_graph_extend", lambda: False)() is False
        triton = LinearAttnKernelBackend("triton")
        runner.linear_attn_backends = LinearAttnBackends(decode=triton, prefill=triton,
                                                         verify=LinearAttnKernelBackend("flashinfer"))
        with pytest.raises(RuntimeError, match="--linear-attn-verify-backend: replay routes KDA through the triton"):
            KDAAttnBackend(runner)
        ssm_states = req_pool.mamba2_layer_cache(LAYERS[0]).temporal
        with pytest.raises(ValueError, match=r"a: expected \[2, 64\] or \[2, 4, 16\]"):
            TritonKDAKernel().packed_decode(torch.zeros(2, 2 * HK * D + HV * D), torch.zeros(2, 63), torch.zeros(2, HV),
                                            A_log=torch.zeros(HV), dt_bias=torch.zeros(HV * D), scale=0.25,
                                            ssm_states=ssm_states, cache_indices=torch.tensor([1, 2]),
                                            num_v_heads=HV, head_v_dim=D)
        with pytest.raises(ValueError, match=r"q: expected \[1, 6, 2, 16\] \(n = 2 rows of T = 3 tokens, a dense"):
            TritonKDAKernel().target_verify(torch.zeros(HV), torch.zeros(HV * D), torch.zeros(1, 5, HK, D),
                                            torch.zeros(1, 6, HK, D), torch.zeros(1, 6, HV, D), torch.zeros(6, HV * D),
                                            torch.zeros(1, 6, HV), ssm_states=ssm_states,
                                            cache_indices=torch.tensor([1, 2]), cache_steps=3)
        with pytest.raises(ValueError, match="retrieve_parent_token: a tree of drafts reached the verify"):
            TritonKDAKernel().target_verify(torch.zeros(HV), torch.zeros(HV * D), torch.zeros(1, 6, HK, D),
                                            torch.zeros(1, 6, HK, D), torch.zeros(1, 6, HV, D), torch.zeros(6, HV * D),
                                            torch.zeros(1, 6, HV), ssm_states=ssm_states,
                                            cache_indices=torch.tensor([1, 2]), cache_steps=3,
                                            retrieve_parent_token=torch.zeros(2, 3, dtype=torch.int64))
    finally:
        hooks.uninstall()
    assert [m.covered for m in fused] == covered


def test_kda_decode_track_copies_the_whole_state(replay_on):
    """SGLang's extra_buffer decode track (``track_mamba_states_all_layers``) on KDA layers: the track
    slot holds the whole state (SGLang's copy of the checkpoint, the source's ring beside it; per-channel
    decays), and decodes on."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
    gen = torch.Generator().manual_seed(23)
    req_pool = _req_pool()
    mp = req_pool.mamba_pool
    src, track = req_pool.mamba_allocator.alloc(1), req_pool.mamba_allocator.alloc(1)
    mp.clear_slots(torch.cat([src, track]))
    A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
    dt_bias = [torch.randn(HV * D, generator=gen) for _ in LAYERS]
    oracle = []
    for layer, layer_id in enumerate(LAYERS):
        state = torch.randn(1, HV, D, D, generator=gen) * 0.3
        mp.mamba_cache.temporal[layer][src] = state
        replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, src)
        oracle.append(state.transpose(-1, -2).double())

    def decode(slot):
        for layer, layer_id in enumerate(LAYERS):
            mixed = torch.randn(1, 2 * HK * D + HV * D, generator=gen)
            a, b = torch.randn(1, HV * D, generator=gen), torch.randn(1, 1, HV, generator=gen)
            out = TritonKDAKernel().packed_decode(mixed, a, b, scale=D ** -0.5, num_v_heads=HV, head_v_dim=D,
                                                  replayssm_d=None, A_log=A_log[layer], dt_bias=dt_bias[layer],
                                                  ssm_states=req_pool.mamba2_layer_cache(layer_id).temporal,
                                                  cache_indices=slot.to(torch.int32), lower_bound=None)
            y, oracle[layer] = step_oracle(SPEC, oracle[layer], dict(_gating(mixed, a, b, A_log[layer], dt_bias[layer],
                                                                              None), scale=D ** -0.5))
            assert rms_ratio(out[0], y) < TOL["fp8"]

    for _ in range(6):                                     # window 4: the ring holds 2 tokens
        decode(src)
    assert mp.replay.cursors["count"][:, src].eq(2).all()
    mask = torch.ones(1, dtype=torch.bool, device=DEVICE)
    hlab.track_mamba_states_all_layers(mp.mamba_cache.conv[0], mp.mamba_cache.temporal, src, mask, track, 1)
    assert mp.replay.cursors["count"][:, track].eq(2).all()      # the ring travels with the copy
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, track), oracle[layer]) < TOL["float32"]
    for _ in range(3):                                     # the track slot decodes on
        decode(track)
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, track), oracle[layer]) < TOL["float32"]
