"""TRT-LLM's GDN call sites routed to replay (``wire_gdn``), on the CPU.

TensorRT-LLM cannot be installed here, so ``Qwen3NextGatedDeltaNet`` below re-enacts what its state
handling does, as read at NVIDIA/TensorRT-LLM commit 0d4bd90 (``_torch/modules/mamba/gdn_mixer.py``):
``forward_core`` splits prefill and decode rows and sends a batch with prefills to ``forward_extend``
(whose chunked kernel writes every row's state in place, decode rows included) and a decode-only
batch to ``forward_decode``, which calls the module-level ``fused_sigmoid_gating_delta_rule_update``
with TRT-LLM's keywords (raw gating ``a``, ``b``, ``A_log``, ``dt_bias``; ``[1, N, heads, dim]`` q / k / v;
the layer's ``temporal`` ``[slots, HV, V, K]``). Projections, conv and norm are left out. The chunked
kernel's stand-in steps each row through the fp64 recurrence on ``temporal``; everything is checked
against the fp64 step recurrence. A target verify (``spec_metadata`` and a speculative manager)
takes the decode rows as ``[N, T, heads, dim]`` in either method and calls the module-level
``_flashinfer_gdn_verify`` on the pool and the slots where ``_can_use_flashinfer_gdn_verify`` holds,
else the Triton kernel ``fused_recurrent_gated_delta_rule_update`` on a gathered copy of the rows'
states (here a recorder: replay must never reach it); the conv windows are left out (the Mamba-2
tests cover their commit).
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
CALLS = []                            # TRT-LLM's own kernels' calls (unrouted states)


def fused_sigmoid_gating_delta_rule_update(**kwargs):
    """TRT-LLM's decode function, as the module global the layer calls; records its calls."""
    CALLS.append(kwargs["initial_state_source"])
    return kwargs["output"]


def _can_use_flashinfer_gdn_verify(initial_state_source, head_k_dim, head_v_dim, draft_token_num):
    """TRT-LLM's check for its FlashInfer verify (a bf16 state among other things): false here."""
    return initial_state_source.dtype == torch.bfloat16


def _flashinfer_gdn_verify(**kwargs):
    CALLS.append(kwargs["initial_state_source"])
    return kwargs["output"]


def fused_recurrent_gated_delta_rule_update(**kwargs):
    """TRT-LLM's Triton verify kernel, on a gathered copy of the rows' states (unroutable)."""
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

    def forward_core(self, rows, attn_metadata, mamba_metadata, spec_metadata=None):
        num_prefills = attn_metadata.num_contexts
        num_decodes = attn_metadata.seq_lens.shape[0] - num_prefills
        state_indices = mamba_metadata.state_indices[:num_prefills + num_decodes]
        manager = attn_metadata.kv_cache_manager
        layer_cache = manager.mamba_layer_cache(self.layer_idx)
        ssm_states = layer_cache.temporal
        state_indices_p, state_indices_d = torch.split(state_indices, [num_prefills, num_decodes])
        if num_prefills > 0:                           # new requests start from a zero state, a later chunk
            fresh = ~mamba_metadata.has_initial_states[:num_prefills]    # of a prompt from the state so far
            ssm_states[state_indices_p[fresh]] = 0.0
        is_target_verify = num_decodes > 0 and spec_metadata is not None and manager.is_speculative()
        ssm_buffer = layer_cache.intermediate_ssm if is_target_verify else None
        kwargs = dict(rows=rows, cache_indices=state_indices, state_indices_p=state_indices_p,
                      state_indices_d=state_indices_d, num_prefill=num_prefills, num_decodes=num_decodes,
                      query_start_loc_long=torch.arange(num_decodes + 1))
        tokens = sum(r["q"].shape[0] for r in rows[num_prefills:])
        if num_prefills > 0:
            return self.forward_extend(None, ssm_states, spec_metadata=spec_metadata, intermediate_conv_states=None,
                                       intermediate_ssm_states=ssm_buffer, is_target_verify=is_target_verify,
                                       output=None, **kwargs)
        output = torch.full((1, tokens, HV, V), float("nan"))
        return self.forward_decode(None, ssm_states, spec_metadata=spec_metadata, intermediate_conv_states=None,
                                   intermediate_ssm_states=ssm_buffer, is_target_verify=is_target_verify,
                                   output=output, **kwargs)

    def _verify(self, ssm_states, slots, rows, intermediate_ssm_states, T, output):
        """The decode rows' verify: FlashInfer's function on the pool where TRT-LLM's check allows it,
        else the Triton kernel on a gathered copy of the rows' states."""
        assert intermediate_ssm_states is not None      # TRT-LLM asserts the per-draft buffer exists
        n = len(rows)
        cat = {name: torch.stack([r[name] for r in rows]) for name in ("q", "k", "v", "a", "b")}
        module = sys.modules[__name__]
        output_d = output.view(n, T, HV, V)
        if module._can_use_flashinfer_gdn_verify(ssm_states, K, V, T):
            return module._flashinfer_gdn_verify(
                A_log=self.A_log, a=cat["a"], dt_bias=self.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
                q=cat["q"], k=cat["k"], v=cat["v"], b=cat["b"], initial_state_source=ssm_states,
                initial_state_indices=slots[:n], intermediate_states_buffer=intermediate_ssm_states[:n],
                scale=K ** -0.5, use_qk_l2norm_in_kernel=True, output=output_d).view(1, n * T, HV, V)
        return module.fused_recurrent_gated_delta_rule_update(
            q=cat["q"], k=cat["k"], v=cat["v"], initial_state_source=ssm_states[slots[:n]],
            initial_state_indices=torch.arange(n), use_qk_l2norm_in_kernel=True, disable_state_update=True,
            intermediate_states_buffer=intermediate_ssm_states, cache_steps=T, output=output_d).view(1, n * T, HV, V)

    def forward_decode(self, conv_states, ssm_states, query_start_loc_long, spec_metadata=None,
                       intermediate_conv_states=None, intermediate_ssm_states=None, is_target_verify=False,
                       output=None, **kwargs):
        if is_target_verify:
            return self._verify(ssm_states, kwargs["cache_indices"], kwargs["rows"], intermediate_ssm_states,
                                spec_metadata.runtime_draft_len + 1, output)
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
        stepped = kwargs["state_indices_p"] if is_target_verify else kwargs["cache_indices"]
        for slot, tokens in zip(stepped.tolist(), kwargs["rows"]):
            state = ssm_states[slot].transpose(-1, -2).double()             # [HV, K, V]
            for t in range(tokens["q"].shape[0]):
                y, state = step(state, self.A_log, self.dt_bias, {n: x[t] for n, x in tokens.items()})
                outs.append(y.float())
            ssm_states[slot] = state.transpose(-1, -2).float()
        if is_target_verify:
            T = spec_metadata.runtime_draft_len + 1
            decode_rows = kwargs["rows"][kwargs["num_prefill"]:]
            output_d = torch.full((1, len(decode_rows) * T, HV, V), float("nan"))
            outs.extend(self._verify(ssm_states, kwargs["state_indices_d"], decode_rows, intermediate_ssm_states, T,
                                     output_d)[0])
        return torch.stack(outs)[None]


@pytest.fixture(autouse=True)
def _restore_module_function():
    """wire_gdn replaces this module's TRT-LLM functions with its routers: put TRT-LLM's back after."""
    module = sys.modules[__name__]
    names = ("fused_sigmoid_gating_delta_rule_update", "_can_use_flashinfer_gdn_verify", "_flashinfer_gdn_verify")
    originals = {name: getattr(module, name) for name in names}
    CALLS.clear()
    yield
    for name, fn in originals.items():
        setattr(module, name, fn)
    CALLS.clear()


def _setup(seed=0, window=4, drafts=0):
    gen = torch.Generator().manual_seed(seed)
    temporal = torch.full((len(LAYER_IDS), S, HV, V, K), float("nan"))
    cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts, ring_dtype="float32")
    states = ReplayMambaStates(SPEC, cfg, temporal, state_layout="vk", backend="reference", padding_slots=(PAD,))
    model = torch.nn.ModuleList([
        Qwen3NextGatedDeltaNet(i, torch.log(torch.rand(HV, generator=gen) * 0.5 + 0.01),
                               torch.randn(HV, generator=gen) - 3.0) for i in LAYER_IDS])
    # cache_manager_class()'s speculative buffers: no per-draft SSM rows
    no_rows = torch.empty(len(LAYER_IDS), 0, drafts + 1, HV, V, K) if drafts else None
    def layer_cache(layer_idx):
        off = OFFSETS[layer_idx]
        return SimpleNamespace(temporal=temporal[off], intermediate_ssm=None if no_rows is None else no_rows[off])

    manager = SimpleNamespace(mamba_layer_cache=layer_cache, is_speculative=lambda: drafts > 0)
    return gen, states, model, manager


def _tokens(gen, T):
    # small q, k: the L2 normalization's epsilon (TRT-LLM's x / (||x|| + 1e-6)) shows in the outputs
    return dict(q=torch.randn(T, HK, K, generator=gen) * 1e-4, k=torch.randn(T, HK, K, generator=gen) * 1e-4,
                v=torch.randn(T, HV, V, generator=gen), a=torch.randn(T, HV, generator=gen) * 2,
                b=torch.randn(T, HV, generator=gen))


def _forward(model, manager, slots, num_contexts, rows, spec_metadata=None, continuing=()):
    """One step of ``model``; prefill rows whose slot is in ``continuing`` are a later chunk of their
    prompt (TRT-LLM's ``has_initial_states``)."""
    meta = SimpleNamespace(num_contexts=num_contexts, seq_lens=torch.ones(len(slots)), kv_cache_manager=manager)
    mamba = SimpleNamespace(state_indices=torch.tensor(slots, dtype=torch.int32),
                            has_initial_states=torch.tensor([s in continuing for s in slots]))
    return [layer.forward_core(rows[k], meta, mamba, spec_metadata) for k, layer in enumerate(model)]


def test_gdn_decode_and_mixed_batches_through_trtllm_call_sites_match_step_recurrence(monkeypatch):
    """Replay's outputs and states at TRT-LLM's call sites against the fp64 recurrence; the inputs are
    formed by the pool backend's gating (``replayssm.gating`` with fla's normalisation)."""
    from replayssm.kernels import backend_reference
    gen, states, model, manager = _setup()
    assert wire_gdn(model, states, layer_class=Qwen3NextGatedDeltaNet) == 2
    original, gated = backend_reference.gating, []
    monkeypatch.setattr(backend_reference, "gating",
                        lambda pool, **kw: gated.append((pool, kw["l2norm"])) or original(pool, **kw))
    oracle = {}                                       # (layer, slot) -> fp64 state [HV, K, V]
    errs = []

    def batch(prefill, decode_slots, continuing=()):
        """prefill: {slot: prompt length} (a later chunk of its prompt for a slot in ``continuing``); then one
        token for each decode slot."""
        slots = list(prefill) + decode_slots
        rows = [[_tokens(gen, T) for T in prefill.values()] + [_tokens(gen, 1) for _ in decode_slots]
                for _ in model]
        outs = _forward(model, manager, slots, len(prefill), rows, continuing=continuing)
        for k, (layer, out) in enumerate(zip(model, outs)):
            out = out[0]
            pos = 0
            for slot, tokens in zip(slots, rows[k]):
                T = tokens["q"].shape[0]
                if slot in prefill and slot not in continuing:
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
    batch({1: 2}, [2, 0], continuing={1})             # its prompt's second chunk, from the state so far
    for _ in range(5):
        batch({}, [2, 0, 1, PAD])
    assert len(errs) == 2 * (6 * 2 + 2 + 2 * 3 + 2 + 2 + 5 * 3) and max(errs) < TOL["float32"]
    for (k, s), state in oracle.items():              # every token is in the state
        assert rms_ratio(states.read_state(k, torch.tensor([s]))[0], state) < TOL["float32"]
    assert not CALLS                                  # TRT-LLM's own decode never ran on replay states
    assert gated and all(entry == (states.pool, "fla") for entry in gated)


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
    module = sys.modules[__name__]
    assert module._can_use_flashinfer_gdn_verify(states.ssm_states[0], K, V, 3)   # replay takes every verify
    assert not module._can_use_flashinfer_gdn_verify(other, K, V, 3)             # TRT-LLM's check otherwise
    # by its parameter's name too (TRT-LLM's is initial_state_source)
    assert module._can_use_flashinfer_gdn_verify(initial_state_source=states.ssm_states[0], head_k_dim=K,
                                                 head_v_dim=V, draft_token_num=3)
    assert not module._can_use_flashinfer_gdn_verify(initial_state_source=other, head_k_dim=K, head_v_dim=V,
                                                     draft_token_num=3)
    verify_tok = {n: x[None].expand(1, 2, *x.shape[1:]) for n, x in tok.items()}  # [N=1, T=2, ...]
    assert module._flashinfer_gdn_verify(
        A_log=model[0].A_log, a=verify_tok["a"], dt_bias=model[0].dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=verify_tok["q"], k=verify_tok["k"], v=verify_tok["v"], b=verify_tok["b"], initial_state_source=other,
        initial_state_indices=torch.tensor([0]), intermediate_states_buffer=None, scale=None,
        use_qk_l2norm_in_kernel=True, output=out) is out
    assert len(CALLS) == 2 and CALLS[1] is other
    with pytest.raises(ValueError, match=r"q: expected TRT-LLM's verify views"):
        module._flashinfer_gdn_verify(
            A_log=model[0].A_log, a=tok["a"], dt_bias=model[0].dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=tok["q"], k=tok["k"], v=tok["v"], b=tok["b"], initial_state_source=states.ssm_states[0],
            initial_state_indices=torch.tensor([0]), intermediate_states_buffer=None, scale=None,
            use_qk_l2norm_in_kernel=True, output=None)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected one token per request"):
        routed(A_log=model[0].A_log, a=tok["a"], dt_bias=model[0].dt_bias, softplus_beta=1.0,
               softplus_threshold=20.0, q=tok["q"][None], k=tok["k"][None], v=tok["v"][None], b=tok["b"],
               initial_state_source=states.ssm_states[0], initial_state_indices=torch.tensor([0]),
               cu_seqlens=torch.arange(3))
    with pytest.raises(ImportError, match="TensorRT-LLM 1.2.x is required"):
        wire_gdn(model, states)                   # TRT-LLM's own class: not installed here


def test_gdn_verify_through_trtllm_call_sites_matches_step_recurrence():
    """Target verifies of T = 3 (random acceptance, TRT-LLM's padding row) through both methods'
    verify paths, committed by ``update_mamba_states``, across flushes (window 4), with prefills
    beside verifies: every verify output against the fp64 recurrence from the committed state, and
    TRT-LLM's own verify kernels never run on replay states."""
    T = 3
    gen, states, model, manager = _setup(drafts=T - 1, seed=4)
    wire_gdn(model, states, layer_class=Qwen3NextGatedDeltaNet)
    spec = SimpleNamespace(runtime_draft_len=T - 1)
    oracle, errs = {}, []

    def batch(prefill, verify_slots):
        """prefill: {slot: prompt length}; then T tokens for each verify slot."""
        slots = list(prefill) + verify_slots
        rows = [[_tokens(gen, n) for n in prefill.values()] + [_tokens(gen, T) for _ in verify_slots]
                for _ in model]
        outs = _forward(model, manager, slots, len(prefill), rows, spec if verify_slots else None)
        accepted = torch.randint(1, T + 1, (len(verify_slots),), generator=gen)
        for k, (layer, out) in enumerate(zip(model, outs)):
            out, pos = out[0], 0
            for slot, tokens in zip(slots, rows[k]):
                n = tokens["q"].shape[0]
                if slot in prefill:
                    oracle[k, slot] = torch.zeros(HV, K, V, dtype=torch.float64)
                    for t in range(n):
                        _, oracle[k, slot] = step(oracle[k, slot], layer.A_log, layer.dt_bias,
                                                  {name: x[t] for name, x in tokens.items()})
                    pos += n
                    continue
                if slot == PAD:
                    assert out[pos:pos + T].eq(0).all()     # a padding row reads and writes nothing
                    pos += T
                    continue
                state = oracle[k, slot]
                for t in range(T):
                    y, state = step(state, layer.A_log, layer.dt_bias, {name: x[t] for name, x in tokens.items()})
                    errs.append(rms_ratio(out[pos], y))
                    pos += 1
                    if t + 1 == accepted[verify_slots.index(slot)]:
                        oracle[k, slot] = state
        if verify_slots:
            meta = SimpleNamespace(num_contexts=len(prefill), num_seqs=len(slots))
            states.update_mamba_states(meta, torch.cat([torch.ones(len(prefill)), accepted]).int(),
                                       torch.tensor(slots))

    batch({0: 5, 1: 3}, [])                           # prefill two requests (chunked kernel)
    for _ in range(5):                                # verify them (forward_decode's path) across flushes
        batch({}, [1, PAD, 0])
    batch({2: 4}, [0, 1])                             # a prefill beside verifies (forward_extend's path)
    for _ in range(4):
        batch({}, [2, 0, PAD, 1])
    assert len(errs) == 2 * T * (5 * 2 + 2 + 4 * 3) and max(errs) < TOL["float32"]
    for (k, s), state in oracle.items():              # every accepted token is in the state
        assert rms_ratio(states.read_state(k, torch.tensor([s]))[0], state) < TOL["float32"]
    assert not CALLS                                  # TRT-LLM's own kernels never ran on replay states


def test_gdn_inputs_refuse_leading_dims_that_would_need_a_copy():
    from replayssm.integrations.trtllm import mixer
    _, states, _, _ = _setup()
    q = torch.randn(3, 2, HK, K).transpose(0, 1)             # [N, T, HK, K] whose rows are not one axis
    k, v = torch.randn(2, 3, HK, K), torch.randn(2, 3, HV, V)
    a, b = torch.randn(2, 3, HV), torch.randn(2, 3, HV)
    with pytest.raises(ValueError, match="q: expected its leading dims viewable as one row axis"):
        mixer._gdn_inputs(states, torch.zeros(HV), a, torch.zeros(HV), 1.0, 20.0, q, k, v, b, True)
    made = mixer._gdn_inputs(states, torch.zeros(HV), a, torch.zeros(HV), 1.0, 20.0, q.contiguous(), k, v, b, True)
    assert made["k"].shape == (2, 3, HK, K) and made["q_scale"].shape == (2, 3, HK) and made["g"].shape == (2, 3, HV)
