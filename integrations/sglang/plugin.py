"""SGLang plugin entry point (group ``sglang.srt.plugins``), loaded by SGLang in every process.

With replay off (no ``REPLAYSSM_SGLANG`` in the environment) it does nothing. With replay on it
checks the SGLang version, and then refuses: the adapters that put replayssm state into SGLang's
mamba pool and route its mixers through the shared kernels are not built yet (README, Status).
"""

from __future__ import annotations

from . import options


def check_version() -> str:
    """The installed SGLang version; RuntimeError unless it is the one this adapter targets."""
    import sglang

    found = getattr(sglang, "__version__", "unknown")
    if found != options.SGLANG_VERSION:
        raise RuntimeError(f"replayssm's SGLang adapter targets sglang=={options.SGLANG_VERSION}, found {found}")
    return found


def load() -> None:
    """Entry point: a no-op unless the replayssm launcher enabled replay."""
    cfg = options.from_env()
    if cfg is None:
        return
    check_version()
    raise NotImplementedError(
        "replayssm: the SGLang adapters (mamba pool state, Mamba-2/GDN/KDA mixer routing, commit, radix "
        "guards) are not built yet; only `launch_server --dry-run` works")
