"""SGLang plugin entry point (group ``sglang.srt.plugins``), loaded by SGLang in every process.

With replay off (no ``REPLAYSSM_SGLANG`` in the environment) it does nothing and SGLang is
untouched. With replay on it checks the SGLang version and installs the class patches of
``hooks`` in this process (SGLang spawns its workers, so each one loads the plugin itself).
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
    """Entry point: a no-op unless the replayssm launcher enabled replay; then installs the hooks."""
    cfg = options.from_env()
    if cfg is None:
        return
    check_version()
    from . import hooks

    hooks.install(cfg)
