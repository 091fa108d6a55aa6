"""The class patches that put replayssm into a SGLang 0.5.17 or 0.5.23 process (installed by the plugin;
where the releases differ, ``versions``).

| target | patch |
|---|---|
| ``HybridReqToTokenPool.mamba_pool_cls`` | ``ReplayMambaPool`` bound to the config (set explicitly: a class REPLACE of ``MambaPool`` would not reach this attribute); it allocates no per-draft ``intermediate_ssm`` |
| ``KVCacheConfigurator._handle_max_mamba_cache`` | the mamba pool's size budgets ring, read copy and cursors per slot and reserves no per-draft snapshots |
| ``layers.attention.mamba.mamba.selective_state_update`` (``MambaMixer2``'s call sites) | replay decode / verify; a state outside a replay pool is refused |
| ``MambaMixer2.forward`` | before its chunk scan, flush the rows (a mixed batch's decode rows); after it wrote ``temporal``, refresh them |
| ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` | cursor commit in place of the ``intermediate_ssm`` scatter |
| ``MambaComponent.prepare_for_caching_req`` | the slot SGLang picked for the radix tree (``insert_params.mamba_value``: a finished request's own slot, an extra_buffer track slot, a running request's no_buffer copy) is donated: flushed, with the other requests' donations, at the next forward's start or slot event on the pool, after the forwards already issued |
| ``ModelRunner._forward_raw`` | the stream a forward runs on is recorded, and the tree donations since the last forward are flushed on it first |
| ``ModelRunner.__init__`` | SGLang's resolved settings that replay refuses (``options.refusal``, as the launcher) raise before SGLang builds the runner |
| ``TritonGDNKernel.packed_decode`` / ``target_verify`` (``GDNAttnBackend``'s kernel seam) | replay GDN decode / verify |
| ``TritonGDNKernel.decode`` | refused (the unpacked decode is not routed) |
| ``GDNAttnBackend.forward_extend`` | around an extend (not a verify): the rows flushed before, refreshed after |
| ``TritonKDAKernel.packed_decode`` / ``decode`` / ``target_verify`` (``KDAAttnBackend``'s kernel seam) | replay KDA decode / verify |
| ``covered`` of the fused KDA decodes (``kda_fused_decode``; 0.5.23: ROCm gfx950's ``kda_fused_decode_gfx950``, ``kda_fused_decode_aiter_hip``), ``KDAAttnBackend._can_run_fused_chain_verify`` (0.5.23) / ``_can_run_dspark_cutedsl_mtp`` | False: those fused kernels would update the state past the seam |
| ``KDAAttnBackend.supports_prefill_graph_extend`` (0.5.23) | False: a breakable prefill CUDA graph would capture the KDA extend past the extend hooks |
| ``KDAAttnBackend.forward_extend`` | around an extend (not a verify): the rows flushed before, refreshed after |
| ``MambaPoolHost.backup_from_device_all_layer`` / ``load_to_device_per_layer`` (HiCache's host tier) | slots flushed before a backup, refreshed after each layer's load |
| ``MambaCheckpointPool.store_from_active`` / ``load_to_active`` (int8 radix store) | active slots flushed before a store (after the forwards already issued), refreshed after a load |
| ``ScheduleBatchDisaggregationDecodeMixin.prepare_for_prebuilt`` (PD decode side) | the transferred requests' slots refreshed, after the forwards already issued |
| ``MambaAttnBackendBase.__init__`` | refuses a linear backend whose family is not the pool's, and GDN / KDA kernels other than Triton |

Every slot event takes its StatePool verb from ``pool.EVENTS`` (``pool.on_state`` / ``on_pool``).
``install`` is idempotent per process and all or nothing (a patch that fails undoes the others);
``uninstall`` restores SGLang's originals.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from replayssm import ReplayConfig

from . import gdn, kda, mamba2, options, pool, versions

_saved: list[tuple[object, str, object]] = []


def _patch(owner, name: str, value) -> None:
    _saved.append((owner, name, owner.__dict__[name]))
    setattr(owner, name, value)


def installed() -> bool:
    """True while the replay patches are in place."""
    return bool(_saved)


def install(cfg: ReplayConfig, backend: str = "auto") -> None:
    """Patch SGLang's classes for replay with ``cfg`` (no-op if already installed with the same).

    ``backend``: the StatePool backend of the replay pools ("auto", "reference", "triton").
    """
    if not isinstance(cfg, ReplayConfig):
        raise TypeError(f"cfg: expected a ReplayConfig, got {type(cfg).__name__}")
    if _saved:
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
        current = HybridReqToTokenPool.mamba_pool_cls
        if (current.replay_cfg, current.replay_backend) != (cfg, backend):
            raise ValueError(f"cfg: replay is installed with {current.replay_cfg} (backend "
                             f"{current.replay_backend!r}); uninstall first")
        return
    try:
        _install(cfg, backend)
    except BaseException:
        uninstall()
        raise


def _install(cfg: ReplayConfig, backend: str) -> None:
    seams = versions.seams()
    from sglang.srt.disaggregation.decode_schedule_batch_mixin import ScheduleBatchDisaggregationDecodeMixin
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel
    from sglang.srt.layers.attention.mamba import mamba as mamba_mod
    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool
    from sglang.srt.model_executor.model_runner import ModelRunner

    MambaPoolHost = importlib.import_module(seams.mamba_pool_host_module).MambaPoolHost
    MambaComponent = importlib.import_module(seams.mamba_component_module).MambaComponent

    _patch(memory_pool.HybridReqToTokenPool, "mamba_pool_cls", pool.pool_class(cfg, backend))
    _patch(KVCacheConfigurator, "_handle_max_mamba_cache",
           pool.replay_budget(cfg, KVCacheConfigurator._handle_max_mamba_cache))

    _patch(mamba_mod, "selective_state_update", mamba2.replay_selective_state_update)

    _patch(mamba_mod.MambaMixer2, "forward", around_mixer_forward(mamba_mod.MambaMixer2.forward))

    commit = hlab.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify

    @functools.wraps(commit)
    def update_mamba_state_after_mtp_verify(self, last_correct_step_indices, mamba_track_indices,
                                            mamba_steps_to_track, model, req_pool_indices=None):
        if not mamba2.commit_after_verify(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track,
                                          req_pool_indices):
            commit(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                   req_pool_indices)

    _patch(hlab.HybridLinearAttnBackend, "update_mamba_state_after_mtp_verify", update_mamba_state_after_mtp_verify)

    def tree_donation(component, req, insert_params, token_ids_len, is_finished):
        # the slot SGLang named for its radix tree (``insert_params.mamba_value``, a virtual slot:
        # a finished request's own slot, an extra_buffer track slot, which 0.5.23 takes from the
        # previous track when the latest ran past the key, or the no_buffer copy of a request still
        # running) is donated (``pool.donate``): flushed, with the other requests' donations, before
        # anything reads it (the next forward's start or slot event on the pool) and after the
        # forwards already issued, so the tree holds the whole state with the ring folded in. An int8
        # store's index is no slot of this pool: the store flushed its source ("int8 store").
        donated = insert_params.mamba_value
        if donated is None or component.int8_ckpt_pool is not None:
            return
        req_pool = component.cache.req_to_token_pool
        pool.donate(req_pool.mamba_pool, req_pool.translate_mamba_indices(donated.reshape(-1)).to(torch.int64))

    _around(MambaComponent, "prepare_for_caching_req", after=tree_donation)

    def forward_starts(runner, *args, **kwargs):
        # every forward (a decode CUDA graph's replay included) enters here, on the forward stream
        mamba_pool = getattr(runner.req_to_token_pool, "mamba_pool", None)
        if hasattr(mamba_pool, "forward_stream"):
            pool.forward_starts(mamba_pool)

    _around(ModelRunner, "_forward_raw", before=forward_starts)

    runner_init = inspect.signature(ModelRunner.__dict__["__init__"])

    def runner_settings_served(runner, *args, **kwargs):
        # SGLang's resolved settings, as the launcher checks them: again here for a server started
        # without the launcher (the plugin's environment variable set by hand)
        message = options.refusal(runner_init.bind_partial(runner, *args, **kwargs).arguments.get("server_args"))
        if message is not None:
            raise RuntimeError(message)

    _around(ModelRunner, "__init__", before=runner_settings_served)

    _patch(TritonGDNKernel, "packed_decode", gdn.replay_packed_decode)

    _patch(TritonGDNKernel, "target_verify", gdn.replay_target_verify)

    def refused(self, *args, **kwargs):
        raise RuntimeError("--replay-ssm: GDN's unpacked decode is not routed through replayssm (the packed "
                           "decode is)")

    _patch(TritonGDNKernel, "decode", refused)

    _patch(TritonKDAKernel, "packed_decode", kda.replay_packed_decode)
    _patch(TritonKDAKernel, "decode", kda.replay_decode)

    _patch(TritonKDAKernel, "target_verify", kda.replay_target_verify)

    def not_taken(*args, **kwargs):
        return False

    # SGLang's fused KDA variants update the state past the kernel seam: K3's conv + decode kernels
    # (CUDA, and ROCm gfx950's HIP ones) and the DSPARK / fused conv + gating chain verify kernels
    for name in seams.kda_fused_decode_modules:
        _patch(importlib.import_module(name), "covered", not_taken)
    for name in seams.kda_fused_paths:
        _patch(KDAAttnBackend, name, not_taken)
    # 0.5.23's breakable prefill CUDA graphs capture a KDA extend on their own slot tables, past the
    # extend hooks that fold and reset its rows' rings: the extend breaks out of the graph, as GDN's does
    if "supports_prefill_graph_extend" in KDAAttnBackend.__dict__:
        _patch(KDAAttnBackend, "supports_prefill_graph_extend", not_taken)

    for backend_cls in (GDNAttnBackend, KDAAttnBackend):
        _patch(backend_cls, "forward_extend", around_extend(backend_cls.forward_extend))

    # extra_buffer: the track copies between a request's slot and its track slot
    for name in ("track_mamba_states_if_needed", "track_mamba_states_all_layers"):
        _patch(hlab, name, functools.partial(pool.track_copy, getattr(hlab, name)))
    _around(hlab.MambaAttnBackendBase, "_track_mamba_state_extend",
            after=lambda backend, forward_batch, h, ssm_states, forward_metadata, *args, **kwargs:
            pool.on_state("track extend", ssm_states, pool.track_extend_slots(forward_metadata)))
    # HiCache's host tier: a backup flushes every layer the host pool backs up (on 0.5.23 MTP draft
    # layers too, when their pool replays), on SGLang's device-to-host stream. SGLang backs up radix-tree
    # slots, whose rings the tree donation emptied, so this finds nothing to fold; it keeps a slot whose
    # ring is not empty (no SGLang path backs one up) from reaching the host tier without it. A load
    # refreshes that layer on the host-to-device stream before SGLang signals the layer done (on the
    # Triton backend reading no device value, so the load stays asynchronous)
    def flush_backup(host, device_pool, host_indices, device_indices, *args, **kwargs):
        for state in seams.host_device_layers(host):
            pool.on_state("hicache backup", state, device_indices)

    _around(MambaPoolHost, "backup_from_device_all_layer", before=flush_backup)
    _around(MambaPoolHost, "load_to_device_per_layer",
            after=lambda host, device_pool, host_indices, device_indices, layer_id, *args, **kwargs:
            pool.on_state("hicache load", seams.host_device_layers(host)[layer_id], device_indices))
    # the int8 radix store: a store quantizes the active slots for the tree, a hit writes them
    _around(MambaCheckpointPool, "store_from_active",
            before=lambda store, active_mamba_pool, active_slots, ckpt_slots:
            pool.after_forwards("int8 store", active_mamba_pool, active_slots))
    _around(MambaCheckpointPool, "load_to_active",
            after=lambda store, active_mamba_pool, ckpt_slots, active_slots:
            pool.on_pool("int8 load", active_mamba_pool, active_slots))
    # PD disaggregation, decode side: the prefill server's whole state landed in a PREBUILT batch's
    # slots (no forward runs before their first decode), whose rings still hold the previous occupant's
    _around(ScheduleBatchDisaggregationDecodeMixin, "prepare_for_prebuilt",
            after=lambda batch: pool.after_forwards("transfer", batch.req_to_token_pool.mamba_pool,
                                                    pool.request_slots(batch.req_to_token_pool, batch.reqs)))
    _around(hlab.MambaAttnBackendBase, "__init__",
            after=lambda backend, model_runner: check_linear_backend(backend, model_runner))


def _around(owner, name: str, *, before=None, after=None) -> None:
    """Patch method ``name`` of ``owner``: ``before`` and ``after`` are called with its arguments
    (``self`` first) around SGLang's own, whose result is returned."""
    original = owner.__dict__[name]

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if before is not None:
            before(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        if after is not None:
            after(self, *args, **kwargs)
        return result

    _patch(owner, name, method)


def around_mixer_forward(mixer_forward):
    """``MambaMixer2.forward`` that folds the rings of the rows its chunk scan takes (``num_prefills``
    first rows: every row of a mixed batch) before, and resets their rings and read copy after."""

    @functools.wraps(mixer_forward)
    def forward(self, **kwargs):
        meta = kwargs["metadata"]
        if meta.num_prefills == 0:
            return mixer_forward(self, **kwargs)
        state, rows = kwargs["layer_cache"].temporal, meta.mamba_cache_indices[:meta.num_prefills]
        pool.on_state("extend start", state, rows)
        result = mixer_forward(self, **kwargs)
        pool.on_state("extend end", state, rows)
        return result

    return forward


def around_extend(extend):
    """A GDN / KDA ``forward_extend`` that folds its rows' rings before (a mixed batch's decode rows)
    and resets their rings and read copy after (not around a target verify)."""

    @functools.wraps(extend)
    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
        state = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id).temporal
        rows = self.forward_metadata.mamba_cache_indices
        pool.on_state("extend start", state, rows)
        result = extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs)
        pool.on_state("extend end", state, rows)
        return result

    return forward_extend


# models whose layers update their recurrent state themselves, past the kernel seams replay routes
BYPASSING_ARCHITECTURES = ("JetNemotronForCausalLM", "JetVLMForConditionalGeneration")


def check_linear_backend(backend, model_runner=None) -> None:
    """Refuse (RuntimeError) a linear-attention backend that replay does not serve on its pool, and a
    model (``model_runner.model_config``) whose layers bypass the seams."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

    owner = backend.req_to_token_pool.mamba_pool
    if not hasattr(owner, "replay"):
        return
    hf_config = getattr(getattr(model_runner, "model_config", None), "hf_config", None)
    for arch in getattr(hf_config, "architectures", None) or ():
        if arch in BYPASSING_ARCHITECTURES:
            raise RuntimeError(f"--replay-ssm: {arch} updates its recurrent state in the model, past the kernel seams "
                               "replayssm routes; serve this model without --replay-ssm")
    name, spec = type(backend).__name__, owner.replay.spec
    families = ((Mamba2AttnBackend, "mamba2"), (GDNAttnBackend, "gdn"), (KDAAttnBackend, "kda"))
    family = next((f for cls, f in families if isinstance(backend, cls)), None)
    if family is None:
        raise RuntimeError(f"--replay-ssm: replayssm routes Mamba-2, GDN and KDA layers in SGLang; {name} routing is "
                           "not built. Serve this model without --replay-ssm")
    if family != spec.family:
        raise RuntimeError(f"--replay-ssm: {name} serves {family} layers but the replay pool was built for "
                           f"{spec.family} from the model's cache parameters")
    if family != "mamba2":
        for phase, chosen in versions.seams().linear_kernel_backends(backend).items():
            if chosen != "triton":
                raise RuntimeError(f"--linear-attn-{phase}-backend: replay routes {family.upper()} through the triton "
                                   f"kernel seam; got {chosen}")


def uninstall() -> None:
    """Restore every patched SGLang attribute."""
    while _saved:
        owner, name, value = _saved.pop()
        setattr(owner, name, value)
