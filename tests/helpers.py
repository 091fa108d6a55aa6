"""Shared test machinery: random inputs, the fp64 step-recurrence oracle, tolerances."""

from __future__ import annotations

import torch

import replayssm as rs
from replayssm.kernels.delta.reference import delta_step_ref
from replayssm.kernels.mamba2.reference import mamba2_step_ref

# RMS-ratio tolerance of one step's outputs (and of states) against the fp64 step recurrence.
# For the read formats the mean over a run must also stay below a quarter of it.
TOL = {
    "float32": 1e-5,
    "bfloat16": 2e-2,
    "float16_sr": 5e-3,
    "fp8": 1.2e-1,
    "int8": 1e-2,                   # SGLang's int8 radix store: symmetric per (head, channel), rounded once
    "nvfp4": 5e-1,
}

SPECS = {
    "mamba2": rs.LayerSpec.mamba2(num_heads=4, head_dim=6, state_dim=16, num_groups=2),
    "gdn": rs.LayerSpec.gdn(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=5),
    "kda": rs.LayerSpec.kda(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=5),
}


def rms_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in fp64 (NaN anywhere gives inf)."""
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


PER_LAYER = {"A", "D", "dt_bias", "scale"}  # inputs without a row axis


class Params:
    """Per-layer parameters of a family (Mamba-2: A, D, dt_bias)."""

    def __init__(self, spec: rs.LayerSpec, num_layers: int, gen: torch.Generator):
        self.spec = spec
        if spec.family == "mamba2":
            H = spec.num_heads
            # slow decays (long memory) next to fast ones
            self.A = [-torch.exp(torch.rand(H, generator=gen) * 4 - 3) for _ in range(num_layers)]
            self.D = [torch.randn(H, generator=gen) for _ in range(num_layers)]
            self.dt_bias = [torch.randn(H, generator=gen) * 0.5 - 2 for _ in range(num_layers)]


def make_inputs(spec: rs.LayerSpec, params: Params, layer: int, n: int, T: int | None,
                gen: torch.Generator, dtype=torch.float32, gate: bool = True, device="cpu") -> dict:
    """Random (never zero) inputs of one step on ``device``; ``T`` None for decode."""
    out = _make_inputs(spec, params, layer, n, T, gen, dtype, gate)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def _make_inputs(spec, params, layer, n, T, gen, dtype, gate):
    lead = (n,) if T is None else (n, T)

    def r(*shape, scale=1.0):
        return (torch.randn(*lead, *shape, generator=gen) * scale).to(dtype)

    if spec.family == "mamba2":
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        out = dict(x=r(H, P), dt=torch.randn(*lead, H, generator=gen), A=params.A[layer],
                   B=r(G, N, scale=0.5), C=r(G, N, scale=0.5), D=params.D[layer],
                   dt_bias=params.dt_bias[layer])
        if gate:
            out["z"] = r(H, P)
        return out
    HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
    k = torch.nn.functional.normalize(torch.randn(*lead, HK, K, generator=gen), dim=-1).to(dtype)
    g_shape = (HV,) if spec.family == "gdn" else (HV, K)
    # log decays in [-0.5, -0.001]: long memory, never exactly zero
    g = -torch.exp(torch.rand(*lead, *g_shape, generator=gen) * 6.2 - 6.9)
    return dict(q=r(HK, K), k=k, v=r(HV, V), g=g, beta=torch.sigmoid(torch.randn(*lead, HV, generator=gen)))


def step_oracle(spec: rs.LayerSpec, state: torch.Tensor, inputs: dict):
    """One token of the step recurrence in the dtype of ``state`` (fp64 for the oracle)."""
    if spec.family == "mamba2":
        return mamba2_step_ref(state, inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"],
                               inputs.get("D"), inputs.get("dt_bias"), inputs.get("z"))
    scale = inputs.get("scale") or spec.head_k_dim ** -0.5
    q = inputs["q"].to(state.dtype)
    if inputs.get("q_scale") is not None:
        q = q * inputs["q_scale"].to(state.dtype)[..., None]
    return delta_step_ref(state, q, inputs["k"], inputs["v"], inputs["g"], inputs["beta"], scale)


def chain_oracle(spec: rs.LayerSpec, state: torch.Tensor, inputs: dict, n: int, T: int, scale: float):
    """n rows of T tokens packed row-major as ``[n*T, ...]`` inputs through the step recurrence from
    ``state [n, ...]``: (outputs ``[n, T, ...]``, the state after each token, ``T`` x ``[n, ...]``)."""
    ys, states = [], []
    for t in range(T):
        rows = {name: x.view(n, T, *x.shape[1:])[:, t] for name, x in inputs.items()}
        y, state = step_oracle(spec, state, dict(rows, scale=scale))
        ys.append(y)
        states.append(state)
    return torch.stack(ys, 1), states


def accepted_states(states: list, accepted) -> torch.Tensor:
    """Each row's state after its ``accepted[i]`` (1-based) tokens, from :func:`chain_oracle`'s states."""
    return torch.stack([states[acc - 1][i] for i, acc in enumerate(accepted)])


def token(inputs: dict, t: int) -> dict:
    """Token t of verify inputs ``[n, T, ...]`` as decode inputs ``[n, ...]``."""
    return {k: (v if k in PER_LAYER or v is None else v[:, t]) for k, v in inputs.items()}


def f64(inputs: dict) -> dict:
    return {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}


class Driver:
    """Drives a StatePool and the fp64 step recurrence side by side over several layers.

    ``decode`` and ``verify`` return the per-layer RMS ratios of the pool's outputs against the
    oracle; ``oracle[layer]`` holds the fp64 state after every committed token of each slot.
    """

    def __init__(self, spec: rs.LayerSpec, cfg: rs.ReplayConfig, num_layers: int, num_slots: int,
                 gen: torch.Generator, **pool_kwargs):
        self.spec, self.cfg, self.gen = spec, cfg, gen
        self.pool = rs.StatePool(spec, cfg, num_layers=num_layers, num_slots=num_slots, backend="reference",
                                 **pool_kwargs)
        self.params = Params(spec, num_layers, gen)
        self.oracle = [dict() for _ in range(num_layers)]  # layer -> {slot: fp64 state}

    def alloc(self, n: int) -> torch.Tensor:
        slots = self.pool.alloc(n)
        for o in self.oracle:
            for s in slots.tolist():
                o[s] = torch.zeros(self.spec.state_shape, dtype=torch.float64)
        return slots

    def _stack(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.oracle[layer][s] for s in slots.tolist()])

    def decode(self, slots: torch.Tensor) -> list[float]:
        """Decode every layer; rows with slot -1 are padding and must come back zero."""
        real = slots >= 0
        errs = []
        for layer in range(self.pool.num_layers):
            inp = make_inputs(self.spec, self.params, layer, slots.numel(), None, self.gen, self.cfg.torch_ring_dtype)
            y = rs.decode(self.pool, layer, slots, **inp)
            rows = {k: (v if k in PER_LAYER or v is None else v[real]) for k, v in inp.items()}
            yr, S = step_oracle(self.spec, self._stack(layer, slots[real]), f64(rows))
            for i, s in enumerate(slots[real].tolist()):
                self.oracle[layer][s] = S[i]
            errs.append(rms_ratio(y[real], yr) if bool(y[~real].eq(0).all()) else float("inf"))
        return errs

    def verify(self, slots: torch.Tensor, T: int, accepted: torch.Tensor) -> list[float]:
        errs = []
        for layer in range(self.pool.num_layers):
            inp = make_inputs(self.spec, self.params, layer, slots.numel(), T, self.gen, self.cfg.torch_ring_dtype)
            y = rs.verify(self.pool, layer, slots, **inp)
            S = self._stack(layer, slots)
            ys = []
            for t in range(T):
                yt, S = step_oracle(self.spec, S, f64(token(inp, t)))
                ys.append(yt)
                for i, s in enumerate(slots.tolist()):
                    if int(accepted[i]) == t + 1:
                        self.oracle[layer][s] = S[i]
            errs.append(rms_ratio(y, torch.stack(ys, 1)))
        self.pool.commit(slots, accepted)
        return errs

    def state_error(self, slots: torch.Tensor) -> float:
        return max(rms_ratio(self.pool.read_state(layer, slots), self._stack(layer, slots))
                   for layer in range(self.pool.num_layers))


def assert_same_resets(a: rs.StatePool, b: rs.StatePool) -> None:
    """Cursors (all but the last column, the padded rows' scratch) and read copies of two pools, bit
    for bit."""
    for name in a.cursors:
        assert torch.equal(a.cursors[name][:, :-1], b.cursors[name][:, :-1]), name
    for name in a.read:
        assert torch.equal(a.read[name].view(torch.uint8), b.read[name].view(torch.uint8)), name


def commit_with_tracks(hybrid, pool, track: torch.Tensor, accepted: list, to_track: list, states: list) -> None:
    """A verify's commit through a host backend's ``update_mamba_state_after_mtp_verify`` with
    extra_buffer track slots (``to_track[i]``: the verify step row i's track slot takes, -1 none),
    checked on every layer of ``pool`` (a StatePool): a tracked slot holds ``states[layer][step][i]``
    (``chain_oracle``'s per-token states), flushed; an untracked one is unchanged."""
    before = [pool.read_state(layer, track) for layer in range(len(states))]
    hybrid.update_mamba_state_after_mtp_verify(torch.tensor(accepted) - 1, track.to(torch.int32),
                                               torch.tensor(to_track), model=None)
    for layer, per_token in enumerate(states):
        got = pool.read_state(layer, track)
        for i, step in enumerate(to_track):
            want = before[layer][i] if step < 0 else per_token[step][i]
            assert rms_ratio(got[i], want) < TOL["float32"], (layer, i, step)
    assert pool.cursors["count"][:, track[torch.tensor(to_track) >= 0]].eq(0).all()   # flushed: the tree takes it
