"""Replay for TensorRT-LLM's PyTorch backend: SSM-state bookkeeping over TRT-LLM's own state tensor.

TensorRT-LLM installs only on CUDA machines (no CPU wheels) and has never run with this; it is written
against its published names, read at NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py``
(commit 00bce92; 1.2.x keeps the module at this path, later versions under ``kv_cache/``):

- ``BaseMambaCacheManager.get_ssm_states(layer_idx)``: ``[slots, num_heads, head_dim, d_state]``;
  ``PythonMambaCacheManager.State.temporal``: every layer's, ``[layers, slots, ...]``;
  ``get_state_indices()``: each request's slot.
- ``update_mamba_states(attn_metadata, num_accepted_tokens, state_indices)``, called by the spec
  workers after acceptance: rows ``[attn_metadata.num_contexts, attn_metadata.num_seqs)`` are the
  generation requests; ``num_accepted_tokens`` counts the verified token plus accepted drafts
  (1..T), i.e. the verify tokens to keep.
- Call sites (``_torch/modules/mamba/``): ``Mamba2Mixer`` plain decode ``selective_state_update``,
  verify ``replay_selective_state_update`` (``mamba2_mixer.py``); ``Qwen3NextGatedDeltaNet``
  plain decode ``fused_sigmoid_gating_delta_rule_update`` and verify ``_replay_verify_recurrent``
  (``gdn_mixer.py``, commit 0d4bd90, whose decode kernel reads the state as ``[slots, HV, V, K]``,
  K innermost: ``state_layout="vk"``). TRT-LLM's GDN kernels form the
  gating (``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``) and L2-normalize q, k
  inside; ``decode`` / ``verify`` here take them formed.

:class:`ReplayMambaStates` adds what TRT-LLM's own replay lacks: plain-decode
replay, a configurable window L, the precision split (fp32 / fp16-SR / bf16 checkpoint with an
fp8 / NVFP4 read copy), and the spec commit as a cursor move. The checkpoint IS TRT-LLM's state
tensor (wrapped, never copied): TRT-LLM's prefill kernels keep writing it, then
:meth:`~ReplayMambaStates.refresh` empties those slots' rings. Each TRT-LLM event the call sites
see takes one of its verbs (``EVENTS``, ``ReplayMambaStates.on_event``). Its methods are plain and
run on a CPU with the reference backend; :func:`cache_manager_class` ties them to TRT-LLM's
``PythonMambaCacheManager`` (imported lazily; never run).
"""

from __future__ import annotations

import dataclasses
import importlib
import os

import torch

import replayssm as rs

# where TRT-LLM keeps its Python mamba manager, newest layout first (``pyexecutor/mamba_cache_manager.py`` at
# 00bce92; then one ``kv_cache/mamba_cache_manager.py`` module, as at 003f8d0; later a
# ``kv_cache/mamba_cache_manager`` package, whose ``legacy`` module builds it by name, as at 2829508)
MANAGER_MODULES = ("tensorrt_llm._torch.pyexecutor.kv_cache.mamba_cache_manager.legacy",
                   "tensorrt_llm._torch.pyexecutor.kv_cache.mamba_cache_manager",
                   "tensorrt_llm._torch.pyexecutor.mamba_cache_manager")
# TRT-LLM's events at the call sites (``mixer``) -> the ReplayMambaStates verb each takes: ``flush``
# folds the rows' rings into TRT-LLM's state before its kernels read it, ``refresh`` empties them
# after its kernels wrote it
EVENTS = {
    "prefill": "refresh",            # Mamba2Mixer.forward prefilled its first num_contexts rows
    "extend start": "flush",         # a GDN forward_extend steps its decode rows from the state
    "extend end": "refresh",         # the GDN forward_extend wrote its rows' state
}
INSTALL_HINT = ("TensorRT-LLM 1.2.x is required: pip install tensorrt-llm==1.2.1 --extra-index-url "
                "https://pypi.nvidia.com (Linux, Python 3.10 / 3.12); the PyPI package alone is a placeholder")


def import_trtllm(names: tuple[str, ...], caller: str):
    """The first of TRT-LLM's modules ``names`` that imports; ImportError naming ``caller`` and saying
    what to install when none does."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            error = e
    raise ImportError(f"replayssm.integrations.trtllm.{caller}: {INSTALL_HINT} ({error})") from error


class ReplayMambaStates:
    """Replay state of every SSM layer of a model, its checkpoint being TRT-LLM's state tensor.

    Args:
        spec, cfg: layer dims and replay configuration (``cfg.checkpoint_dtype`` must be the
            dtype of ``ssm_states``: TRT-LLM's ``mamba_ssm_cache_dtype``; ``float16_sr`` for fp16).
        ssm_states: TRT-LLM's ``temporal`` ``[num_layers, num_slots, *state]`` (any strides),
            read and written in place. Mamba-2 ``[.., H, P, N]``; GDN / KDA ``[.., HV, K, V]``
            (``state_layout="kv"``) or ``[.., HV, V, K]`` ("vk").
        backend: StatePool backend ("auto": Triton kernels on CUDA, the reference elsewhere).
        padding_slots: TRT-LLM's shared dummy slots (``_padding_slot`` of the CUDA-graph padding
            sentinels, ``_attention_dp_dummy_slot``): several rows of a batch may carry one, so
            their rows are padding (-1: output zero, nothing read or written).

    Slots are TRT-LLM's (``state_indices``, int on the state's device); every slot counts as
    allocated. ``layer`` is TRT-LLM's local index (``mamba_layer_offsets[layer_idx]``).
    Buffers: ``pool`` (a :class:`replayssm.StatePool`: read copy, rings, cursors).

    On the Triton backend every method runs with ``checked=False``: no device value is read on
    the host, so TRT-LLM's CUDA graphs can capture the steps. Its slots are distinct within a
    step, but for the shared padding slots, which become padded rows.
    """

    def __init__(self, spec: rs.LayerSpec, cfg: rs.ReplayConfig, ssm_states: torch.Tensor, *,
                 state_layout: str = "kv", backend: str = "auto", padding_slots: tuple = ()):
        if not isinstance(ssm_states, torch.Tensor) or ssm_states.dim() != 5:
            raise ValueError("ssm_states: expected TRT-LLM's temporal state tensor [layers, slots, *state], got "
                             f"{type(ssm_states).__name__} {list(getattr(ssm_states, 'shape', []))}")
        self.ssm_states = ssm_states
        self.pool = rs.StatePool(spec, cfg, num_layers=ssm_states.shape[0], num_slots=ssm_states.shape[1],
                                 device=ssm_states.device, backend=backend, checkpoint=ssm_states,
                                 state_layout=state_layout)
        self.pool.allocated.fill_(True)  # TRT-LLM's resource manager assigns the slots
        bad = [p for p in padding_slots if not isinstance(p, int) or not 0 <= p < ssm_states.shape[1]]
        if bad:
            raise ValueError(f"padding_slots: expected slot indices in [0, {ssm_states.shape[1]}), got {bad[0]!r}")
        self.padding_slots = torch.tensor(padding_slots, dtype=torch.int64, device=ssm_states.device)
        self.checked = not self.pool.backend_ops.supports_unchecked

    def _rows(self, state_indices: torch.Tensor) -> torch.Tensor:
        """int64 slots with TRT-LLM's shared padding slots as -1."""
        if not isinstance(state_indices, torch.Tensor) or state_indices.dim() != 1 \
                or state_indices.dtype.is_floating_point or state_indices.dtype == torch.bool:
            raise ValueError("state_indices: expected a 1-d int tensor, got "
                             f"{getattr(state_indices, 'dtype', type(state_indices).__name__)} "
                             f"{list(getattr(state_indices, 'shape', []))}")
        idx = state_indices.to(torch.int64)
        return torch.where(torch.isin(idx, self.padding_slots), torch.full_like(idx, -1), idx)

    def get_ssm_states(self, layer: int) -> torch.Tensor:
        """TRT-LLM's state tensor of ``layer`` ``[slots, *state]`` (for its prefill kernels)."""
        self.pool.check_layer(layer)
        return self.ssm_states[layer]

    def on_event(self, event: str, state_indices: torch.Tensor, *, layer: int | None = None) -> None:
        """TRT-LLM's ``event`` (an ``EVENTS`` key) on ``state_indices``: its verb, in ``layer`` or
        every layer."""
        getattr(self, EVENTS[event])(state_indices, layer=layer)

    def refresh(self, state_indices: torch.Tensor, *, layer: int | None = None) -> None:
        """TRT-LLM wrote the state of ``state_indices`` (prefill, new request, copy): empty their
        rings and re-derive their read copy, in ``layer`` or every layer."""
        self.pool.refresh(self._rows(state_indices), layer=layer, checked=self.checked)

    def decode(self, layer: int, state_indices: torch.Tensor, *, out: torch.Tensor | None = None,
               **inputs) -> torch.Tensor:
        """One token per request through ``layer`` (``replayssm.decode``): ``[n, heads, dim]``."""
        return rs.decode(self.pool, layer, self._rows(state_indices), out=out, checked=self.checked, **inputs)

    def verify(self, layer: int, state_indices: torch.Tensor, *, out: torch.Tensor | None = None,
               **inputs) -> torch.Tensor:
        """T tokens per request through ``layer``, uncommitted (``replayssm.verify``): ``[n, T, heads, dim]``."""
        return rs.verify(self.pool, layer, self._rows(state_indices), out=out, checked=self.checked, **inputs)

    def update_mamba_states(self, attn_metadata, num_accepted_tokens: torch.Tensor,
                            state_indices: torch.Tensor) -> None:
        """TRT-LLM's commit after acceptance, for every layer: a cursor move, no state copy.

        Args:
            attn_metadata: has ``num_contexts`` and ``num_seqs`` (rows in between are generations).
            num_accepted_tokens: int ``[>= num_seqs]``: tokens to keep of each request's verify (1..T).
            state_indices: int ``[>= num_seqs]``: each request's slot.
        """
        lo, hi = int(attn_metadata.num_contexts), int(attn_metadata.num_seqs)
        for name, t in (("num_accepted_tokens", num_accepted_tokens), ("state_indices", state_indices)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] < hi:
                raise ValueError(f"{name}: expected a 1-d tensor of at least num_seqs={hi} rows, got "
                                 f"{list(getattr(t, 'shape', []))}")
        if hi > lo:
            self.pool.commit(self._rows(state_indices[lo:hi]), num_accepted_tokens[lo:hi], checked=self.checked)

    def flush(self, state_indices: torch.Tensor, *, layer: int | None = None) -> None:
        """Fold the committed rings of ``state_indices`` into TRT-LLM's state tensor, in ``layer`` or
        every layer (before TRT-LLM reads or copies it: its prefill kernels, prefix cache,
        disaggregated transfer). Afterwards that tensor is the state."""
        self.pool.flush(self._rows(state_indices), layer=layer, checked=self.checked)

    def read_state(self, layer: int, state_indices: torch.Tensor) -> torch.Tensor:
        """fp32 state after every committed token ``[n, *state]`` (canonical layout); nothing changes."""
        return self.pool.read_state(layer, self._rows(state_indices))


def commit_conv_windows(conv: torch.Tensor, intermediate_conv_window: torch.Tensor, attn_metadata,
                        num_accepted_tokens: torch.Tensor, state_indices: torch.Tensor,
                        src_state_indices: torch.Tensor) -> None:
    """TRT-LLM's conv-state commit after acceptance, as its ``update_mamba_states`` does it (read
    at 00bce92): generation row ``r`` of the verify kept the window after each of its T tokens in
    ``intermediate_conv_window[:, src_state_indices[r], t]``; the window after its accepted tokens
    becomes its slot's conv state, in every layer. Rows of TRT-LLM's shared padding slots are
    copied like the others, as TRT-LLM does (their windows feed only discarded outputs), so that
    nothing depends on a device value's count (no host synchronization, CUDA-graph safe).

    Args:
        conv: ``[layers, slots, conv_dim, width - 1]``, updated in place.
        intermediate_conv_window: ``[layers, rows, T, conv_dim, width - 1]``.
        attn_metadata, num_accepted_tokens, state_indices: as :meth:`ReplayMambaStates.update_mamba_states`.
        src_state_indices: int ``[>= num_seqs - num_contexts]``, the generation rows' entries of
            ``intermediate_conv_window`` (TRT-LLM's ``intermediate_state_indices``, an arange).
    """
    lo, hi = int(attn_metadata.num_contexts), int(attn_metadata.num_seqs)
    if hi == lo:
        return
    steps = num_accepted_tokens[lo:hi].long() - 1
    conv[:, state_indices[lo:hi].long()] = intermediate_conv_window[:, src_state_indices[:hi - lo].long(), steps]


# TRT-LLM's SSM cache dtype -> the replay checkpoint stored in it
_CHECKPOINT_OF = {dtype: name for name, dtype in rs.spec.CHECKPOINT_DTYPES.items()}


def layer_spec(model_type: str, temporal: torch.Tensor, conv: torch.Tensor) -> rs.LayerSpec:
    """A rank's layer dims from TRT-LLM's state tensors (``PythonMambaCacheManager`` at 00bce92):
    ``nemotron_hybrid`` (Mamba-2) ``temporal [layers, slots, H, P, N]``, conv channels ``H P + 2 G N``;
    ``qwen3_next`` (GDN) ``temporal [layers, slots, HV, V, K]``, conv channels ``2 HK K + HV V``."""
    if model_type not in ("nemotron_hybrid", "qwen3_next"):
        raise ValueError(f"model_type: replay serves nemotron_hybrid (Mamba-2) and qwen3_next (GDN), "
                         f"got {model_type!r}")
    heads, dim, state = temporal.shape[2:]
    groups, rest = divmod(conv.shape[2] - heads * dim, 2 * state)
    if rest or groups < 1:
        raise ValueError(f"conv: {conv.shape[2]} channels do not fit {heads} x {dim} and groups of 2 x {state}")
    if model_type == "nemotron_hybrid":
        return rs.LayerSpec.mamba2(num_heads=heads, head_dim=dim, state_dim=state, num_groups=groups)
    return rs.LayerSpec.gdn(num_k_heads=groups, num_v_heads=heads, head_k_dim=state, head_v_dim=dim)


def cache_manager_class(base=None, *, defaults: dict | None = None):
    """TRT-LLM's ``PythonMambaCacheManager`` with replay on its ``temporal`` tensor (never run inside TRT-LLM).

    The returned class takes TRT-LLM's constructor arguments plus ``replay_spec``, ``replay_cfg``
    and ``replay_state_layout`` keywords, and holds a :class:`ReplayMambaStates` as ``replay``
    (its padding slots: TRT-LLM's ``_padding_slot`` and ``_attention_dp_dummy_slot``).
    A speculative manager (``speculative_num_draft_tokens``) keeps TRT-LLM's conv-window buffer
    and drops its per-draft SSM states (``intermediate_ssm``, replaced by a tensor of no rows after
    TRT-LLM's constructor allocated it: the replay verify writes no state); its ``update_mamba_states``
    commits by a cursor move and TRT-LLM's conv-window copy (:meth:`ReplayMambaStates.update_mamba_states`,
    :func:`commit_conv_windows`). ``replay_cfg.max_draft_tokens`` must cover
    ``speculative_num_draft_tokens``. Refused: TRT-LLM's own replay (``use_replay_state_update``)
    and ``TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP=1`` (its MTP op bypasses ``selective_state_update_func``).

    Args:
        base: the class to extend; None imports TRT-LLM's (ImportError saying what to install
            without TensorRT-LLM).
        defaults: ``ReplayConfig`` fields for a manager built without ``replay_cfg``, as TRT-LLM's own
            executor builds it once ``executor.enable_replay`` put this class in its place: the layer
            dims then come from the state tensors (:func:`layer_spec`), the checkpoint dtype from
            ``ssm_cache_dtype``, ``max_draft_tokens`` from ``speculative_num_draft_tokens``, the layout
            from ``model_type`` (``qwen3_next``: "vk"), and TRT-LLM's own replay is turned off.
    """
    if base is None:
        base = import_trtllm(MANAGER_MODULES, "cache_manager_class").PythonMambaCacheManager

    class ReplayPythonMambaCacheManager(base):
        replayssm_defaults = defaults

        def __init__(self, *args, replay_spec=None, replay_cfg=None, replay_state_layout=None, **kwargs):
            auto = replay_cfg is None
            if auto and defaults is None:
                raise ValueError("replay_cfg: expected a replayssm.ReplayConfig")
            if auto:
                kwargs["use_replay_state_update"] = False     # replayssm's replay replaces TRT-LLM's own
            elif kwargs.get("use_replay_state_update"):
                raise ValueError("use_replay_state_update: TRT-LLM's own replay and replayssm's cannot share the "
                                 "state; leave it False (TRTLLM_USE_MAMBA_REPLAY=0)")
            if os.environ.get("TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP") == "1":
                raise ValueError("TRTLLM_MAMBA2_MTP_USE_CUSTOM_OP=1: TRT-LLM's MTP op bypasses the routed "
                                 "selective_state_update_func; unset it")
            drafts = kwargs.get("speculative_num_draft_tokens")
            if not auto and drafts is not None and drafts > replay_cfg.max_draft_tokens:
                raise ValueError(f"replay_cfg: max_draft_tokens={replay_cfg.max_draft_tokens} cannot hold a verify "
                                 f"of speculative_num_draft_tokens={drafts} drafts")
            super().__init__(*args, **kwargs)
            ssm = getattr(self.mamba_cache, "intermediate_ssm", None)
            if ssm is not None:                       # no rows: TRT-LLM's GDN verify asserts the buffer exists
                empty = ssm.new_empty((ssm.shape[0], 0, *ssm.shape[2:]))
                self.mamba_cache = dataclasses.replace(self.mamba_cache, intermediate_ssm=empty)
                del ssm
                torch.cuda.empty_cache()
            model_type = kwargs.get("model_type", "nemotron_hybrid")
            temporal = self.mamba_cache.temporal
            if auto:
                if temporal.dtype not in _CHECKPOINT_OF:
                    raise ValueError(f"ssm_cache_dtype: replay keeps its checkpoint in float32, bfloat16 or float16, "
                                     f"got {temporal.dtype}")
                replay_cfg = rs.ReplayConfig(**{**defaults, "checkpoint_dtype": _CHECKPOINT_OF[temporal.dtype],
                                                "max_draft_tokens": max(defaults.get("max_draft_tokens", 0),
                                                                        drafts or 0)})
            spec = replay_spec or layer_spec(model_type, temporal, self.mamba_cache.conv)
            layout = replay_state_layout or ("vk" if model_type == "qwen3_next" else "kv")
            pads = tuple(p for p in (self._padding_slot, self._attention_dp_dummy_slot) if p is not None)
            self.replay = ReplayMambaStates(spec, replay_cfg, temporal, state_layout=layout, padding_slots=pads)

        def shutdown(self):
            # TRT-LLM empties its state tensors here, so that their memory is freed while references to
            # the manager remain (the memory estimation's manager, before the serving one is built): the
            # replay state over them (ring, read copy, the layer registry's entries) goes with them
            self.replay = None
            super().shutdown()

        def update_mamba_states(self, attn_metadata, num_accepted_tokens, state_indices=None,
                                accepted_leaf_positions=None):
            # TRT-LLM's facade (MambaCacheManager) passes these by position: the first two, then
            # state_indices in later versions, then accepted_leaf_positions (tree verify) in the latest
            if accepted_leaf_positions is not None:
                raise ValueError("accepted_leaf_positions: tree verify is not wired to replay")
            if state_indices is None:                 # TRT-LLM versions whose signature has none
                state_indices = self.state_indices
            self.replay.update_mamba_states(attn_metadata, num_accepted_tokens, state_indices)
            commit_conv_windows(self.mamba_cache.conv, self.mamba_cache.intermediate_conv_window, attn_metadata,
                                num_accepted_tokens, state_indices, self.intermediate_state_indices)

    return ReplayPythonMambaCacheManager
