"""The replay options that travel from the launcher to every SGLang process (an env var)."""

from __future__ import annotations

import json
import os

from replayssm.ring import RING_VERSION
from replayssm.spec import ReplayConfig

ENV_VAR = "REPLAYSSM_SGLANG"


def encode(cfg: ReplayConfig) -> str:
    """JSON of the fields SGLang processes need, with the ring-contract version."""
    return json.dumps(dict(window=cfg.window, max_draft_tokens=cfg.max_draft_tokens,
                           checkpoint_dtype=cfg.checkpoint_dtype, read_format=cfg.read_format,
                           ring_dtype=cfg.ring_dtype, seed=cfg.seed, ring_version=RING_VERSION), sort_keys=True)


def from_env() -> ReplayConfig | None:
    """The ReplayConfig the launcher put in the environment, or None when replay is off."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return None
    fields = json.loads(raw)
    version = fields.pop("ring_version", None)
    if version != RING_VERSION:
        raise RuntimeError(f"{ENV_VAR}: ring contract version {version} from the launcher, "
                           f"this process has {RING_VERSION}; use one replayssm install everywhere")
    return ReplayConfig(**fields)


# resolved SGLang settings replay refuses: field -> (flag, value that is fine, why)
REFUSED_SETTINGS = {
    "enable_unified_memory": ("--enable-unified-memory", False, "its mamba pool class is not the replay pool"),
    "enable_mamba_cache_stochastic_rounding": ("--enable-mamba-cache-stochastic-rounding", False,
                                               "use --replay-checkpoint-dtype float16_sr"),
    "enable_lmcache": ("--enable-lmcache", False, "LMCache loads a state into a mamba slot past the replay hooks"),
    # SGLang 0.5.23 (0.5.17 has no such field)
    "enable_unified_cache_external_linker": ("--enable-unified-cache-external-linker", False,
                                             "the external linker loads a state into a mamba slot past the replay "
                                             "hooks"),
}


def refusal(server_args) -> str | None:
    """What replay refuses in SGLang's resolved ``server_args``, as a message naming the flag, or None.

    The launcher refuses these at start (``launch_server``); the hooks check them again where SGLang
    builds a model runner, for a server started without the launcher."""
    for field, (flag, fine, why) in REFUSED_SETTINGS.items():
        value = getattr(server_args, field, fine)
        if value != fine:
            return f"{flag}: not served with --replay-ssm ({why}); got {value!r}"
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is not None and str(algorithm).upper() in ("DFLASH", "DSPARK"):
        return (f"--speculative-algorithm: replay verifies a dense chain of drafts; {algorithm}'s ragged verify "
                "is not built")
    strategy = getattr(server_args, "mamba_radix_cache_strategy", None)
    if strategy not in (None, "auto", "no_buffer", "extra_buffer"):
        return f"--mamba-radix-cache-strategy: replayssm serves no_buffer and extra_buffer; got {strategy}"
    return None
