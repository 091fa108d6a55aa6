"""transformers adapter (targets transformers 5.19): decode transformers' own hybrid models
(NemotronH, Qwen3-Next, Qwen3.5, KimiLinear) with their recurrent state in a replayssm StatePool.

``ReplayCache`` (``replayssm.integrations.transformers.cache``) and the demo behind
``python -m replayssm.demo`` (``.demo``). Nothing here imports transformers at import time.
"""


def __getattr__(name: str):
    if name == "ReplayCache":
        from .cache import ReplayCache
        return ReplayCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
