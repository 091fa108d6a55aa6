"""The backend protocol: what a ``StatePool`` calls to step, flush, store and commit, and the
registry that finds a backend by name.

A backend is a module (or any object) with the members of :class:`Backend`. The built-in ones sit
beside the kernels they run (``replayssm.kernels.backend_reference``: PyTorch, any device;
``replayssm.kernels.backend``: Triton); the registry names their modules and imports one when a
pool first asks for it, so importing ``replayssm`` imports no kernel.

Slots follow RING.md: int64 ``[n]``, -1 a padded row. ``cpu_slots`` / ``cpu_rows`` are the CPU
copy of validated slots; ``rows`` are on the pool's device.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

import torch

BACKENDS: dict[str, str] = {"reference": "replayssm.kernels.backend_reference",
                            "triton": "replayssm.kernels.backend"}


@runtime_checkable
class Backend(Protocol):
    """The operations a ``StatePool`` delegates to its backend (all in place)."""

    supports_unchecked: bool
    """True when every operation indexes rows on the device, so steps, commits, flushes and
    refreshes may run with ``checked=False`` (no host read, CUDA-graph capturable)."""

    def check(self, spec, cfg) -> None:
        """Raise ValueError for layer dims or a configuration this backend does not take."""

    def step(self, pool, layer: int, slots: torch.Tensor, cpu_slots: torch.Tensor | None, inputs: dict, *,
             committed: bool, out: torch.Tensor) -> None:
        """One decode (``committed``, T = 1) or verify step of ``slots`` through ``layer``: outputs
        into ``out [n, T, heads, dim]``, ring append, flush of the rows whose window fills, cursors
        advanced. ``inputs``: validated, ``[n, T, ...]``; ``cpu_slots`` None for ``checked=False``."""

    def flush(self, pool, layer: int, rows: torch.Tensor) -> None:
        """Fold the committed ring of ``rows`` (int64 ``[r]`` on the pool's device, distinct, no
        uncommitted verify) into the checkpoint of ``layer`` and re-derive the read copy; their
        rings empty. Rows with an empty ring keep their checkpoint bytes."""

    def store(self, pool, layer: int, cpu_rows: torch.Tensor, state: torch.Tensor) -> None:
        """Write fp32 ``state [r, *state_shape]`` as the checkpoint of ``cpu_rows`` (rounded to the
        checkpoint dtype) and re-derive their read copy; cursors untouched."""

    def refresh(self, pool, layer: int, rows: torch.Tensor) -> None:
        """Re-derive the read copy of ``rows`` (int64 ``[r]`` on the pool's device, slots of the pool;
        repeats allowed) of ``layer`` from their stored checkpoint; checkpoint and cursors untouched.
        Called only on a pool with a read copy."""

    def copy(self, pool, src: torch.Tensor, dst: torch.Tensor, *, layer: int | None, checkpoint: bool) -> None:
        """Make slots ``dst`` copies of ``src`` (int64 ``[n]`` on the pool's device; ``dst`` distinct and
        disjoint from ``src``) in ``layer`` or every layer (None): read copy, ring, cursors, and the
        checkpoint when ``checkpoint``. A backend with ``supports_unchecked`` skips a row whose ``src``
        or ``dst`` is outside ``[0, num_slots)`` (a padded row); the pool gives the others none."""

    def commit(self, cursors: dict, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the first ``num_accepted [n]`` pending tokens of ``slots`` in every layer."""

    def fold_committed(self, pool, layer: int, cpu_rows: torch.Tensor) -> torch.Tensor:
        """fp32 state ``[r, *state_shape]`` after the committed ring of ``cpu_rows``; nothing changes."""

    def gating(self, pool, *, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None, beta_round: bool,
               l2norm: str | None, softplus_beta: float, softplus_threshold: float) -> dict:
        """A GDN / KDA pool's step inputs from raw projections (validated; see ``replayssm.gating``),
        bit for bit ``kernels/gating/reference.py``: fresh ``dict(q_scale, k, g, beta)`` (no q_scale
        when ``l2norm`` is None)."""


def register(name: str, module: str) -> None:
    """Make the backend in ``module`` (a dotted module name, imported on first use) available to
    ``StatePool(backend=name)``."""
    if not isinstance(name, str) or not name or name == "auto":
        raise ValueError(f"name: expected a backend name other than 'auto', got {name!r}")
    if not isinstance(module, str) or not module or not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"module: expected a dotted module name (e.g. 'mypkg.replay_backend'), got {module!r}")
    BACKENDS[name] = module


def get(name: str) -> Backend:
    """The registered backend ``name`` (imports its module); ValueError for an unknown name or a
    module that lacks a member of :class:`Backend`."""
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {sorted(BACKENDS)}, got {name!r}")
    found = importlib.import_module(BACKENDS[name])
    if not isinstance(found, Backend):
        members = ("supports_unchecked", "check", "step", "flush", "refresh", "store", "copy", "commit",
                   "fold_committed", "gating")
        missing = [m for m in members if not hasattr(found, m)]
        raise ValueError(f"backend: {BACKENDS[name]} does not implement replayssm.backend.Backend (missing "
                         f"{', '.join(missing)})")
    return found
