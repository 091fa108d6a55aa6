"""GDN decode through SGLang 0.5.23's kernel seam (``TritonGDNKernel.packed_decode``) on the CPU (or the GPU:
``REPLAYSSM_TEST_DEVICE=cuda``), on a pool built by SGLang's own ``HybridReqToTokenPool`` with Qwen3-Next-style
cache parameters.

The reference is the fp64 step recurrence fed with the gating SGLang's packed kernel computes
(q, k L2-normalised, ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``); rings and
cursors are compared bit for bit with a standalone StatePool fed ``replayssm.gating``'s reference of
the same raw inputs (the adapter forms them with the pool backend's gating, one launch on Triton).
"""

import pytest
import torch

pytest.importorskip("sglang")

import replayssm as rs  # noqa: E402
from conftest import DEVICE  # noqa: E402
from helpers import TOL, accepted_states, chain_oracle, commit_with_tracks, rms_ratio, step_oracle  # noqa: E402
from replayssm.integrations.sglang import hooks, pool as replay_pool  # noqa: E402
from replayssm.kernels.gating.reference import gating_ref  # noqa: E402

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool  # noqa: E402

HK, HV, K, V = 2, 4, 16, 8
LAYERS = [0, 2]
SPEC = rs.LayerSpec.gdn(num_k_heads=HK, num_v_heads=HV, head_k_dim=K, head_v_dim=V)

pytestmark = pytest.mark.usefixtures("test_device")


def _req_pool(draft_tokens=None):
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=HK, num_heads=HV,
                                    head_dim=V, state_size=K, conv_kernel=4, conv_shard_groups=[HK * K, HK * K, HV * V])
    params = Mamba2CacheParams(shape=shape, layers=LAYERS,
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    return HybridReqToTokenPool(size=8, mamba_size=6, mamba_spec_state_size=8, max_context_len=64, device=DEVICE,
                                enable_memory_saver=False, cache_params=params, mamba_layer_ids=LAYERS,
                                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=draft_tokens)


def _gating(mixed, a, b, A_log, dt_bias):
    """The per-token inputs SGLang's packed GDN kernel forms, in fp64: q, k, v, g, beta."""
    n = mixed.shape[0]
    q, k, v = mixed.double().split([HK * K, HK * K, HV * V], dim=-1)
    norm = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    x = a.double() + dt_bias.double()
    g = -torch.exp(A_log.double()) * torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    beta = torch.sigmoid(b.double()).to(b.dtype).double()
    return dict(q=norm(q.view(n, HK, K)), k=norm(k.view(n, HK, K)), v=v.view(n, HV, V), g=g, beta=beta)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gdn_packed_decode_matches_step_recurrence(backend, monkeypatch):
    """Both StatePool backends behind the adapter (the Triton kernels in Triton's interpreter on a CPU);
    the adapter's gating runs on the pool's backend once per layer and step."""
    import importlib
    module = importlib.import_module(rs.backend.BACKENDS[backend])
    original, calls = module.gating, []

    def spy(pool, **kw):
        calls.append(pool)
        return original(pool, **kw)

    monkeypatch.setattr(module, "gating", spy)
    hooks.install(rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32"), backend=backend)
    try:
        _gdn_decode_run(backend)
    finally:
        hooks.uninstall()
    assert len(calls) == 10 * len(LAYERS)


def _gdn_decode_run(backend):
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    gen = torch.Generator().manual_seed(11)
    req_pool = _req_pool()
    mp = req_pool.mamba_pool
    assert mp.replay.spec == SPEC and mp.replay.checkpoint.data_ptr() == mp.mamba_cache.temporal.data_ptr()
    assert mp.replay.backend == backend
    twin = rs.StatePool(SPEC, mp.replay.cfg, num_layers=2, num_slots=mp.size + 1, device=DEVICE,
                       backend="reference")
    twin.allocated.fill_(True)
    slots = req_pool.mamba_allocator.alloc(3)
    mp.clear_slots(slots)
    twin.refresh(slots)
    oracle = {}
    A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
    dt_bias = [torch.randn(HV, generator=gen) for _ in LAYERS]
    for layer, layer_id in enumerate(LAYERS):                       # prefill writes SGLang's [HV, V, K] state
        state = torch.randn(3, HV, V, K, generator=gen) * 0.3
        mp.mamba_cache.temporal[layer][slots] = state
        replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, slots)
        twin.write_state(layer, slots, state.transpose(-1, -2).contiguous())
        oracle[layer] = state.transpose(-1, -2).double()                # replayssm's [HV, K, V]
    batch = torch.cat((slots[:1], torch.tensor([-1]), slots[1:])).to(torch.int32)
    real = batch >= 0
    errs = []
    for _ in range(10):                                                 # flushes at tokens 4 and 8
        for layer, layer_id in enumerate(LAYERS):
            mixed = torch.randn(4, 2 * HK * K + HV * V, generator=gen)
            a, b = torch.randn(4, HV, generator=gen), torch.randn(4, HV, generator=gen)
            ssm_states = req_pool.mamba2_layer_cache(layer_id).temporal
            out = TritonGDNKernel().packed_decode(mixed, a, b, A_log=A_log[layer], dt_bias=dt_bias[layer],
                                                  scale=K ** -0.5, ssm_states=ssm_states, cache_indices=batch,
                                                  num_v_heads=HV, head_v_dim=V, replayssm_d=None, replayssm_k=None,
                                                  replayssm_g=None, replayssm_write_pos=None,
                                                  replayssm_force_flush=None)
            assert out.shape == (1, 4, HV, V) and bool(out[0, ~real].eq(0).all())
            ref = _gating(mixed, a, b, A_log[layer], dt_bias[layer])
            rows = {name: t[real] for name, t in ref.items()}
            y, oracle[layer] = step_oracle(SPEC, oracle[layer], dict(rows, scale=K ** -0.5))
            errs.append(rms_ratio(out[0, real], y))
            q, k, v = mixed.split([HK * K, HK * K, HV * V], dim=-1)
            made = gating_ref(q.view(4, HK, K), k.view(4, HK, K), a, b, A_log[layer], dt_bias[layer],
                              ring_dtype=torch.float32, beta_dtype=b.dtype)
            rs.decode(twin, layer, batch.long(), q=q.view(4, HK, K), v=v.reshape(4, HV, V), scale=K ** -0.5, **made)
    assert max(errs) < TOL["fp8"] and sum(errs) / len(errs) < TOL["fp8"] / 4, errs
    for layer in range(2):
        assert rms_ratio(mp.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
    assert mp.replay.cursors["count"][:, slots].eq(2).all()
    for name in ("k", "v", "g", "beta"):                               # the same raw entries, bit for bit
        assert torch.equal(mp.replay.ring[name], twin.ring[name]), name
    assert rms_ratio(mp.replay.ring["d"], twin.ring["d"].double()) < 1e-6
    for name, cur in mp.replay.cursors.items():
        assert torch.equal(cur, twin.cursors[name]), name


def test_gdn_refusals(replay_on):
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    req_pool = _req_pool()
    ssm_states = req_pool.mamba2_layer_cache(LAYERS[0]).temporal
    args = (torch.randn(2, 2 * HK * K + HV * V), torch.randn(2, HV), torch.randn(2, HV))
    kw = dict(A_log=torch.zeros(HV), dt_bias=torch.zeros(HV), scale=0.25, ssm_states=ssm_states,
              cache_indices=torch.tensor([1, 2], dtype=torch.int32), num_v_heads=HV, head_v_dim=V)
    with pytest.raises(ValueError, match=r"mixed_qkv: expected \[B, 96\]"):
        TritonGDNKernel().packed_decode(args[0][:, :-1], *args[1:], **kw)
    with pytest.raises(ValueError, match="replayssm_g: SGLang's own replay buffers"):
        TritonGDNKernel().packed_decode(*args, **kw, replayssm_g=torch.zeros(1))
    with pytest.raises(ValueError, match="num_v_heads, head_v_dim: the pool holds 4 heads of 8"):
        TritonGDNKernel().packed_decode(*args, **dict(kw, head_v_dim=16))
    with pytest.raises(RuntimeError, match="GDN's unpacked decode is not routed"):
        TritonGDNKernel().decode()
    with pytest.raises(ValueError, match=r"q: expected \[1, 6, 2, 16\] \(n = 2 rows of T = 3 tokens\)"):
        TritonGDNKernel().target_verify(kw["A_log"], kw["dt_bias"], torch.zeros(1, 5, HK, K), torch.zeros(1, 6, HK, K),
                                        torch.zeros(1, 6, HV, V), torch.zeros(6, HV), torch.zeros(6, HV),
                                        ssm_states=ssm_states, cache_indices=kw["cache_indices"], cache_steps=3)
    with pytest.raises(ValueError, match="retrieve_parent_token: a tree of drafts reached the verify"):
        TritonGDNKernel().target_verify(kw["A_log"], kw["dt_bias"], torch.zeros(1, 6, HK, K), torch.zeros(1, 6, HK, K),
                                        torch.zeros(1, 6, HV, V), torch.zeros(6, HV), torch.zeros(6, HV),
                                        ssm_states=ssm_states, cache_indices=kw["cache_indices"], cache_steps=3,
                                        retrieve_parent_token=torch.zeros(2, 3, dtype=torch.int64))


def _runner(server_args, req_pool):
    """ModelRunner needs a loaded model: a namespace with the fields the backends' constructors read."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
    return SimpleNamespace(server_args=server_args, device=DEVICE, is_draft_worker=False, req_to_token_pool=req_pool,
                           token_to_kv_pool=None, linear_attn_backends=resolve_linear_attn_backends())


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gdn_verify_and_commit_through_sglangs_backend(server_args, backend):
    """Verify through ``TritonGDNKernel.target_verify`` with the arguments GDNAttnBackend.forward_extend
    passes, commit through SGLang's real HybridLinearAttnBackend over a real GDNAttnBackend, with
    extra_buffer track slots taking the state at the step SGLang names (``[HV, V, K]`` state: the
    copy goes through the transposed checkpoint view)."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    hooks.install(rs.ReplayConfig(window=4, ring_dtype="float32"), backend=backend)
    try:
        gen = torch.Generator().manual_seed(12)
        req_pool = _req_pool(draft_tokens=3)
        runner = _runner(server_args, req_pool)
        backend = HybridLinearAttnBackend(TorchNativeAttnBackend(runner), GDNAttnBackend(runner), [1, 3])
        mp = req_pool.mamba_pool
        assert mp.replay.cfg.max_draft_tokens == 2
        slots, track = req_pool.mamba_allocator.alloc(2), req_pool.mamba_allocator.alloc(2)
        mp.clear_slots(torch.cat((slots, track)))
        A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
        dt_bias = [torch.randn(HV, generator=gen) for _ in LAYERS]
        oracle = []
        for layer, layer_id in enumerate(LAYERS):
            state = torch.randn(2, HV, V, K, generator=gen) * 0.3
            mp.mamba_cache.temporal[layer][slots] = state
            replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, slots)
            oracle.append(state.transpose(-1, -2).double())
        T = 3
        for accepted, to_track in (([2, 3], [1, -1]), ([3, 1], [-1, 0]), ([1, 2], [0, 1]), ([3, 3], [-1, -1])):
            candidates = []
            for layer, layer_id in enumerate(LAYERS):
                mixed = torch.randn(2 * T, 2 * HK * K + HV * V, generator=gen)
                a, b = torch.randn(2 * T, HV, generator=gen), torch.randn(2 * T, HV, generator=gen)
                q, k, v = torch.split(mixed, [HK * K, HK * K, HV * V], dim=-1)   # as forward_extend splits
                out = TritonGDNKernel().target_verify(
                    A_log=A_log[layer], dt_bias=dt_bias[layer], q=q.view(1, 2 * T, HK, K),
                    k=k.view(1, 2 * T, HK, K), v=v.view(1, 2 * T, HV, V), a=a, b=b,
                    ssm_states=req_pool.mamba2_layer_cache(layer_id).temporal, cache_indices=slots.to(torch.int32),
                    query_start_loc=torch.arange(3, dtype=torch.int32) * T,
                    intermediate_states_buffer=req_pool.mamba2_layer_cache(layer_id).intermediate_ssm,
                    intermediate_state_indices=torch.arange(2, dtype=torch.int32), cache_steps=T,
                    retrieve_parent_token=None, stable_rows=False)
                assert out.shape == (1, 2 * T, HV, V)
                ref = _gating(mixed, a, b, A_log[layer], dt_bias[layer])
                ref["beta"] = torch.sigmoid(b.double())                    # the verify kernel does not round beta
                ys, states = chain_oracle(SPEC, oracle[layer], ref, 2, T, K ** -0.5)
                assert rms_ratio(out[0].view(2, T, HV, V), ys) < TOL["float32"]
                candidates.append(states)
            backend.linear_attn_backend.forward_metadata = ForwardMetadata(
                query_start_loc=torch.arange(3, dtype=torch.int32) * T, mamba_cache_indices=slots.to(torch.int32))
            commit_with_tracks(backend, mp.replay, track, accepted, to_track, candidates)
            oracle = [accepted_states(states, accepted) for states in candidates]
        for layer in range(len(LAYERS)):
            assert rms_ratio(mp.replay.read_state(layer, slots), oracle[layer]) < TOL["float32"]
        assert mp.replay.pending[:, slots.cpu()].eq(0).all()             # the host mirror
    finally:
        hooks.uninstall()


def test_gdn_backend_kernel_choice_is_checked(server_args, replay_on):
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.utils import LinearAttnBackends, LinearAttnKernelBackend
    runner = _runner(server_args, _req_pool())
    assert isinstance(GDNAttnBackend(runner), GDNAttnBackend)
    triton = LinearAttnKernelBackend("triton")
    runner.linear_attn_backends = LinearAttnBackends(decode=LinearAttnKernelBackend("flashinfer"), prefill=triton,
                                                     verify=triton)
    with pytest.raises(RuntimeError, match="--linear-attn-decode-backend: replay routes GDN through the triton"):
        GDNAttnBackend(runner)


def test_gdn_decode_track_copies_the_whole_state(replay_on):
    """SGLang's extra_buffer decode track (``track_mamba_states_if_needed``) on GDN layers, whose state
    SGLang stores ``[HV, V, K]``: the track slot holds the whole state (SGLang's copy of the checkpoint,
    the source's ring beside it), and decodes on from it."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    gen = torch.Generator().manual_seed(13)
    req_pool = _req_pool()
    mp = req_pool.mamba_pool
    src, track = req_pool.mamba_allocator.alloc(1), req_pool.mamba_allocator.alloc(1)
    mp.clear_slots(torch.cat([src, track]))
    A_log = [torch.randn(HV, generator=gen) * 0.5 - 1 for _ in LAYERS]
    dt_bias = [torch.randn(HV, generator=gen) for _ in LAYERS]
    oracle = {}
    for layer, layer_id in enumerate(LAYERS):
        state = torch.randn(1, HV, V, K, generator=gen) * 0.3
        mp.mamba_cache.temporal[layer][src] = state
        replay_pool.on_state("extend end", req_pool.mamba2_layer_cache(layer_id).temporal, src)
        oracle[layer] = state.transpose(-1, -2).double()

    def decode(slot):
        for layer, layer_id in enumerate(LAYERS):
            mixed = torch.randn(1, 2 * HK * K + HV * V, generator=gen)
            a, b = torch.randn(1, HV, generator=gen), torch.randn(1, HV, generator=gen)
            out = TritonGDNKernel().packed_decode(mixed, a, b, A_log=A_log[layer], dt_bias=dt_bias[layer],
                                                  scale=K ** -0.5, ssm_states=req_pool.mamba2_layer_cache(layer_id).temporal,
                                                  cache_indices=slot.to(torch.int32), num_v_heads=HV, head_v_dim=V)
            y, oracle[layer] = step_oracle(SPEC, oracle[layer], dict(_gating(mixed, a, b, A_log[layer],
                                                                              dt_bias[layer]), scale=K ** -0.5))
            assert rms_ratio(out[0], y) < TOL["fp8"]

    for _ in range(6):                                     # window 4: the ring holds 2 tokens
        decode(src)
    assert mp.replay.cursors["count"][:, src].eq(2).all()
    mask = torch.ones(1, dtype=torch.bool, device=DEVICE)
    for layer_id in LAYERS:
        cache = req_pool.mamba2_layer_cache(layer_id)
        hlab.track_mamba_states_if_needed(cache.conv[0], cache.temporal, src, mask, track, 1)
    assert mp.replay.cursors["count"][:, track].eq(2).all()      # the ring travels with the copy
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, track), oracle[layer]) < TOL["float32"]
    for _ in range(3):                                     # the track slot decodes on (as a copy-on-write target would)
        decode(track)
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, track), oracle[layer]) < TOL["float32"]
