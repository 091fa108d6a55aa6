"""Kernels run in Triton's interpreter on machines without a GPU (set before triton is imported);
the device of the SGLang adapter tests; SGLang's process-wide server arguments and the replay hooks
for the SGLang adapter tests.

``REPLAYSSM_TEST_DEVICE=cuda`` runs the SGLang adapter tests (the modules that use the
``test_device`` fixture) on the GPU, with the real Triton kernels (the StatePool backend "auto" is
"triton" there): SGLang's pools are built on ``DEVICE`` and the tensors those tests make go there.
Other test modules pick their device themselves. Default: cpu.
"""

import json
import os
import sys

import pytest
import torch

DEVICE = os.environ.get("REPLAYSSM_TEST_DEVICE", "cpu")
if DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"REPLAYSSM_TEST_DEVICE: expected cpu or cuda, got {DEVICE!r}")
if DEVICE == "cuda":
    if not torch.cuda.is_available():
        raise pytest.UsageError("REPLAYSSM_TEST_DEVICE=cuda: torch sees no CUDA device")
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        raise pytest.UsageError("REPLAYSSM_TEST_DEVICE=cuda runs the Triton kernels on the GPU; unset TRITON_INTERPRET")
elif not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _tf32_dots_in_the_interpreter():
    """Triton's interpreter multiplies ``tl.dot`` operands in fp32 whatever the precision asked. A
    GPU's tensor cores take the operands of an ``input_precision="tf32"`` product rounded to tf32
    (10 mantissa bits, to nearest, ties away: ``cvt.rna.tf32.f32``); round them so here too, so that
    a tf32 product over an operand that tf32 does not hold exactly fails the CPU tests as well."""
    import numpy as np
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def rounded(h):
        if h.data.dtype != np.float32:
            return h
        bits = (h.data.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        return interpreter.TensorHandle(bits.view(np.float32), h.dtype)

    def create_dot_tf32(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = rounded(a), rounded(b)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot_tf32


if os.environ.get("TRITON_INTERPRET", "0") != "0":
    _tf32_dots_in_the_interpreter()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_FACTORIES = {torch.tensor, torch.arange, torch.full, torch.zeros, torch.ones, torch.empty, torch.rand, torch.randn,
              torch.randint}


class _TestTensorsOnDevice(torch.overrides.TorchFunctionMode):
    """Tensors that code in tests/ makes without naming a device are made on ``DEVICE``; random ones
    are drawn from their (host) generator and moved, so every device sees the same inputs. Tensors
    that SGLang and replayssm make are left alone."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and kwargs.get("device") is None \
                and sys._getframe(1).f_code.co_filename.startswith(_TESTS_DIR):
            gen = kwargs.get("generator")
            if gen is not None and gen.device.type == "cpu":
                return func(*args, **kwargs).to(DEVICE)
            kwargs["device"] = DEVICE
        return func(*args, **kwargs)


@pytest.fixture
def test_device():
    """``DEVICE``; off the CPU, the tensors the test makes without a device are made there."""
    if DEVICE == "cpu":
        yield DEVICE
    else:
        with _TestTensorsOnDevice():
            yield DEVICE


# a tiny Nemotron-H config: SGLang resolves its server arguments from it, offline
TINY_NEMOTRON_H = dict(architectures=["NemotronHForCausalLM"], model_type="nemotron_h", hidden_size=64,
                       vocab_size=128, num_hidden_layers=4, hybrid_override_pattern="M*M-", mamba_num_heads=4,
                       mamba_head_dim=6, n_groups=2, ssm_state_size=16, conv_kernel=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=256,
                       chunk_size=8)


@pytest.fixture(scope="session")
def server_args(tmp_path_factory):
    """SGLang's process-wide server arguments, as the launcher's no_buffer resolution leaves them."""
    from sglang.srt.server_args import prepare_server_args, set_global_server_args_for_scheduler
    model = tmp_path_factory.mktemp("tiny_nemotron_h")
    (model / "config.json").write_text(json.dumps(TINY_NEMOTRON_H))
    offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        args = prepare_server_args(["--model-path", str(model), "--device", DEVICE, "--skip-tokenizer-init",
                                    "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"])
    finally:
        if offline is None:
            os.environ.pop("HF_HUB_OFFLINE")
        else:
            os.environ["HF_HUB_OFFLINE"] = offline
    set_global_server_args_for_scheduler(args)
    return args


@pytest.fixture
def replay_on():
    """replayssm's SGLang hooks installed with a small window (flushes every 4 tokens) and an fp8 read copy."""
    import replayssm as rs
    from replayssm.integrations.sglang import hooks
    cfg = rs.ReplayConfig(window=4, read_format="fp8", ring_dtype="float32")
    hooks.install(cfg)
    yield cfg
    hooks.uninstall()
