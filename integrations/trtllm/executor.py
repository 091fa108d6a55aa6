"""Replay inside TRT-LLM's own PyTorch executor, from an out-of-tree module (never run inside TensorRT-LLM).

TRT-LLM builds a hybrid model's cache manager itself, after loading the model
(``pyexecutor/_util.py``: ``KvCacheCreator`` picks the class, ``_create_kv_cache_manager`` builds it
with ``model_type="nemotron_hybrid"`` or ``"qwen3_next"``). Of its hybrid managers only the Mixed one
(``MixedMambaHybridCacheManager``, selected by ``TRTLLM_USE_PY_MAMBA=1``, or by
``TLLM_MAMBA_MANAGER_PREFERENCE=MIXED``; the default Cpp / V2 managers keep their state in C++ pools)
holds a Python manager: its ``MambaCacheManager`` facade builds ``self._impl =
PythonMambaCacheManager(...)`` by that module-global name and forwards ``mamba_layer_cache``,
``get_ssm_states``, ``update_mamba_states`` and the rest to it (read at 00bce92, where the module is
``pyexecutor/mamba_cache_manager.py``; later ``pyexecutor/kv_cache/mamba_cache_manager/legacy.py``).

:func:`enable_replay` therefore:

- replaces that name with :func:`~.cache.cache_manager_class`'s subclass, built with the replay
  settings given here (the layer dims, checkpoint dtype, draft budget and layout come from what
  TRT-LLM passes it), which registers its state for the routed call sites;
- routes ``Mamba2Mixer`` (every instance built from then on) and ``Qwen3NextGatedDeltaNet`` (its
  module's decode and verify functions and ``forward_extend``) to replay for registered states
  (:func:`~.mixer.route_mamba2_class`, :func:`~.mixer.route_gdn_class`); other states keep TRT-LLM's
  kernels.

Call it before the executor is created, in every process that builds one, e.g. from a package that
``trtllm-serve --custom_module_dirs DIR`` imports (``DIR/<package>/__init__.py``), or before
``LLM(...)``. Replay then serves plain decode and linear speculative verify; TensorRT-LLM itself was
never run with it (docs/trtllm.md).
"""

from __future__ import annotations

import replayssm as rs

from . import mixer as _mixer
from .cache import MANAGER_MODULES, cache_manager_class, import_trtllm

# where TRT-LLM's classes live (module of the Python manager, Mamba-2 mixer, GDN layer)
_MODULES = {"cache": MANAGER_MODULES, **_mixer.MIXER_MODULES}


def enable_replay(window: int = 16, read_format: str = "checkpoint", ring_dtype: str = "bfloat16", seed: int = 0,
                  *, modules: dict | None = None) -> None:
    """Make TRT-LLM's executor build replay managers and route its SSM layers to them (see the module docs).

    Args:
        window, read_format, ring_dtype, seed: ``replayssm.ReplayConfig`` fields of every manager
            (checked here); the checkpoint dtype is TRT-LLM's ``mamba_ssm_cache_dtype`` (float16:
            ``float16_sr``), ``max_draft_tokens`` its ``speculative_num_draft_tokens``.
        modules: ``{"cache", "mamba2", "gdn"}`` -> the modules holding ``PythonMambaCacheManager``,
            ``Mamba2Mixer`` and ``Qwen3NextGatedDeltaNet``; None imports TRT-LLM's (ImportError saying
            what to install without it).
    """
    defaults = dict(window=window, read_format=read_format, ring_dtype=ring_dtype, seed=seed)
    rs.ReplayConfig(**defaults)
    mods = modules if modules is not None else {name: import_trtllm(names, "executor.enable_replay")
                                                for name, names in _MODULES.items()}
    cache = mods["cache"]
    if getattr(cache.PythonMambaCacheManager, "replayssm_defaults", None) is not None:
        raise ValueError("enable_replay: already enabled in this process")
    base = cache_manager_class(cache.PythonMambaCacheManager, defaults=defaults)

    class RegisteringReplayManager(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            _mixer.register(self.replay)

    _mixer.route_mamba2_class(mods["mamba2"].Mamba2Mixer)
    _mixer.route_gdn_class(mods["gdn"].Qwen3NextGatedDeltaNet)
    cache.PythonMambaCacheManager = RegisteringReplayManager

