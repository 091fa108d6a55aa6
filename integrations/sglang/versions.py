"""Where the SGLang releases replayssm serves differ, one class per release.

Every seam whose name, module or arguments changed between SGLang 0.5.17 and 0.5.23 is a method or
attribute here; the adapter (``hooks``, ``pool``, ``mamba2``) calls ``seams()`` and never compares
versions itself. A release not in ``SEAMS`` is refused by ``plugin.check_version``.

| seam | 0.5.23 | 0.5.17 |
|---|---|---|
| HiCache host pool (``MambaPoolHost``) | ``mem_cache.pool_host.mamba``; ``temporal_device_layers`` | ``mem_cache.memory_pool_host``; ``device_pool.mamba_cache.temporal`` |
| radix-tree mamba component (``MambaComponent``) | ``unified_cache.components.mamba`` | ``unified_cache.components.mamba_component`` |
| a request's mamba slot | ``req.kv.mamba_pool_idx`` (``req.kv.holds_mamba``) | ``req.mamba_pool_idx`` (None when it holds none) |
| KDA fused kernels past the seam | ``_can_run_fused_chain_verify``, ``_can_run_dspark_cutedsl_mtp`` | ``_can_run_dspark_cutedsl_mtp`` |
| draft tokens per verify (pool sizing) | ``runtime_context.max_speculative_num_draft_tokens()`` | ``server_args.max_speculative_num_draft_tokens`` |
| replay's side bytes in the mamba pool budget | ``KVCacheConfigurator.extra_mamba_cache_bytes_per_req`` | ``mamba_cache_per_req`` of the configurator's cache parameters (no extra-bytes field) |
| linear-attention kernel backends chosen | ``model_runner.linear_attn_backends`` | ``layers.attention.linear.utils`` getters |
| conv-window rollback after a verify | ``fused_conv_window_scatter_with_mask(..., src_rows)``, stable rows, per-slot side states | ``fused_conv_window_scatter_with_mask`` of 4 arguments, CUDA only |
| the config holding KDA layers (launcher dry run) | ``hybrid_arch.hybrid_kda_config`` | ``hybrid_arch.kimi_linear_config`` |
| a rank's parallel sizes outside a server (launcher dry run) | ``runtime_context.create_context`` / ``use_context`` | ``get_parallel().override`` |
"""

from __future__ import annotations

import contextlib
import importlib


class Seams0523:
    """SGLang 0.5.23."""

    version = "0.5.23"
    mamba_pool_host_module = "sglang.srt.mem_cache.pool_host.mamba"
    mamba_component_module = "sglang.srt.mem_cache.unified_cache.components.mamba"
    kda_fused_paths = ("_can_run_fused_chain_verify", "_can_run_dspark_cutedsl_mtp")
    # modules of fused KDA decodes (conv + gating + decode, writing the state) whose ``covered`` check
    # decides whether they run: K3's, and on ROCm gfx950 the HIP ones KDAAttnBackend.forward_decode takes
    kda_fused_decode_modules = ("sglang.kernels.ops.attention.kda_fused_decode",
                                "sglang.kernels.ops.attention.kda_fused_decode_gfx950",
                                "sglang.kernels.ops.attention.kda_fused_decode_aiter_hip")
    kda_config_finder = "hybrid_kda_config"

    @staticmethod
    def rank_context(server_args):
        """A context in which SGLang's config classes see the parallel sizes of ``server_args`` (one
        scheduler rank), as they do in a server."""
        from sglang.srt import runtime_context

        return runtime_context.use_context(runtime_context.create_context(server_args, role="scheduler"))

    @staticmethod
    def req_mamba_slot(req):
        """The request's mamba slot tensor, or None when it holds none."""
        return req.kv.mamba_pool_idx if req.kv.holds_mamba else None

    @staticmethod
    def host_device_layers(host_pool):
        """The device checkpoint of every layer a HiCache host pool backs up."""
        return host_pool.temporal_device_layers

    @staticmethod
    def attn_dp_size(configurator) -> int:
        """The attention data-parallel size the configurator divides running requests by."""
        return configurator.attn_dp_size

    @staticmethod
    def max_draft_tokens(configurator) -> int:
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens

        return max_speculative_num_draft_tokens()

    @staticmethod
    @contextlib.contextmanager
    def charged(configurator, side_bytes: int):
        """While sizing the mamba pool: every slot costs ``side_bytes`` more."""
        saved = configurator.extra_mamba_cache_bytes_per_req
        configurator.extra_mamba_cache_bytes_per_req = saved + side_bytes
        try:
            yield
        finally:
            configurator.extra_mamba_cache_bytes_per_req = saved

    @staticmethod
    def linear_kernel_backends(backend) -> dict[str, str]:
        """phase -> the kernel backend SGLang chose for GDN / KDA (``decode``, ``verify``)."""
        kernels = backend._model_runner.linear_attn_backends
        return {phase: getattr(kernels, phase).value for phase in ("decode", "verify")}

    @staticmethod
    def verify_slots(linear, req_pool, n: int, req_pool_indices):
        """``(slots, src_rows)`` of a verify batch's ``n`` rows: their mamba slots and, under SGLang's
        stable-rows mode, the rows of the conv windows to copy from (else None)."""
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

        if hlab.pp_spec_stable_rows_enabled() and req_pool_indices is not None:
            src_rows = req_pool_indices[:n]
            return linear._translate_mamba_indices(req_pool.get_mamba_indices(src_rows)), src_rows
        return linear.forward_metadata.mamba_cache_indices[:n], None

    @staticmethod
    def scatter_conv_window(conv, window, dst_slots, dst_steps, src_rows) -> None:
        """Roll a layer's conv window back to the accepted token (SGLang's own scatter)."""
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as hlab

        if conv.is_cuda:
            hlab.fused_conv_window_scatter_with_mask(conv, window, dst_slots, dst_steps, src_rows)
        else:
            hlab.HybridLinearAttnBackend._scatter_speculative_state_with_mask(conv, window, dst_slots, dst_steps,
                                                                              src_rows)

    @staticmethod
    def commit_side_states(backend, slots, last_correct_step_indices, track_args, src_rows) -> None:
        """SGLang's per-slot side states after a verify (0.5.23's PLE states)."""
        backend._update_ple_state_after_mtp_verify(slots, last_correct_step_indices, *track_args, src_rows)


class Seams0517(Seams0523):
    """SGLang 0.5.17 (what differs from 0.5.23)."""

    version = "0.5.17"
    mamba_pool_host_module = "sglang.srt.mem_cache.memory_pool_host"
    mamba_component_module = "sglang.srt.mem_cache.unified_cache.components.mamba_component"
    kda_fused_paths = ("_can_run_dspark_cutedsl_mtp",)
    kda_fused_decode_modules = ("sglang.kernels.ops.attention.kda_fused_decode",)
    kda_config_finder = "kimi_linear_config"

    @staticmethod
    def rank_context(server_args):
        from sglang.srt.runtime_context import get_parallel

        tp = server_args.tp_size
        attn_tp = tp // server_args.dp_size if server_args.enable_dp_attention else tp
        return get_parallel().override(tp_size=tp, attn_tp_size=attn_tp)

    @staticmethod
    def req_mamba_slot(req):
        return req.mamba_pool_idx

    @staticmethod
    def host_device_layers(host_pool):
        return list(host_pool.device_pool.mamba_cache.temporal.unbind(0))

    @staticmethod
    def attn_dp_size(configurator) -> int:
        return configurator.ps.attn_dp_size

    @staticmethod
    def max_draft_tokens(configurator) -> int:
        return configurator.server_args.max_speculative_num_draft_tokens

    @staticmethod
    @contextlib.contextmanager
    def charged(configurator, side_bytes: int):
        # 0.5.17 sizes a slot from its cache parameters' ``mamba_cache_per_req`` alone (the
        # configurator has slots, no extra-bytes field): the configurator sees a model config whose
        # cache parameters charge ``side_bytes`` more per slot, everything else forwarded
        saved = configurator.mambaish_config
        configurator.mambaish_config = _ChargedConfig(saved, side_bytes)
        try:
            yield
        finally:
            configurator.mambaish_config = saved

    @staticmethod
    def linear_kernel_backends(backend) -> dict[str, str]:
        from sglang.srt.layers.attention.linear import utils

        chosen = {"decode": utils.get_linear_attn_decode_backend().value,
                  "verify": utils.get_linear_attn_verify_backend().value}
        # 0.5.17's GDN verify runs FlashInfer whenever decode or prefill does
        prefill = utils.get_linear_attn_prefill_backend().value
        if prefill != "triton" and chosen["verify"] == "triton":
            chosen["verify"] = f"{prefill} (through --linear-attn-prefill-backend)"
        return chosen

    @staticmethod
    def verify_slots(linear, req_pool, n: int, req_pool_indices):
        return linear.forward_metadata.mamba_cache_indices[:n], None

    @staticmethod
    def scatter_conv_window(conv, window, dst_slots, dst_steps, src_rows) -> None:
        from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_conv_window_scatter_with_mask

        if not conv.is_cuda:
            raise RuntimeError("SGLang 0.5.17 rolls conv windows back on CUDA only")
        fused_conv_window_scatter_with_mask(conv, window, dst_slots, dst_steps)

    @staticmethod
    def commit_side_states(backend, slots, last_correct_step_indices, track_args, src_rows) -> None:
        """0.5.17 keeps no per-slot side states."""


class _ChargedParams:
    def __init__(self, params, side_bytes: int):
        self._params, self._side = params, side_bytes

    @property
    def mamba_cache_per_req(self):
        return self._params.mamba_cache_per_req + self._side

    def __getattr__(self, name):
        return getattr(self._params, name)


class _ChargedConfig:
    def __init__(self, config, side_bytes: int):
        self._config, self._side = config, side_bytes

    @property
    def mamba2_cache_params(self):
        return _ChargedParams(self._config.mamba2_cache_params, self._side)

    def __getattr__(self, name):
        return getattr(self._config, name)


SEAMS = {cls.version: cls for cls in (Seams0523, Seams0517)}


def seams():
    """The seams of the installed SGLang (RuntimeError naming the served releases for any other)."""
    found = getattr(importlib.import_module("sglang"), "__version__", "unknown")
    if found not in SEAMS:
        raise RuntimeError(f"replayssm's SGLang adapter serves sglang {', '.join(sorted(SEAMS))}; found {found}")
    return SEAMS[found]
