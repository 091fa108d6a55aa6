"""Model folders for SGLang servers with ``--load-format dummy``: a ``config.json`` each, with the
published dims of one served model per family and, where the whole model would be slow to build or
too large for one GPU, fewer layers (``LAYERS`` says how many of how many).

    python benchmarks/server/models.py DEST      # writes DEST/<name>/config.json for every model

| name | family | published model | layers served |
|---|---|---|---|
| ``nemotron-h-8b`` | Mamba-2 | NVIDIA Nemotron-H-8B | all 52 (24 Mamba-2, 4 attention, 24 MLP) |
| ``qwen3-next`` | GDN | Qwen3-Next-80B-A3B | the first 8 of 48 (6 GDN, 2 attention; 512 experts each) |
| ``kimi-linear`` | KDA | Kimi-Linear-48B-A3B | the first 8 of 27 (6 KDA, 2 MLA; 256 experts each) |
| ``qwen3.5-9b`` | GDN | Qwen3.5-9B (its text model) | the first 8 of 32 (6 GDN, 2 attention; dense MLPs) |
| ``kimi-linear-dense`` | KDA | Kimi-Linear-48B-A3B | as ``kimi-linear``, a dense MLP in place of each MoE |

The dense models are the ones to compare tokens on: with random routers a rounding-level change in a
layer's output can send a token to other experts, which a comparison of two SSM paths would read as a
difference of the SSM layers.

The SSM / linear-attention dims (heads, head dims, state size, groups, conv width) are the published
ones in every row; they are what replay's pool and kernels see.
"""

from __future__ import annotations

import json
import pathlib
import sys

_NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

CONFIGS = {
    "nemotron-h-8b": dict(
        architectures=["NemotronHForCausalLM"], model_type="nemotron_h", vocab_size=131072, hidden_size=4096,
        intermediate_size=21504, hybrid_override_pattern=_NEMOTRON_H_8B_PATTERN,
        num_hidden_layers=len(_NEMOTRON_H_8B_PATTERN), num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mlp_hidden_act="relu2", attention_bias=False, mlp_bias=False, use_bias=False, layer_norm_epsilon=1e-5,
        residual_in_fp32=False, max_position_embeddings=8192, ssm_state_size=128, mamba_num_heads=128,
        mamba_n_groups=8, n_groups=8, mamba_head_dim=64, mamba_d_conv=4, mamba_expand=2, mamba_hidden_act="silu",
        mamba_conv_bias=True, mamba_proj_bias=False, mamba_chunk_size=128, rescale_prenorm_residual=True,
        tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "qwen3-next": dict(
        architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=151936, hidden_size=2048,
        intermediate_size=5120, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, partial_rotary_factor=0.25,
        rope_theta=10000000.0, full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
        norm_topk_prob=True, mlp_only_layers=[], tie_word_embeddings=False, torch_dtype="bfloat16",
        bos_token_id=151643, eos_token_id=151645),
    "kimi-linear": dict(
        architectures=["KimiLinearForCausalLM"], model_type="kimi_linear", vocab_size=163840, hidden_size=2304,
        intermediate_size=9216, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=32, head_dim=72,
        hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=32768,
        moe_intermediate_size=1024, moe_renormalize=True, moe_router_activation_func="sigmoid", num_experts=256,
        num_experts_per_token=8, num_shared_experts=1, routed_scaling_factor=2.446, first_k_dense_replace=1,
        moe_layer_freq=1, use_grouped_topk=True, num_expert_group=1, topk_group=1, q_lora_rank=None,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, mla_use_nope=True,
        linear_attn_config=dict(kda_layers=[1, 2, 3, 5, 6, 7], full_attn_layers=[4, 8], num_heads=32, head_dim=128,
                                short_conv_kernel_size=4),
        tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=163584, eos_token_id=163585,
        pad_token_id=163839),
}
CONFIGS["qwen3.5-9b"] = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", vocab_size=248320, hidden_size=4096,
    intermediate_size=12288, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
    hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, partial_rotary_factor=0.25,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, attn_output_gate=True,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
    tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=248044, eos_token_id=248044)
CONFIGS["kimi-linear-dense"] = dict(CONFIGS["kimi-linear"], first_k_dense_replace=8)
FAMILIES = {"nemotron-h-8b": "mamba2", "qwen3-next": "gdn", "kimi-linear": "kda", "qwen3.5-9b": "gdn",
            "kimi-linear-dense": "kda"}


# the published models' MTP draft layer (SGLang 0.5.17 serves it as the draft of ``--speculative-algorithm
# NEXTN``, the same folder as the target): the config key that declares it, per model
MTP = {"qwen3.5-9b": dict(mtp_num_hidden_layers=1), "qwen3-next": dict(num_nextn_predict_layers=1)}


def write(dest: pathlib.Path, name: str, mtp: bool = False) -> pathlib.Path:
    """``dest/name/config.json`` for model ``name`` (a key of ``CONFIGS``); with ``mtp``, the model
    with its MTP draft layer declared, in ``dest/name-mtp``; returns the folder."""
    if name not in CONFIGS:
        raise ValueError(f"name: expected one of {sorted(CONFIGS)}, got {name!r}")
    if mtp and name not in MTP:
        raise ValueError(f"name: an MTP draft is declared for {sorted(MTP)} only, got {name!r}")
    folder = dest / (f"{name}-mtp" if mtp else name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIGS[name] | (MTP[name] if mtp else {}), indent=1) + "\n")
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: models.py DEST")
    for model in CONFIGS:
        print(write(pathlib.Path(sys.argv[1]), model))
