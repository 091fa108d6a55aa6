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
