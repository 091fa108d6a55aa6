"""Replay state inside SGLang's mamba pool (``MambaPool`` of sglang 0.5.17 and 0.5.23).

``ReplayMambaPool`` is the class the plugin puts in ``HybridReqToTokenPool.mamba_pool_cls``.
SGLang's own ``temporal`` tensor (its checkpoint dtype; Mamba-2 ``[layers, size + 1, H, P, N]``,
GDN / KDA ``[layers, size + 1, HV, V, K]``, used through a transposed view) is the
replay checkpoint, wrapped without a copy by one ``replayssm.StatePool`` per mamba pool; the
ring, cursors and read copy are the StatePool's and follow every slot event SGLang issues:

| SGLang event | replay side |
|---|---|
| ``clear_slots`` (fresh slot, zeroed state) | cursors reset, read copy re-derived |
| ``copy_from`` (COW on a radix hit, no_buffer copy for the tree) | source flushed first, destination cursors reset and read copy re-derived |
| ``get_cpu_copy`` (host tier / transfer) | slots flushed first, so the copy is the whole state |
| ``load_cpu_copy`` | cursors reset, read copy re-derived |
| int8 radix store (``MambaCheckpointPool.store_from_active``, ``--enable-int8-mamba-checkpoint``) | active slots flushed first |
| int8 radix hit (``MambaCheckpointPool.load_to_active``: the copy-on-write) | active slots' cursors reset, read copy re-derived |
| HiCache backup (``MambaPoolHost.backup_from_device_all_layer``, ``before_host_backup``) | slots flushed first, on the transfer stream |
| HiCache load (``MambaPoolHost.load_to_device_per_layer``, ``after_host_load``) | that layer's cursors reset and read copy re-derived, before the layer's completion event |
| an extend about to read ``temporal`` as its rows' initial states (``before_extend``, mixer / backend hook) | those rows' rings folded first: a mixed batch's decode rows ride along as one-token extends |
| prefill writing ``temporal`` (``after_prefill``, called by the mixer / backend hook) | cursors of that layer reset, read copy re-derived |
| PD disaggregation, decode side: a transferred request's first batch (``ScheduleBatch.prepare_for_prebuilt``, ``after_transfer``) | cursors reset, read copy re-derived from the state the prefill server sent |
| a finished request's slot donated to the radix tree (``flush_for_tree``, called by the ``MambaComponent`` hook) | slot flushed first |

Slot allocation stays SGLang's (``MambaSlotAllocator``); every pool slot is open to the
StatePool. Slot ``-1`` is SGLang's padding row, as in replayssm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref

import torch

from replayssm import LayerSpec, ReplayConfig, StatePool
from replayssm.pool import side_bytes_per_slot

from . import versions

_BY_STATE: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, int]] = {}


def layer_spec(cache_params) -> LayerSpec:
    """The per-rank ``LayerSpec`` of SGLang's cache parameters (TP-sharded dims).

    KDA has its own parameters (``is_kda``). SGLang describes Mamba-2 and GDN layers with the same
    ``Mamba2StateShape``; GDN models record their q/k/v conv blocks in ``conv_shard_groups``,
    Mamba-2 models do not. GDN / KDA: temporal is ``(HV, V, K)`` and ``num_k_heads_per_tp`` is HK.
    Mamba-2: temporal is ``(H, P, N)`` and the conv state ``(H*P + 2*G*N, K-1)``, so the local
    group count is ``(conv_dim - H*P) / (2N)``. The backend check in ``hooks`` refuses a model
    whose layers are not of the family found here.
    """
    shape = cache_params.shape
    if 0 in shape.temporal:
        raise ValueError(f"cache_params: temporal {tuple(shape.temporal)} is empty (no recurrent state, e.g. a "
                         "short-conv model); replay does not apply, serve it without --replay-ssm")
    if getattr(cache_params, "is_kda", False):
        hv, v, k = shape.temporal
        return LayerSpec.kda(num_k_heads=shape.num_k_heads_per_tp, num_v_heads=hv, head_k_dim=k, head_v_dim=v)
    if shape.conv_shard_groups is not None:
        hv, v, k = shape.temporal
        return LayerSpec.gdn(num_k_heads=shape.num_k_heads_per_tp, num_v_heads=hv, head_k_dim=k, head_v_dim=v)
    H, P, N = shape.temporal
    conv_dim = shape.conv[0][0]
    groups, rest = divmod(conv_dim - H * P, 2 * N)
    if rest or groups <= 0:
        raise ValueError(f"cache_params: conv dim {conv_dim} is not H*P + 2*G*N for temporal {(H, P, N)}; "
                         "not a Mamba-2 layer")
    return LayerSpec.mamba2(num_heads=H, head_dim=P, state_dim=N, num_groups=groups)


def pool_class(cfg: ReplayConfig, backend: str = "auto"):
    """A ``ReplayMambaPool`` subclass bound to ``cfg`` and the StatePool ``backend`` (what the plugin
    installs; "auto": the Triton kernels on CUDA, the reference elsewhere)."""
    if not isinstance(cfg, ReplayConfig):
        raise TypeError(f"cfg: expected a ReplayConfig, got {type(cfg).__name__}")
    from sglang.srt.mem_cache.memory_pool import MambaPool

    class ReplayMambaPool(MambaPool):
        """SGLang's ``MambaPool`` whose ``temporal`` is a replay checkpoint (see the module docs).

        Attributes:
            replay: the ``StatePool`` over ``mamba_cache.temporal`` (``num_slots = size + 1``).
        """

        replay_cfg = cfg
        replay_backend = backend

        def __init__(self, **kwargs):
            for flag in ("enable_linear_replayssm", "enable_linear_replayssm_spec"):
                if kwargs.get(flag):
                    raise ValueError(f"{flag}: SGLang's own replay cannot run beside replayssm; drop "
                                     f"--{flag.replace('_', '-')} and use --replay-ssm")
            if kwargs.get("envelope_layout"):
                # the page-major envelope makes temporal a strided view whose extends run on gathered
                # copies, written back after the hooks that reset the rings have run
                raise ValueError("envelope_layout: SGLang's page-major KV layout is not served with --replay-ssm; "
                                 "drop --enable-page-major-kv-layout")
            drafts = kwargs.get("speculative_num_draft_tokens")
            if drafts:
                # per-draft full-state snapshots are never written or read under replay (verify appends
                # to the ring, commit moves cursors): SGLang's allocation of them is skipped, and an
                # empty tensor stands in its place (SGLang's GDN / KDA verify require the buffer to exist)
                params = kwargs["cache_params"]
                snapshots = (len(kwargs["mamba_layer_ids"]), kwargs["spec_state_size"] + 1, drafts,
                             *params.shape.temporal)
                with _without_allocation(snapshots):
                    super().__init__(**kwargs)
            else:
                super().__init__(**kwargs)
            spec = layer_spec(kwargs["cache_params"])
            temporal = self.mamba_cache.temporal
            if temporal.dtype != cfg.torch_checkpoint_dtype:
                raise ValueError(f"cache_params: SGLang stores the ssm state as {temporal.dtype}, replay checkpoint "
                                 f"dtype {cfg.checkpoint_dtype} needs {cfg.torch_checkpoint_dtype}; set "
                                 "--mamba-ssm-dtype accordingly (the launcher does)")
            self.replay = StatePool(spec, _with_drafts(cfg, drafts), num_layers=temporal.shape[0],
                                    num_slots=temporal.shape[1], device=temporal.device, backend=backend,
                                    checkpoint=temporal, state_layout="vk")
            self.replay.allocated.fill_(True)  # SGLang's MambaSlotAllocator owns the slots
            for layer in range(temporal.shape[0]):
                _BY_STATE[_key(temporal[layer])] = (weakref.ref(self), layer)

        def clear_slots(self, indices: torch.Tensor):
            super().clear_slots(indices)
            _refresh(self.replay, indices)

        def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor):
            _flush(self.replay, src_indices.unique())
            super().copy_from(src_indices, dst_indices)
            _refresh(self.replay, dst_indices)

        def get_cpu_copy(self, indices):
            _flush(self.replay, indices.unique())
            return super().get_cpu_copy(indices)

        def load_cpu_copy(self, mamba_cache_cpu, indices):
            super().load_cpu_copy(mamba_cache_cpu, indices)
            _refresh(self.replay, indices)

    return ReplayMambaPool


def _with_drafts(cfg: ReplayConfig, drafts) -> ReplayConfig:
    """``cfg`` for a pool whose verifies take up to ``drafts`` tokens (SGLang's
    ``speculative_num_draft_tokens``, the bonus token included; None without speculation)."""
    return dataclasses.replace(cfg, max_draft_tokens=drafts - 1) if drafts else cfg


def replay_budget(cfg: ReplayConfig, handle):
    """SGLang's ``KVCacheConfigurator._handle_max_mamba_cache`` (``handle``) for replay pools.

    SGLang sizes its mamba pool from the bytes of conv and ssm state per slot, plus per-draft
    snapshots when speculative decoding is on. Under replay each slot also holds the ring, read
    copy and cursors of every layer (charged through the configurator's
    ``extra_mamba_cache_bytes_per_req`` on 0.5.23, its cache parameters' bytes per slot on 0.5.17:
    ``versions``), and no snapshots exist (the speculative reserve is skipped by sizing as for plain
    decoding). The pool SGLang then builds is the pool it can afford."""
    @functools.wraps(handle)
    def _handle_max_mamba_cache(self, total_rest_memory):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        seams = versions.seams()
        params = self.mambaish_config.mamba2_cache_params
        drafts = None if self.spec_algorithm.is_none() else seams.max_draft_tokens(self)
        side = sum(side_bytes_per_slot(layer_spec(params), _with_drafts(cfg, drafts)).values()) * len(params.layers)
        saved = self.spec_algorithm
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        try:
            with seams.charged(self, side):
                return handle(self, total_rest_memory)
        finally:
            self.spec_algorithm = saved
    return _handle_max_mamba_cache


class _WithoutAllocation(torch.overrides.TorchFunctionMode):
    """A torch function mode in which ``torch.zeros`` of exactly ``shape`` (the per-draft
    ``intermediate_ssm`` snapshots ``[layers, slots, T, ...]``) returns a placeholder of no slots
    ``[layers, 0, T, ...]`` instead of allocating (``skipped`` counts them); every other torch call
    runs as it would. Active on the constructing thread only, around ``MambaPool.__init__``."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape, self.skipped = shape, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros:
            size = kwargs.get("size", args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args)
            if tuple(size) == self.shape:
                self.skipped += 1
                # no bytes, but one (empty) entry per layer: SGLang indexes it by layer
                return torch.empty((self.shape[0], 0, *self.shape[2:]), dtype=kwargs.get("dtype"),
                                   device=kwargs.get("device"))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _without_allocation(shape: tuple[int, ...]):
    """While SGLang's ``MambaPool.__init__`` runs: its ``torch.zeros`` of exactly ``shape`` returns a
    placeholder instead of allocating (``_WithoutAllocation``), and must do so exactly once."""
    mode = _WithoutAllocation(shape)
    with mode:
        yield
    if mode.skipped != 1:
        raise RuntimeError(f"sglang MambaPool: expected one per-draft snapshot allocation of shape {list(shape)} "
                           f"to skip, saw {mode.skipped}; this SGLang is not a release the plugin serves")


def _key(state: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return state.data_ptr(), tuple(state.shape)


def _slots(pool: StatePool, indices: torch.Tensor) -> torch.Tensor:
    """SGLang slot indices (int32/int64 ``[n]``) as StatePool slots (int64 on the pool device)."""
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64) \
            or indices.dim() != 1:
        got = f"{indices.dtype} {list(indices.shape)}" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"indices: expected int32 or int64 slot indices of shape [n], got {got}")
    return indices.to(device=pool.device, dtype=torch.int64)


def _flush(replay: StatePool, indices: torch.Tensor, layer: int | None = None) -> None:
    """``replay.flush`` of SGLang slot ``indices`` (distinct), in ``layer`` or every layer, unchecked
    on the Triton backend."""
    replay.flush(_slots(replay, indices), layer=layer, checked=checked(replay))


def _refresh(replay: StatePool, indices: torch.Tensor, layer: int | None = None) -> None:
    """``replay.refresh`` of SGLang slot ``indices`` (distinct), in ``layer`` or every layer, unchecked
    on the Triton backend."""
    replay.refresh(_slots(replay, indices), layer=layer, checked=checked(replay))


def checked(pool: StatePool) -> bool:
    """Whether steps, commits, flushes and refreshes on ``pool`` validate slot values on the host:
    only off the Triton backend.

    SGLang hands the kernels its own slot indices; on the Triton backend steps and commits run
    with ``checked=False`` and read no device value (no synchronization per layer); flushes and
    refreshes too (their slots are distinct: a batch's rows, one finishing request, or
    ``unique()`` ones)."""
    return pool.backend != "triton"


def lookup(ssm_state: torch.Tensor):
    """``(ReplayMambaPool, layer)`` whose checkpoint is ``ssm_state`` (one layer of ``temporal``), or None."""
    entry = _BY_STATE.get(_key(ssm_state))
    if entry is None:
        return None
    owner = entry[0]()
    if owner is None or owner.mamba_cache.temporal[entry[1]].data_ptr() != ssm_state.data_ptr():
        return None
    return owner, entry[1]


def before_extend(ssm_state: torch.Tensor, slots: torch.Tensor) -> None:
    """An extend is about to read ``ssm_state[slots]`` as its rows' initial states: fold those rows'
    rings into that layer's checkpoint first (in place).

    ``ssm_state``: one layer of a ``ReplayMambaPool``'s ``temporal``; ``slots``: int32/int64 ``[n]``,
    distinct (an extend batch's rows). A prefill row's ring is empty (its slot was cleared, copied or
    prefilled before), so only the decode rows of a mixed batch (``--enable-mixed-chunk``: running
    requests join a prefill batch as one-token extends) fold here. A state of no replay pool is left
    alone."""
    found = lookup(ssm_state)
    if found is not None:
        owner, layer = found
        _flush(owner.replay, slots, layer)


def after_prefill(ssm_state: torch.Tensor, prefill_slots: torch.Tensor) -> None:
    """Prefill wrote ``ssm_state[prefill_slots]`` itself: reset those rows of that layer (updated in place).

    ``ssm_state``: one layer of a ``ReplayMambaPool``'s ``temporal``, ``[size + 1, H, P, N]`` (Mamba-2)
    or ``[size + 1, HV, V, K]`` (GDN / KDA);
    ``prefill_slots``: int32/int64 ``[n]``. A state that belongs to no replay pool is left alone.
    """
    found = lookup(ssm_state)
    if found is not None:
        owner, layer = found
        _refresh(owner.replay, prefill_slots, layer)


def flush_for_tree(req_to_token_pool, mamba_pool_idx: torch.Tensor) -> None:
    """Fold the ring of a finishing request's slot into its checkpoint, in every layer (in place).

    ``req_to_token_pool``: SGLang's ``HybridReqToTokenPool``; ``mamba_pool_idx``: the request's
    0-d slot tensor (virtual under the unified memory pool). The radix tree then holds the whole
    state at the request's last token, with its conv window at the same token. No-op when the
    mamba pool is not a replay pool.
    """
    owner = req_to_token_pool.mamba_pool
    if hasattr(owner, "replay"):
        slot = req_to_token_pool.translate_mamba_indices(mamba_pool_idx.view(1))
        _flush(owner.replay, slot)


def track_copy(copy, conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
               **kwargs):
    """SGLang's extra_buffer track copy (``track_mamba_states_if_needed`` for one layer's
    ``ssm_states`` ``[size + 1, ...]``, or ``track_mamba_states_all_layers`` for the whole
    ``temporal`` ``[layers, size + 1, ...]``) on a replay pool: the masked source rows' rings are
    folded into their checkpoints first (the copy then carries the whole state at this token),
    SGLang's ``copy`` runs, and the destination rows' rings are emptied and read copies re-derived
    from the copied checkpoint. A state of no replay pool is copied as SGLang does. Reads the mask
    on the host (a synchronization on a GPU): the launcher turns CUDA graphs off with extra_buffer.
    """
    found = _track_owner(ssm_states)
    if found is None:
        return copy(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                    **kwargs)
    owner, layer = found
    mask = mamba_track_mask[:batch_size].to(device="cpu", dtype=torch.bool)
    src = _slots(owner.replay, cache_indices[:batch_size].cpu()[mask])
    dst = _slots(owner.replay, mamba_track_indices[:batch_size].cpu()[mask])
    owner.replay.flush(src, layer=layer)
    result = copy(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size, **kwargs)
    owner.replay.refresh(dst, layer=layer)
    return result


def _track_owner(ssm_states: torch.Tensor):
    """``(pool, layer)`` for one layer's state, ``(pool, None)`` for a whole ``temporal``, or None."""
    found = lookup(ssm_states)
    if found is not None:
        return found
    if ssm_states.dim() >= 2 and ssm_states.shape[0] > 0:
        found = lookup(ssm_states[0])
        if found is not None and found[1] == 0 and found[0].mamba_cache.temporal.shape == ssm_states.shape:
            return found[0], None
    return None


def before_int8_store(active_pool, active_slots: torch.Tensor) -> None:
    """SGLang's int8 radix store (``MambaCheckpointPool.store_from_active``) is about to quantize
    ``active_slots`` (int32/int64 ``[n]``, distinct: a finishing request's or a track slot) of
    ``active_pool`` for the tree: fold their rings into the checkpoint first, in every layer (in
    place), so the tree holds the whole state. No-op when ``active_pool`` is not a replay pool."""
    if hasattr(active_pool, "replay"):
        _flush(active_pool.replay, active_slots)


def after_int8_load(active_pool, active_slots: torch.Tensor) -> None:
    """SGLang's int8 radix hit (``MambaCheckpointPool.load_to_active``) wrote dequantized states into
    ``active_slots`` (int32/int64 ``[n]``): empty their rings and re-derive their read copies, in every
    layer (in place). No-op when ``active_pool`` is not a replay pool."""
    if hasattr(active_pool, "replay"):
        _refresh(active_pool.replay, active_slots)


def before_host_backup(host_pool, device_indices: torch.Tensor) -> None:
    """HiCache is about to copy ``device_indices`` (int32/int64 ``[n]``, distinct) of every layer of
    ``host_pool`` (SGLang's ``MambaPoolHost``) to the host: fold their rings into the checkpoints
    first, in the layers that belong to a replay pool (in place), so the host holds the whole state.

    A radix-tree slot's ring is already empty (it was flushed when the tree took it), so this is a
    no-op there; a slot backed up while it decodes (a retracted request) needs it. Runs on the
    caller's stream (SGLang's device-to-host stream, after its start event)."""
    # every layer the host pool backs up: on 0.5.23 MTP draft layers too, when their pool replays
    for state in versions.seams().host_device_layers(host_pool):
        found = lookup(state)
        if found is not None:
            _flush(found[0].replay, device_indices, found[1])


def after_host_load(host_pool, device_indices: torch.Tensor, layer_id: int) -> None:
    """HiCache copied layer ``layer_id`` of ``host_pool`` (SGLang's ``MambaPoolHost``) at
    ``device_indices`` (int32/int64 ``[n]``) from the host into the checkpoint: empty those rows' rings
    of that layer and re-derive their read copy (in place), if the layer belongs to a replay pool.

    Runs on SGLang's host-to-device stream before it signals the layer done, so the forward never
    reads a loaded checkpoint beside the slot's previous ring; on the Triton backend it reads no
    device value (the load stays asynchronous)."""
    found = lookup(versions.seams().host_device_layers(host_pool)[layer_id])
    if found is not None:
        _refresh(found[0].replay, device_indices, found[1])


def after_transfer(req_to_token_pool, reqs) -> None:
    """PD disaggregation, decode side: the prefill server's state (conv window and ``temporal``, the
    whole state: its prefill left the ring empty) has landed in these requests' slots. Empty their
    rings, which still hold the slot's previous occupant's tokens, and re-derive their read copies,
    in every layer (in place).

    ``req_to_token_pool``: SGLang's ``HybridMambaDecodeReqToTokenPool``; ``reqs``: the requests of a
    PREBUILT batch (no forward runs before their first decode, so nothing else resets the slot). A
    request restored from the host tier afterwards is reset again by that load. No-op when the
    mamba pool is not a replay pool."""
    owner = req_to_token_pool.mamba_pool
    slot = versions.seams().req_mamba_slot
    held = [slot(req).view(1) for req in reqs if slot(req) is not None]
    if hasattr(owner, "replay") and held:
        _refresh(owner.replay, req_to_token_pool.translate_mamba_indices(torch.cat(held)))


def after_track_extend(ssm_states: torch.Tensor, forward_metadata) -> None:
    """SGLang's extend track (``_track_mamba_state_extend``) wrote the track slots' states of one
    layer from the prefill's chunk states: empty their rings and re-derive their read copies."""
    found = lookup(ssm_states)
    if found is None or not forward_metadata.has_mamba_track_mask:
        return
    owner, layer = found
    # 0.5.17's metadata has no recompute destinations
    written = [d.reshape(-1).to(torch.int64) for d in (forward_metadata.track_ssm_h_dst,
                                                        getattr(forward_metadata, "track_ssm_recompute_dst", None),
                                                        forward_metadata.track_ssm_final_dst) if d is not None]
    owner.replay.refresh(_slots(owner.replay, torch.cat(written).unique()), layer=layer)
