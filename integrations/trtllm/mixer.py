"""Replay at TensorRT-LLM's Mamba-2 call site (PyTorch backend; never run inside TensorRT-LLM).

Written against ``tensorrt_llm/_torch/modules/mamba/mamba2_mixer.py`` as read at NVIDIA/TensorRT-LLM
commit 02140fd (the 1.2.x module has the same plain-decode path). ``Mamba2Mixer.__init__`` picks its
state-update function once, ``self.selective_state_update_func`` (FlashInfer's or its own Triton
``selective_state_update``), and ``forward`` calls it on the decode rows with the
``selective_state_update`` convention (``replayssm.integrations.selective_state_update``):
``(ssm_states, x, dt, A, B, C, D, z=None, dt_bias=, dt_softplus=, state_batch_indices=, out=)``,
A, dt, D and dt_bias being einops ``repeat`` views (stride 0) of per-head values, ``ssm_states`` the
layer's ``kv_cache_manager.get_ssm_states(layer_idx)``. Prefill rows are written by
``mamba_chunk_scan_combined`` into ``ssm_states[state_indices[:num_contexts]]`` first.

:func:`wire_mamba2` routes the mixers of a built model to a :class:`~.cache.ReplayMambaStates`
(whose checkpoint IS the cache manager's ``temporal``): each mixer's ``selective_state_update_func``
becomes :func:`replay_selective_state_update` (a replay decode of that layer), and its ``forward``
empties the rings of the rows it prefilled. A target verify goes through the same function: at
02140fd ``forward`` (``is_target_verify``: a speculative cache manager and ``spec_metadata``) views
the decode rows as ``[num_decodes, T, ...]`` (T = ``spec_metadata.runtime_draft_len + 1``, each
request's tokens contiguous), rolls the conv windows forward by all T tokens and keeps each step's
window in ``layer_cache.intermediate_conv_window``, then calls ``selective_state_update_func`` with
``disable_state_update=True``, ``intermediate_states_buffer=layer_cache.intermediate_ssm``,
``cache_steps=T``: here a replay verify (the tokens go to the ring; no state and no per-draft
state is written: the buffer may have no rows). The commit after acceptance is
``cache_manager_class()``'s ``update_mamba_states`` (cursor move + TRT-LLM's conv-window copy).
TRT-LLM's stochastic rounding of an fp16 state (``rand_seed``, ``philox_rounds``) is replay's own there: the
``float16_sr`` checkpoint an fp16 ``ssm_cache_dtype`` gives rounds stochastically at every flush, from its
own counter-based bits, so the call is taken and its seed unused; any other checkpoint refuses it.

GDN (Qwen3-Next / Qwen3.5), written against ``tensorrt_llm/_torch/modules/mamba/gdn_mixer.py`` at
commit 0d4bd90: ``Qwen3NextGatedDeltaNet.forward_core`` sends a batch without prefills to
``forward_decode``, which calls the module-level ``fused_sigmoid_gating_delta_rule_update`` with the
raw gating inputs (``a``, ``b``, ``A_log``, ``dt_bias``), q / k / v as ``[1, N, heads, dim]`` views,
``initial_state_source`` the layer's ``temporal`` ``[slots, HV, V, K]`` (``state_layout="vk"``) and
``initial_state_indices`` the slots; a batch with prefills goes to ``forward_extend``, whose chunked
kernel writes the state of every row (decode rows included) in place. A target verify
(``is_target_verify``) takes the decode rows as ``[N, T, heads, dim]`` in either method and, where
``_can_use_flashinfer_gdn_verify(ssm_states, K, V, T)`` holds, calls the module-level
``_flashinfer_gdn_verify`` with the same raw inputs, the pool and the slots (otherwise a Triton kernel
on a gathered copy of the rows' states, which cannot be routed). :func:`wire_gdn` replaces those three
module-level names with routers (registered state tensors go to replay, others to TRT-LLM's
functions; the verify check holds for registered states) and wraps each layer's ``forward_extend``:
without a verify the decode rows' rings are folded into the state first (``flush``) and every
row's ring is emptied after (``refresh``); with one, only the prefill rows' rings are emptied
(the verify rows' rings hold their drafts until ``update_mamba_states`` commits).
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref

import torch

import replayssm

from ..selective_state_update import step_inputs
from .cache import ReplayMambaStates, import_trtllm

# the modules of TRT-LLM's Mamba-2 mixer and GDN layer
MIXER_MODULES = {"mamba2": ("tensorrt_llm._torch.modules.mamba.mamba2_mixer",),
                 "gdn": ("tensorrt_llm._torch.modules.mamba.gdn_mixer",)}
_BY_STATE: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, int]] = {}


def register(states: ReplayMambaStates) -> None:
    """Make every layer of ``states`` findable from its state tensor (``ssm_states[layer]``)."""
    if not isinstance(states, ReplayMambaStates):
        raise TypeError(f"states: expected a ReplayMambaStates, got {type(states).__name__}")
    for layer in range(states.ssm_states.shape[0]):
        view = states.ssm_states[layer]
        _BY_STATE[(view.data_ptr(), tuple(view.shape))] = (weakref.ref(states), layer)


def _find(ssm_states) -> tuple[ReplayMambaStates, int] | None:
    """``(states, layer)`` whose checkpoint of ``layer`` is ``ssm_states``, or None."""
    entry = _BY_STATE.get((ssm_states.data_ptr(), tuple(ssm_states.shape))) \
        if isinstance(ssm_states, torch.Tensor) else None
    states = entry[0]() if entry else None
    return None if states is None else (states, entry[1])


def lookup(ssm_states: torch.Tensor) -> tuple[ReplayMambaStates, int]:
    """``(states, layer)`` whose checkpoint of ``layer`` is ``ssm_states``; raises if none is registered."""
    found = _find(ssm_states)
    if found is None:
        raise ValueError("ssm_states: not a layer of a registered ReplayMambaStates' state tensor (wire_mamba2 "
                         "registers the one it routes to; the mixer must read the cache manager's temporal)")
    return found


def replay_selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                                  state_batch_indices=None, out=None, disable_state_update=False,
                                  intermediate_states_buffer=None, cache_steps=None, intermediate_state_indices=None,
                                  rand_seed=None, philox_rounds=None):
    """A Mamba-2 decode of a replay layer, with the arguments ``Mamba2Mixer`` passes.

    Args:
        state: ``get_ssm_states(layer_idx)`` of a registered ReplayMambaStates ``[slots, H, P, N]``.
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, out: as ``selective_state_update``
            (``replayssm.integrations.selective_state_update``); ``out`` ``[n, H, P]`` written in place.
        state_batch_indices: TRT-LLM's slots ``[n]``; its shared padding slots are padded rows.
        disable_state_update, cache_steps: a target verify's (``x [n, T, H, P]``, ``cache_steps`` = T):
            T tokens appended to the ring uncommitted, outputs ``[n, T, H, P]``; nothing else written.
        intermediate_states_buffer, intermediate_state_indices: TRT-LLM's per-draft states; never
            written (replay keeps no per-draft state; ``cache_manager_class()`` frees the buffer).
        rand_seed, philox_rounds: TRT-LLM's stochastic rounding of an fp16 state: unused with the ``float16_sr``
            checkpoint (it rounds stochastically itself, at every flush); refused with any other.
    Returns:
        ``out``.
    """
    states, layer = lookup(state)
    ckpt = states.pool.cfg.checkpoint_dtype
    if (rand_seed is not None or philox_rounds is not None) and ckpt != "float16_sr":
        raise ValueError(f"rand_seed: TRT-LLM's stochastic rounding of an fp16 state is replay's float16_sr "
                         f"checkpoint (an fp16 ssm_cache_dtype); this state's checkpoint is {ckpt}")
    is_verify, inputs = step_inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus=dt_softplus,
                                    state_batch_indices=state_batch_indices, out=out,
                                    disable_state_update=disable_state_update, cache_steps=cache_steps)
    step = states.verify if is_verify else states.decode
    return step(layer, state_batch_indices, out=out, **inputs)


def wire_mamba2(model: torch.nn.Module, states: ReplayMambaStates, *, mixer_class=None) -> int:
    """Route every ``Mamba2Mixer`` of ``model`` to ``states``; returns how many were routed.

    Args:
        model: a built TRT-LLM model (e.g. ``NemotronHForCausalLM``), weights loaded.
        states: replay over the cache manager's ``temporal`` (``cache_manager_class()``'s ``replay``).
        mixer_class: the mixer class to match; None: TRT-LLM's ``Mamba2Mixer`` (ImportError saying
            what to install without TensorRT-LLM).
    Each mixer's ``selective_state_update_func`` becomes :func:`replay_selective_state_update`; its
    ``forward`` then refreshes (``states.on_event("prefill", ...)``) the rows it prefilled (the first
    ``attn_metadata.num_contexts`` of ``mamba_metadata.state_indices``) in its own layer.
    """
    if mixer_class is None:
        mixer_class = import_trtllm(MIXER_MODULES["mamba2"], "wire_mamba2").Mamba2Mixer
    register(states)
    mixers = [m for m in model.modules() if isinstance(m, mixer_class)]
    for mixer in mixers:
        if getattr(mixer.forward, "replayssm_wired", False):
            raise ValueError(f"model: mixer of layer {mixer.layer_idx} is already wired to replay")
        _require_ssu(mixer)
        mixer.selective_state_update_func = replay_selective_state_update
        mixer.forward = types.MethodType(_resetting_prefills(type(mixer).forward), mixer)
    return len(mixers)


def route_mamba2_class(mixer_class) -> None:
    """Route every ``Mamba2Mixer`` built from now on (``executor.enable_replay``): its
    ``selective_state_update_func`` sends registered states to :func:`replay_selective_state_update`
    and others to the function TRT-LLM chose; ``forward`` resets the rings of the registered rows it
    prefilled."""
    if getattr(mixer_class.forward, "replayssm_wired", False):
        raise ValueError(f"mixer_class: {mixer_class.__name__} is already routed to replay")
    init = mixer_class.__init__

    @functools.wraps(init)
    def routed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _require_ssu(self)
        self.selective_state_update_func = _route(self.selective_state_update_func, replay_selective_state_update,
                                                  "state")

    mixer_class.__init__ = routed_init
    mixer_class.forward = _resetting_prefills(mixer_class.forward)


def _require_ssu(mixer) -> None:
    """The mixer calls its state update through ``selective_state_update_func`` (the seam replay
    routes); RuntimeError otherwise (TRT-LLM versions whose mixer picks per-phase kernels instead,
    which would keep writing the state past replay)."""
    if not callable(getattr(mixer, "selective_state_update_func", None)):
        raise RuntimeError(f"{type(mixer).__name__}: this TensorRT-LLM's Mamba-2 mixer has no "
                           "selective_state_update_func, the call site replay routes; its kernels would update "
                           "the state past replay, so it is not served")


def _resetting_prefills(forward):
    """``Mamba2Mixer.forward`` (unbound) that then empties the rings of the rows it prefilled (the
    first ``attn_metadata.num_contexts`` of ``mamba_metadata.state_indices``), if its layer's state is
    registered."""
    @functools.wraps(forward)
    def wired(self, hidden_states, attn_metadata, mamba_metadata, *args, **kwargs):
        out = forward(self, hidden_states, attn_metadata, mamba_metadata, *args, **kwargs)
        prefills = int(attn_metadata.num_contexts)
        found = _find(attn_metadata.kv_cache_manager.get_ssm_states(self.layer_idx)) if prefills else None
        if found:
            found[0].on_event("prefill", mamba_metadata.state_indices[:prefills], layer=found[1])
        return out
    wired.replayssm_wired = True
    return wired


def replay_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                                            initial_state_source, initial_state_indices, scale=None,
                                            use_qk_l2norm_in_kernel=False, cu_seqlens=None, output=None):
    """A GDN decode of a replay layer, with the arguments ``Qwen3NextGatedDeltaNet.forward_decode`` passes.

    Args:
        A_log, dt_bias: fp32 ``[HV]``; a, b: ``[N, HV]`` (row-strided views); the gating is formed
            here as TRT-LLM's kernel forms it: ``g = -exp(A_log) softplus(a + dt_bias)`` (softplus
            with ``softplus_beta``, linear above ``softplus_threshold``), ``beta = sigmoid(b)``.
        q, k: ``[1, N, HK, K]``; v: ``[1, N, HV, V]`` (one token per request); q and k are
            L2-normalized (``x / (||x|| + 1e-6)``) when ``use_qk_l2norm_in_kernel``: k before the
            ring, q as ``q_scale`` (q stays in its dtype, the factor applies to the outputs).
        initial_state_source: the layer's ``temporal`` of a registered ReplayMambaStates.
        initial_state_indices: TRT-LLM's slots ``[N]``; its shared padding slots are padded rows.
        scale: default ``K ** -0.5``. cu_seqlens: ``[N + 1]`` (one token per request, not read).
        output: ``[1, N, HV, V]``, written in place.
    Returns:
        ``[1, N, HV, V]`` (``output`` when given).
    """
    states, layer = lookup(initial_state_source)
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"q: expected TRT-LLM's decode view [1, N, HK, K], got {list(q.shape)}")
    n = q.shape[1]
    if cu_seqlens is not None and tuple(cu_seqlens.shape) != (n + 1,):
        raise ValueError(f"cu_seqlens: expected one token per request, [N + 1] = [{n + 1}], got "
                         f"{list(cu_seqlens.shape)}")
    out = None if output is None else output[0]
    y = states.decode(layer, initial_state_indices, out=out, scale=scale,
                      **_gdn_inputs(states, A_log, a, dt_bias, softplus_beta, softplus_threshold, q[0], k[0], v[0], b,
                                    use_qk_l2norm_in_kernel))
    return y.unsqueeze(0) if output is None else output


def replay_gdn_verify(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                      initial_state_indices, intermediate_states_buffer=None, scale=None,
                      use_qk_l2norm_in_kernel=False, output=None):
    """A GDN target verify of a replay layer, with the arguments ``forward_decode`` / ``forward_extend``
    pass ``_flashinfer_gdn_verify`` at 0d4bd90: the T tokens are appended to the ring uncommitted.

    Args:
        A_log, dt_bias, softplus_beta, softplus_threshold, use_qk_l2norm_in_kernel, scale: as
            :func:`replay_sigmoid_gating_delta_rule_update`.
        q, k: ``[N, T, HK, K]``; v: ``[N, T, HV, V]``; a, b: ``[N, T, HV]``.
        initial_state_source, initial_state_indices: the layer's ``temporal`` of a registered
            ReplayMambaStates and the rows' slots ``[N]`` (TRT-LLM's shared padding slots: padded rows).
        intermediate_states_buffer: TRT-LLM's per-draft states; never written.
        output: ``[N, T, HV, V]``, written in place.
    Returns:
        ``[N, T, HV, V]`` (``output`` when given).
    """
    states, layer = lookup(initial_state_source)
    if q.dim() != 4 or k.shape != q.shape or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q: expected TRT-LLM's verify views q, k [N, T, HK, K], v [N, T, HV, V], got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    return states.verify(layer, initial_state_indices, out=output, scale=scale,
                         **_gdn_inputs(states, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                                       use_qk_l2norm_in_kernel))


def _gdn_inputs(states, A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, use_qk_l2norm_in_kernel):
    """TRT-LLM's raw GDN inputs (any leading dims, the same for every input) as replay's step inputs,
    formed by ``replayssm.gating`` (one launch on the triton backend) as TRT-LLM's kernels form them:
    ``g = -exp(A_log) softplus(a + dt_bias)`` (softplus with ``softplus_beta``, linear above
    ``softplus_threshold``), ``beta = sigmoid(b)``; with ``use_qk_l2norm_in_kernel`` q and k
    L2-normalized as fla's kernels do (``x / (||x|| + 1e-6)``): k before the ring, q as ``q_scale``
    (q stays in its dtype, the factor applies to the outputs)."""
    lead, (HK, K), HV = q.shape[:-2], q.shape[-2:], a.shape[-1]

    def rows(name: str, t: torch.Tensor, *tail: int) -> torch.Tensor:
        try:
            return t.view(-1, *tail)
        except RuntimeError:
            raise ValueError(f"{name}: expected its leading dims viewable as one row axis (never copied), got "
                             f"shape {list(t.shape)}, strides {t.stride()}") from None

    made = replayssm.gating(states.pool, q=rows("q", q, HK, K), k=rows("k", k, HK, K), a=rows("a", a, HV),
                            b=rows("b", b, HV), A_log=A_log, dt_bias=dt_bias,
                            l2norm="fla" if use_qk_l2norm_in_kernel else None, softplus_beta=softplus_beta,
                            softplus_threshold=softplus_threshold)
    made = {name: t.view(*lead, *t.shape[1:]) for name, t in made.items()}
    return dict(made, q=q, v=v.to(states.pool.cfg.torch_ring_dtype))


def _route(original, replay, state: str):
    """``original`` (a TRT-LLM function) with the calls whose state tensor (keyword ``state``, else
    the first positional argument) is registered sent to ``replay``."""
    @functools.wraps(original)
    def routed(*args, **kwargs):
        return (replay if _find(kwargs[state] if state in kwargs else args[0]) else original)(*args, **kwargs)
    routed.replayssm_original = original
    return routed


def _no_other_decode(*args, **kwargs) -> bool:
    """``_can_use_flashinfer_gdn_decode`` for replay states: their decode is replay's (through
    ``fused_sigmoid_gating_delta_rule_update``), never FlashInfer's in-place update."""
    return False


def _replays_every_verify(*args, **kwargs) -> bool:
    """``_can_use_flashinfer_gdn_verify`` for replay states: their verify is replay's."""
    return True


def wire_gdn(model: torch.nn.Module, states: ReplayMambaStates, *, layer_class=None) -> int:
    """Route every ``Qwen3NextGatedDeltaNet`` of ``model`` to ``states``; returns how many were routed.

    Args:
        model: a built TRT-LLM model (e.g. ``Qwen3NextForCausalLM``), weights loaded.
        states: replay over the cache manager's ``temporal`` with ``state_layout="vk"``
            (``cache_manager_class()``'s ``replay``).
        layer_class: the GDN layer class to match; None: TRT-LLM's ``Qwen3NextGatedDeltaNet``
            (ImportError saying what to install without TensorRT-LLM). The module that defines it
            holds the ``fused_sigmoid_gating_delta_rule_update`` its ``forward_decode`` calls.
    The module's ``fused_sigmoid_gating_delta_rule_update``, ``_can_use_flashinfer_gdn_verify`` and
    ``_flashinfer_gdn_verify`` become routers (once per module): the layers of registered states
    decode through :func:`replay_sigmoid_gating_delta_rule_update` and verify through
    :func:`replay_gdn_verify`, any other state tensor through TRT-LLM's functions. Each layer's
    ``forward_extend`` folds its decode rows' rings into the state before TRT-LLM's chunked kernel
    runs and empties every row's ring after (in a verify, the prefill rows' only). A verify commits
    through ``cache_manager_class()``'s ``update_mamba_states``.
    """
    if layer_class is None:
        layer_class = import_trtllm(MIXER_MODULES["gdn"], "wire_gdn").Qwen3NextGatedDeltaNet
    layers = [m for m in model.modules() if isinstance(m, layer_class)]
    for layer in layers:
        if getattr(layer.forward_extend, "replayssm_wired", False):
            raise ValueError(f"model: GDN layer {layer.layer_idx} is already wired to replay")
    _route_gdn_module(sys.modules[layer_class.__module__])
    register(states)
    for layer in layers:
        layer.forward_extend = types.MethodType(_folding_around_extend(type(layer).forward_extend), layer)
    return len(layers)


def route_gdn_class(layer_class) -> None:
    """Route every ``Qwen3NextGatedDeltaNet`` (``executor.enable_replay``): its module's decode and verify
    functions (as :func:`wire_gdn`) and its ``forward_extend``, for the layers whose state is registered."""
    if getattr(layer_class.forward_extend, "replayssm_wired", False):
        raise ValueError(f"layer_class: {layer_class.__name__} is already routed to replay")
    _route_gdn_module(sys.modules[layer_class.__module__])
    layer_class.forward_extend = _folding_around_extend(layer_class.forward_extend)


def _route_gdn_module(module) -> None:
    routes = {"fused_sigmoid_gating_delta_rule_update": lambda f: _route(f, replay_sigmoid_gating_delta_rule_update,
                                                                         "initial_state_source"),
              "_can_use_flashinfer_gdn_verify": lambda f: _route(f, _replays_every_verify, "initial_state_source"),
              "_flashinfer_gdn_verify": lambda f: _route(f, replay_gdn_verify, "initial_state_source")}
    missing = [name for name in routes if getattr(module, name, None) is None]
    if missing:
        raise ValueError(f"layer_class: its module {module.__name__} has no {', '.join(missing)} to route (written "
                         "against TRT-LLM 0d4bd90)")
    # later TRT-LLM modules step decode rows through kernels these routes do not reach, unless turned off: a
    # mixed batch's decode rows through the recurrent decode inside forward_extend (whose rings the extend's
    # refresh would then empty), and a standard decode as a PDL pair with the conv (gdn_decode_pdl_update)
    if getattr(module, "_MIXED_DECODE_RECURRENT", False):
        raise RuntimeError(f"{module.__name__}: a mixed batch's decode rows bypass replay's routes; set "
                           "TLLM_GDN_MIXED_DECODE_RECURRENT=0 before TensorRT-LLM is imported")
    if hasattr(module, "can_use_gdn_decode_pdl_pair") and os.environ.get("TRTLLM_GDN_DISABLE_PDL_DECODE_PAIR") != "1":
        raise RuntimeError(f"{module.__name__}: its PDL decode pair (gdn_decode_pdl_update) bypasses replay's "
                           "routes; set TRTLLM_GDN_DISABLE_PDL_DECODE_PAIR=1")
    if getattr(module, "_can_use_flashinfer_gdn_decode", None) is not None:
        routes["_can_use_flashinfer_gdn_decode"] = lambda f: _route(f, _no_other_decode, "initial_state_source")
    for name, route in routes.items():
        if not hasattr(getattr(module, name), "replayssm_original"):
            setattr(module, name, route(getattr(module, name)))


def _folding_around_extend(forward_extend):
    """``forward_extend`` (unbound) of a GDN layer, its registered state's rings folded and reset around it."""
    @functools.wraps(forward_extend)
    def wired(self, conv_states, ssm_states, *args, is_target_verify=False, **kwargs):
        found = _find(ssm_states)
        if found is None:
            return forward_extend(self, conv_states, ssm_states, *args, is_target_verify=is_target_verify, **kwargs)
        states, layer = found
        if is_target_verify:              # the verify rows' rings hold their drafts: only prefills reset
            rows = kwargs["state_indices_p"]
        else:                             # the chunked kernel steps the decode rows from the state
            if kwargs["num_decodes"] > 0:
                states.on_event("extend start", kwargs["state_indices_d"], layer=layer)
            rows = kwargs["cache_indices"]
        out = forward_extend(self, conv_states, ssm_states, *args, is_target_verify=is_target_verify, **kwargs)
        states.on_event("extend end", rows, layer=layer)
        return out
    wired.replayssm_wired = True
    return wired
