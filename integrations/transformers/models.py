"""Tiny hybrid models of transformers' own classes: seeded random weights, built in memory.

NemotronH (Mamba-2 + attention), Qwen3-Next and Qwen3.5 (GDN + attention; Qwen3.5's text model)
and KimiLinear (KDA + MLA). Dimensions are small enough for a CPU and keep the
state's contraction axis (N or K) a multiple of 16, as the fp8 / nvfp4 read copies need.
"""

from __future__ import annotations

import torch

MODELS = ("nemotron_h", "qwen3_next", "qwen3_5_text", "kimi_linear")


def tiny_config(name: str):
    """The transformers config of the tiny ``name`` model (one of MODELS), fp32."""
    import transformers

    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "nemotron_h":
        # at the default initializer_range (0.02) the readout C.S of the Mamba-2 state is ~1e-6 of
        # the D x skip, so no logit would depend on the state; 0.2 makes it matter
        return transformers.NemotronHConfig(
            **common, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
            layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention", "mlp"],
            mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=16)
    if name == "qwen3_next":
        return transformers.Qwen3NextConfig(
            **common, num_hidden_layers=4, num_key_value_heads=2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    if name == "qwen3_5_text":
        return transformers.Qwen3_5TextConfig(
            **common, num_hidden_layers=4, num_key_value_heads=2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    if name == "kimi_linear":
        return transformers.KimiLinearConfig(
            **common, num_hidden_layers=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
            num_local_experts=4, num_experts_per_tok=2, linear_num_heads=4, linear_head_dim=16,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"])
    raise ValueError(f"name: expected one of {MODELS}, got {name!r}")


def tiny_model(name: str, *, seed: int = 0, device: str | torch.device = "cpu"):
    """The tiny ``name`` causal LM (eval mode, fp32) with weights drawn from ``seed``.

    The global torch RNG is left as it was.
    """
    import transformers

    config = tiny_config(name)
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.to(device).eval()
