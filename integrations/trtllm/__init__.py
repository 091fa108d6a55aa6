"""TensorRT-LLM adapter. Built so far: ``aot`` (PTX + launch manifest of the shared kernels).

The TensorRT plugins and the PyTorch-backend modules are not built yet (README.md, Status).
Nothing here imports tensorrt or tensorrt_llm.
"""
