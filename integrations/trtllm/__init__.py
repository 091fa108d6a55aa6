"""TensorRT-LLM adapter. Not built yet: see README.md, section Status."""
