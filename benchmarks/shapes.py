"""Layer shapes shared by tests and benchmarks: one SSM layer of Nemotron-H, Qwen3.5, Qwen3.5-122B and Kimi-Linear."""

from replayssm.spec import MODELS, model_layer

MODEL_SPECS = {name: model_layer(name) for name in MODELS}  # the dims are replayssm.spec.MODELS
BATCHES = (1, 64, 256, 512)
WINDOW = 16
