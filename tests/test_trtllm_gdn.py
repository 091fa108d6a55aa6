"""TRT-LLM's GDN call sites routed to replay (``wire_gdn``), on the CPU.

TensorRT-LLM cannot be installed here, so ``Qwen3NextGatedDeltaNet`` below re-enacts what its state
handling does, as read at NVIDIA/TensorRT-LLM commit 0d4bd90 (``_torch/modules/mamba/gdn_mixer.py``):
``forward_core`` splits prefill and decode rows and sends a batch with prefills to ``forward_extend``
(whose chunked kernel writes every row's state in place, decode rows included) and a decode-only
batch to ``forward_decode``, which calls the module-level ``fused_sigmoid_gating_delta_rule_update``
with TRT-LLM's keywords (raw gating ``a``, ``b``, ``A_log``, ``dt_bias``; ``[1, N, heads, dim]`` q / k / v;
the layer's ``temporal`` ``[slots, HV, V, K]``). Projections, conv and norm are left out. The chunked
kernel's stand-in steps each row through the fp64 recurrence on ``temporal``; everything is checked
against the fp64 step recurrence.
"""

import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import SPECS, TOL, rms_ratio
from helpers import step_oracle as _oracle_step

import replayssm as rs
from replayssm.integrations.trtllm.cache import ReplayMambaStates
from replayssm.integrations.trtllm.mixer import wire_gdn

SPEC = SPECS["gdn"]
HK, HV, K, V = SPEC.num_k_heads, SPEC.num_v_heads, SPEC.head_k_dim, SPEC.head_v_dim
LAYER_IDS = (0, 2)                    # model layer ids of the two GDN layers
OFFSETS = {0: 0, 2: 1}                # the cache manager's mamba_layer_offsets
S, PAD = 6, 5                         # slots; slot 5 is TRT-LLM's shared CUDA-graph padding slot
CALLS = []                            # TRT-LLM's own decode function's calls (unrouted states)


def fused_sigmoid_gating_delta_rule_update(**kwargs):
    """TRT-LLM's decode function, as the module global the layer calls; records its calls."""
    CALLS.append(kwargs["initial_state_source"])
    return kwargs["output"]


def formed(A_log, dt_bias, tok):
    """A token's raw TRT-LLM inputs in the recurrence's form (fp64), as TRT-LLM's kernel forms them."""
    q, k = (x.double() / (x.double().norm(dim=-1, keepdim=True) + 1e-6) for x in (tok["q"], tok["k"]))
    g = -A_log.double().exp() * torch.nn.functional.softplus(tok["a"].double() + dt_bias.double())
    return dict(q=q, k=k, v=tok["v"].double(), g=g, beta=torch.sigmoid(tok["b"].double()))


def step(state, A_log, dt_bias, tok):
    """One token of the fp64 step recurrence: state ``[HV, K, V]`` -> (o ``[HV, V]``, state)."""
    y, new = _oracle_step(SPEC, state[None], {n: x[None] for n, x in formed(A_log, dt_bias, tok).items()})
    return y[0], new[0]


class Qwen3NextGatedDeltaNet(torch.nn.Module):
    """The state handling of TRT-LLM's GDN layer (see the module docs). ``rows`` holds each request's
    tokens (dicts of q ``[T, HK, K]``, k, v ``[T, HV, V]``, a, b ``[T, HV]``)."""

    def __init__(self, layer_idx, A_log, dt_bias):
        super().__init__()
        self.layer_idx, self.A_log, self.dt_bias = layer_idx, A_log, dt_bias

    def forward_core(self, rows, attn_metadata, mamba_metadata):
        num_prefills = attn_metadata.num_contexts
        num_decodes = attn_metadata.seq_lens.shape[0] - num_prefills
        state_indices = mamba_metadata.state_indices[:num_prefills + num_decodes]
        ssm_states = attn_metadata.kv_cache_manager.mamba_layer_cache(self.layer_idx).temporal
        state_indices_p, state_indices_d = torch.split(state_indices, [num_prefills, num_decodes])
        if num_prefills > 0:
            ssm_states[state_indices_p] = 0.0          # new requests start from a zero state
        kwargs = dict(rows=rows, cache_indices=state_indices, state_indices_p=state_indices_p,
                      state_indices_d=state_indices_d, num_prefill=num_prefills, num_decodes=num_decodes,
                      query_start_loc_long=torch.arange(num_decodes + 1))
        if num_prefills > 0:
            return self.forward_extend(None, ssm_states, spec_metadata=None, intermediate_conv_states=None,
                                       intermediate_ssm_states=None, is_target_verify=False, output=None,
                                       **kwargs)
        output = torch.full((1, num_decodes, HV, V), float("nan"))
        return self.forward_decode(None, ssm_states, spec_metadata=None, intermediate_conv_states=None,
                                   intermediate_ssm_states=None, is_target_verify=False, output=output, **kwargs)

    def forward_decode(self, conv_states, ssm_states, query_start_loc_long, spec_metadata=None,
                       intermediate_conv_states=None, intermediate_ssm_states=None, is_target_verify=False,
                       output=None, **kwargs):
        cat = {n: torch.cat([r[n] for r in kwargs["rows"]]) for n in ("q", "k", "v", "a", "b")}
        n = cat["q"].shape[0]
        packed = torch.cat([cat["q"].flatten(1), cat["k"].flatten(1), cat["v"].flatten(1)], 1)  # like mixed_qkv
        ba = torch.cat([cat["b"], cat["a"]], 1)                                                  # like in_proj_ba
        return sys.modules[__name__].fused_sigmoid_gating_delta_rule_update(
            A_log=self.A_log, dt_bias=self.dt_bias,
            q=packed[:, :HK * K].view(1, n, HK, K), k=packed[:, HK * K:2 * HK * K].view(1, n, HK, K),
            v=packed[:, 2 * HK * K:].view(1, n, HV, V), a=ba[:, HV:], b=ba[:, :HV],
            initial_state_source=ssm_states, initial_state_indices=kwargs["cache_indices"],
            cu_seqlens=query_start_loc_long, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
            softplus_threshold=20.0, output=output)

    def forward_extend(self, conv_states, ssm_states, spec_metadata=None, intermediate_conv_states=None,
                       intermediate_ssm_states=None, is_target_verify=False, output=None, **kwargs):
        outs = []
        for slot, tokens in zip(kwargs["cache_indices"].tolist(), kwargs["rows"]):
            state = ssm_states[slot].transpose(-1, -2).double()             # [HV, K, V]
            for t in range(tokens["q"].shape[0]):
                y, state = step(state, self.A_log, self.dt_bias, {n: x[t] for n, x in tokens.items()})
                outs.append(y.float())
            ssm_states[slot] = state.transpose(-1, -2).float()
        return torch.stack(outs)[None]


@pytest.fixture(autouse=True)
def _restore_module_function():
    """wire_gdn replaces this module's decode function with its router: put TRT-LLM's back after."""
    original = sys.modules[__name__].fused_sigmoid_gating_delta_rule_update
    CALLS.clear()
    yield
    sys.modules[__name__].fused_sigmoid_gating_delta_rule_update = original
    CALLS.clear()


def _setup(seed=0, window=4):
    gen = torch.Generator().manual_seed(seed)
    temporal = torch.full((len(LAYER_IDS), S, HV, V, K), float("nan"))
    cfg = rs.ReplayConfig(window=window, ring_dtype="float32")
    states = ReplayMambaStates(SPEC, cfg, temporal, state_layout="vk", backend="reference", padding_slots=(PAD,))
    model = torch.nn.ModuleList([
        Qwen3NextGatedDeltaNet(i, torch.log(torch.rand(HV, generator=gen) * 0.5 + 0.01),
                               torch.randn(HV, generator=gen) - 3.0) for i in LAYER_IDS])
    manager = SimpleNamespace(mamba_layer_cache=lambda layer_idx: SimpleNamespace(temporal=temporal[OFFSETS[layer_idx]]))
    return gen, states, model, manager


def _tokens(gen, T):
    # small q, k: the L2 normalization's epsilon (TRT-LLM's x / (||x|| + 1e-6)) shows in the outputs
    return dict(q=torch.randn(T, HK, K, generator=gen) * 1e-4, k=torch.randn(T, HK, K, generator=gen) * 1e-4,
                v=torch.randn(T, HV, V, generator=gen), a=torch.randn(T, HV, generator=gen) * 2,
                b=torch.randn(T, HV, generator=gen))


def _forward(model, manager, slots, num_contexts, rows):
    meta = SimpleNamespace(num_contexts=num_contexts, seq_lens=torch.ones(len(slots)), kv_cache_manager=manager)
    mamba = SimpleNamespace(state_indices=torch.tensor(slots, dtype=torch.int32))
    return [layer.forward_core(rows[k], meta, mamba) for k, layer in enumerate(model)]


def test_gdn_decode_and_mixed_batches_through_trtllm_call_sites_match_step_recurrence():
    gen, states, model, manager = _setup()
    assert wire_gdn(model, states, layer_class=Qwen3NextGatedDeltaNet) == 2
    oracle = {}                                       # (layer, slot) -> fp64 state [HV, K, V]
    errs = []

    def batch(prefill, decode_slots):
        """prefill: {slot: prompt length}; then one token for each decode slot."""
        slots = list(prefill) + decode_slots
        rows = [[_tokens(gen, T) for T in prefill.values()] + [_tokens(gen, 1) for _ in decode_slots]
                for _ in model]
        outs = _forward(model, manager, slots, len(prefill), rows)
        for k, (layer, out) in enumerate(zip(model, outs)):
            out = out[0]
            pos = 0
            for slot, tokens in zip(slots, rows[k]):
                T = tokens["q"].shape[0]
                if slot in prefill:
                    oracle[k, slot] = torch.zeros(HV, K, V, dtype=torch.float64)
                if slot == PAD:
                    assert out[pos].eq(0).all()      # a padding row reads and writes nothing
                    pos += T
                    continue
                for t in range(T):
                    y, oracle[k, slot] = step(oracle[k, slot], layer.A_log, layer.dt_bias,
                                              {n: x[t] for n, x in tokens.items()})
                    if slot not in prefill:
                        errs.append(rms_ratio(out[pos], y))
                    pos += 1

    batch({0: 5, 1: 3}, [])                           # prefill two requests (chunked kernel)
    for _ in range(6):                                # decode them through replay (flushes at window 4)
        batch({}, [1, PAD, 0])
    batch({2: 4}, [0, 1])                             # a prefill beside decodes: rings folded, then emptied
    for _ in range(2):
        batch({}, [2, 0, 1, PAD])
    batch({1: 3}, [2, 0])                             # a new request in slot 1 (its ring held entries)
    for _ in range(5):
        batch({}, [2, 0, 1, PAD])
    assert len(errs) == 2 * (6 * 2 + 2 + 2 * 3 + 2 + 5 * 3) and max(errs) < TOL["float32"]
    for (k, s), state in oracle.items():              # every token is in the state
        assert rms_ratio(states.read_state(k, torch.tensor([s]))[0], state) < TOL["float32"]
    assert not CALLS                                  # TRT-LLM's own decode never ran on replay states


def test_gdn_router_and_refusals():
    gen, states, model, manager = _setup()
    wire_gdn(model, states, layer_class=Qwen3NextGatedDeltaNet)
    with pytest.raises(ValueError, match="already wired"):
        wire_gdn(model, states, layer_class=Qwen3NextGatedDeltaNet)
    other = torch.zeros(S, HV, V, K)              # a state tensor replay does not own: TRT-LLM's function
    routed = sys.modules[__name__].fused_sigmoid_gating_delta_rule_update
    tok = _tokens(gen, 1)
    out = torch.zeros(1, 1, HV, V)
    assert routed(A_log=model[0].A_log, a=tok["a"], dt_bias=model[0].dt_bias, softplus_beta=1.0,
                  softplus_threshold=20.0, q=tok["q"][None], k=tok["k"][None], v=tok["v"][None], b=tok["b"],
                  initial_state_source=other, initial_state_indices=torch.tensor([0]), output=out) is out
    assert len(CALLS) == 1 and CALLS[0] is other
    with pytest.raises(ValueError, match="is_target_verify: a speculative verify"):
        model[0].forward_decode(None, states.ssm_states[0], None, is_target_verify=True)
    with pytest.raises(ValueError, match="is_target_verify: a speculative verify"):
        model[0].forward_extend(None, states.ssm_states[0], is_target_verify=True)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected one token per request"):
        routed(A_log=model[0].A_log, a=tok["a"], dt_bias=model[0].dt_bias, softplus_beta=1.0,
               softplus_threshold=20.0, q=tok["q"][None], k=tok["k"][None], v=tok["v"][None], b=tok["b"],
               initial_state_source=states.ssm_states[0], initial_state_indices=torch.tensor([0]),
               cu_seqlens=torch.arange(3))
    with pytest.raises(ImportError, match="TensorRT-LLM 1.2.x is required"):
        wire_gdn(model, states)                   # TRT-LLM's own class: not installed here
