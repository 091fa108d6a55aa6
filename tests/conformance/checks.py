"""Checks shared by the conformance tests and the GPU script: tolerances, outputs vs the
recurrence, state vs another path."""

from __future__ import annotations

import torch

from helpers import TOL, rms_ratio


def tolerance(cfg) -> float:
    """RMS-ratio bound of one step's outputs against the fp64 recurrence."""
    tol = TOL[cfg.read_format] if cfg.read_format != "checkpoint" else TOL[cfg.checkpoint_dtype]
    return max(tol, 2e-2) if cfg.ring_dtype == "bfloat16" else tol


def pair_tolerance(cfg) -> float:
    """RMS-ratio bound between two implementations (reference vs Triton) of the same step."""
    if cfg.ring_dtype == "bfloat16":
        return 2e-2
    if cfg.read_format != "checkpoint":
        return 5e-2
    return 2e-5 if cfg.checkpoint_dtype == "float32" else 1e-2


def check_outputs(c, got: list, oracle: tuple, problems: list, *, ungated_verify=False, padded=True) -> float:
    """Each step's outputs vs the recurrence (``paths.run_oracle``'s result); returns the worst
    RMS ratio, appends failures to ``problems``."""
    want, plain = oracle
    steps = [s for s in c.steps if s.kind in ("decode", "verify")]
    worst, errs = 0.0, []
    for j, (step, y, y_true) in enumerate(zip(steps, got, want)):
        if ungated_verify and step.kind == "verify" and plain[j] is not None:
            y_true = plain[j]
        real = torch.tensor([r >= 0 for r in step.rows])
        err = rms_ratio(y[real], y_true[real])
        worst = max(worst, err)
        if err >= tolerance(c.cfg):
            problems.append(f"step {j} ({step.kind}): error {err:.2e} >= {tolerance(c.cfg):.0e}")
        if padded and not bool(y[~real].eq(0).all()):
            problems.append(f"step {j}: padded rows not zero")
        errs.append(err)
    if c.cfg.read_format != "checkpoint" and sum(errs) / len(errs) >= tolerance(c.cfg) / 4:
        problems.append(f"mean error {sum(errs) / len(errs):.2e} >= a quarter of {tolerance(c.cfg):.0e}")
    return worst


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a floating-point tensor (integers as they are), for bit-exact comparisons."""
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


def check_state(c, got: dict, base: dict, problems: list, *, exact: bool) -> None:
    """Rings and cursors vs ``base``: raw entries bit-exact, d within the pair tolerance (bit-exact
    when ``exact``, which also takes the checkpoint and read-copy bytes)."""
    for key, want in base.items():
        if key not in got:
            problems.append(f"{key} missing")
        elif key.startswith(("ring.", "cursor.")) and key != "ring.d" or exact:
            if not torch.equal(_bits(got[key]), _bits(want)):
                problems.append(f"{key} differs")
        elif key == "ring.d" and rms_ratio(got[key], want) >= pair_tolerance(c.cfg):
            problems.append(f"ring.d error {rms_ratio(got[key], want):.2e}")


def check_kernels_vs_reference(c, t, base, problems: list) -> None:
    """The Triton path's trace ``t`` vs the reference pool's ``base``: outputs and checkpoint
    within the pair tolerance, raw rings and cursors bit-exact."""
    for j, (y, y_ref) in enumerate(zip(t.outputs, base.outputs)):
        if rms_ratio(y, y_ref) >= pair_tolerance(c.cfg):
            problems.append(f"step {j} outputs vs reference {rms_ratio(y, y_ref):.2e}")
    check_state(c, t.state, base.state, problems, exact=False)
    ck_tol = 1e-5 if c.cfg.checkpoint_dtype == "float32" else 2e-2
    if rms_ratio(t.state["checkpoint"].float(), base.state["checkpoint"].float()) >= ck_tol:
        problems.append("checkpoint vs reference")


def check_identical(c, t, base, problems: list) -> None:
    """Two traces of the same kernels: every step's outputs and every state buffer (rings, cursors,
    checkpoint, read copy) bit for bit."""
    if len(t.outputs) != len(base.outputs):
        problems.append(f"{len(t.outputs)} step outputs for {len(base.outputs)}")
    for j, (y, y_ref) in enumerate(zip(t.outputs, base.outputs)):
        if not torch.equal(_bits(y), _bits(y_ref)):
            problems.append(f"step {j} outputs differ")
    check_state(c, t.state, base.state, problems, exact=True)
