"""Host-framework adapters (SGLang, TensorRT-LLM); each imports its framework lazily."""
