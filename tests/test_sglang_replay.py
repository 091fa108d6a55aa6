"""Replay inside SGLang 0.5.23 on the CPU (or the GPU: ``REPLAYSSM_TEST_DEVICE=cuda``), through SGLang's real
pool classes and its Mamba-2 call site.

The pool under test is built by SGLang's own ``HybridReqToTokenPool`` (``mamba_pool_cls`` set by the
hooks); steps go through the patched ``selective_state_update`` of SGLang's mamba module with the
arguments ``MambaMixer2.forward`` builds; results are checked against the fp64 step recurrence and,
for rings and cursors, bit-exactly against a standalone ``StatePool`` fed the same inputs.
"""

import dataclasses
import math
import pathlib

import pytest
import torch

pytest.importorskip("sglang")

import replayssm as rs  # noqa: E402
from conftest import DEVICE  # noqa: E402
from helpers import TOL, Params, make_inputs, rms_ratio, step_oracle, f64, token  # noqa: E402
from replayssm.integrations.sglang import hooks, options, plugin, pool as replay_pool  # noqa: E402

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape  # noqa: E402
from sglang.srt.layers.attention.mamba import mamba as mamba_mod  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool  # noqa: E402

H, P, N, G = 4, 6, 16, 2
LAYERS = [1, 3]                     # model layer ids of the two mamba layers
SPEC = rs.LayerSpec.mamba2(num_heads=H, head_dim=P, state_dim=N, num_groups=G)

pytestmark = pytest.mark.usefixtures("test_device")


def _cache_params(dtype=torch.float32):
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=H * P, n_groups=G, num_heads=H,
                                    head_dim=P, state_size=N, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=LAYERS, dtype=Mamba2StateDType(conv=torch.float32, temporal=dtype))


def _req_pool(draft_tokens=None, dtype=torch.float32):
    return HybridReqToTokenPool(size=8, mamba_size=6, mamba_spec_state_size=8, max_context_len=64, device=DEVICE,
                                enable_memory_saver=False, cache_params=_cache_params(dtype), mamba_layer_ids=LAYERS,
                                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=draft_tokens)


def forward_start(req_pool) -> None:
    """The start of SGLang's next forward, as the hooks patch it (``ModelRunner._forward_raw``), on a
    runner that holds ``req_pool`` and nothing else: the patched entry runs (it records the stream
    the forward runs on), then SGLang's own body stops at the first attribute this runner lacks."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    runner = object.__new__(ModelRunner)
    runner.req_to_token_pool = req_pool
    with pytest.raises(AttributeError):
        ModelRunner._forward_raw(runner, None, None)


def _sglang_args(inp: dict, slots: torch.Tensor, out: torch.Tensor, verify_T=None):
    """``selective_state_update`` arguments exactly as MambaMixer2.forward builds them from per-head values."""
    A_d = inp["A"][:, None, ...][:, :, None].expand(-1, P, N).to(dtype=torch.float32)
    dt_d = inp["dt"][..., None].expand(*inp["dt"].shape, P)
    args = dict(dt_bias=inp["dt_bias"][:, None, ...].expand(-1, P), dt_softplus=True,
                state_batch_indices=slots.to(torch.int32), out=out, z=None)
    if verify_T is not None:
        args.update(disable_state_update=True, intermediate_states_buffer=None, cache_steps=verify_T,
                    retrieve_parent_token=None,
                    intermediate_state_indices=torch.arange(slots.numel(), dtype=torch.int32))
    return (inp["x"], dt_d, A_d, inp["B"], inp["C"], inp["D"][:, None, ...].expand(-1, P)), args


class Run:
    """A replay SGLang pool, a standalone StatePool and the fp64 oracle, stepped together."""

    def __init__(self, req_pool, cfg, gen):
        self.req_pool, self.gen = req_pool, gen
        self.mp = req_pool.mamba_pool
        self.cfg = self.mp.replay.cfg
        self.twin = rs.StatePool(SPEC, self.cfg, num_layers=len(LAYERS), num_slots=self.mp.size + 1,
                                 device=DEVICE, backend="reference")
        self.twin.allocated.fill_(True)
        self.params = Params(SPEC, len(LAYERS), gen)
        self.oracle = {}                                  # (layer, slot) -> fp64 state

    def clear(self, slots):
        """A fresh slot: SGLang's clear_slots (the twin sees the same host write)."""
        self.mp.clear_slots(slots)
        self.twin.refresh(slots)

    def prefill(self, slots):
        """What SGLang's prefill does: write ``temporal`` rows, then the mixer hook's refresh (``extend end``)."""
        for layer in range(len(LAYERS)):
            # as SGLang stores it: in its ssm dtype (the replay checkpoint dtype)
            state = (torch.randn(slots.numel(), H, P, N, generator=self.gen) * 0.3).to(self.mp.mamba_cache.temporal.dtype)
            self.mp.mamba_cache.temporal[layer][slots] = state
            replay_pool.on_state("extend end", self.req_pool.mamba2_layer_cache(LAYERS[layer]).temporal, slots)
            state = state.float()
            self.twin.write_state(layer, slots, state)
            for i, s in enumerate(slots.tolist()):
                self.oracle[layer, s] = state[i].double()

    def started(self, slots, tokens):
        """Fresh ``slots``: cleared, prefilled, then ``tokens`` decode steps (their rings hold what has not
        flushed)."""
        self.clear(slots)
        self.prefill(slots)
        for _ in range(tokens):
            self.decode(slots)

    def adopt(self, slots, states):
        """SGLang wrote ``states`` (``[layers, n, H, P, N]``) into ``slots`` itself (a copy, a load, a
        transfer): the twin takes the same write and the oracle continues from them."""
        for layer in range(len(LAYERS)):
            self.twin.write_state(layer, slots, states[layer].float().to(DEVICE))
            for i, s in enumerate(slots.tolist()):
                self.oracle[layer, s] = states[layer][i].double().to(DEVICE)

    def decode(self, slots):
        """One token through every layer; slots may hold -1 (padding). Returns the worst error."""
        worst = 0.0
        real = slots >= 0
        for layer in range(len(LAYERS)):
            inp = make_inputs(SPEC, self.params, layer, slots.numel(), None, self.gen, gate=False, device=DEVICE)
            out = torch.full((slots.numel(), H, P), float("nan"))
            args, kw = _sglang_args(inp, slots, out)
            ssm_state = self.req_pool.mamba2_layer_cache(LAYERS[layer]).temporal
            assert mamba_mod.selective_state_update(ssm_state, *args, **kw) is out
            rs.decode(self.twin, layer, slots, **inp)
            rows = {k: (v if k in ("A", "D", "dt_bias") else v[real]) for k, v in inp.items()}
            live = slots[real].tolist()
            y, S = step_oracle(SPEC, torch.stack([self.oracle[layer, s] for s in live]), f64(rows))
            for i, s in enumerate(live):
                self.oracle[layer, s] = S[i]
            assert bool(out[~real].eq(0).all()), "padded rows must come back zero"
            worst = max(worst, rms_ratio(out[real], y))
        return worst

    def verify(self, slots, T):
        """T draft tokens through every layer (uncommitted); returns (worst error, per-layer inputs)."""
        worst, kept = 0.0, []
        for layer in range(len(LAYERS)):
            inp = make_inputs(SPEC, self.params, layer, slots.numel(), T, self.gen, gate=False, device=DEVICE)
            out = torch.full((slots.numel(), T, H, P), float("nan"))
            args, kw = _sglang_args(inp, slots, out, verify_T=T)
            ssm_state = self.req_pool.mamba2_layer_cache(LAYERS[layer]).temporal
            mamba_mod.selective_state_update(ssm_state, *args, **kw)
            rs.verify(self.twin, layer, slots, **inp)
            S = torch.stack([self.oracle[layer, s] for s in slots.tolist()])
            ys = []
            for t in range(T):
                y, S = step_oracle(SPEC, S, f64(token(inp, t)))
                ys.append(y)
            worst = max(worst, rms_ratio(out, torch.stack(ys, 1)))
            kept.append(inp)
        return worst, kept

    def accept(self, slots, accepted, kept):
        """Commit ``accepted`` tokens in both pools; the oracle replays the kept prefix."""
        # as SGLang's commit hook does: sync-free on the Triton backend
        self.mp.replay.commit(slots, accepted, checked=replay_pool.checked(self.mp.replay))
        self.twin.commit(slots, accepted)
        self.accept_oracle(slots, accepted, kept)

    def accept_oracle(self, slots, accepted, kept):
        for layer, inp in enumerate(kept):
            for i, s in enumerate(slots.tolist()):
                S = self.oracle[layer, s][None]
                for t in range(int(accepted[i])):
                    _, S = step_oracle(SPEC, S, f64(token({k: (v if k in ("A", "D", "dt_bias") else v[i:i + 1])
                                                           for k, v in inp.items()}, t)))
                self.oracle[layer, s] = S[0]

    def state_error(self, slots):
        return max(rms_ratio(self.mp.replay.read_state(layer, slots),
                             torch.stack([self.oracle[layer, s] for s in slots.tolist()]))
                   for layer in range(len(LAYERS)))

    def assert_ring_matches_twin(self):
        for name, buf in self.mp.replay.ring.items():
            assert torch.equal(buf, self.twin.ring[name]), name
        for name, cur in self.mp.replay.cursors.items():
            assert torch.equal(cur, self.twin.cursors[name]), name


def test_replay_off_leaves_sglang_untouched():
    kernel, forward = mamba_mod.selective_state_update, mamba_mod.MambaMixer2.forward
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool and not hooks.installed()
    plugin.load()                                            # no REPLAYSSM_SGLANG: a no-op
    assert options.ENV_VAR not in __import__("os").environ
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool and mamba_mod.selective_state_update is kernel
    mp = _req_pool().mamba_pool
    assert type(mp) is MambaPool and not hasattr(mp, "replay") and mp.replayssm_write_pos is None
    hooks.install(rs.ReplayConfig())
    assert HybridReqToTokenPool.mamba_pool_cls is not MambaPool and mamba_mod.selective_state_update is not kernel
    hooks.install(rs.ReplayConfig())                         # same config: a no-op
    with pytest.raises(ValueError, match="cfg: replay is installed with"):
        hooks.install(rs.ReplayConfig(window=8))
    hooks.uninstall()
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool and mamba_mod.selective_state_update is kernel
    assert mamba_mod.MambaMixer2.forward is forward


def test_pool_wraps_sglang_temporal_without_copy(replay_on):
    mp = _req_pool().mamba_pool
    temporal = mp.mamba_cache.temporal                      # [layers, size + 1, H, P, N]
    assert isinstance(mp, MambaPool) and mp.replay.spec == SPEC and mp.replay.cfg == replay_on
    assert mp.replay.checkpoint.data_ptr() == temporal.data_ptr() and mp.replay.checkpoint.shape == temporal.shape
    assert mp.replay.num_slots == mp.size + 1 and mp.replay.num_layers == len(LAYERS)
    assert mp.replay.read["codes"].dtype == torch.float8_e4m3fn


def test_no_per_draft_snapshots_are_allocated_under_replay(monkeypatch):
    from sglang.srt.mem_cache import memory_pool
    seen, init = [], memory_pool.MambaPool.__init__

    def watched(self, **kwargs):                                # SGLang's module keeps its own torch throughout
        seen.append(memory_pool.torch is torch)
        init(self, **kwargs)

    monkeypatch.setattr(memory_pool.MambaPool, "__init__", watched)
    plain = _req_pool(draft_tokens=3).mamba_pool               # SGLang's own pool: [layers, 9, 3, H, P, N] snapshots
    assert tuple(plain.mamba_cache.intermediate_ssm.shape) == (len(LAYERS), 9, 3, H, P, N)
    hooks.install(rs.ReplayConfig(window=4, ring_dtype="float32"))
    try:
        mp = _req_pool(draft_tokens=3).mamba_pool
    finally:
        hooks.uninstall()
    assert memory_pool.torch is torch and seen == [True, True]
    # a stand-in of no slots: no bytes, but present per layer (SGLang's GDN / KDA verify require it)
    assert tuple(mp.mamba_cache.intermediate_ssm.shape) == (len(LAYERS), 0, 3, H, P, N)
    assert mp.mamba2_layer_cache(0).intermediate_ssm.numel() == 0
    assert [tuple(w.shape) for w in mp.mamba_cache.intermediate_conv_window] == \
        [tuple(w.shape) for w in plain.mamba_cache.intermediate_conv_window]   # conv rollback stays SGLang's
    assert mp.replay.cfg.max_draft_tokens == 2


@pytest.mark.parametrize("tp, heads, groups", [(1, 8, 4), (2, 4, 2), (4, 2, 1), (8, 1, 1)])
def test_tensor_parallel_ranks_replay_their_own_heads(tp, heads, groups):
    """SGLang shards the recurrent state by heads (its shape classes at ``tp_world_size``; Mamba-2
    groups fewer than the ranks are replicated): each rank's replay layer is its own shard."""
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape
    dtype = Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    m2 = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=8 * 6, n_groups=4, num_heads=8, head_dim=6,
                                 state_size=16, conv_kernel=4)
    gdn = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=8 * 8, n_groups=4, num_heads=8, head_dim=8,
                                  state_size=16, conv_kernel=4, conv_shard_groups=[4 * 16, 4 * 16, 8 * 8])
    kda = KimiLinearStateShape.create(tp_world_size=tp, num_heads=8, head_dim=16, num_k_heads=8, head_k_dim=16,
                                      conv_kernel_size=4)
    assert replay_pool.layer_spec(Mamba2CacheParams(shape=m2, layers=LAYERS, dtype=dtype)) == \
        rs.LayerSpec.mamba2(num_heads=heads, head_dim=6, state_dim=16, num_groups=groups)
    assert replay_pool.layer_spec(Mamba2CacheParams(shape=gdn, layers=LAYERS, dtype=dtype)) == \
        rs.LayerSpec.gdn(num_k_heads=groups, num_v_heads=heads, head_k_dim=16, head_v_dim=8)
    assert replay_pool.layer_spec(KimiLinearCacheParams(shape=kda, layers=LAYERS, dtype=dtype)) == \
        rs.LayerSpec.kda(num_k_heads=heads, num_v_heads=heads, head_k_dim=16, head_v_dim=16)
    hooks.install(rs.ReplayConfig(window=4, ring_dtype="float32"))
    try:
        mp = HybridReqToTokenPool(size=4, mamba_size=3, mamba_spec_state_size=4, max_context_len=16, device=DEVICE,
                                  enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=m2, layers=LAYERS,
                                                                                            dtype=dtype),
                                  mamba_layer_ids=LAYERS, enable_mamba_extra_buffer=False).mamba_pool
    finally:
        hooks.uninstall()
    assert tuple(mp.mamba_cache.temporal.shape[2:]) == (heads, 6, 16)
    assert tuple(mp.replay.ring["x"].shape[2:]) == (heads, mp.replay.cfg.capacity, 6)
    assert tuple(mp.replay.ring["B"].shape[2:]) == (groups, mp.replay.cfg.capacity, 16)


def _mamba_budget(spec_algorithm, **server_fields):
    """SGLang's own mamba pool sizing (``KVCacheConfigurator._handle_max_mamba_cache``) for this
    file's cache parameters and 1 GiB, under a scoped config: (slots it sizes, the configurator, the
    GiB it leaves to the KV cache)."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_context, get_schedule

    class Sizing(KVCacheConfigurator):          # the real method; no fused draft pool to price
        def fused_entry_bytes(self, sub_pool_name):
            return None

    conf = object.__new__(Sizing)
    conf.mambaish_config = SimpleNamespace(mamba2_cache_params=_cache_params())
    conf.pp_size = conf.attn_dp_size = 1                              # 0.5.23's configurator
    conf.ps = SimpleNamespace(pp_size=1, attn_dp_size=1)              # 0.5.17's
    conf.model_config = SimpleNamespace(hf_config=None)
    conf.hybrid_gdn_config = conf.hybrid_kda_config = None
    conf.extra_mamba_cache_bytes_per_req, conf.spec_algorithm = 0, spec_algorithm
    with get_context().override_server_args(**server_fields):
        conf.server_args = get_context().server_args
        rest = conf._handle_max_mamba_cache(1.0)
        return get_schedule().max_mamba_cache_size, conf, rest


def test_mamba_pool_budget_charges_the_ring_and_no_snapshots():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from replayssm.pool import side_bytes_per_slot
    plain, ngram = SpeculativeAlgorithm.NONE, SpeculativeAlgorithm.NGRAM
    spec_fields = dict(speculative_num_draft_tokens=4, max_running_requests=8)
    per_req = _cache_params().mamba_cache_per_req                  # conv + ssm state, every layer
    slots_plain, _, _ = _mamba_budget(plain)
    slots_spec, _, _ = _mamba_budget(ngram, **spec_fields)
    assert slots_spec < slots_plain / 2                              # SGLang reserves per-draft snapshots
    cfg = rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32")
    hooks.install(cfg)
    try:
        replay_plain, conf, rest_plain = _mamba_budget(plain)
        replay_spec, _, rest_spec = _mamba_budget(ngram, **spec_fields)
    finally:
        hooks.uninstall()
    assert conf.extra_mamba_cache_bytes_per_req == 0 and conf.spec_algorithm is plain      # restored
    budget = (slots_plain + 1) * per_req                             # what SGLang gives the mamba pool
    params = _cache_params()
    conv = sum(math.prod(shape) for shape in params.shape.conv) * params.dtype.conv.itemsize * len(LAYERS)
    # the per-draft conv windows SGLang still allocates: 4 draft tokens for 8 running requests and
    # the padding one, taken from the KV cache's share (as SGLang's own reserve is)
    windows = conv * 4 * (8 + 1)
    for slots, drafts, rest, reserved in ((replay_plain, 0, rest_plain, 0), (replay_spec, 3, rest_spec, windows)):
        side = sum(side_bytes_per_slot(SPEC, dataclasses.replace(cfg, max_draft_tokens=drafts)).values())
        per_slot = per_req + side * len(LAYERS)                      # ring, read copy, cursors charged
        room = budget * (1 - reserved / 2 ** 30)                     # the mamba share of 1 GiB less the reserve
        assert (slots + 1) * per_slot <= room + per_req and room < (slots + 2) * per_slot
        assert rest == pytest.approx(1.0 - reserved / 2 ** 30 - (slots + 1) * per_slot / 2 ** 30, abs=1e-12)
    assert replay_spec > slots_spec                                   # no snapshot reserve under replay


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_decode_through_sglang_call_site_matches_step_recurrence(backend):
    """Both StatePool backends behind the adapter (the Triton kernels in Triton's interpreter on a CPU)."""
    cfg = rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32")
    hooks.install(cfg, backend=backend)
    try:
        _decode_run(cfg, backend)
    finally:
        hooks.uninstall()


def _decode_run(cfg, backend):
    gen = torch.Generator().manual_seed(0)
    run = Run(_req_pool(), cfg, gen)
    assert run.mp.replay.backend == backend
    slots = run.req_pool.mamba_allocator.alloc(3)
    run.clear(slots)
    run.prefill(slots)
    batch = torch.cat((slots[:2], torch.tensor([-1]), slots[2:]))
    errs = [run.decode(batch) for _ in range(10)]           # 10 tokens: flushes at 4 and 8
    assert max(errs) < TOL["fp8"] and sum(errs) / len(errs) < TOL["fp8"] / 4, errs
    assert run.state_error(slots) < TOL["float32"]
    assert run.req_pool.mamba_pool.replay.cursors["count"][:, slots].eq(2).all()
    run.assert_ring_matches_twin()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fp16_sr_checkpoint_and_nvfp4_read_copy_through_sglang_call_site(backend):
    """``--replay-checkpoint-dtype float16_sr`` (the launcher sets ``--mamba-ssm-dtype float16``): the replay
    checkpoint is SGLang's own float16 ``temporal``, not a copy; decodes through SGLang's call site
    behind an NVFP4 read copy, across flushes, match the fp64 recurrence, and the state stays within
    the fp16 rounding of it."""
    cfg = rs.ReplayConfig(window=4, checkpoint_dtype="float16_sr", read_format="nvfp4", ring_dtype="float32")
    hooks.install(cfg, backend=backend)
    try:
        gen = torch.Generator().manual_seed(3)
        run = Run(_req_pool(dtype=torch.float16), cfg, gen)
        temporal = run.mp.mamba_cache.temporal
        assert temporal.dtype == torch.float16 and run.mp.replay.checkpoint.data_ptr() == temporal.data_ptr()
        slots = run.req_pool.mamba_allocator.alloc(3)
        run.clear(slots)
        run.prefill(slots)
        batch = torch.cat((slots[:1], torch.tensor([-1]), slots[1:]))
        errs = [run.decode(batch) for _ in range(10)]       # flushes at 4 and 8
        assert max(errs) < TOL["nvfp4"] and sum(errs) / len(errs) < TOL["nvfp4"] / 4, errs
        assert run.state_error(slots) < TOL["float16_sr"]
        run.assert_ring_matches_twin()
    finally:
        hooks.uninstall()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_verify_and_commit_match_step_recurrence(backend):
    cfg = rs.ReplayConfig(window=4, ring_dtype="float32")
    hooks.install(cfg, backend=backend)
    try:
        gen = torch.Generator().manual_seed(1)
        run = Run(_req_pool(draft_tokens=3), cfg, gen)
        assert run.cfg.max_draft_tokens == 2              # from SGLang's speculative_num_draft_tokens
        slots = run.req_pool.mamba_allocator.alloc(2)
        run.clear(slots)
        run.prefill(slots)
        for accepted in ([1, 3], [3, 2], [2, 2], [3, 1]):
            run.decode(slots)
            err, kept = run.verify(slots, 3)
            assert err < TOL["float32"], err
            run.accept(slots, torch.tensor(accepted), kept)
        assert run.state_error(slots) < TOL["float32"]
        run.assert_ring_matches_twin()
    finally:
        hooks.uninstall()


def _backends(req_pool, server_args, model_config=None):
    """SGLang's real HybridLinearAttnBackend over a real Mamba2AttnBackend. ModelRunner needs a loaded
    model, so the runner is a namespace with just the fields the backends' constructors read (the
    model config only with extra_buffer, for the chunk size)."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, Mamba2AttnBackend
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    runner = SimpleNamespace(server_args=server_args, device=DEVICE, is_draft_worker=False, req_to_token_pool=req_pool,
                             token_to_kv_pool=None, model_config=model_config)
    return HybridLinearAttnBackend(TorchNativeAttnBackend(runner), Mamba2AttnBackend(runner), [0, 2]), runner


def test_commit_after_verify_through_sglangs_backend(server_args):
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    cfg = rs.ReplayConfig(window=4, ring_dtype="float32")
    hooks.install(cfg)
    try:
        gen = torch.Generator().manual_seed(5)
        run = Run(_req_pool(draft_tokens=3), cfg, gen)
        backend, _ = _backends(run.req_pool, server_args)
        slots = run.req_pool.mamba_allocator.alloc(2)
        run.clear(slots)
        run.prefill(slots)
        caches = run.req_pool.get_speculative_mamba2_params_all_layers()
        for accepted in ([3, 1], [2, 3], [1, 2]):
            run.decode(slots)
            err, kept = run.verify(slots, 3)
            assert err < TOL["float32"], err
            for w in caches.intermediate_conv_window:             # per-draft conv windows (may overlap)
                w.copy_(torch.randn(w.shape, generator=gen))
            windows = [w.clone() for w in caches.intermediate_conv_window]
            backend.linear_attn_backend.forward_metadata = ForwardMetadata(
                query_start_loc=torch.arange(3, dtype=torch.int32) * 3, mamba_cache_indices=slots.to(torch.int32))
            steps = torch.tensor(accepted) - 1
            backend.update_mamba_state_after_mtp_verify(steps, None, None, model=None)
            run.twin.commit(slots, torch.tensor(accepted))
            run.accept_oracle(slots, torch.tensor(accepted), kept)
            for conv, new in zip(caches.conv, windows):            # conv rolled back to the last accepted token
                for row, s in enumerate(slots.tolist()):
                    assert torch.equal(conv[:, s], new[:, row, int(steps[row])])
            assert run.req_pool.mamba_pool.replay.pending[:, slots.cpu()].eq(0).all()   # the host mirror
        assert run.state_error(slots) < TOL["float32"]
        run.assert_ring_matches_twin()
    finally:
        hooks.uninstall()


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_commit_after_verify_moves_the_track_slots(server_args, backend):
    """extra_buffer under speculative decoding: a tracked row's track slot takes the whole state at
    the verify step SGLang names (``mamba_steps_to_track``), flushed (count 0: the tree takes the
    checkpoint), and that step's conv window; the rows commit as without tracking; a track slot of
    an untracked row (-1) is left alone. The standalone twin runs copy, commit and flush alike (on the
    Triton backend SGLang's commit runs them with ``checked=False``)."""
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    cfg = rs.ReplayConfig(window=4, ring_dtype="float32")
    hooks.install(cfg, backend=backend)
    try:
        gen = torch.Generator().manual_seed(6)
        run = Run(_req_pool(draft_tokens=3), cfg, gen)
        attn, _ = _backends(run.req_pool, server_args)
        mp = run.req_pool.mamba_pool
        assert mp.replay.backend == backend
        slots, track = run.req_pool.mamba_allocator.alloc(2), run.req_pool.mamba_allocator.alloc(2)
        run.clear(torch.cat((slots, track)))
        run.prefill(torch.cat((slots, track)))
        caches = run.req_pool.get_speculative_mamba2_params_all_layers()
        for accepted, to_track in (([3, 2], [1, -1]), ([2, 3], [-1, 2]), ([1, 3], [0, 0])):
            run.decode(slots)
            err, kept = run.verify(slots, 3)
            assert err < TOL["float32"], err
            for w in caches.intermediate_conv_window:
                w.copy_(torch.randn(w.shape, generator=gen))
            windows = [w.clone() for w in caches.intermediate_conv_window]
            before = mp.mamba_cache.temporal[:, track].clone(), [c[:, track].clone() for c in caches.conv]
            want = {}                                               # (layer, row) -> state after step + 1 tokens
            for layer, inp in enumerate(kept):
                for i, s in enumerate(slots.tolist()):
                    S = run.oracle[layer, s][None]
                    for t in range(to_track[i] + 1):
                        _, S = step_oracle(SPEC, S, f64(token({k: (v if k in ("A", "D", "dt_bias") else v[i:i + 1])
                                                               for k, v in inp.items()}, t)))
                    want[layer, i] = S[0]
            attn.linear_attn_backend.forward_metadata = ForwardMetadata(
                query_start_loc=torch.arange(3, dtype=torch.int32) * 3, mamba_cache_indices=slots.to(torch.int32))
            attn.update_mamba_state_after_mtp_verify(torch.tensor(accepted) - 1, track.to(torch.int32),
                                                        torch.tensor(to_track), model=None)
            rows = torch.tensor(to_track).ge(0).nonzero().flatten()
            if rows.numel():
                run.twin.copy(slots[rows], track[rows])
                run.twin.commit(track[rows], torch.tensor(to_track)[rows] + 1)
                run.twin.flush(track[rows])
            run.twin.commit(slots, torch.tensor(accepted))
            run.accept_oracle(slots, torch.tensor(accepted), kept)
            for i, d in enumerate(track.tolist()):
                if to_track[i] < 0:
                    assert torch.equal(mp.mamba_cache.temporal[:, d], before[0][:, i])
                    assert all(torch.equal(c[:, d], b[:, i]) for c, b in zip(caches.conv, before[1]))
                    continue
                assert mp.replay.cursors["count"][:, d].eq(0).all()
                for layer in range(len(LAYERS)):
                    assert rms_ratio(mp.mamba_cache.temporal[layer, d], want[layer, i]) < TOL["float32"]
                for conv, new in zip(caches.conv, windows):
                    assert torch.equal(conv[:, d], new[:, i, to_track[i]])
        assert run.state_error(slots) < TOL["float32"]
        run.assert_ring_matches_twin()
        with pytest.raises(ValueError, match="mamba_steps_to_track: expected it exactly with mamba_track_indices"):
            attn.update_mamba_state_after_mtp_verify(torch.tensor(accepted) - 1, track.to(torch.int32), None,
                                                        model=None)
    finally:
        hooks.uninstall()


def test_a_gdn_backend_on_a_mamba2_pool_is_refused(server_args, replay_on):
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
    _, runner = _backends(_req_pool(), server_args)
    runner.linear_attn_backends = resolve_linear_attn_backends()
    with pytest.raises(RuntimeError, match="GDNAttnBackend serves gdn layers but the replay pool was built for mamba2"):
        GDNAttnBackend(runner)


def test_a_model_that_updates_its_state_past_the_seams_is_refused(server_args, replay_on):
    from types import SimpleNamespace

    model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=["JetNemotronForCausalLM"]))
    with pytest.raises(RuntimeError, match="JetNemotronForCausalLM updates its recurrent state in the model"):
        _backends(_req_pool(), server_args, model_config)
    model_config.hf_config.architectures = ["NemotronHForCausalLM"]
    _backends(_req_pool(), server_args, model_config)


def test_slot_events_follow_sglang_clear_copy_and_host_copy(replay_on):
    gen = torch.Generator().manual_seed(2)
    run = Run(_req_pool(), replay_on, gen)
    mp = run.req_pool.mamba_pool
    a, b, c = (run.req_pool.mamba_allocator.alloc(1) for _ in range(3))
    run.clear(torch.cat((a, c)))
    run.prefill(torch.cat((a, c)))
    for _ in range(3):
        run.decode(torch.cat((a, c)))                        # count 3: the ring holds tokens
    ring_a = {name: buf[:, a].clone() for name, buf in mp.replay.ring.items()}
    mp.copy_from(a, b)                                       # COW / no_buffer copy for the tree
    run.twin.copy(a, b)
    for layer in range(len(LAYERS)):
        run.oracle[layer, b.item()] = run.oracle[layer, a.item()].clone()
    for name, buf in mp.replay.ring.items():                 # the ring travels; the source keeps its own
        assert torch.equal(buf[:, b], ring_a[name]) and torch.equal(buf[:, a], ring_a[name]), name
    for name, cur in mp.replay.cursors.items():
        assert torch.equal(cur[:, b], cur[:, a]), name
    assert mp.replay.cursors["count"][:, torch.cat((a, b))].eq(3).all()
    assert torch.equal(mp.mamba_cache.temporal[:, b], mp.mamba_cache.temporal[:, a])
    for name, buf in mp.replay.read.items():
        assert torch.equal(buf[:, b].view(torch.uint8), buf[:, a].view(torch.uint8)), name
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.replay.read_state(layer, b), run.oracle[layer, b.item()]) < TOL["float32"]
    for _ in range(3):                                       # both go on from the copied state (a flush in between)
        assert run.decode(torch.cat((a, b))) < TOL["fp8"]
    assert run.state_error(torch.cat((a, b))) < TOL["float32"]
    run.assert_ring_matches_twin()
    d = run.req_pool.mamba_allocator.alloc(2)                # one source into two slots at once (COW hits)
    mp.copy_from(a.repeat(2), d)
    for name, buf in mp.replay.ring.items():
        assert torch.equal(buf[:, d[0]], buf[:, a[0]]) and torch.equal(buf[:, d[1]], buf[:, a[0]]), name
    host = mp.get_cpu_copy(c)                                # the host copy is the whole state
    for layer in range(len(LAYERS)):
        assert rms_ratio(host[1][layer, 0].to(DEVICE), run.oracle[layer, c.item()]) < TOL["float32"]
    mp.clear_slots(c)
    assert mp.mamba_cache.temporal[:, c].eq(0).all() and mp.replay.cursors["count"][:, c].eq(0).all()
    _assert_read_copy_is_encoded_checkpoint(mp, c)
    mp.load_cpu_copy(host, c)
    assert torch.equal(mp.mamba_cache.temporal[:, c], host[1].to(DEVICE))
    _assert_read_copy_is_encoded_checkpoint(mp, c)
    run.adopt(c, host[1].to(DEVICE))
    run.decode(c)                                            # a retraction's offload and resume pass a request's
    assert mp.replay.cursors["count"][:, c].eq(1).all()      # slot as SGLang stores it: a 0-d tensor
    host = mp.get_cpu_copy(c[0])
    for layer in range(len(LAYERS)):
        assert rms_ratio(host[1][layer].to(DEVICE), run.oracle[layer, c.item()]) < TOL["float32"]
    mp.clear_slots(c)
    mp.load_cpu_copy(host, c[0])
    assert torch.equal(mp.mamba_cache.temporal[:, c[0]], host[1].to(DEVICE))
    assert mp.replay.cursors["count"][:, c].eq(0).all()
    _assert_read_copy_is_encoded_checkpoint(mp, c)


def test_finishing_request_slot_is_flushed_before_the_tree_takes_it(replay_on):
    gen = torch.Generator().manual_seed(3)
    run = Run(_req_pool(), replay_on, gen)
    mp = run.req_pool.mamba_pool
    slot = run.req_pool.mamba_allocator.alloc(1)
    run.clear(slot)
    run.prefill(slot)
    for _ in range(6):
        run.decode(slot)
    assert mp.replay.cursors["count"][:, slot].eq(2).all()
    replay_pool.on_pool("tree donation", mp, run.req_pool.translate_mamba_indices(slot[0].view(1)))
    assert mp.replay.cursors["count"][:, slot].eq(0).all()
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.mamba_cache.temporal[layer, slot[0]], run.oracle[layer, slot.item()]) < TOL["float32"]
    _assert_read_copy_is_encoded_checkpoint(mp, slot)


@pytest.mark.parametrize("case", ["finished", "running", "track", "track past the key"])
def test_the_slot_sglang_picks_for_the_tree_is_flushed(replay_on, case):
    """SGLang's own ``MambaComponent.prepare_for_caching_req`` (patched) on a request whose own slot
    and two extra_buffer track slots all hold unflushed ring entries: the slot it names in
    ``insert_params.mamba_value`` (a finished request's own slot; a running request's no_buffer copy;
    the latest track; past the key, 0.5.23's previous track) is donated, flushed at the next
    forward's start, and then holds the recurrence's state; every other slot keeps its bytes."""
    import importlib
    from types import SimpleNamespace

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    from replayssm.integrations.sglang import versions
    from test_unchecked import _buffers

    seams = versions.seams()
    MambaComponent = importlib.import_module(seams.mamba_component_module).MambaComponent
    extra = case.startswith("track")
    req_pool = HybridReqToTokenPool(size=8, mamba_size=6, mamba_spec_state_size=8, max_context_len=64,
                                    device=DEVICE, enable_memory_saver=False, cache_params=_cache_params(),
                                    mamba_layer_ids=LAYERS, enable_mamba_extra_buffer=extra,
                                    enable_overlap_schedule=True)
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(11))
    mp = run.mp
    slots = req_pool.mamba_allocator.alloc(3)             # the request's own slot, two track slots
    run.started(slots, 6)                                 # window 4: two entries in every ring
    assert mp.replay.cursors["count"][:, slots].eq(2).all()
    own, track = slots[:1], slots[1:]
    # the latest track (16 tokens) in ping-pong entry 1, the previous (8) in entry 0; 0.5.23 reads
    # these fields under req.kv, 0.5.17 on the request
    req = SimpleNamespace(rid="r", mamba_pool_idx=own[0], mamba_ping_pong_track_buffer=track.clone(),
                          mamba_next_track_idx=0, mamba_last_track_idx=1, mamba_last_track_seqlen=16,
                          mamba_prev_track_seqlen=8, holds_mamba=True)
    req.kv = req
    component = object.__new__(MambaComponent)
    component.cache = SimpleNamespace(req_to_token_pool=req_pool, enable_mamba_extra_buffer=extra)
    before = _buffers(mp.replay)
    params = InsertParams()
    component.prepare_for_caching_req(req=req, insert_params=params, is_finished=case != "running",
                                      token_ids_len=12 if case == "track past the key" else 20)

    donated = int(params.mamba_value.reshape(-1)[0])
    assert mp.replay.cursors["count"][:, donated].eq(2).all() and len(mp.donations) == 1    # pending ...
    forward_start(req_pool)                                                                 # ... until a forward
    source = {"finished": own, "running": own, "track": track[1:],
              "track past the key": track[:1] if seams.version == "0.5.23" else track[1:]}[case]
    if case == "running":
        assert donated not in slots.tolist()              # SGLang's copy for the tree, a new slot
    else:
        assert donated == int(source[0])
    assert mp.replay.cursors["count"][:, donated].eq(0).all()
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.mamba_cache.temporal[layer, donated], run.oracle[layer, int(source[0])]) < TOL["float32"]
    _assert_read_copy_is_encoded_checkpoint(mp, torch.tensor([donated], device=DEVICE))
    after = _buffers(mp.replay)
    for s in slots.tolist():
        if s != donated:
            for name in before:
                assert torch.equal(before[name][:, s], after[name][:, s]), (name, s)


@pytest.mark.parametrize("drain", ["forward", "slot event"])
def test_tree_donations_flush_together_before_any_reader(replay_on, drain, monkeypatch):
    """Donations (``pool.donate``, one per request, as SGLang issues them) stay pending and are
    flushed in one verb before anything reads their slots: the next forward's start, or a slot event
    on the pool (here SGLang's copy of a donated slot, whose copy then holds the flushed state). A
    slot donated twice is flushed once; a pool with nothing pending is left as it was."""
    from test_unchecked import _buffers

    req_pool = _req_pool()
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(13))
    mp = run.mp
    slots = req_pool.mamba_allocator.alloc(3)
    run.started(slots, 6)                                  # window 4: two entries in every ring
    before = _buffers(mp.replay)
    forward_start(req_pool)                                # nothing pending: nothing changes
    assert all(torch.equal(before[k], v) for k, v in _buffers(mp.replay).items())
    for s in (slots[0], slots[1], slots[0]):               # two requests, one slot donated twice
        replay_pool.donate(mp, req_pool.translate_mamba_indices(s.view(1)))
    verbs = []
    after_forwards = replay_pool.after_forwards
    monkeypatch.setattr(replay_pool, "after_forwards", lambda *a: (verbs.append(a), after_forwards(*a)))
    assert mp.replay.cursors["count"][:, slots].eq(2).all() and len(mp.donations) == 3
    if drain == "forward":
        forward_start(req_pool)
        flushed = slots[:2]
    else:
        dst = req_pool.mamba_allocator.alloc(1)
        mp.copy_from(slots[1:2], dst)                      # reads a donated slot
        flushed = torch.cat([slots[:2], dst])
        assert torch.equal(mp.mamba_cache.temporal[:, dst[0]], mp.mamba_cache.temporal[:, slots[1]])
    assert mp.donations == []
    (event, _, flushed_slots), = verbs                   # one verb; the repeat is padding (a distinct flush)
    assert event == "tree donation" and sorted(flushed_slots.tolist()) == sorted([-1, *slots[:2].tolist()])
    assert mp.replay.cursors["count"][:, flushed].eq(0).all() and mp.replay.cursors["count"][:, slots[2]].eq(2).all()
    for s in slots[:2].tolist():
        for layer in range(len(LAYERS)):
            assert rms_ratio(mp.mamba_cache.temporal[layer, s], run.oracle[layer, s]) < TOL["float32"]
    _assert_read_copy_is_encoded_checkpoint(mp, slots[:2])


def test_a_tree_donation_waits_for_the_forwards_already_issued(replay_on):
    """The patched ``ModelRunner._forward_raw`` records the stream a forward runs on, and a tree
    donation's flush, issued from another stream (SGLang's scheduler thread), waits for that
    stream's work first (on a CPU no stream is recorded and the flush runs as issued)."""
    req_pool = _req_pool()
    run = Run(req_pool, replay_on, torch.Generator().manual_seed(12))
    mp = run.mp
    slot = req_pool.mamba_allocator.alloc(1)
    run.started(slot, 6)
    assert mp.forward_stream is None
    if DEVICE != "cuda":
        forward_start(req_pool)
        assert mp.forward_stream is None
        replay_pool.after_forwards("tree donation", mp, slot)
    else:
        forward = torch.cuda.Stream()
        with torch.cuda.stream(forward):
            forward_start(req_pool)
            torch.cuda._sleep(200_000_000)                # the forward still running on its stream
        assert mp.forward_stream == forward
        replay_pool.after_forwards("tree donation", mp, slot)
        assert not forward.query()                        # issued without waiting on the host ...
        torch.cuda.synchronize()
    assert mp.replay.cursors["count"][:, slot].eq(0).all()    # ... and flushed after it
    for layer in range(len(LAYERS)):
        assert rms_ratio(mp.mamba_cache.temporal[layer, slot[0]], run.oracle[layer, slot.item()]) < TOL["float32"]


def _assert_read_copy_is_encoded_checkpoint(mp, slots):
    from replayssm import formats
    for layer in range(len(LAYERS)):
        codes, bs, rs_ = formats.quantize(mp.replay.checkpoint[layer, slots].float(), "fp8")
        assert torch.equal(mp.replay.read["codes"][layer, slots].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(mp.replay.read["row_scale"][layer, slots], rs_)


@pytest.mark.parametrize("change,match", [
    (lambda a, kw: a.__setitem__(1, a[1].contiguous()), "dt: expected per-head values broadcast"),
    (lambda a, kw: a.__setitem__(2, a[2].contiguous()), "A: expected per-head values broadcast"),
    (lambda a, kw: kw.update(dt_softplus=False), "dt_softplus: replay applies softplus"),
    (lambda a, kw: kw.update(disable_state_update=True), "disable_state_update: expected False"),
    (lambda a, kw: kw.update(enable_stochastic_rounding=True), "enable_stochastic_rounding: SGLang's"),
    (lambda a, kw: kw.update(out=None), "out: expected an output buffer"),
    (lambda a, kw: kw.update(state_batch_indices=kw["state_batch_indices"].float()), "indices: expected int32"),
    (lambda a, kw: kw.update(retrieve_parent_token=torch.zeros(2, 1, dtype=torch.int64)),
     "retrieve_parent_token: a tree of drafts reached the verify"),
    (lambda a, kw: a.__setitem__(0, a[0].to(torch.bfloat16)), "x: expected dtype torch.float32"),
])
def test_bad_call_site_arguments_are_named(replay_on, change, match):
    gen = torch.Generator().manual_seed(4)
    run = Run(_req_pool(), replay_on, gen)
    slots = run.req_pool.mamba_allocator.alloc(2)
    inp = make_inputs(SPEC, run.params, 0, 2, None, gen, gate=False, device=DEVICE)
    args, kw = _sglang_args(inp, slots, torch.empty(2, H, P))
    args = list(args)
    change(args, kw)
    with pytest.raises((ValueError, TypeError), match=match):
        mamba_mod.selective_state_update(run.req_pool.mamba2_layer_cache(LAYERS[0]).temporal, *args, **kw)


def test_a_replay_pool_logs_its_side_state_as_the_serving_benchmark_reads_it(replay_on, caplog):
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "server"))
    import bench_serving
    from replayssm.pool import side_bytes_per_slot

    with caplog.at_level("INFO", logger="replayssm"):
        mp = _req_pool(draft_tokens=3).mamba_pool
    side = sum(side_bytes_per_slot(SPEC, mp.replay.cfg).values()) * len(LAYERS) * mp.mamba_cache.temporal.shape[1]
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("replayssm pool:")]
    assert len(logged) == 1 and "2 draft tokens" in logged[0]
    assert bench_serving.server_memory(logged[0]) == dict(replay_side_gb=round(side / 2 ** 30, 2))


def test_pool_refusals(replay_on):
    with pytest.raises(ValueError, match="cache_params: SGLang stores the ssm state as torch.bfloat16"):
        _req_pool(dtype=torch.bfloat16)
    empty = Mamba2CacheParams(shape=Mamba2StateShape.create_full_rank(tp_world_size=1, intermediate_size=0,
                                                                     state_size=N, conv_kernel=4),
                              layers=LAYERS, dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    with pytest.raises(ValueError, match=r"cache_params: temporal \(0, 1, 16\) is empty"):
        HybridReqToTokenPool.mamba_pool_cls(size=4, spec_state_size=4, cache_params=empty, mamba_layer_ids=LAYERS,
                                            device=DEVICE)
    mamba1 = Mamba2CacheParams(shape=Mamba2StateShape.create_full_rank(tp_world_size=1, intermediate_size=H * P,
                                                                      state_size=N, conv_kernel=4),
                               layers=LAYERS, dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    with pytest.raises(ValueError, match=r"cache_params: conv dim 24 = H\*P for temporal \(24, 1, 16\): a Mamba-1 "
                                         r"layer .* serve it without --replay-ssm"):
        HybridReqToTokenPool.mamba_pool_cls(size=4, spec_state_size=4, cache_params=mamba1, mamba_layer_ids=LAYERS,
                                            device=DEVICE)
    cls = HybridReqToTokenPool.mamba_pool_cls
    with pytest.raises(ValueError, match="enable_linear_replayssm: SGLang's own replay cannot run beside"):
        cls(size=4, spec_state_size=4, cache_params=_cache_params(), mamba_layer_ids=LAYERS, device=DEVICE,
            enable_linear_replayssm=True)
    with pytest.raises(ValueError, match="envelope_layout: SGLang's page-major KV layout is not served"):
        cls(size=4, spec_state_size=4, cache_params=_cache_params(), mamba_layer_ids=LAYERS, device=DEVICE,
            envelope_layout=True)
    with pytest.raises(ValueError, match="speculative_eagle_topk: replay verifies a chain of drafts .* got 10; NGRAM"):
        cls(size=4, spec_state_size=4, cache_params=_cache_params(), mamba_layer_ids=LAYERS, device=DEVICE,
            speculative_num_draft_tokens=4, speculative_eagle_topk=10)


def test_refused_settings_stop_a_runner_before_sglang_builds_it(replay_on):
    """A server started without the launcher (the plugin's environment variable set by hand) meets the
    launcher's refusals of SGLang's resolved settings where SGLang builds its model runner, before any
    of SGLang's own construction runs."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    for settings, match in ((dict(enable_lmcache=True), "--enable-lmcache: not served with --replay-ssm"),
                            (dict(speculative_algorithm="DFLASH"), "--speculative-algorithm: .*DFLASH's ragged"),
                            (dict(mamba_radix_cache_strategy="extra_buffer_lazy"),
                             "--mamba-radix-cache-strategy: replayssm serves no_buffer and extra_buffer; got "
                             "extra_buffer_lazy")):
        with pytest.raises(RuntimeError, match=match):
            ModelRunner.__init__(runner, server_args=SimpleNamespace(**settings))
    # served settings go on to SGLang's own constructor, which then wants its other arguments
    with pytest.raises(TypeError):
        ModelRunner.__init__(runner, server_args=SimpleNamespace(mamba_radix_cache_strategy="extra_buffer",
                                                                 speculative_algorithm="EAGLE"))


def test_a_state_outside_a_replay_pool_is_refused(replay_on):
    stray = torch.zeros(7, H, P, N)
    inp = make_inputs(SPEC, Params(SPEC, 1, torch.Generator().manual_seed(6)), 0, 2, None,
                      torch.Generator().manual_seed(6), gate=False, device=DEVICE)
    args, kw = _sglang_args(inp, torch.tensor([1, 2]), torch.empty(2, H, P))
    with pytest.raises(ValueError, match="state: not a layer of a ReplayMambaPool's temporal tensor"):
        mamba_mod.selective_state_update(stray, *args, **kw)
