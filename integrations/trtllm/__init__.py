"""TensorRT-LLM adapter.

- ``steps``: one layer's step as the plugin layers see it: named buffers, the launches
  ``kernels/ops.py`` performs on them, the model dims, Triton's JIT specialization of a launch.
- ``aot``: the command writing the PTX + launch manifest of the shared kernels (``python -m``).
- ``plugin_desc``: TensorRT plugin descriptors as plain data (inputs, outputs, aliasing, launch).
- ``plugins``: ``tensorrt.plugin`` registrations (AOT) and ``add_step`` for a network; needs TensorRT.
- ``ptx_launch``: the plugin layers' PTX loaded and launched through the CUDA driver in TensorRT's
  parameter order (a manifest directory or built in-process; launching needs cuda-python and a GPU).
- ``cache``: ``ReplayMambaStates``, replay bookkeeping over TRT-LLM's own SSM state tensor, and
  ``cache_manager_class`` (TRT-LLM's ``PythonMambaCacheManager`` with it; needs TensorRT-LLM).
- ``mixer``: ``wire_mamba2`` / ``wire_gdn`` route a built model's ``Mamba2Mixer`` /
  ``Qwen3NextGatedDeltaNet`` decode and verify call sites to a ``ReplayMambaStates`` (TRT-LLM's
  classes are imported when called).
- ``executor``: ``enable_replay`` makes TRT-LLM's own PyTorch executor build replay managers and
  route its SSM layers to them, from an out-of-tree module (``trtllm-serve --custom_module_dirs``).

Nothing here imports tensorrt or tensorrt_llm at import time. docs/trtllm.md says what was verified
where and what never ran.
"""
