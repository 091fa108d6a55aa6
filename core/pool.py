"""StatePool: checkpoints, read copies, rings and cursors of every layer and slot."""

from __future__ import annotations

import math
import os

import torch

from . import backend as backends
from . import formats, ring
from .spec import LayerSpec, ReplayConfig
from .validate import check_flag, check_slot_tensor, check_slots, check_tensor


class StatePool:
    """Replay state of ``num_layers`` layers for ``num_slots`` sequences.

    | Name        | Shape                                   | Dtype            |
    |-------------|-----------------------------------------|------------------|
    | checkpoint  | ``[NL, S, *spec.state_shape]`` (view)   | checkpoint dtype |
    | read[codes] | ``[NL, S, heads, rows, cols or cols/2]``| e4m3 / uint8     |
    | read[block_scale] | ``[NL, S, heads, rows, cols/16]`` | e4m3             |
    | read[row_scale]   | ``[NL, S, heads, rows]``          | fp32             |
    | ring[name]  | ``[NL, S, *ring_buffers()[name]]``      | see RING.md      |
    | cursors[f]  | ``[NL, S + 1]`` (last column: padding)  | int32            |

    Args:
        spec: layer dimensions. cfg: replay configuration.
        num_layers, num_slots: pool size.
        device: where every buffer lives.
        backend: a registered backend (``replayssm.backend``): "reference" (PyTorch, any device),
            "triton", or "auto" (the Triton kernels on CUDA, the reference elsewhere).
        checkpoint: optional framework-owned checkpoint tensor ``[NL, S, ...]`` (any strides)
            in the checkpoint dtype; the pool reads and writes it in place.
        state_layout: layout of ``checkpoint`` for GDN/KDA: "kv" (``[.., HV, K, V]``) or "vk".

    Attributes:
        backend: the backend's name. backend_ops: the backend (``replayssm.backend.Backend``).
        layer_A: per layer, the Mamba-2 ``A [H]`` the layer was last stepped with (None before its
            first step), which a flush outside a step folds with. It is the caller's tensor, kept by
            reference as a model's parameter is (CUDA graphs of flushes read it by address): an
            in-place change to it changes what later flushes fold with.

    The pool's methods validate their arguments and may synchronize with the device; the
    step functions ``replayssm.decode`` / ``verify`` do the math (through ``check_layer``,
    ``cpu_slots``, ``require_unchecked`` and ``backend_ops``).
    """

    def __init__(self, spec: LayerSpec, cfg: ReplayConfig, *, num_layers: int, num_slots: int,
                 device="cpu", backend: str = "auto", checkpoint: torch.Tensor | None = None,
                 state_layout: str = "kv"):
        if not isinstance(spec, LayerSpec):
            raise TypeError(f"spec: expected a LayerSpec, got {type(spec).__name__}")
        if not isinstance(cfg, ReplayConfig):
            raise TypeError(f"cfg: expected a ReplayConfig, got {type(cfg).__name__}")
        cfg.check(spec)
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if backend != "auto" and backend not in backends.BACKENDS:
            raise ValueError(f"backend: expected 'auto' or one of {sorted(backends.BACKENDS)}, got {backend!r}")
        if state_layout not in ("kv", "vk"):
            raise ValueError(f"state_layout: expected 'kv' or 'vk', got {state_layout!r}")
        self.spec, self.cfg = spec, cfg
        self.num_layers, self.num_slots = num_layers, num_slots
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.backend = _resolve_backend(backend, self.device)
        self.backend_ops = backends.get(self.backend)
        self.backend_ops.check(spec, cfg)
        self.checkpoint = self._make_checkpoint(checkpoint, state_layout)
        self.read = {}
        if cfg.read_format != "checkpoint":
            heads, rows, cols = spec.read_rows_cols
            for name, (shape, dtype) in formats.read_copy_shapes(cfg.read_format, rows, cols).items():
                self.read[name] = torch.zeros(num_layers, num_slots, heads, *shape, dtype=dtype, device=self.device)
        self.ring = {name: torch.zeros(num_layers, num_slots, *shape, dtype=dtype, device=self.device)
                     for name, (shape, dtype) in ring.ring_buffers(spec, cfg).items()}
        self.cursors = ring.new_cursors(num_layers, num_slots, self.device)
        self.allocated = torch.zeros(num_slots, dtype=torch.bool)
        # Mamba-2: the A [H] each layer was last stepped with; folding ring entries outside a
        # step (read_state, flush) needs it
        self.layer_A: list[torch.Tensor | None] = [None] * num_layers
        self.pending = torch.zeros(num_layers, num_slots, dtype=torch.int64)  # host mirror

    def _make_checkpoint(self, checkpoint, state_layout):
        shape = (self.num_layers, self.num_slots, *self.spec.state_shape)
        dtype = self.cfg.torch_checkpoint_dtype
        if checkpoint is None:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        view = checkpoint.transpose(-1, -2) if (self.spec.is_delta and state_layout == "vk") else checkpoint
        expected = shape if state_layout == "kv" or not self.spec.is_delta else shape[:-2] + shape[-2:][::-1]
        check_tensor("checkpoint", checkpoint, expected, self.device, dtype)
        return view

    def cpu_slots(self, slots, name: str = "slots") -> torch.Tensor:
        """Validated ``slots`` (int64 ``[n]`` on the pool's device: distinct, allocated or -1)
        as an int64 CPU tensor ``[n]``; ValueError naming the argument ``name`` otherwise. Reads the
        slots on the host."""
        return check_slots(slots, self.num_slots, self.allocated, self.device, name)

    def check_layer(self, layer) -> None:
        """ValueError unless ``layer`` is an int in ``[0, num_layers)``."""
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: expected an int in [0, {self.num_layers}), got {layer!r}")

    def require_unchecked(self) -> None:
        """ValueError unless the backend takes ``checked=False`` operations (it indexes rows on the
        device: the triton backend)."""
        if not self.backend_ops.supports_unchecked:
            raise ValueError(f"checked: False needs the triton backend (the {self.backend!r} backend indexes rows "
                             "on the host)")

    def alloc(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots (int64 ``[n]`` on the pool device) with zero state and empty rings."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        free = (~self.allocated).nonzero().flatten()
        if free.numel() < n:
            raise ValueError(f"n: only {free.numel()} free slots, asked for {n}")
        cpu_idx = free[:n]
        self.allocated[cpu_idx] = True
        slots = cpu_idx.to(self.device)
        zero = torch.zeros(n, *self.spec.state_shape, dtype=torch.float32, device=self.device)
        for layer in range(self.num_layers):
            self.backend_ops.store(self, layer, cpu_idx, zero)
        ring.empty(self.cursors, None, slots, wrote_checkpoint=False)
        self.pending[:, cpu_idx] = 0
        return slots

    def free(self, slots: torch.Tensor) -> None:
        """Return ``slots`` to the pool."""
        cpu_idx = self.cpu_slots(slots)
        self.allocated[cpu_idx[cpu_idx >= 0]] = False

    def fork(self, slots: torch.Tensor) -> torch.Tensor:
        """New slots holding a copy of ``slots`` (checkpoint, read copy, ring, cursors)."""
        cpu_idx = self.cpu_slots(slots)
        if (cpu_idx < 0).any():
            raise ValueError("slots: fork takes no padded rows (-1)")
        child = self.alloc(cpu_idx.numel())
        self.copy(slots, child)
        return child

    def copy(self, src: torch.Tensor, dst: torch.Tensor, *, checked: bool = True, checkpoint: bool = True,
             layer: int | None = None) -> None:
        """Make allocated slots ``dst`` copies of ``src`` (checkpoint, read copy, ring, cursors and an
        uncommitted verify) in ``layer`` or, when None, every layer, row by row, in place; ``src`` is
        unchanged.

        The ring travels with the copy, so a copy needs no flush: ``dst`` holds the same state as
        ``src`` (the same checkpoint bytes and the same ring entries behind the same cursors).

        Args:
            src, dst: int64 ``[n]`` slots on the pool's device; ``dst`` distinct and disjoint from
                ``src``; a source may repeat (one slot copied into several). A padded row (-1) is -1
                in both and copies nothing.
            checked: False (triton backend) reads nothing on the host, for hosts that copy slots
                between steps or inside steps captured in CUDA graphs (a masked copy, as SGLang's
                track copy): the rules above are then not checked, a row with either slot outside
                ``[0, num_slots)`` is a padded row, and the host record of uncommitted verifies is
                left alone (as ``commit(checked=False)`` does). The triton backend copies in one
                launch for all buffers and layers.
            checkpoint: False leaves the checkpoint to the caller (a host that copies its own state
                tensor, which the pool wraps, itself).
        """
        check_flag("checked", checked)
        check_flag("checkpoint", checkpoint)
        if layer is not None:
            self.check_layer(layer)
        check_slot_tensor(src, self.device, "src")
        check_slot_tensor(dst, self.device, "dst")
        if src.numel() != dst.numel():
            raise ValueError(f"dst: expected as many slots as src ({src.numel()}), got {dst.numel()}")
        if not checked:
            self.require_unchecked()
            s, d = src, dst
        else:
            src_cpu, dst_cpu = src.cpu(), self.cpu_slots(dst, "dst")
            padded = src_cpu == -1
            if bool((padded != (dst_cpu == -1)).any()):
                raise ValueError("src, dst: a padded row (-1) must be padded in both")
            src_cpu, dst_cpu = src_cpu[~padded], dst_cpu[~padded]
            self.cpu_slots(src_cpu.unique().to(self.device), "src")       # in range and allocated
            if bool(torch.isin(dst_cpu, src_cpu).any()):
                raise ValueError("dst: expected slots none of which is in src")
            s, d = src_cpu.to(self.device), dst_cpu.to(self.device)
        if s.numel():
            self.backend_ops.copy(self, s, d, layer=layer, checkpoint=checkpoint)
        if checked:                                # the host mirror, once the copy was taken
            sel = slice(None) if layer is None else layer
            self.pending[sel, dst_cpu] = self.pending[sel, src_cpu]

    def write_state(self, layer: int, slots: torch.Tensor, state: torch.Tensor) -> None:
        """Set the checkpoint of ``slots`` to ``state`` (fp32, canonical layout) and empty the ring."""
        self.check_layer(layer)
        cpu_idx = self.cpu_slots(slots)
        check_tensor("state", state, (cpu_idx.numel(), *self.spec.state_shape), self.device, torch.float32)
        keep = cpu_idx >= 0
        self.backend_ops.store(self, layer, cpu_idx[keep], state[keep.to(self.device)])
        ring.empty(self.cursors, layer, slots, wrote_checkpoint=True)
        self.pending[layer, cpu_idx[keep]] = 0

    def read_state(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """fp32 state after every committed token ``[n, *state_shape]``; the pool is unchanged.

        Tokens of an uncommitted verify are not included. Padded rows (-1) read zeros.
        """
        self.check_layer(layer)
        cpu_idx = self.cpu_slots(slots)
        out = torch.zeros(cpu_idx.numel(), *self.spec.state_shape, dtype=torch.float32, device=self.device)
        keep = cpu_idx >= 0
        if keep.any():
            out[keep.to(self.device)] = self.backend_ops.fold_committed(self, layer, cpu_idx[keep])
        return out

    def flush(self, slots: torch.Tensor, *, checked: bool = True, layer: int | None = None) -> None:
        """Fold the committed ring of ``slots`` into the checkpoint in ``layer`` or, when None,
        every layer.

        Afterwards the checkpoint is the state and the ring is empty; rows with an empty ring
        keep their checkpoint bytes. Refuses slots with an uncommitted verify.

        The backend folds (``Backend.flush``; the triton backend on the device). ``checked=False`` (triton
        backend) reads nothing on the host: ``slots`` (int64 on the pool's device, -1 = padding;
        an index outside ``[0, num_slots)`` is a padded row too) must then be distinct and have no
        uncommitted verify, which is not checked.
        """
        check_flag("checked", checked)
        if layer is not None:
            self.check_layer(layer)
        layers = range(self.num_layers) if layer is None else (layer,)
        if not checked:
            self.require_unchecked()
            check_slot_tensor(slots, self.device)
            rows = slots
        else:
            cpu_idx = self.cpu_slots(slots)
            cpu_idx = cpu_idx[cpu_idx >= 0]
            if bool((self.pending[list(layers)][:, cpu_idx] > 0).any()):
                raise ValueError("slots: a slot has an uncommitted verify; commit before flush")
            rows = cpu_idx.to(self.device)
        for lay in layers:
            self.backend_ops.flush(self, lay, rows)

    def refresh(self, slots: torch.Tensor, *, layer: int | None = None, checked: bool = True) -> None:
        """The host wrote the checkpoint of ``slots`` itself (prefill, clear, copy, load).

        Empties their rings (cursors reset, any uncommitted verify dropped; ``epoch`` counts the
        host's write) and re-derives their read copy from the stored checkpoint, in ``layer`` or,
        when None, every layer; the checkpoint bytes are not touched. Padded rows (-1) are skipped.

        ``checked=False`` (triton backend) reads nothing on the host: ``slots`` (int64 on the pool's
        device) must then be distinct, which is not checked, and the host record of uncommitted
        verifies is left alone (as ``commit(checked=False)`` does). A padded row (-1, or any index
        outside ``[0, num_slots)``) is skipped: no read copy written, no cursor reset, so a masked
        event (SGLang's track copy under a CUDA graph) costs its real rows only.
        """
        check_flag("checked", checked)
        if layer is not None:
            self.check_layer(layer)
        layers = range(self.num_layers) if layer is None else (layer,)
        if not checked:
            self.require_unchecked()
            check_slot_tensor(slots, self.device)
            if slots.numel() == 0:
                return
            real = (slots >= 0) & (slots < self.num_slots)
            slots = rows = torch.where(real, slots, torch.full_like(slots, -1))
        else:
            cpu_idx = self.cpu_slots(slots)
            cpu_idx = cpu_idx[cpu_idx >= 0]
            rows = cpu_idx.to(self.device)
        if self.read and rows.numel():
            for lay in layers:
                self.backend_ops.refresh(self, lay, rows)
        # the cursors of every layer in one move
        ring.empty(self.cursors, layer, slots, wrote_checkpoint=True)
        if checked:
            self.pending[slice(None) if layer is None else layer, cpu_idx] = 0

    def commit(self, slots: torch.Tensor, num_accepted: torch.Tensor, *, checked: bool = True) -> None:
        """Keep the first ``num_accepted`` tokens of the last verify of ``slots``, in every layer.

        Args:
            slots: int64 ``[n]``. num_accepted: int ``[n]``, each in ``1..T`` of that verify
                (ignored for padded rows).
            checked: False (triton backend) skips the host-side checks of slots and counts and
                reads no device value, for hosts that drive steps with ``checked=False``
                (``replayssm.decode``); ``num_accepted`` must then be on the pool's device, a slot
                outside ``[0, num_slots)`` is a padded row (skipped), and a count outside
                ``[0, T]`` keeps the nearest end (0 drops the verify).
        """
        check_flag("checked", checked)
        if not checked:
            self.require_unchecked()
            check_slot_tensor(slots, self.device)
            if not isinstance(num_accepted, torch.Tensor) or num_accepted.dtype.is_floating_point \
                    or num_accepted.dtype == torch.bool or tuple(num_accepted.shape) != (slots.numel(),) \
                    or num_accepted.device != self.device or not num_accepted.is_contiguous():
                raise ValueError(f"num_accepted: expected a contiguous int tensor of shape [{slots.numel()}] on "
                                 f"{self.device}")
            self.backend_ops.commit(self.cursors, slots, num_accepted)    # the kernel skips padded rows
            return
        cpu_idx = self.cpu_slots(slots)
        if not isinstance(num_accepted, torch.Tensor) or num_accepted.dtype.is_floating_point \
                or num_accepted.dtype == torch.bool or tuple(num_accepted.shape) != (cpu_idx.numel(),):
            raise ValueError(f"num_accepted: expected an int tensor of shape [{cpu_idx.numel()}]")
        acc = num_accepted.cpu().to(torch.int64)
        keep = cpu_idx >= 0
        pend = self.pending[:, cpu_idx[keep]]
        if pend.numel() and bool((pend != pend[:1]).any()):
            raise ValueError("slots: layers disagree on the pending verify; verify every layer before commit")
        if keep.any():
            T = pend[0]
            if bool((T == 0).any()):
                raise ValueError("slots: a slot has no uncommitted verify")
            a = acc[keep]
            if bool(((a < 1) | (a > T)).any()):
                raise ValueError(f"num_accepted: expected values in 1..T (T = {T.tolist()}), got {a.tolist()}")
        acc = torch.where(keep, acc, torch.zeros_like(acc))
        # the validated slots themselves (the caller's tensor may be a strided view)
        self.backend_ops.commit(self.cursors, cpu_idx.to(self.device), acc.to(self.device))
        self.pending[:, cpu_idx[keep]] = 0

    def decoded_read_copy(self, layer: int, rows: torch.Tensor) -> torch.Tensor:
        """fp32 state that non-flush steps read, canonical layout ``[r, *state_shape]``."""
        if not self.read:
            return self.checkpoint[layer, rows].float()
        x = formats.dequantize(self.read["codes"][layer, rows], self.read["block_scale"][layer, rows],
                               self.read["row_scale"][layer, rows], self.cfg.read_format)
        return x.transpose(-1, -2) if self.spec.is_delta else x

    def bytes_per_slot(self) -> dict[str, int]:
        """Bytes per slot and layer of checkpoint, read copy and ring."""
        side = side_bytes_per_slot(self.spec, self.cfg)
        return {"checkpoint": self.spec.state_numel * self.checkpoint.element_size(),
                "read_copy": side["read_copy"], "ring": side["ring"]}


def side_bytes_per_slot(spec: LayerSpec, cfg: ReplayConfig) -> dict[str, int]:
    """Bytes per slot and layer that a pool keeps beside the checkpoint: ring, read copy, cursors.

    A host that owns the checkpoint tensor and budgets its memory adds these per slot."""
    def size(buffers):
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in buffers.values())

    heads, rows, cols = spec.read_rows_cols
    read = {} if cfg.read_format == "checkpoint" else formats.read_copy_shapes(cfg.read_format, rows, cols)
    return {"ring": size(ring.ring_buffers(spec, cfg)), "read_copy": heads * size(read),
            "cursors": len(ring.CURSOR_FIELDS) * torch.int32.itemsize}


def to_read_layout(spec: LayerSpec, state: torch.Tensor) -> torch.Tensor:
    """Canonical state ``[.., *state_shape]`` to the read-copy layout ``[.., heads, rows, cols]``."""
    return state.transpose(-1, -2) if spec.is_delta else state


def round_checkpoint(state: torch.Tensor, cfg: ReplayConfig, layer: int, epoch: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``state [r, ...]`` to the checkpoint dtype (stochastic for float16_sr)."""
    if cfg.checkpoint_dtype == "float16_sr":
        numel = state[0].numel() if state.shape[0] else 0
        u = formats.sr_uniform(cfg.seed, layer, epoch, numel).reshape(state.shape)
        return formats.fp16_stochastic_round(state, u)
    return state.to(cfg.torch_checkpoint_dtype)


def _resolve_backend(backend: str, device: torch.device) -> str:
    """"auto": the Triton kernels on CUDA, the reference elsewhere."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend: 'triton' on device {device} runs in Triton's interpreter; set "
                         "TRITON_INTERPRET=1 before importing replayssm.kernels")
    return backend
