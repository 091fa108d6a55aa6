"""TRT-LLM's Mamba-2 call site routed to replay (``wire_mamba2``), on the CPU.

TensorRT-LLM cannot be installed here, so ``Mamba2Mixer`` below re-enacts its state update as read
at NVIDIA/TensorRT-LLM commit 02140fd (``_torch/modules/mamba/mamba2_mixer.py``): the prefill rows'
states written into ``ssm_states[state_indices[:num_contexts]]``, then the decode rows through
``self.selective_state_update_func`` with TRT-LLM's arguments (einops ``repeat`` views of A, dt, D,
dt_bias; ``out`` a view of the preallocated output). Projections, conv and norm are left out: what
is under test is the call convention and the slot bookkeeping, against the fp64 step recurrence.
"""

from types import SimpleNamespace

import pytest
import torch
from einops import rearrange, repeat
from helpers import SPECS, TOL, Params, f64, make_inputs, rms_ratio, step_oracle

import replayssm as rs
from replayssm.integrations.trtllm.cache import ReplayMambaStates
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

    def forward(self, hidden_states, attn_metadata, mamba_metadata):
        num_prefills = attn_metadata.num_contexts
        num_decodes = attn_metadata.seq_lens.shape[0] - num_prefills
        state_indices = mamba_metadata.state_indices[:num_prefills + num_decodes]
        ssm_states = attn_metadata.kv_cache_manager.get_ssm_states(self.layer_idx)
        state_indices_p, state_indices_d = torch.split(state_indices, [num_prefills, num_decodes])
        out = torch.empty(num_decodes, H * P)
        if num_prefills > 0:
            ssm_states[state_indices_p] = hidden_states["prefill"]
        if num_decodes > 0:
            x_d = rearrange(hidden_states["x"], "b (h p) -> b h p", p=P).contiguous()
            dt_d = repeat(hidden_states["dt"], "b h -> b h p", p=P)
            B_d = rearrange(hidden_states["B"], "b (g n) -> b g n", g=G).contiguous()
            C_d = rearrange(hidden_states["C"], "b (g n) -> b g n", g=G).contiguous()
            self.selective_state_update_func(ssm_states, x_d, dt_d, self._A_expanded, B_d, C_d, self._D_expanded,
                                             z=None, dt_bias=self._dt_bias_expanded, dt_softplus=True,
                                             state_batch_indices=state_indices_d,
                                             out=out.view(num_decodes, -1, P))
        return out


def _setup(seed=0, window=4):
    gen = torch.Generator().manual_seed(seed)
    params = Params(SPEC, len(LAYER_IDS), gen)
    temporal = torch.full((len(LAYER_IDS), S, H, P, N), float("nan"))
    cfg = rs.ReplayConfig(window=window, ring_dtype="float32")
    states = ReplayMambaStates(SPEC, cfg, temporal, backend="reference", padding_slots=(PAD,))
    model = torch.nn.ModuleList([Mamba2Mixer(i, params.A[k], params.D[k], params.dt_bias[k])
                                 for k, i in enumerate(LAYER_IDS)])
    manager = SimpleNamespace(get_ssm_states=lambda layer_idx: temporal[OFFSETS[layer_idx]])
    return gen, params, states, model, manager


def _forward(model, manager, slots, num_contexts, hidden):
    meta = SimpleNamespace(num_contexts=num_contexts, seq_lens=torch.ones(slots.numel()), kv_cache_manager=manager)
    return [mixer(hidden[k], meta, SimpleNamespace(state_indices=slots)) for k, mixer in enumerate(model)]


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
    with pytest.raises(ValueError, match="disable_state_update: a speculative verify"):
        replay_selective_state_update(states.ssm_states[0], x, dt, A, B, B, D, dt_bias=model[0]._dt_bias_expanded,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x),
                                      disable_state_update=True, cache_steps=2)
    with pytest.raises(ValueError, match="rand_seed: TRT-LLM's stochastic rounding"):
        replay_selective_state_update(states.ssm_states[0], x[:, 0], dt[:, 0], A, B[:, 0], B[:, 0], D,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x[:, 0]),
                                      rand_seed=torch.zeros(1))
    with pytest.raises(ValueError, match="ssm_states: not a layer of a registered ReplayMambaStates"):
        replay_selective_state_update(torch.zeros(S, H, P, N), x[:, 0], dt[:, 0], A, B[:, 0], B[:, 0], D,
                                      dt_softplus=True, state_batch_indices=slots, out=torch.empty_like(x[:, 0]))
    with pytest.raises(ImportError, match="TensorRT-LLM 1.2.x is required"):
        wire_mamba2(model, states)                    # TRT-LLM's own Mamba2Mixer: not installed here
