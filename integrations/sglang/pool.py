"""Replay state inside SGLang's mamba pool (``MambaPool`` of sglang 0.5.17 and 0.5.23).

``ReplayMambaPool`` is the class the plugin puts in ``HybridReqToTokenPool.mamba_pool_cls``.
SGLang's own ``temporal`` tensor (its checkpoint dtype; Mamba-2 ``[layers, size + 1, H, P, N]``,
GDN / KDA ``[layers, size + 1, HV, V, K]``, used through a transposed view) is the
replay checkpoint, wrapped without a copy by one ``replayssm.StatePool`` per mamba pool; the
ring, cursors and read copy are the StatePool's and follow every slot event SGLang issues, each
taking one of the pool's verbs (``EVENTS``; ``on_event`` applies it): ``flush`` folds the slots'
rings into the checkpoint before SGLang reads it, ``refresh`` empties their rings and re-derives the
read copy after SGLang wrote it, ``copy`` carries ring, cursors and read copy beside SGLang's own
copy of the checkpoint (no flush: the copy holds the source's state as it stands).

| ``EVENTS`` key | SGLang event | verb |
|---|---|---|
| ``clear`` | ``clear_slots`` (fresh slot, zeroed state) | refresh |
| ``copy`` | ``copy_from`` (COW on a radix hit, no_buffer copy for the tree) | copy (SGLang copies the checkpoint) |
| ``cpu copy`` | ``get_cpu_copy`` (host tier / transfer): the copy is the whole state | flush |
| ``cpu load`` | ``load_cpu_copy`` | refresh |
| ``int8 store`` | int8 radix store (``MambaCheckpointPool.store_from_active``, ``--enable-int8-mamba-checkpoint``), after the forwards already issued (``after_forwards``) | flush |
| ``int8 load`` | int8 radix hit (``MambaCheckpointPool.load_to_active``: the copy-on-write) | refresh |
| ``hicache backup`` | HiCache backup (``MambaPoolHost.backup_from_device_all_layer``), on the transfer stream | flush |
| ``hicache load`` | HiCache load (``MambaPoolHost.load_to_device_per_layer``), that layer, before its completion event | refresh |
| ``extend start`` | an extend about to read ``temporal`` as its rows' initial states (mixer / backend hook): a mixed batch's decode rows ride along as one-token extends | flush |
| ``extend end`` | the extend (a prefill) wrote ``temporal`` (mixer / backend hook), that layer | refresh |
| ``transfer`` | PD disaggregation, decode side: a transferred request's first batch (``ScheduleBatch.prepare_for_prebuilt``): the state the prefill server sent, after the forwards already issued (``after_forwards``) | refresh |
| ``tree donation`` | a request's state cached in the radix tree (``MambaComponent.prepare_for_caching_req``): the slot SGLang picked for the tree, kept pending (``donate``) and flushed with the others at the next forward's start or slot event on the pool, after the forwards already issued (``after_forwards``) | flush |
| ``track`` | extra_buffer's track copy (``track_copy``): SGLang copies the masked rows' checkpoints to their track slots | copy |
| ``verify track`` | extra_buffer's verify track (``mamba2.commit_track``): a track slot took its row's slot and kept the accepted prefix | flush |
| ``track extend`` | extra_buffer's extend track wrote the track slots (``_track_mamba_state_extend``) | refresh |

Slot allocation stays SGLang's (``MambaSlotAllocator``); every pool slot is open to the
StatePool. Slot ``-1`` is SGLang's padding row, as in replayssm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading
import weakref

import torch

from replayssm import LayerSpec, ReplayConfig, StatePool
from replayssm.graphs import VerbGraphs
from replayssm.pool import side_bytes_per_slot

from . import versions

log = logging.getLogger("replayssm")
_BY_STATE: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, int]] = {}

EVENTS = {
    "clear": "refresh",
    "copy": "copy",
    "cpu copy": "flush",
    "cpu load": "refresh",
    "int8 store": "flush",
    "int8 load": "refresh",
    "hicache backup": "flush",
    "hicache load": "refresh",
    "extend start": "flush",
    "extend end": "refresh",
    "transfer": "refresh",
    "tree donation": "flush",
    "track": "copy",
    "verify track": "flush",
    "track extend": "refresh",
}


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
    if conv_dim == H * P:
        raise ValueError(f"cache_params: conv dim {conv_dim} = H*P for temporal {(H, P, N)}: a Mamba-1 layer (its B and "
                         "C come after the conv); replay serves Mamba-2, GDN and KDA layers, serve it without "
                         "--replay-ssm")
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
            replay_graphs: ``VerbGraphs`` of ``replay``: the unchecked slot events replay from CUDA
                graphs (SGLang issues most of them one request at a time, over every layer). Each
                stream's graphs are recorded at once, by its first forward or event (the server's
                warm-up request), not one by one as traffic first needs them.
            forward_stream: the CUDA stream the last forward ran on (recorded as it starts), after
                whose work the scheduler thread's slot events run (``after_forwards``); None until
                one ran on CUDA.
            donations: the tree donations not yet flushed (``donate``), each ``(slots, stream)``:
                the slots and the stream that issued them; flushed together at the next forward's
                start or slot event on this pool (``drain_donations``).
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
            topk = kwargs.get("speculative_eagle_topk")
            if drafts and topk is not None and topk > 1:
                # a tree's drafts branch from earlier drafts, not only from the token before them
                raise ValueError(f"speculative_eagle_topk: replay verifies a chain of drafts (a width of 1), got "
                                 f"{topk}; NGRAM takes it from --speculative-ngram-max-bfs-breadth (default 10): "
                                 "pass 1")
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
            side = sum(side_bytes_per_slot(spec, self.replay.cfg).values())         # per slot and layer
            log.info("replayssm pool: %d slots x %d layers, window %d, %d draft tokens, read format %s: "
                     "ring, read copy and cursors %.2f GB beside SGLang's state; no per-draft state snapshots",
                     temporal.shape[1], temporal.shape[0], self.replay.cfg.window, self.replay.cfg.max_draft_tokens,
                     self.replay.cfg.read_format, side * temporal.shape[0] * temporal.shape[1] / 2 ** 30)
            self.replay_graphs = VerbGraphs(self.replay, ahead=True)
            self.forward_stream = None
            self.donations = []
            self.donations_lock = threading.Lock()
            for layer in range(temporal.shape[0]):
                _BY_STATE[_key(temporal[layer])] = (weakref.ref(self), layer)

        # each slot event first flushes the pending tree donations (drain_donations), before SGLang's
        # own body reads or writes any slot
        def clear_slots(self, indices: torch.Tensor):
            drain_donations(self)
            super().clear_slots(indices)
            on_event("clear", self, indices)

        def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor):
            drain_donations(self)
            super().copy_from(src_indices, dst_indices)
            on_event("copy", self, src_indices, dst=dst_indices)

        # SGLang passes a request's own slot as a 0-d tensor here (a retraction's offload and resume)
        def get_cpu_copy(self, indices):
            on_event("cpu copy", self, indices.reshape(-1).unique())
            return super().get_cpu_copy(indices)

        def load_cpu_copy(self, mamba_cache_cpu, indices):
            drain_donations(self)
            super().load_cpu_copy(mamba_cache_cpu, indices)
            on_event("cpu load", self, indices.reshape(-1))

    return ReplayMambaPool


def _with_drafts(cfg: ReplayConfig, drafts) -> ReplayConfig:
    """``cfg`` for a pool whose verifies take up to ``drafts`` tokens (SGLang's
    ``speculative_num_draft_tokens``, the bonus token included; None without speculation)."""
    return dataclasses.replace(cfg, max_draft_tokens=drafts - 1) if drafts else cfg


def replay_budget(cfg: ReplayConfig, handle):
    """SGLang's ``KVCacheConfigurator._handle_max_mamba_cache`` (``handle``) for replay pools.

    SGLang sizes its mamba pool from the bytes of conv and ssm state per slot, plus a speculative
    reserve per running request and draft token (its per-draft ssm snapshots and conv windows) when
    speculative decoding is on. Under replay each slot also holds the ring, read copy and cursors of
    every layer (charged through the configurator's ``extra_mamba_cache_bytes_per_req`` on 0.5.23,
    its cache parameters' bytes per slot on 0.5.17: ``versions``), and no snapshots exist: the pool
    is sized as for plain decoding, and only the conv windows SGLang still allocates per running
    request and draft token are reserved, taken from the memory left to the KV cache as SGLang's
    own reserve is (dense ``[draft, dim, K - 1]`` windows, as SGLang charges them: an upper bound of
    the deduplicated layout it allocates on CUDA). The pool SGLang then builds is the pool it can
    afford."""
    @functools.wraps(handle)
    def _handle_max_mamba_cache(self, total_rest_memory):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        seams = versions.seams()
        params = self.mambaish_config.mamba2_cache_params
        drafts = None if self.spec_algorithm.is_none() else seams.max_draft_tokens(self)
        side = sum(side_bytes_per_slot(layer_spec(params), _with_drafts(cfg, drafts)).values()) * len(params.layers)
        conv_windows = 0 if drafts is None else conv_window_reserve(params, drafts, self)
        saved = self.spec_algorithm
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        try:
            with seams.charged(self, side):
                return handle(self, total_rest_memory - conv_windows / (1 << 30))
        finally:
            self.spec_algorithm = saved
    return _handle_max_mamba_cache


def conv_window_reserve(params, drafts: int, configurator) -> int:
    """Bytes of the per-draft conv windows SGLang allocates beside a replay pool under speculative
    decoding: every layer's conv state per draft token (``drafts``) for each running request and the
    padding request, as SGLang's own speculative reserve counts them."""
    from sglang.srt.runtime_context import get_schedule

    conv_numel = sum(math.prod(shape) for shape in params.shape.conv)
    requests = max(1, get_schedule().max_running_requests // versions.seams().attn_dp_size(configurator)) + 1
    return conv_numel * params.dtype.conv.itemsize * len(params.layers) * drafts * requests


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


def replay_slots(pool: StatePool, indices: torch.Tensor) -> torch.Tensor:
    """SGLang slot indices (int32/int64 ``[n]``) as StatePool slots (int64 on the pool device)."""
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64) \
            or indices.dim() != 1:
        got = f"{indices.dtype} {list(indices.shape)}" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"indices: expected int32 or int64 slot indices of shape [n], got {got}")
    return indices.to(device=pool.device, dtype=torch.int64)


def on_event(event: str, owner, indices: torch.Tensor | None, layer: int | None = None, *,
             verified: bool | None = None, dst: torch.Tensor | None = None) -> None:
    """SGLang's slot ``event`` (an ``EVENTS`` key) on ``owner`` (a ``ReplayMambaPool``): its verb on
    SGLang slot ``indices`` (int32/int64 ``[n]``, distinct), in ``layer`` or every layer, in place.
    ``flush`` / ``refresh``: ``StatePool.flush`` / ``refresh``; ``copy``: ``StatePool.copy`` from
    ``indices`` (a source may repeat; -1 padding) to ``dst`` (``[n]``, distinct; -1 where ``indices``
    is), the checkpoint left to SGLang's own copy. ``verified``: the verb's ``checked``; None:
    ``checked(owner.replay)`` (unchecked on the Triton backend, where flush and refresh replay from
    the pool's ``replay_graphs``). Nothing happens for ``owner`` None (not a replay pool) or no ``indices``."""
    if owner is None or indices is None:
        return
    drain_donations(owner)
    replay, verb = owner.replay, EVENTS[event]
    slots = replay_slots(replay, indices)
    check = checked(replay) if verified is None else verified
    if verb == "copy":
        if dst is None:
            raise ValueError(f"{event}: a copy takes dst slots")
        replay.copy(slots, replay_slots(replay, dst), checked=check, checkpoint=False, layer=layer)
    elif check:
        getattr(StatePool, verb)(replay, slots, layer=layer, checked=True)
    else:
        owner.replay_graphs(verb, slots, layer)


def on_state(event: str, ssm_state: torch.Tensor, indices: torch.Tensor) -> None:
    """``on_event`` on the replay pool and layer whose checkpoint is ``ssm_state`` (one layer of a
    ``ReplayMambaPool``'s ``temporal``: ``lookup``); a state of no replay pool is left alone."""
    found = lookup(ssm_state)
    if found is not None:
        on_event(event, found[0], indices, found[1])


def after_forwards(event: str, mamba_pool, indices: torch.Tensor | None) -> None:
    """``on_pool`` for an event SGLang issues from its scheduler thread on slots a forward may still
    be writing: on the current stream after the work already issued on the stream the forwards run
    on (``forward_stream``, recorded as each forward starts), which the current stream waits for on
    the device (no host synchronization).

    Under the overlap scheduler the forward launched before a request's result was processed may
    still be copying into the slot SGLang then caches (a decode track copy, on the forward stream):
    the tree donation's flush of that slot (``tree donation``) and an int8 store's (``int8 store``)
    then run after it, and before the tree hands the slot to any reader, which SGLang orders after
    the current stream. A PD decode server's refresh of transferred slots (``transfer``) waits too: a
    slot freed by a finished request may still take that request's last step."""
    stream = getattr(mamba_pool, "forward_stream", None)
    if stream is not None:
        current = torch.cuda.current_stream(stream.device)
        if current != stream:
            current.wait_stream(stream)
    on_pool(event, mamba_pool, indices)


def forward_starts(owner) -> None:
    """A forward starts on ``owner``'s pool: the stream it runs on is recorded (CUDA pools only), its
    slot-event graphs are recorded if they are not yet (``VerbGraphs.prepare``: the first forward
    outside a capture, the server's warm-up), and the tree donations since the last forward are
    flushed on it, before the forward's work."""
    if owner.replay.device.type == "cuda":
        owner.forward_stream = torch.cuda.current_stream(owner.replay.device)
        if torch.cuda.is_current_stream_capturing():
            return
        owner.replay_graphs.prepare(owner.forward_stream)
    drain_donations(owner)


def donate(mamba_pool, indices: torch.Tensor | None) -> None:
    """A tree donation (``tree donation``) of SGLang slots ``indices`` (int32/int64 ``[n]``) on
    ``mamba_pool``, kept pending: SGLang donates one request at a time, and a flush of every layer
    per request is 2 launches per layer on rings that are mostly empty (just prefilled). The
    donations are flushed together by ``drain_donations``, before anything reads the slots: the next
    forward on the pool (``forward_starts``) or the next slot event on it (``on_event``). No-op
    unless ``mamba_pool`` is a ``ReplayMambaPool``."""
    if not hasattr(mamba_pool, "replay") or indices is None:
        return
    slots = replay_slots(mamba_pool.replay, indices)
    stream = torch.cuda.current_stream(slots.device) if slots.device.type == "cuda" else None
    with mamba_pool.donations_lock:
        mamba_pool.donations.append((slots, stream))


def drain_donations(owner) -> None:
    """Flush ``owner``'s pending tree donations in one verb (``tree donation``), where they would have
    run one by one: on the stream that donated them (the scheduler's), after the work already
    issued there and on the forward stream (``after_forwards``); a caller on another stream (a
    forward's start, HiCache's transfer stream) then waits for that flush on the device. No host
    synchronization. A slot donated twice is flushed once (repeats become padding, -1, on the device)."""
    with owner.donations_lock:
        pending, owner.donations = owner.donations, []
    if not pending:
        return
    home = pending[-1][1]
    with contextlib.nullcontext() if home is None else torch.cuda.stream(home):
        for stream in {s for _, s in pending if s is not None and s != home}:
            home.wait_stream(stream)
        slots = torch.cat([s for s, _ in pending])
        if len(pending) > 1:
            slots, _ = torch.sort(slots)
            repeat = torch.zeros_like(slots, dtype=torch.bool)
            repeat[1:] = slots[1:] == slots[:-1]
            slots = torch.where(repeat, -1, slots)
        after_forwards("tree donation", owner, slots)
    if home is not None:
        current = torch.cuda.current_stream(home.device)
        if current != home:
            current.wait_stream(home)


def chain_only(retrieve_parent_token) -> None:
    """A verify's draft tree links (SGLang's ``retrieve_parent_token``) must be absent: replay verifies
    a chain, each draft after the token before it. SGLang passes them with a draft tree wider than one
    (``speculative_eagle_topk > 1``, which the pool refuses at start)."""
    if retrieve_parent_token is not None:
        raise ValueError("retrieve_parent_token: a tree of drafts reached the verify; replay verifies a chain "
                         "(speculative_eagle_topk 1)")


def on_pool(event: str, mamba_pool, indices: torch.Tensor | None) -> None:
    """``on_event`` in every layer of ``mamba_pool`` (SGLang's mamba pool); no-op unless it is a
    ``ReplayMambaPool``."""
    on_event(event, mamba_pool if hasattr(mamba_pool, "replay") else None, indices)


def checked(pool: StatePool) -> bool:
    """Whether steps, commits, flushes and refreshes on ``pool`` validate slot values on the host:
    only on a backend that takes no ``checked=False`` operation (the reference).

    SGLang hands the kernels its own slot indices; on the Triton backend steps and commits run
    with ``checked=False`` and read no device value (no synchronization per layer); flushes and
    refreshes too (their slots are distinct: a batch's rows, one finishing request, or
    ``unique()`` ones)."""
    return not pool.backend_ops.supports_unchecked


def lookup(ssm_state: torch.Tensor):
    """``(ReplayMambaPool, layer)`` whose checkpoint is ``ssm_state`` (one layer of ``temporal``), or None."""
    entry = _BY_STATE.get(_key(ssm_state))
    if entry is None:
        return None
    owner = entry[0]()
    if owner is None or owner.mamba_cache.temporal[entry[1]].data_ptr() != ssm_state.data_ptr():
        return None
    return owner, entry[1]


def request_slots(req_to_token_pool, reqs) -> torch.Tensor | None:
    """The mamba pool slots (int64 ``[n]``) of the requests ``reqs`` that hold one, translated by
    SGLang's ``HybridReqToTokenPool`` (virtual under the unified memory pool); None when none does."""
    slot = versions.seams().req_mamba_slot
    held = [slot(req).view(1) for req in reqs if slot(req) is not None]
    return req_to_token_pool.translate_mamba_indices(torch.cat(held)) if held else None


def track_copy(copy, conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
               **kwargs):
    """SGLang's extra_buffer track copy (``track_mamba_states_if_needed`` for one layer's
    ``ssm_states`` ``[size + 1, ...]``, or ``track_mamba_states_all_layers`` for the whole
    ``temporal`` ``[layers, size + 1, ...]``) on a replay pool: SGLang's ``copy`` moves the masked
    rows' checkpoints into their track slots and the pool's copy moves their rings, cursors and read
    copies beside them, so a track slot holds its source's state at this token as it stands (nothing
    is flushed or re-encoded). A state of no replay pool is copied as SGLang does.

    The mask stays on the device: a row it leaves out is a padded row (-1) of the copy, which skips
    it; on the Triton backend (an unchecked copy, one launch) the copy reads no device value, so
    SGLang's decode CUDA graphs capture it.
    """
    found = _track_owner(ssm_states)
    if found is None:
        return copy(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                    **kwargs)
    owner, layer = found
    result = copy(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size, **kwargs)
    mask = mamba_track_mask[:batch_size].to(torch.bool)
    src, dst = (torch.where(mask, rows[:batch_size].to(torch.int64), -1)
                for rows in (cache_indices, mamba_track_indices))
    on_event("track", owner, src, layer, dst=dst)
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


def track_extend_slots(forward_metadata) -> torch.Tensor | None:
    """The track slots (int64 ``[n]``, distinct) SGLang's extend track (``_track_mamba_state_extend``)
    wrote from the prefill's chunk states, or None without a track mask.

    SGLang splits the track slots of the masked requests (one per request) into the chunk-aligned
    ones (``track_ssm_final_dst``), those read from the chunk states ``h`` (``track_ssm_h_dst``) and,
    from 0.5.23, those it recomputes (``track_ssm_recompute_dst``): disjoint parts of distinct
    slots, so their concatenation is distinct as it stands. Nothing is read on the host (a
    deduplication on the device would synchronize the host with the device at every layer of
    every extend)."""
    if not forward_metadata.has_mamba_track_mask:
        return None
    # 0.5.17's metadata has no recompute destinations
    written = [d.reshape(-1).to(torch.int64) for d in (forward_metadata.track_ssm_h_dst,
                                                        getattr(forward_metadata, "track_ssm_recompute_dst", None),
                                                        forward_metadata.track_ssm_final_dst) if d is not None]
    return torch.cat(written)
