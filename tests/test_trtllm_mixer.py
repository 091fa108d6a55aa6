"""TRT-LLM's Mamba-2 call site routed to replay (``wire_mamba2``), on the CPU.

TensorRT-LLM cannot be installed here, so ``Mamba2Mixer`` below re-enacts its state update as read
at NVIDIA/TensorRT-LLM commit 02140fd (``_torch/modules/mamba/mamba2_mixer.py``): the prefill rows'
states written into ``ssm_states[state_indices[:num_contexts]]``, then the decode rows through
``self.selective_state_update_func`` with TRT-LLM's arguments (einops ``repeat`` views of A, dt, D,
dt_bias; ``out`` a view of the preallocated output); with ``spec_metadata`` and a speculative cache
manager, a target verify: the decode rows as ``[num_decodes, T, ...]``, the conv windows rolled
forward by all T tokens with each step's window kept in ``intermediate_conv_window`` (the state
handling of TRT-LLM's ``causal_conv1d_update``), then the state update with
``disable_state_update=True``. Projections, the conv's output and norm are left out: what is under
test is the call convention and the slot bookkeeping, against the fp64 step recurrence.
``PythonMambaCacheManager`` re-enacts what ``cache_manager_class()`` builds on (its speculative
buffers, padding slot and ``mamba_layer_cache`` as read at commit 00bce92).
"""

import dataclasses
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from einops import rearrange, repeat
from helpers import SPECS, TOL, Params, f64, make_inputs, rms_ratio, step_oracle

import replayssm as rs
from replayssm.integrations.trtllm.cache import ReplayMambaStates, cache_manager_class, layer_spec
from replayssm.integrations.trtllm.mixer import replay_selective_state_update, wire_mamba2

SPEC = SPECS["mamba2"]
H, P, N, G = SPEC.num_heads, SPEC.head_dim, SPEC.state_dim, SPEC.num_groups
LAYER_IDS = (1, 3)                    # model layer ids of the two Mamba-2 layers
OFFSETS = {1: 0, 3: 1}                # the cache manager's mamba_layer_offsets
S, PAD = 6, 5                         # slots; slot 5 is TRT-LLM's shared CUDA-graph padding slot


def _not_wired(*args, **kwargs):
    raise AssertionError("the mixer's own state update ran: it was not routed to replay")


class Mamba2Mixer(torch.nn.Module):
    """TRT-LLM's ``Mamba2Mixer`` state update (see the module docs); ``hidden_states`` carries the
    prefill rows' states and the decode rows' x, dt, B, C as the in_proj / conv would give them."""

    def __init__(self, layer_idx: int, A: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor):
        super().__init__()
        self.layer_idx, self.A, self.D, self.dt_bias = layer_idx, A, D, dt_bias
        self.selective_state_update_func = _not_wired
        self._A_expanded = repeat(self.A, "h -> h p n", p=P, n=N).to(dtype=torch.float32)
        self._dt_bias_expanded = repeat(self.dt_bias, "h -> h p", p=P)
        self._D_expanded = repeat(self.D, "h -> h p", p=P)

    def forward(self, hidden_states, attn_metadata, mamba_metadata, spec_metadata=None):
        num_prefills = attn_metadata.num_contexts
        num_decodes = attn_metadata.seq_lens.shape[0] - num_prefills
        state_indices = mamba_metadata.state_indices[:num_prefills + num_decodes]
        manager = attn_metadata.kv_cache_manager
        ssm_states = manager.get_ssm_states(self.layer_idx)
        state_indices_p, state_indices_d = torch.split(state_indices, [num_prefills, num_decodes])
        is_target_verify = manager.is_speculative() and spec_metadata is not None
        T = spec_metadata.runtime_draft_len + 1 if is_target_verify else 1
        out = torch.empty(num_decodes * T, H * P)
        if num_prefills > 0:
            ssm_states[state_indices_p] = hidden_states["prefill"]
            if "prefill_conv" in hidden_states:          # the plain-decode test leaves the conv out
                manager.get_conv_states(self.layer_idx)[state_indices_p] = hidden_states["prefill_conv"]
        if num_decodes > 0 and is_target_verify:
            layer_cache = manager.mamba_layer_cache(self.layer_idx)
            rows = torch.arange(manager.get_max_resource_count(), dtype=torch.int32)[:num_decodes]   # TRT-LLM's
            _conv_state_update(hidden_states["xbc"].view(num_decodes, T, -1).transpose(1, 2), layer_cache.conv,
                               state_indices_d, layer_cache.intermediate_conv_window, rows)
            x_d = rearrange(hidden_states["x"], "(b t) (h p) -> b t h p", t=T, p=P).contiguous()
            dt_d = repeat(hidden_states["dt"], "(b t) h -> b t h p", t=T, p=P)
            B_d = rearrange(hidden_states["B"], "(b t) (g n) -> b t g n", t=T, g=G).contiguous()
            C_d = rearrange(hidden_states["C"], "(b t) (g n) -> b t g n", t=T, g=G).contiguous()
            self.selective_state_update_func(ssm_states, x_d, dt_d, self._A_expanded, B_d, C_d, self._D_expanded,
                                             z=None, dt_bias=self._dt_bias_expanded, dt_softplus=True,
                                             state_batch_indices=state_indices_d,
                                             out=out.view(num_decodes, T, -1, P), disable_state_update=True,
                                             intermediate_states_buffer=layer_cache.intermediate_ssm,
                                             cache_steps=T, intermediate_state_indices=rows)
        elif num_decodes > 0:
            x_d = rearrange(hidden_states["x"], "b (h p) -> b h p", p=P).contiguous()
            dt_d = repeat(hidden_states["dt"], "b h -> b h p", p=P)
            B_d = rearrange(hidden_states["B"], "b (g n) -> b g n", g=G).contiguous()
            C_d = rearrange(hidden_states["C"], "b (g n) -> b g n", g=G).contiguous()
            self.selective_state_update_func(ssm_states, x_d, dt_d, self._A_expanded, B_d, C_d, self._D_expanded,
                                             z=None, dt_bias=self._dt_bias_expanded, dt_softplus=True,
                                             state_batch_indices=state_indices_d,
                                             out=out.view(num_decodes, -1, P))
        return out


def _conv_state_update(xbc, conv_states, conv_state_indices, intermediate_conv_window, intermediate_state_indices):
    """The state handling of TRT-LLM's ``causal_conv1d_update`` in a verify: each row's window
    ``[conv_dim, width - 1]`` rolls forward by its T tokens (``xbc [n, conv_dim, T]``), and the window
    after token t is kept at ``intermediate_conv_window[intermediate_state_indices[row], t]``."""
    for row, slot in enumerate(conv_state_indices.tolist()):
        window = conv_states[slot].clone()
        for t in range(xbc.shape[2]):
            window = torch.cat([window[:, 1:], xbc[row, :, t:t + 1]], dim=1)
            intermediate_conv_window[intermediate_state_indices[row], t] = window
        conv_states[slot] = window


CONV_DIM, WIDTH = H * P + 2 * G * N, 4  # conv windows [slots, CONV_DIM, WIDTH - 1]


class PythonMambaCacheManager:
    """TRT-LLM's manager as ``cache_manager_class()`` builds on it (see the module docs): the
    constructor's buffers, its padding slot (the last slot), ``mamba_layer_cache``."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class State:
        conv: torch.Tensor
        temporal: torch.Tensor

        def at_layer_idx(self, layer):
            return type(self)(**{k: None if v is None else v[layer] for k, v in vars(self).items()})

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class SpeculativeState(State):
        intermediate_conv_window: torch.Tensor
        intermediate_ssm: torch.Tensor | None = None

    def __init__(self, d_state, d_conv, num_heads, n_groups, head_dim, num_layers, max_batch_size, spec_state_size,
                 mapping, dtype, ssm_cache_dtype, layer_mask=None, speculative_num_draft_tokens=None,
                 model_type="nemotron_hybrid", use_replay_state_update=False, mamba_ssm_stochastic_rounding=False):
        conv_dim = head_dim * num_heads + 2 * n_groups * d_state
        conv = torch.zeros(num_layers, max_batch_size, conv_dim, d_conv - 1, dtype=dtype)
        temporal = torch.full((num_layers, max_batch_size, num_heads, head_dim, d_state), float("nan"),
                              dtype=ssm_cache_dtype)
        self.mamba_layer_offsets = {idx: offset for offset, idx in enumerate(i for i, m in enumerate(layer_mask) if m)}
        if speculative_num_draft_tokens is not None:
            T = speculative_num_draft_tokens + 1
            self.mamba_cache = self.SpeculativeState(
                conv=conv, temporal=temporal,
                intermediate_conv_window=torch.zeros(num_layers, spec_state_size, T, conv_dim, d_conv - 1, dtype=dtype),
                intermediate_ssm=torch.zeros(num_layers, spec_state_size, T, num_heads, head_dim, d_state))
        else:
            self.mamba_cache = self.State(conv=conv, temporal=temporal)
        self._padding_slot, self._attention_dp_dummy_slot = max_batch_size - 1, None
        self.intermediate_state_indices = torch.arange(max_batch_size, dtype=torch.int32)
        self.max_batch_size = max_batch_size

    def get_max_resource_count(self):
        return self.max_batch_size

    def is_speculative(self):
        return isinstance(self.mamba_cache, self.SpeculativeState)

    def shutdown(self):
        # TRT-LLM's: empty state tensors in place of the cache's, freed while the manager lives on
        self.mamba_cache = self.State(conv=torch.empty(0), temporal=torch.empty(0))

    def mamba_layer_cache(self, layer_idx):
        return self.mamba_cache.at_layer_idx(self.mamba_layer_offsets[layer_idx])

    def get_ssm_states(self, layer_idx):
        return self.mamba_cache.temporal[self.mamba_layer_offsets[layer_idx]]

    def get_conv_states(self, layer_idx):
        return self.mamba_cache.conv[self.mamba_layer_offsets[layer_idx]]


def _setup(seed=0, window=4):
    gen = torch.Generator().manual_seed(seed)
    params = Params(SPEC, len(LAYER_IDS), gen)
    temporal = torch.full((len(LAYER_IDS), S, H, P, N), float("nan"))
    cfg = rs.ReplayConfig(window=window, ring_dtype="float32")
    states = ReplayMambaStates(SPEC, cfg, temporal, backend="reference", padding_slots=(PAD,))
    model = torch.nn.ModuleList([Mamba2Mixer(i, params.A[k], params.D[k], params.dt_bias[k])
                                 for k, i in enumerate(LAYER_IDS)])
    manager = SimpleNamespace(get_ssm_states=lambda layer_idx: temporal[OFFSETS[layer_idx]],
                              is_speculative=lambda: False)
    return gen, params, states, model, manager


def _forward(model, manager, slots, num_contexts, hidden):
    meta = SimpleNamespace(num_contexts=num_contexts, seq_lens=torch.ones(slots.numel()), kv_cache_manager=manager)
    return [mixer(hidden[k], meta, SimpleNamespace(state_indices=slots)) for k, mixer in enumerate(model)]


def test_trtllms_stochastic_rounding_is_the_float16_sr_checkpoints_own():
    """TRT-LLM passes ``rand_seed`` / ``philox_rounds`` with an fp16 state and stochastic rounding on; a replay
    state on the ``float16_sr`` checkpoint (what an fp16 ``ssm_cache_dtype`` gives) rounds stochastically
    itself at each flush: the calls are taken and step exactly as without them (outputs, rings, cursors,
    checkpoint bits), across flushes."""
    from replayssm.integrations.trtllm.mixer import register

    gen = torch.Generator().manual_seed(4)
    cfg = rs.ReplayConfig(window=2, checkpoint_dtype="float16_sr", ring_dtype="float32")
    start = (torch.randn(1, S, H, P, N, generator=gen) * 0.3).half()
    pair = [ReplayMambaStates(SPEC, cfg, start.clone(), backend="reference", padding_slots=(PAD,)) for _ in range(2)]
    for states in pair:
        register(states)
    A = (-torch.rand(H, generator=gen))[:, None, None].expand(H, P, N)
    D, dt_bias = (torch.randn(H, generator=gen)[:, None].expand(H, P) for _ in range(2))
    slots = torch.tensor([0, 3, PAD], dtype=torch.int32)
    for step in range(5):                             # flushes at 2 and 4
        x, B, C = torch.randn(3, H, P, generator=gen), torch.randn(3, G, N, generator=gen), torch.randn(3, G, N,
                                                                                                          generator=gen)
        dt = torch.randn(3, H, generator=gen)[..., None].expand(3, H, P)
        outs = []
        for states, seed in zip(pair, (None, torch.full((S,), 7, dtype=torch.int64))):
            out = torch.full((3, H, P), float("nan"))
            replay_selective_state_update(states.ssm_states[0], x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True,
                                          state_batch_indices=slots, out=out, rand_seed=seed,
                                          philox_rounds=None if seed is None else 10)
            outs.append(out)
        assert torch.equal(outs[0], outs[1]) and torch.isfinite(outs[0][:2]).all(), step
    assert torch.equal(pair[0].ssm_states.view(torch.int16), pair[1].ssm_states.view(torch.int16))
    assert not torch.equal(pair[0].ssm_states, start)            # the flushes wrote the checkpoint
    for name in pair[0].pool.ring:
        assert torch.equal(pair[0].pool.ring[name], pair[1].pool.ring[name]), name
    for name in pair[0].pool.cursors:
        assert torch.equal(pair[0].pool.cursors[name], pair[1].pool.cursors[name]), name


def test_decode_through_trtllm_call_site_matches_step_recurrence():
    gen, params, states, model, manager = _setup()
    assert wire_mamba2(model, states, mixer_class=Mamba2Mixer) == 2
    oracle = {}                                       # (layer, slot) -> fp64 state after every token
    errs = []

    def batch(prefill_slots, decode_slots):
        slots = torch.tensor(prefill_slots + decode_slots, dtype=torch.int32)
        n_d = len(decode_slots)
        hidden, refs = [], []
        for k in range(len(LAYER_IDS)):
            init = torch.randn(len(prefill_slots), H, P, N, generator=gen) * 0.1
            inp = make_inputs(SPEC, params, k, n_d, None, gen, gate=False)
            hidden.append(dict(prefill=init, x=inp["x"].flatten(1), dt=inp["dt"], B=inp["B"].flatten(1),
                               C=inp["C"].flatten(1)))
            for s, state in zip(prefill_slots, init):
                oracle[k, s] = state.double()
            refs.append(inp)
        outs = _forward(model, manager, slots, len(prefill_slots), hidden)
        for k, (out, inp) in enumerate(zip(outs, refs)):
            for row, s in enumerate(decode_slots):
                if s == PAD:
                    assert out[row].eq(0).all()      # a padding row reads and writes nothing
                    continue
                row_inp = {name: (v if v.dim() == 1 and name in ("A", "D", "dt_bias") else v[row:row + 1])
                           for name, v in f64(inp).items()}
                y, oracle[k, s] = step_oracle(SPEC, oracle[k, s][None], row_inp)
                oracle[k, s] = oracle[k, s][0]
                errs.append(rms_ratio(out[row].view(H, P), y[0]))

    batch([0, 1, 2], [])                              # prefill three requests
    for _ in range(6):                                # decode them (flushes at window 4) with a padded row
        batch([], [2, 0, PAD, 1])
    batch([3, 1], [0, 2])                             # a new request in slot 1 prefills beside decodes
    for _ in range(5):
        batch([], [1, 3, 0, 2, PAD])
    assert max(errs) < TOL["float32"] and len(errs) == 2 * (6 * 3 + 2 + 5 * 4)
    for (k, s), state in oracle.items():              # every committed token is in the state
        assert rms_ratio(states.read_state(k, torch.tensor([s]))[0], state) < TOL["float32"]


def test_wiring_and_call_refusals():
    gen, params, states, model, manager = _setup()
    slots = torch.tensor([0], dtype=torch.int32)
    hidden = [dict(prefill=torch.zeros(0, H, P, N), x=torch.randn(1, H * P), dt=torch.randn(1, H),
                   B=torch.randn(1, G * N), C=torch.randn(1, G * N))] * 2
    with pytest.raises(AssertionError, match="not routed"):
        _forward(model, manager, slots, 0, hidden)   # the re-enacted mixer fails when not wired
    wire_mamba2(model, states, mixer_class=Mamba2Mixer)
    with pytest.raises(ValueError, match="already wired"):
        wire_mamba2(model, states, mixer_class=Mamba2Mixer)
    x, dt = torch.randn(1, 2, H, P), repeat(torch.randn(1, 2, H), "b t h -> b t h p", p=P)
    A, D = model[0]._A_expanded, model[0]._D_expanded
    B = torch.randn(1, 2, G, N)
    with pytest.raises(ValueError, match="cache_steps: expected T = 2, got 3"):
        replay_selective_state_update(states.ssm_states[0], x, dt, A, B, B, D, dt_bias=model[0]._dt_bias_expanded,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x),
                                      disable_state_update=True, cache_steps=3)
    with pytest.raises(ValueError, match="disable_state_update: expected True for x of shape"):
        replay_selective_state_update(states.ssm_states[0], x, dt, A, B, B, D, dt_bias=model[0]._dt_bias_expanded,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x))
    with pytest.raises(ValueError, match="rand_seed: TRT-LLM's stochastic rounding of an fp16 state is replay's "
                                         "float16_sr checkpoint .* this state's checkpoint is float32"):
        replay_selective_state_update(states.ssm_states[0], x[:, 0], dt[:, 0], A, B[:, 0], B[:, 0], D,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x[:, 0]),
                                      rand_seed=torch.zeros(1))
    with pytest.raises(ValueError, match="ssm_states: not a layer of a registered ReplayMambaStates"):
        replay_selective_state_update(torch.zeros(S, H, P, N), x[:, 0], dt[:, 0], A, B[:, 0], B[:, 0], D,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x[:, 0]))
    with pytest.raises(ImportError, match="TensorRT-LLM 1.2.x is required"):
        wire_mamba2(model, states)                    # TRT-LLM's own Mamba2Mixer: not installed here
    # a mixer that picks per-phase kernels (``_stp_ssu_func`` / ``_mtp_ssu_func``) has no seam to route
    per_phase = type("Mamba2Mixer", (Mamba2Mixer,), {})
    mixer = per_phase(LAYER_IDS[0], params.A[0], params.D[0], params.dt_bias[0])
    del mixer.selective_state_update_func
    with pytest.raises(RuntimeError, match="has no selective_state_update_func, the call site replay routes"):
        wire_mamba2(torch.nn.ModuleList([mixer]), states, mixer_class=per_phase)


def _spec_manager(monkeypatch, drafts=2, window=4, **kwargs):
    """``cache_manager_class()`` over the re-enacted ``PythonMambaCacheManager``."""
    module = types.ModuleType("tensorrt_llm._torch.pyexecutor.mamba_cache_manager")
    module.PythonMambaCacheManager = PythonMambaCacheManager
    for name in ("tensorrt_llm", "tensorrt_llm._torch", "tensorrt_llm._torch.pyexecutor"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=kwargs.pop("max_draft_tokens", drafts), ring_dtype="float32")
    args = dict(d_state=N, d_conv=WIDTH, num_heads=H, n_groups=G, head_dim=P, num_layers=len(LAYER_IDS),
                max_batch_size=S, spec_state_size=S, mapping=None, dtype=torch.float32, ssm_cache_dtype=torch.float32,
                layer_mask=[i in LAYER_IDS for i in range(max(LAYER_IDS) + 1)], speculative_num_draft_tokens=drafts,
                **kwargs)
    return cache_manager_class()(replay_spec=SPEC, replay_cfg=cfg, **args)


def test_verify_and_commit_through_trtllm_call_site_and_manager(monkeypatch):
    """Speculative decoding through the re-enacted call site and ``cache_manager_class()``: T = 3
    verifies of three requests (and TRT-LLM's padding row) with random acceptance, across flushes
    (window 4), a prefill beside verifies; every verify output (all T tokens) against the fp64 step
    recurrence from the committed state, the conv windows after each commit equal to the window
    after the accepted tokens, and no per-draft SSM buffer kept."""
    T = 3
    manager = _spec_manager(monkeypatch, drafts=T - 1)
    assert manager.mamba_cache.intermediate_ssm.shape == (2, 0, T, H, P, N)   # no per-draft states kept
    gen = torch.Generator().manual_seed(3)
    params = Params(SPEC, len(LAYER_IDS), gen)
    model = torch.nn.ModuleList([Mamba2Mixer(i, params.A[k], params.D[k], params.dt_bias[k])
                                 for k, i in enumerate(LAYER_IDS)])
    assert wire_mamba2(model, manager.replay, mixer_class=Mamba2Mixer) == 2
    _speculative_run(manager, model, params, gen, T)


def _speculative_run(manager, model, params, gen, T):
    """Prefills, T-token verifies with random acceptance across flushes (window 4) and a prefill beside
    verifies through ``model``'s mixers over ``manager``; commits by ``manager.update_mamba_states``. The
    mixers and the commit see ``manager`` (a manager or TRT-LLM's facade over one); the checks read the
    manager itself."""
    impl = getattr(manager, "_impl", manager)
    pad = impl._padding_slot
    oracle, conv_oracle, errs = {}, {}, []

    def batch(prefill_slots, verify_slots):
        slots = torch.tensor(prefill_slots + verify_slots, dtype=torch.int32)
        n_p, n_v = len(prefill_slots), len(verify_slots)
        meta = SimpleNamespace(num_contexts=n_p, num_seqs=n_p + n_v, seq_lens=torch.ones(n_p + n_v),
                               kv_cache_manager=manager)
        accepted = torch.randint(1, T + 1, (n_v,), generator=gen)
        for k, mixer in enumerate(model):
            init = torch.randn(n_p, H, P, N, generator=gen) * 0.1
            init_conv = torch.randn(n_p, CONV_DIM, WIDTH - 1, generator=gen)
            inp = make_inputs(SPEC, params, k, n_v, T, gen, gate=False)
            xbc = torch.randn(n_v * T, CONV_DIM, generator=gen)
            hidden = dict(prefill=init, prefill_conv=init_conv, x=inp["x"].flatten(2).flatten(0, 1),
                          dt=inp["dt"].flatten(0, 1), B=inp["B"].flatten(2).flatten(0, 1),
                          C=inp["C"].flatten(2).flatten(0, 1), xbc=xbc)
            out = mixer(hidden, meta, SimpleNamespace(state_indices=slots),
                        SimpleNamespace(runtime_draft_len=T - 1)).view(n_v, T, H, P)
            for s, state, window in zip(prefill_slots, init, init_conv):
                oracle[k, s], conv_oracle[k, s] = state.double(), window
            for row, s in enumerate(verify_slots):
                if s == pad:
                    assert out[row].eq(0).all()                # a padding row reads and writes nothing
                    continue
                state, window = oracle[k, s][None], conv_oracle[k, s]
                for t in range(T):
                    tok = {name: (v if name in ("A", "D", "dt_bias") else v[row:row + 1, t])
                           for name, v in f64(inp).items()}
                    y, state = step_oracle(SPEC, state, tok)
                    errs.append(rms_ratio(out[row, t], y[0]))
                    window = torch.cat([window[:, 1:], xbc.view(n_v, T, -1)[row, t][:, None]], dim=1)
                    if t + 1 == accepted[row]:
                        oracle[k, s], conv_oracle[k, s] = state[0], window
        num_accepted = torch.cat([torch.full((n_p,), 7), accepted]).int()
        manager.update_mamba_states(meta, num_accepted, slots)
        for (k, s), window in conv_oracle.items():
            assert torch.equal(impl.mamba_cache.conv[k, s], window), (k, s)

    batch([0, 1, 2], [])
    for _ in range(6):                                # accepted 1..3 per verify: flushes at window 4
        batch([], [2, 0, pad, 1])
    batch([3, 1], [0, 2])                             # a new request in slot 1 prefills beside verifies
    for _ in range(5):
        batch([], [1, 3, pad, 0, 2])
    assert max(errs) < TOL["float32"] and len(errs) == 2 * T * (6 * 3 + 2 + 5 * 4)
    for (k, s), state in oracle.items():              # every accepted token is in the state
        assert rms_ratio(impl.replay.read_state(k, torch.tensor([s]))[0], state) < TOL["float32"]


class MambaCacheManager:
    """TRT-LLM's facade over its Python manager (00bce92; the Mixed hybrid manager's base): builds
    ``self._impl`` by the module-global name ``PythonMambaCacheManager`` and forwards TRT-LLM's own
    methods to it, by name, nothing else (as TRT-LLM's facade does); its ``update_mamba_states``
    passes the latest releases' four arguments by position (2829508)."""

    def __init__(self, module, **kwargs):
        self._impl = module.PythonMambaCacheManager(**kwargs)

    def get_max_resource_count(self):
        return self._impl.get_max_resource_count()

    def get_conv_states(self, layer_idx):
        return self._impl.get_conv_states(layer_idx)

    def get_ssm_states(self, layer_idx):
        return self._impl.get_ssm_states(layer_idx)

    def is_speculative(self):
        return self._impl.is_speculative()

    def mamba_layer_cache(self, layer_idx):
        return self._impl.mamba_layer_cache(layer_idx)

    def shutdown(self):
        self._impl.shutdown()

    def update_mamba_states(self, attn_metadata, num_accepted_tokens, state_indices, accepted_leaf_positions=None):
        self._impl.update_mamba_states(attn_metadata, num_accepted_tokens, state_indices, accepted_leaf_positions)


def _reenacted_gdn_module(monkeypatch):
    """A module holding a GDN layer class and the three functions TRT-LLM's GDN layer calls."""
    module = types.ModuleType("reenacted_gdn_mixer")
    for name in ("fused_sigmoid_gating_delta_rule_update", "_can_use_flashinfer_gdn_verify", "_flashinfer_gdn_verify"):
        setattr(module, name, lambda *args, **kwargs: None)
    module.Qwen3NextGatedDeltaNet = type("Qwen3NextGatedDeltaNet", (), {
        "__module__": module.__name__, "forward_extend": lambda self, conv_states, ssm_states, **kwargs: None})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_later_gdn_modules_decode_paths_are_refused_or_routed(monkeypatch):
    """Decode paths of later TRT-LLM GDN modules (the newest the index holds) that bypass the routed
    functions: a mixed batch's recurrent decode rows and the PDL decode pair are refused while on;
    FlashInfer's in-place decode is routed off for replay states."""
    from replayssm.integrations.trtllm.mixer import register, route_gdn_class

    gdn = _reenacted_gdn_module(monkeypatch)
    gdn._MIXED_DECODE_RECURRENT = True
    with pytest.raises(RuntimeError, match="set TLLM_GDN_MIXED_DECODE_RECURRENT=0"):
        route_gdn_class(gdn.Qwen3NextGatedDeltaNet)
    gdn._MIXED_DECODE_RECURRENT = False
    gdn.can_use_gdn_decode_pdl_pair = lambda *args: True
    monkeypatch.delenv("TRTLLM_GDN_DISABLE_PDL_DECODE_PAIR", raising=False)
    with pytest.raises(RuntimeError, match="set TRTLLM_GDN_DISABLE_PDL_DECODE_PAIR=1"):
        route_gdn_class(gdn.Qwen3NextGatedDeltaNet)
    monkeypatch.setenv("TRTLLM_GDN_DISABLE_PDL_DECODE_PAIR", "1")
    gdn._can_use_flashinfer_gdn_decode = lambda initial_state_source, K, V, T, N: True     # TRT-LLM's signature
    route_gdn_class(gdn.Qwen3NextGatedDeltaNet)
    gen, params, states, model, manager = _setup()
    register(states)
    assert gdn._can_use_flashinfer_gdn_decode(states.ssm_states[0], 128, 128, 4, 4) is False
    assert gdn._can_use_flashinfer_gdn_decode(torch.zeros(S, 4, 8, 8), 128, 128, 4, 4) is True
    assert gdn._can_use_flashinfer_gdn_decode(initial_state_source=states.ssm_states[0], K=128, V=128, T=4,
                                              N=4) is False
    assert gdn._can_use_flashinfer_gdn_decode(initial_state_source=torch.zeros(S, 4, 8, 8), K=128, V=128, T=4,
                                              N=4) is True


def test_enable_replay_puts_replay_managers_and_layers_in_trtllm_executor(monkeypatch):
    """``executor.enable_replay`` over re-enacted TRT-LLM modules: the facade TRT-LLM's executor builds
    holds a replay manager (dims, checkpoint dtype, draft budget from TRT-LLM's arguments; TRT-LLM's
    own replay off), mixers built afterwards route to it, and speculative decoding through them
    matches the fp64 recurrence; the GDN layer class and its module's functions are routed."""
    from replayssm.integrations.trtllm.executor import enable_replay
    T = 3
    cache = types.ModuleType("reenacted_mamba_cache_manager")
    seen = []

    class PythonManager(PythonMambaCacheManager):
        def __init__(self, **kwargs):
            seen.append(kwargs["use_replay_state_update"])
            super().__init__(**kwargs)

    cache.PythonMambaCacheManager = PythonManager
    mixer_class = type("Mamba2Mixer", (Mamba2Mixer,), {})
    gdn = _reenacted_gdn_module(monkeypatch)
    with pytest.raises(ValueError, match="read_format: expected one of"):
        enable_replay(read_format="int4", modules=dict(cache=cache, mamba2=SimpleNamespace(Mamba2Mixer=mixer_class),
                                                       gdn=gdn))
    enable_replay(window=4, ring_dtype="float32",
                  modules=dict(cache=cache, mamba2=SimpleNamespace(Mamba2Mixer=mixer_class), gdn=gdn))
    assert getattr(gdn.Qwen3NextGatedDeltaNet.forward_extend, "replayssm_wired", False)
    assert hasattr(gdn._flashinfer_gdn_verify, "replayssm_original")
    with pytest.raises(ValueError, match="enable_replay: already enabled"):
        enable_replay(modules=dict(cache=cache, mamba2=SimpleNamespace(Mamba2Mixer=mixer_class), gdn=gdn))
    manager = MambaCacheManager(
        cache, d_state=N, d_conv=WIDTH, num_heads=H, n_groups=G, head_dim=P, num_layers=len(LAYER_IDS),
        max_batch_size=S, spec_state_size=S, mapping=None, dtype=torch.float32, ssm_cache_dtype=torch.float32,
        layer_mask=[i in LAYER_IDS for i in range(max(LAYER_IDS) + 1)], speculative_num_draft_tokens=T - 1,
        model_type="nemotron_hybrid", use_replay_state_update=True)
    cfg = manager._impl.replay.pool.cfg
    assert seen == [False] and (cfg.window, cfg.max_draft_tokens, cfg.checkpoint_dtype) == (4, T - 1, "float32")
    assert manager._impl.replay.pool.spec == SPEC
    gen = torch.Generator().manual_seed(5)
    params = Params(SPEC, len(LAYER_IDS), gen)
    model = torch.nn.ModuleList([mixer_class(i, params.A[k], params.D[k], params.dt_bias[k])
                                 for k, i in enumerate(LAYER_IDS)])
    _speculative_run(manager, model, params, gen, T)  # its commits through the facade's positional call
    with pytest.raises(ValueError, match="accepted_leaf_positions: tree verify"):
        manager.update_mamba_states(SimpleNamespace(num_contexts=0, num_seqs=1), torch.tensor([1]), torch.tensor([0]),
                                    torch.zeros(1))
    # states replay does not own keep TRT-LLM's functions
    with pytest.raises(AssertionError, match="not routed"):
        model[0].selective_state_update_func(torch.zeros(S, H, P, N), None, None, None, None, None)
    other = torch.zeros(S, 4, 5, 16)
    assert gdn.Qwen3NextGatedDeltaNet().forward_extend(None, other, num_decodes=1) is None


def test_layer_spec_from_trtllm_state_tensors():
    gdn = SPECS["gdn"]
    temporal = torch.zeros(1, 2, gdn.num_v_heads, gdn.head_v_dim, gdn.head_k_dim)
    conv = torch.zeros(1, 2, 2 * gdn.num_k_heads * gdn.head_k_dim + gdn.num_v_heads * gdn.head_v_dim, 3)
    assert layer_spec("qwen3_next", temporal, conv) == gdn
    assert layer_spec("nemotron_hybrid", torch.zeros(1, 2, H, P, N), torch.zeros(1, 2, CONV_DIM, 3)) == SPEC
    with pytest.raises(ValueError, match="model_type: replay serves nemotron_hybrid"):
        layer_spec("kimi_linear", temporal, conv)
    with pytest.raises(ValueError, match="conv: 5 channels do not fit"):
        layer_spec("nemotron_hybrid", torch.zeros(1, 2, H, P, N), torch.zeros(1, 2, 5, 3))


def test_a_manager_shut_down_lets_its_replay_state_go(monkeypatch):
    import gc
    import weakref

    manager = _spec_manager(monkeypatch)
    replay, state = weakref.ref(manager.replay), weakref.ref(manager.mamba_cache.temporal)
    manager.shutdown()
    gc.collect()
    assert manager.replay is None and replay() is None and state() is None


def test_speculative_manager_refusals(monkeypatch):
    with pytest.raises(ValueError, match="use_replay_state_update: TRT-LLM's own replay"):
        _spec_manager(monkeypatch, use_replay_state_update=True)
    with pytest.raises(ValueError, match="max_draft_tokens=1 cannot hold a verify of speculative_num_draft_tokens=2"):
        _spec_manager(monkeypatch, drafts=2, max_draft_tokens=1)
    monkeypatch.setenv("TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP", "1")
    with pytest.raises(ValueError, match="TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP=1"):
        _spec_manager(monkeypatch)
    monkeypatch.delenv("TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP")
    manager = _spec_manager(monkeypatch)
    meta = SimpleNamespace(num_contexts=0, num_seqs=1)
    with pytest.raises(ValueError, match="accepted_leaf_positions: tree verify"):
        manager.update_mamba_states(meta, torch.tensor([1]), torch.tensor([0]), accepted_leaf_positions=torch.zeros(1))
