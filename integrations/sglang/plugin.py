"""SGLang plugin entry point (group ``sglang.srt.plugins``), loaded by SGLang in every process.

With replay off (no ``REPLAYSSM_SGLANG`` in the environment) it does nothing and SGLang is
untouched. With replay on it checks the SGLang version (``versions.SEAMS``: 0.5.17 and 0.5.23) and installs the
class patches of ``hooks`` in this process (SGLang spawns its workers, so each one loads the plugin
itself). SGLang logs and swallows a plugin's exception, so a process whose install failed would serve
without replay: the entry point (``entry_point``) ends such a process with the error instead.
"""

from __future__ import annotations

from . import options, versions


def check_version() -> str:
    """The installed SGLang version; RuntimeError naming the served releases unless it is one of them."""
    return versions.seams().version


def load() -> None:
    """Entry point: a no-op unless the replayssm launcher enabled replay; then installs the hooks."""
    cfg = options.from_env()
    if cfg is None:
        return
    check_version()
    from . import hooks

    hooks.install(cfg)


def entry_point() -> None:
    """What SGLang's plugin loader calls (``sglang.srt.plugins`` group): ``load``, and a process
    whose install failed ends with the error (SGLang would log it and serve without replay)."""
    try:
        load()
    except BaseException:
        import os
        import traceback

        traceback.print_exc()
        os._exit(3)
