"""Kernels run in Triton's interpreter on machines without a GPU (set before triton is imported);
SGLang's process-wide server arguments and the replay hooks for the SGLang adapter tests."""

import json
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))


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
        args = prepare_server_args(["--model-path", str(model), "--device", "cpu", "--skip-tokenizer-init",
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
