"""Layer dimensions and replay configuration, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FAMILIES = ("mamba2", "gdn", "kda")
CHECKPOINT_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16_sr": torch.float16,
}
READ_FORMATS = ("checkpoint", "fp8", "nvfp4")
RING_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BLOCK = 16  # elements per block scale of the fp8 / nvfp4 read copy
# one SSM layer of each published model the benchmarks and the TensorRT AOT command name:
# name -> ``family`` and the ``LayerSpec`` dims of that family (``model_layer`` builds the spec)
MODELS = {
    "nemotron-h": dict(family="mamba2", num_heads=128, head_dim=64, state_dim=128, num_groups=8),
    "qwen3.5": dict(family="gdn", num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
    "qwen3.5-122b": dict(family="gdn", num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
    "kimi-linear": dict(family="kda", num_k_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128),
}


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


@dataclass(frozen=True)
class LayerSpec:
    """Dimensions of one SSM / linear-attention layer.

    Mamba-2 uses ``num_heads`` (H), ``head_dim`` (P), ``state_dim`` (N), ``num_groups`` (G).
    GDN and KDA use ``num_k_heads`` (HK), ``num_v_heads`` (HV), ``head_k_dim`` (K),
    ``head_v_dim`` (V). Build with :meth:`mamba2`, :meth:`gdn` or :meth:`kda`.
    """

    family: str
    num_heads: int = 0
    head_dim: int = 0
    state_dim: int = 0
    num_groups: int = 0
    num_k_heads: int = 0
    num_v_heads: int = 0
    head_k_dim: int = 0
    head_v_dim: int = 0

    @classmethod
    def mamba2(cls, *, num_heads: int, head_dim: int, state_dim: int, num_groups: int) -> "LayerSpec":
        return cls("mamba2", num_heads=num_heads, head_dim=head_dim, state_dim=state_dim, num_groups=num_groups)

    @classmethod
    def gdn(cls, *, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int) -> "LayerSpec":
        return cls("gdn", num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                   head_v_dim=head_v_dim)

    @classmethod
    def kda(cls, *, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int) -> "LayerSpec":
        return cls("kda", num_k_heads=num_k_heads, num_v_heads=num_v_heads, head_k_dim=head_k_dim,
                   head_v_dim=head_v_dim)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {FAMILIES}, got {self.family!r}")
        if self.family == "mamba2":
            for name in ("num_heads", "head_dim", "state_dim", "num_groups"):
                _positive(name, getattr(self, name))
            if self.num_heads % self.num_groups:
                raise ValueError(f"num_heads: expected a multiple of num_groups={self.num_groups}, "
                                 f"got {self.num_heads}")
        else:
            for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
                _positive(name, getattr(self, name))
            if self.num_v_heads % self.num_k_heads:
                raise ValueError(f"num_v_heads: expected a multiple of num_k_heads={self.num_k_heads}, "
                                 f"got {self.num_v_heads}")

    @property
    def is_delta(self) -> bool:
        """True for the delta-rule families (GDN, KDA)."""
        return self.family != "mamba2"

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """Canonical per-slot state shape: Mamba-2 ``(H, P, N)``, GDN/KDA ``(HV, K, V)``."""
        if self.family == "mamba2":
            return (self.num_heads, self.head_dim, self.state_dim)
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def read_rows_cols(self) -> tuple[int, int, int]:
        """Read-copy layout ``(heads, rows, cols)``; cols is the contraction axis (N or K)."""
        if self.family == "mamba2":
            return (self.num_heads, self.head_dim, self.state_dim)
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def state_numel(self) -> int:
        h, a, b = self.state_shape
        return h * a * b


@dataclass(frozen=True)
class ReplayConfig:
    """How a pool keeps state: ring window, drafts, checkpoint precision, read copy.

    window: L, the ring length in committed tokens; a decode step flushes (writes the
        checkpoint) once every L tokens. ``window=1`` is the conventional recurrence.
    max_draft_tokens: largest number of draft tokens per verify (a verify takes
        ``1..max_draft_tokens + 1`` tokens).
    checkpoint_dtype: "float32", "bfloat16" or "float16_sr" (fp16, stochastic rounding at
        every checkpoint write, seeded by ``seed``).
    read_format: what non-flush steps read: "checkpoint" itself, or a read copy in
        "fp8" (e4m3) or "nvfp4" (e2m1), block-scaled along the contraction axis.
    ring_dtype: storage dtype of ring activations (x, B / k, v); inputs must have it.
    seed: seed of the stochastic rounding.
    """

    window: int = 16
    max_draft_tokens: int = 0
    checkpoint_dtype: str = "float32"
    read_format: str = "checkpoint"
    ring_dtype: str = "float32"
    seed: int = 0
    torch_checkpoint_dtype: torch.dtype = field(init=False, repr=False, compare=False)
    torch_ring_dtype: torch.dtype = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _positive("window", self.window)
        if not isinstance(self.max_draft_tokens, int) or self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens: expected an int >= 0, got {self.max_draft_tokens!r}")
        if self.checkpoint_dtype not in CHECKPOINT_DTYPES:
            raise ValueError(f"checkpoint_dtype: expected one of {tuple(CHECKPOINT_DTYPES)}, "
                             f"got {self.checkpoint_dtype!r}")
        if self.read_format not in READ_FORMATS:
            raise ValueError(f"read_format: expected one of {READ_FORMATS}, got {self.read_format!r}")
        if self.ring_dtype not in RING_DTYPES:
            raise ValueError(f"ring_dtype: expected one of {tuple(RING_DTYPES)}, got {self.ring_dtype!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            raise ValueError(f"seed: expected an int in [0, 2**31), got {self.seed!r}")
        object.__setattr__(self, "torch_checkpoint_dtype", CHECKPOINT_DTYPES[self.checkpoint_dtype])
        object.__setattr__(self, "torch_ring_dtype", RING_DTYPES[self.ring_dtype])

    @property
    def max_tokens(self) -> int:
        """T_max: the most tokens one verify takes."""
        return self.max_draft_tokens + 1

    @property
    def capacity(self) -> int:
        """Physical ring entries per slot: the most committed history plus one verify."""
        return max(self.window - 1, self.max_tokens) + self.max_tokens

    def check(self, spec: LayerSpec) -> None:
        """Raise ValueError if this config cannot serve ``spec``."""
        if self.read_format != "checkpoint":
            cols = spec.read_rows_cols[2]
            if cols % BLOCK:
                axis = "state_dim" if spec.family == "mamba2" else "head_k_dim"
                raise ValueError(f"{axis}: read_format={self.read_format!r} needs a multiple of "
                                 f"{BLOCK}, got {cols}")


def model_layer(name: str) -> LayerSpec:
    """The ``LayerSpec`` of one SSM layer of the published model ``name`` (a key of ``MODELS``)."""
    if name not in MODELS:
        raise ValueError(f"name: expected one of {sorted(MODELS)}, got {name!r}")
    dims = dict(MODELS[name])
    return getattr(LayerSpec, dims.pop("family"))(**dims)
