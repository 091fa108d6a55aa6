"""Deterministic conformance vectors: one script of steps per family and mode, drawn from a seed.

A vector set (:class:`Case`) is everything a path needs to replay the same run: the layer spec,
the replay config, the initial state of every sequence, and a list of :class:`Step` (decode,
verify with its random acceptance, fork, flush). Sequences are logical ids ``0..num_seqs-1``
(each path maps them to its own slots); ``-1`` in a step's rows is a padded row.

The delta families' inputs come in two forms drawn together: SGLang's call-site form
(``raw``: un-normalised q, k in the ring dtype, v, gating inputs ``a`` and ``b`` with
``A_log = dt_bias = 0``) and the replayssm form (``inputs``: ``q_scale``, k L2-normalised,
``g = -softplus(a)``, ``beta = sigmoid(b)``), computed by ``replayssm.gating``'s reference, whose
bits every backend's gating (the one the SGLang adapter calls) reproduces, so both forms reach the
op as the same bits.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

import replayssm as rs
from replayssm.kernels.gating.reference import gating_ref

NUM_LAYERS = 1
# tiny dims: every contraction axis 16 (read copies and the Triton kernels need a power of two
# >= 16); KDA with HK == HV as Kimi-Linear (transformers' adapter assumes it), GDN with grouped heads
SPECS = {
    "mamba2": rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=16, num_groups=2),
    "gdn": rs.LayerSpec.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8),
    "kda": rs.LayerSpec.kda(num_k_heads=2, num_v_heads=2, head_k_dim=16, head_v_dim=16),
}

# script letters: D decode, V<T> verify of T tokens then commit a random prefix, F fork every
# live sequence, X pool.flush of every live sequence. With window 4: "decode" flushes at its 4th
# token (count 3 + 1 == window); "flush" verifies 2 tokens at count 2 and 3 at count 1
# (count + T == window) around a pool.flush.
MODES = {
    "decode": (dict(window=4), "D D D D D", True),
    "verify": (dict(window=4, max_draft_tokens=2), "V3 D V2 V3 D", True),
    "fork": (dict(window=4), "D D F D D D", False),
    "flush": (dict(window=4, max_draft_tokens=2), "D D V2 D X D V3", True),
    "fp8-fp16sr": (dict(window=4, max_draft_tokens=2, read_format="fp8", checkpoint_dtype="float16_sr", seed=7),
                   "V3 D V2 D D", True),
    "nvfp4-bf16": (dict(window=4, max_draft_tokens=2, read_format="nvfp4", checkpoint_dtype="bfloat16",
                        ring_dtype="bfloat16"), "V3 D V2 D D", True),
}
FAMILIES = tuple(SPECS)
INIT_SEQS = 2


@dataclass
class Step:
    """One scripted step.

    kind: "decode", "verify", "fork" or "flush". rows: logical sequence ids ``[n]`` (-1 = padding).
    inputs: replayssm inputs (``x [n, H, P]`` ... or with a token axis ``[n, T, ...]`` for verify).
    raw: delta families only, SGLang's form: ``q, k [n, (T,) HK, K]``, ``v``, ``a [n, (T,) HV]``
    (GDN) / ``[n, (T,) HV, K]`` (KDA), ``b [n, (T,) HV]``.
    accepted: int64 ``[n]`` tokens kept by the commit after a verify (padded rows ignored).
    children: fork only, the new sequence ids of ``rows`` in order.
    """

    kind: str
    rows: list[int]
    inputs: dict | None = None
    raw: dict | None = None
    accepted: torch.Tensor | None = None
    children: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int | None:
        """T of a verify, None for a decode."""
        if self.kind != "verify":
            return None
        return (self.inputs["x"] if "x" in self.inputs else self.inputs["v"]).shape[1]


@dataclass
class Case:
    """The vectors of one family and mode.

    init_state: fp32 ``[INIT_SEQS, *spec.state_shape]``, values exactly representable in every
    checkpoint dtype (so a host write of it is the same bits everywhere).
    params: Mamba-2 per-layer ``A, D, dt_bias [H]`` (fp32), empty for the delta families.
    """

    family: str
    mode: str
    spec: rs.LayerSpec
    cfg: rs.ReplayConfig
    init_state: torch.Tensor
    steps: list[Step]
    num_seqs: int
    params: dict

    @property
    def name(self) -> str:
        return f"{self.family}-{self.mode}"


def _mamba2_inputs(spec, params, lead, gen, dtype) -> dict:
    H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
    r = lambda *s, scale=1.0: (torch.randn(*lead, *s, generator=gen) * scale).to(dtype)  # noqa: E731
    return dict(x=r(H, P), dt=torch.randn(*lead, H, generator=gen), A=params["A"], B=r(G, N, scale=0.5),
                C=r(G, N, scale=0.5), D=params["D"], dt_bias=params["dt_bias"], z=r(H, P))


def _delta_inputs(spec, lead, gen, dtype) -> tuple[dict, dict]:
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    gate = (HV,) if spec.family == "gdn" else (HV, K)
    r = lambda *s: torch.randn(*lead, *s, generator=gen).to(dtype)  # noqa: E731
    raw = dict(q=r(HK, K), k=r(HK, K), v=r(HV, V),
               # softplus(a) in ~[0.005, 0.2]: long memory, never zero decay
               a=torch.randn(*lead, *gate, generator=gen) * 0.5 - 3.5, b=torch.randn(*lead, HV, generator=gen))
    # the adapter's gating (replayssm.gating) with A_log = dt_bias = 0: -exp(0) * softplus(a + 0), sigmoid(b)
    made = gating_ref(raw["q"], raw["k"], raw["a"], raw["b"], torch.zeros(HV), torch.zeros(*gate), ring_dtype=dtype)
    inputs = dict(q=raw["q"], v=raw["v"], scale=spec.head_k_dim ** -0.5, **made)
    return inputs, raw


def make_case(family: str, mode: str) -> Case:
    """The vectors of ``family`` x ``mode``, drawn from a seed derived from their names."""
    spec = SPECS[family]
    cfg_kwargs, script, pad = MODES[mode]
    cfg = rs.ReplayConfig(**cfg_kwargs)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{family}-{mode}".encode()))
    dtype = cfg.torch_ring_dtype
    params = {}
    if family == "mamba2":
        H = spec.num_heads
        params = dict(A=-torch.exp(torch.rand(H, generator=gen) * 3 - 3), D=torch.randn(H, generator=gen),
                      dt_bias=torch.randn(H, generator=gen) * 0.5 - 2)
    # multiples of 1/512 in +-[1/512, 1/2]: exact in fp16 and bf16, never zero
    mag = torch.randint(1, 257, (INIT_SEQS, *spec.state_shape), generator=gen).float() / 512
    init = torch.where(torch.rand(mag.shape, generator=gen) < 0.5, -mag, mag)
    live = list(range(INIT_SEQS))
    steps = []
    for word in script.split():
        if word == "F":
            children = list(range(len(live), 2 * len(live)))
            steps.append(Step("fork", list(live), children=children))
            live = live + children
            continue
        if word == "X":
            steps.append(Step("flush", list(live)))
            continue
        rows = live[:1] + [-1] + live[1:] if pad else list(live)
        T = int(word[1:]) if word[0] == "V" else None
        lead = (len(rows),) if T is None else (len(rows), T)
        if family == "mamba2":
            inputs, raw = _mamba2_inputs(spec, params, lead, gen, dtype), None
        else:
            inputs, raw = _delta_inputs(spec, lead, gen, dtype)
        accepted = None if T is None else torch.randint(1, T + 1, (len(rows),), generator=gen)
        steps.append(Step("decode" if T is None else "verify", rows, inputs, raw, accepted))
    return Case(family, mode, spec, cfg, init, steps, len(live), params)


CASES = [(f, m) for f in FAMILIES for m in MODES]
