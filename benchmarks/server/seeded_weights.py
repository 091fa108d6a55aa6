"""Seeded random weights at a trained model's scale, for SGLang servers started with ``--load-format dummy``.

SGLang's dummy loader fills every floating-point tensor with ``uniform(-1e-3, 1e-3)`` from one seed:
norm weights near zero scale the hidden state away, the logits come out flat (every logprob about
``-log(vocab)``) and the greedy tokens barely depend on the prompt, so two servers agree whatever
their SSM layers compute. ``initialize`` instead draws each tensor from a generator seeded by the
seed and the tensor's name:

| tensor | values |
|---|---|
| ``A_log`` (GDN, KDA) | ``log(A)``, ``A ~ U(1, 16)`` |
| ``A`` (SGLang's Mamba-2 holds ``-exp(A_log)``) | ``-A``, ``A ~ U(1, 16)`` |
| ``dt_bias`` | ``softplus^-1(dt)``, ``log dt ~ U(log 1e-3, log 1e-1)`` |
| other 1-D ``weight`` tensors of a ``*norm*`` module | ``1 + U(-0.1, 0.1)`` |
| other 1-D tensors (biases, ``D``) | ``U(-0.02, 0.02)`` |
| tensors of 2 or more dims | ``U(-a, a)``, ``a = sqrt(3 / fan_in)``, fan_in their last dim |

so the state decays by ``exp(-A dt)`` per token, between 0.2 and 0.999: most heads remember far past a
16-token window and the checkpoint carries a real share of every output. Every server given the same
seed gets the same weights.

``seeded_init/sitecustomize.py`` puts ``initialize`` in place of SGLang's ``initialize_dummy_weights``
in every process of a server started with ``REPLAYSSM_SEEDED_WEIGHTS=<seed>`` and ``seeded_init`` on
``PYTHONPATH`` (``check_server.py --weights seeded`` does both).
"""

from __future__ import annotations

import math
import zlib

import torch

ENV_VAR = "REPLAYSSM_SEEDED_WEIGHTS"
TARGET_MODULE = "sglang.srt.model_loader.loader"


def _draw(name: str, shape: tuple, generator: torch.Generator, device) -> torch.Tensor:
    """fp32 values for tensor ``name`` of ``shape`` (the table above)."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return torch.log(1.0 + 15.0 * u)
    if leaf == "A":
        return -(1.0 + 15.0 * u)
    if leaf == "dt_bias":
        dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * u)
        return dt + torch.log(-torch.expm1(-dt))
    if len(shape) <= 1:
        return 1.0 + 0.2 * (u - 0.5) if leaf == "weight" and "norm" in name else 0.04 * (u - 0.5)
    a = math.sqrt(3.0 / shape[-1])
    return 2.0 * a * (u - 0.5)


@torch.no_grad()
def initialize(model: torch.nn.Module, low: float = -1e-3, high: float = 1e-3, seed: int | None = None) -> None:
    """Fill every floating-point tensor of ``model.state_dict()`` in place (the table in the module
    docstring); ``low`` / ``high`` are SGLang's signature and unused. ``seed`` defaults to
    ``$REPLAYSSM_SEEDED_WEIGHTS`` (0 when unset)."""
    import os

    base = int(os.environ.get(ENV_VAR, "0")) if seed is None else seed
    for name, t in model.state_dict().items():
        if not torch.is_floating_point(t):
            continue
        g = torch.Generator(device=t.device)
        g.manual_seed((base * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFFFFFF)
        t.copy_(_draw(name, tuple(t.shape), g, t.device).to(t.dtype))
