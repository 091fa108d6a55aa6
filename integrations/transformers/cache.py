"""ReplayCache: transformers' DynamicCache with the recurrent state of the Mamba-2 / GDN / KDA
layers in a replayssm StatePool.

The model's own code keeps everything else: projections, convolutions (their states stay in
the DynamicCache), gates, norms, attention. Only the function each recurrent layer calls for
its state update and readout is routed: inside ``cache.routing()`` the modeling module's
one-token function (the cached-decode path) becomes ``replayssm.decode`` and its multi-token
function, once the state lives in the pool, ``replayssm.verify``. Calls with any other state
(the prefill, other caches) go to transformers' own function.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin

import replayssm as rs


@dataclass(frozen=True)
class Family:
    """Where a transformers model family keeps its recurrent layer and the functions it calls."""

    kind: str      # replayssm family: "mamba2", "gdn" or "kda"
    module: str    # the transformers modeling module
    mixer: str     # the recurrent layer's class in that module
    step: str      # module function for one cached token: (state, ...) -> y
    chunk: str     # module function for several tokens: (..., initial state, ...) -> (y, state)
    step_state: str   # name of the state argument of ``step``
    chunk_state: str  # name of the state argument of ``chunk``


FAMILIES = {
    "nemotron_h": Family("mamba2", "transformers.models.nemotron_h.modeling_nemotron_h", "NemotronHMamba2Mixer",
                         "mamba2_selective_state_update", "mamba2_chunk_scan", "state", "initial_states"),
    "qwen3_next": Family("gdn", "transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet",
                         "torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule",
                         "initial_state", "initial_state"),
    "qwen3_5_text": Family("gdn", "transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet",
                           "torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule",
                           "initial_state", "initial_state"),
    "kimi_linear": Family("kda", "transformers.models.kimi_linear.modeling_kimi_linear", "KimiLinearDeltaAttention",
                          "recurrent_kimi_delta_attention", "chunk_kimi_delta_attention",
                          "initial_state", "initial_state"),
}


def family_of(config) -> Family:
    """The Family of a model config; ValueError for a model type without recurrent layers we route."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model: expected a model of type {tuple(FAMILIES)}, got {model_type!r}")
    return FAMILIES[model_type]


def layer_spec(config) -> rs.LayerSpec:
    """The replayssm LayerSpec of the recurrent layers of ``config`` (NemotronH, Qwen3-Next, Qwen3.5, KimiLinear)."""
    kind = family_of(config).kind
    if kind == "mamba2":
        return rs.LayerSpec.mamba2(num_heads=config.mamba_num_heads, head_dim=config.mamba_head_dim,
                                   state_dim=config.ssm_state_size, num_groups=config.n_groups)
    if kind == "gdn":
        return rs.LayerSpec.gdn(num_k_heads=config.linear_num_key_heads, num_v_heads=config.linear_num_value_heads,
                                head_k_dim=config.linear_key_head_dim, head_v_dim=config.linear_value_head_dim)
    return rs.LayerSpec.kda(num_k_heads=config.linear_num_heads, num_v_heads=config.linear_num_heads,
                            head_k_dim=config.linear_head_dim, head_v_dim=config.linear_head_dim)


def _per_head(name: str, t: torch.Tensor | None, dims: int) -> torch.Tensor | None:
    """``t`` without its last ``dims`` axes, over which the Mamba-2 mixer broadcasts it (stride 0)."""
    if t is None:
        return None
    if any(t.stride(-1 - i) != 0 and t.shape[-1 - i] > 1 for i in range(dims)):
        raise ValueError(f"{name}: expected a per-head value broadcast over its last {dims} axes (stride 0), "
                         f"got shape {list(t.shape)} with strides {list(t.stride())}")
    return t[(Ellipsis,) + (0,) * dims]


def _dense(**inputs) -> dict:
    """The step inputs with contiguous tensors (the Triton kernels take a dense last axis; the
    model hands over views of its projections)."""
    return {name: t.contiguous() if isinstance(t, torch.Tensor) else t for name, t in inputs.items()}


class ReplayCache(DynamicCache):
    """A DynamicCache whose recurrent layers keep their state in ``self.pool`` (a StatePool).

    Pool layer ``j`` is the model's ``j``-th recurrent layer (``self.layer_map``: model layer
    index -> pool layer). The prefill runs the model's own code; the final state it hands to
    ``update_recurrent_state`` (fp32 ``[B, H, P, N]`` or ``[B, HV, K, V]``) is written into the
    pool with ``pool.write_state`` and the cache keeps a handle (int64 ``[B]``) in its place, so
    no recurrent state is kept or written outside the pool.

    Args:
        model: a NemotronH, Qwen3-Next, Qwen3.5 (text) or KimiLinear model of transformers (any head).
        cfg: the pool's ReplayConfig. With ``max_draft_tokens > 0`` the cache records past
            convolution states so that ``commit`` can drop rejected tokens.
        batch_size: sequences in a batch (one pool slot each).
        backend: the pool's backend: "auto" (Triton kernels on CUDA, the reference elsewhere),
            "reference" or "triton".

    Run the model inside ``with cache.routing():``. With drafts in play, call
    ``commit(num_accepted)`` after every forward.
    """

    def __init__(self, model, cfg: rs.ReplayConfig, *, batch_size: int, backend: str = "auto"):
        self.family = family_of(getattr(model, "config", None))
        super().__init__(config=model.config)
        self.spec = layer_spec(model.config)
        mixer = getattr(importlib.import_module(self.family.module), self.family.mixer)
        indices = sorted(m.layer_idx for m in model.modules() if isinstance(m, mixer))
        if not indices:
            raise ValueError(f"model: no {self.family.mixer} layers found")
        self.layer_map = {idx: j for j, idx in enumerate(indices)}
        device = next(model.parameters()).device
        self.pool = rs.StatePool(self.spec, cfg, num_layers=len(indices), num_slots=batch_size,
                                 device=device, backend=backend)
        self.slots = self.pool.alloc(batch_size)
        self._handles: list[torch.Tensor | None] = [None] * len(indices)
        self._epoch0 = torch.zeros(len(indices), batch_size, dtype=torch.int64)
        self._appended = 0          # ring entries appended, summed over layers and sequences
        self._last_tokens = 0       # tokens of the last forward not yet committed
        self._last_verify = False
        self._records_past = cfg.max_draft_tokens > 0
        if self._records_past:
            self.activate_past_recording()

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0,
                               **kwargs) -> torch.Tensor:
        """Recurrent layers: the first state (the prefill's) goes into the pool; later ones are the
        handle the routed functions returned and change nothing. Other layers: as DynamicCache."""
        j = self.layer_map.get(layer_idx)
        if j is None:
            return super().update_recurrent_state(recurrent_states, layer_idx, state_idx, **kwargs)
        layer = self.layers[layer_idx]
        if self._handles[j] is not None:
            return self._handles[j]
        self.pool.write_state(j, self.slots, recurrent_states.to(self.pool.device, torch.float32))
        self._epoch0[j] = self.pool.cursors["epoch"][j, self.slots].cpu()
        handle = self.slots.clone()
        self._handles[j] = handle
        layer.recurrent_states[state_idx] = handle
        layer.is_recurrent_states_initialized[state_idx] = True
        return handle

    @contextlib.contextmanager
    def routing(self):
        """Route the modeling module's recurrent functions through the pool while inside."""
        module = importlib.import_module(self.family.module)
        originals = {name: getattr(module, name) for name in (self.family.step, self.family.chunk)}
        setattr(module, self.family.step, self._router(originals[self.family.step], self.family.step_state,
                                                       verify=False))
        setattr(module, self.family.chunk, self._router(originals[self.family.chunk], self.family.chunk_state,
                                                        verify=True))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(module, name, fn)

    def commit(self, num_accepted: int) -> None:
        """Keep the first ``num_accepted`` (1..T) tokens of the last forward of T tokens, the same
        count for every sequence (transformers crops its caches uniformly).

        Commits the pool's verify in every recurrent layer (T > 1; a one-token forward was a
        committed decode) and crops the attention keys / values and the recorded conv states of
        the rest. Needs a cache built with ``cfg.max_draft_tokens > 0``.
        """
        if not self._records_past:
            raise ValueError("commit: the cache was built with max_draft_tokens=0; nothing to roll back")
        T = self._last_tokens
        if T == 0:
            raise ValueError("commit: no forward since the last commit")
        if not isinstance(num_accepted, int) or isinstance(num_accepted, bool) or not 1 <= num_accepted <= T:
            raise ValueError(f"num_accepted: expected an int in 1..{T}, got {num_accepted!r}")
        if self._last_verify:
            self.pool.commit(self.slots, torch.full((self.slots.numel(),), num_accepted, dtype=torch.int64))
        for layer in self.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin) and not any(layer.is_conv_states_initialized.values()):
                continue  # a layer without conv state (e.g. an MLP block of NemotronH)
            layer.crop(num_accepted - T)
        self._last_tokens = 0

    def state_bytes_written(self) -> float:
        """Bytes of recurrent state written since the prefill, over all layers and sequences:
        checkpoint (+ read copy) at every flush plus every ring entry appended (drafts included)."""
        sizes = self.pool.bytes_per_slot()
        entry = sizes["ring"] / self.pool.cfg.capacity
        return self.checkpoint_writes() * (sizes["checkpoint"] + sizes["read_copy"]) + self._appended * entry

    def checkpoint_writes(self) -> int:
        """Checkpoint writes (flushes) since the prefill, over all layers and sequences."""
        return int((self.pool.cursors["epoch"][:, self.slots].cpu().long() - self._epoch0).sum())

    def _pool_layer(self, state) -> int | None:
        for j, handle in enumerate(self._handles):
            if state is handle and handle is not None:
                return j
        return None

    def _router(self, original, state_name: str, *, verify: bool):
        signature = inspect.signature(original)
        run = self._mamba2 if self.family.kind == "mamba2" else self._delta

        def routed(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            j = self._pool_layer(bound.arguments.get(state_name))
            if j is None:
                return original(*args, **kwargs)
            return run(j, bound.arguments, verify=verify)

        return routed

    def _count(self, tokens: int, verify: bool) -> None:
        self._appended += tokens * self.slots.numel()
        self._last_tokens, self._last_verify = tokens, verify

    def _mamba2(self, j: int, a: dict, *, verify: bool):
        """``mamba2_selective_state_update`` (x ``[B, H, P]``; dt, D, dt_bias broadcast over P;
        A over P, N) or ``mamba2_chunk_scan`` (x ``[B, T, H, P]``, dt ``[B, T, H]``, A, D,
        dt_bias ``[H]``) through the pool; returns y like the function it replaces.

        Follows the decode step's semantics (softplus(dt + dt_bias), no ``dt_limit`` clamp)."""
        if not a.get("dt_softplus"):
            raise ValueError("dt_softplus: replayssm applies softplus to dt + dt_bias; got dt_softplus=False")
        if verify:
            x = a["hidden_states"]
            y = rs.verify(self.pool, j, self.slots, **_dense(x=x, dt=a["dt"], A=a["A"], B=a["B"], C=a["C"],
                                                             D=a.get("D"), dt_bias=a.get("dt_bias")))
            self._count(x.shape[1], True)
            return (y, self._handles[j]) if a.get("return_final_states") else y
        y = rs.decode(self.pool, j, self.slots, **_dense(
            x=a["hidden_states"], dt=_per_head("dt", a["dt"], 1), A=_per_head("A", a["A"], 2), B=a["B"], C=a["C"],
            D=_per_head("D", a.get("D"), 1), dt_bias=_per_head("dt_bias", a.get("dt_bias"), 1), z=a.get("z")))
        self._count(1, False)
        return y

    def _delta(self, j: int, a: dict, *, verify: bool):
        """GDN / KDA recurrent or chunk function (q, k ``[B, T, heads, K]``, v ``[B, T, HV, V]``,
        g ``[B, T, HV]`` or ``[B, T, HV, K]``, beta ``[B, T, HV]``) through the pool; returns
        ``(o [B, T, HV, V] in q's dtype, handle or None)`` like the function it replaces."""
        module = importlib.import_module(self.family.module)
        q, k = a["query"].float(), a["key"].float()
        if a.get("use_qk_l2norm_in_kernel"):
            q, k = module.l2norm(q, dim=-1, eps=1e-6), module.l2norm(k, dim=-1, eps=1e-6)
        # layers with grouped value heads repeat_interleave q, k to HV heads; keep one per key head
        group = q.shape[2] // self.spec.num_k_heads
        q, k = q[:, :, ::group], k[:, :, ::group]
        inputs = dict(q=q, k=k.to(self.pool.cfg.torch_ring_dtype), v=a["value"], g=a["g"].float(),
                      beta=a["beta"].float())
        T = q.shape[1]
        if verify:
            o = rs.verify(self.pool, j, self.slots, scale=self.spec.head_k_dim ** -0.5, **_dense(**inputs))
        else:
            o = rs.decode(self.pool, j, self.slots, scale=self.spec.head_k_dim ** -0.5,
                          **_dense(**{name: t[:, 0] for name, t in inputs.items()})).unsqueeze(1)
        self._count(T, verify)
        return o.to(a["query"].dtype), (self._handles[j] if a.get("output_final_state") else None)
