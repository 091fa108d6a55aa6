"""replayssm: replay decoding for SSM / linear-attention layers (Mamba-2, Gated DeltaNet, KDA).

A pool keeps, per layer and sequence, a checkpoint, an optional low-precision read copy and a
ring of recent inputs; decode appends and flushes every ``window`` tokens, verify appends
draft tokens, commit keeps an accepted prefix by moving a cursor. See RING.md.
"""

from .api import decode, gating, verify
from .pool import StatePool
from .ring import RING_VERSION
from .spec import LayerSpec, ReplayConfig

__all__ = ["LayerSpec", "ReplayConfig", "StatePool", "decode", "gating", "verify", "RING_VERSION"]
__version__ = "0.1.0"
