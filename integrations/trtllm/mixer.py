"""Replay at TensorRT-LLM's Mamba-2 call site (PyTorch backend; TensorRT-LLM never ran here).

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
empties the rings of the rows it prefilled. Plain decode only, like ``cache_manager_class``: a
verify (``disable_state_update=True``) is refused, since TRT-LLM's spec commit also rolls back conv
windows, which is not wired. TRT-LLM's own stochastic rounding (``rand_seed``) is refused: use the
``float16_sr`` checkpoint.
"""

from __future__ import annotations

import functools
import weakref

import torch

from ..selective_state_update import step_inputs
from .cache import INSTALL_HINT, ReplayMambaStates

_BY_STATE: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, int]] = {}


def register(states: ReplayMambaStates) -> None:
    """Make every layer of ``states`` findable from its state tensor (``ssm_states[layer]``)."""
    if not isinstance(states, ReplayMambaStates):
        raise TypeError(f"states: expected a ReplayMambaStates, got {type(states).__name__}")
    for layer in range(states.ssm_states.shape[0]):
        view = states.ssm_states[layer]
        _BY_STATE[(view.data_ptr(), tuple(view.shape))] = (weakref.ref(states), layer)


def lookup(ssm_states: torch.Tensor) -> tuple[ReplayMambaStates, int]:
    """``(states, layer)`` whose checkpoint of ``layer`` is ``ssm_states``; raises if none is registered."""
    entry = _BY_STATE.get((ssm_states.data_ptr(), tuple(ssm_states.shape))) \
        if isinstance(ssm_states, torch.Tensor) else None
    states = entry[0]() if entry else None
    if states is None:
        raise ValueError("ssm_states: not a layer of a registered ReplayMambaStates' state tensor (wire_mamba2 "
                         "registers the one it routes to; the mixer must read the cache manager's temporal)")
    return states, entry[1]


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
        disable_state_update, intermediate_states_buffer, cache_steps, intermediate_state_indices:
            a verify's; refused (plain decode only).
        rand_seed, philox_rounds: TRT-LLM's stochastic rounding; refused.
    Returns:
        ``out``.
    """
    states, layer = lookup(state)
    if disable_state_update or intermediate_states_buffer is not None:
        raise ValueError("disable_state_update: a speculative verify through Mamba2Mixer is not wired to replay "
                         "(TRT-LLM's spec commit also rolls back the conv windows); serve plain decode")
    if rand_seed is not None or philox_rounds is not None:
        raise ValueError("rand_seed: TRT-LLM's stochastic rounding cannot run under replay; use the float16_sr "
                         "replay checkpoint (mamba_ssm_stochastic_rounding off)")
    _, inputs = step_inputs(x, dt, A, B, C, D, z, dt_bias, dt_softplus=dt_softplus,
                            state_batch_indices=state_batch_indices, out=out, disable_state_update=False,
                            cache_steps=None)
    return states.decode(layer, state_batch_indices, out=out, **inputs)


def wire_mamba2(model: torch.nn.Module, states: ReplayMambaStates, *, mixer_class=None) -> int:
    """Route every ``Mamba2Mixer`` of ``model`` to ``states``; returns how many were routed.

    Args:
        model: a built TRT-LLM model (e.g. ``NemotronHForCausalLM``), weights loaded.
        states: replay over the cache manager's ``temporal`` (``cache_manager_class()``'s ``replay``).
        mixer_class: the mixer class to match; None: TRT-LLM's ``Mamba2Mixer`` (ImportError saying
            what to install without TensorRT-LLM).
    Each mixer's ``selective_state_update_func`` becomes :func:`replay_selective_state_update`; its
    ``forward`` then calls ``states.after_prefill`` on the rows it prefilled (the first
    ``attn_metadata.num_contexts`` of ``mamba_metadata.state_indices``) in its own layer.
    """
    if mixer_class is None:
        try:
            from tensorrt_llm._torch.modules.mamba.mamba2_mixer import Mamba2Mixer as mixer_class
        except ImportError as e:
            raise ImportError(f"replayssm.integrations.trtllm.wire_mamba2: {INSTALL_HINT} ({e})") from e
    register(states)
    mixers = [m for m in model.modules() if isinstance(m, mixer_class)]
    for mixer in mixers:
        if getattr(mixer.forward, "replayssm_wired", False):
            raise ValueError(f"model: mixer of layer {mixer.layer_idx} is already wired to replay")
        mixer.selective_state_update_func = replay_selective_state_update
        mixer.forward = _refresh_after_prefill(mixer, mixer.forward)
    return len(mixers)


def _refresh_after_prefill(mixer, forward):
    @functools.wraps(forward)
    def wired(hidden_states, attn_metadata, mamba_metadata, *args, **kwargs):
        out = forward(hidden_states, attn_metadata, mamba_metadata, *args, **kwargs)
        prefills = int(attn_metadata.num_contexts)
        if prefills:
            states, layer = lookup(attn_metadata.kv_cache_manager.get_ssm_states(mixer.layer_idx))
            states.after_prefill(mamba_metadata.state_indices[:prefills], layer=layer)
        return out
    wired.replayssm_wired = True
    return wired
