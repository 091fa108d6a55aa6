"""Argument checks: every error names the argument and what was expected."""

from __future__ import annotations

import torch

from .spec import LayerSpec, ReplayConfig

MAMBA2_INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias", "z")
DELTA_INPUTS = ("q", "k", "v", "g", "beta", "scale", "q_scale")
LAYER_INPUTS = ("A", "D", "dt_bias", "scale")  # per layer, no row axis
# the L2 normalisations ``replayssm.gating`` takes (None: q and k arrive normalised)
L2NORMS = ("sglang", "fla", None)


def check_tensor(name: str, t, shape: tuple[int, ...], device: torch.device, dtype=None,
                 floating: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {list(shape)}, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")


def check_flag(name: str, value) -> None:
    """TypeError unless ``value`` is a bool (a flag is never taken by truthiness)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")


def check_number(name: str, value, *, optional: bool = False) -> None:
    """TypeError unless ``value`` is an int or float (not a bool), or None where ``optional``."""
    if optional and value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name}: expected a number{' or None' if optional else ''}, got {value!r}")


def check_inputs(spec: LayerSpec, cfg: ReplayConfig, n: int, T: int | None, device: torch.device,
                 inputs: dict) -> dict:
    """Validate one step's inputs; ``T`` None for decode (no token axis). Returns them with defaults."""
    allowed = MAMBA2_INPUTS if spec.family == "mamba2" else DELTA_INPUTS
    unknown = sorted(set(inputs) - set(allowed))
    if unknown:
        raise TypeError(f"{unknown[0]}: not an input of a {spec.family} layer; expected {allowed}")
    lead = (n,) if T is None else (n, T)
    act = cfg.torch_ring_dtype
    out = dict(inputs)
    if spec.family == "mamba2":
        H, P, N, G = spec.num_heads, spec.head_dim, spec.state_dim, spec.num_groups
        required = ("x", "dt", "A", "B", "C")
        for name in required:
            if inputs.get(name) is None:
                raise TypeError(f"{name}: required input of a mamba2 layer is missing")
        check_tensor("x", inputs["x"], lead + (H, P), device, act)
        check_tensor("dt", inputs["dt"], lead + (H,), device)
        check_tensor("A", inputs["A"], (H,), device)
        check_tensor("B", inputs["B"], lead + (G, N), device, act)
        check_tensor("C", inputs["C"], lead + (G, N), device)
        for name, shape in (("D", (H,)), ("dt_bias", (H,)), ("z", lead + (H, P))):
            out.setdefault(name, None)
            if out[name] is not None:
                check_tensor(name, out[name], shape, device)
    else:
        HK, HV, K, V = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim
        for name in ("q", "k", "v", "g", "beta"):
            if inputs.get(name) is None:
                raise TypeError(f"{name}: required input of a {spec.family} layer is missing")
        check_tensor("q", inputs["q"], lead + (HK, K), device)
        check_tensor("k", inputs["k"], lead + (HK, K), device, act)
        check_tensor("v", inputs["v"], lead + (HV, V), device, act)
        g_shape = lead + ((HV,) if spec.family == "gdn" else (HV, K))
        check_tensor("g", inputs["g"], g_shape, device)
        check_tensor("beta", inputs["beta"], lead + (HV,), device)
        out.setdefault("q_scale", None)
        if out["q_scale"] is not None:
            check_tensor("q_scale", out["q_scale"], lead + (HK,), device, torch.float32)
        scale = out.get("scale")
        if scale is None:
            out["scale"] = K ** -0.5
        elif not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise ValueError(f"scale: expected a positive float, got {scale!r}")
    return out


def check_slot_tensor(slots, device: torch.device, name: str = "slots") -> None:
    """Slot indices: an int64 ``[n]`` tensor on ``device`` (metadata only: reads no values); errors
    name the argument ``name``."""
    if not isinstance(slots, torch.Tensor):
        raise TypeError(f"{name}: expected an int64 torch.Tensor of shape [n], got {type(slots).__name__}")
    if slots.dim() != 1 or slots.dtype != torch.int64:
        raise ValueError(f"{name}: expected an int64 tensor of shape [n], got {slots.dtype} {list(slots.shape)}")
    if slots.device != device:
        raise ValueError(f"{name}: expected device {device}, got {slots.device}")
    if not slots.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (the kernels read it in memory order), got strides "
                         f"{slots.stride()}")


def check_slots(slots, num_slots: int, allocated: torch.Tensor, device: torch.device,
                name: str = "slots") -> torch.Tensor:
    """Slot indices ``[n]`` int64 on ``device``: allocated, distinct, or -1 (padding). Returns them on
    CPU; errors name the argument ``name``."""
    check_slot_tensor(slots, device, name)
    host = slots.cpu()
    bad = host[(host < -1) | (host >= num_slots)]
    if bad.numel():
        raise ValueError(f"{name}: expected indices in [0, {num_slots}) or -1, got {bad[0].item()}")
    real = host[host >= 0]
    if real.numel() and not bool(allocated[real].all()):
        raise ValueError(f"{name}: slot {real[~allocated[real]][0].item()} is not allocated")
    if real.unique().numel() != real.numel():
        raise ValueError(f"{name}: expected distinct slot indices")
    return host
