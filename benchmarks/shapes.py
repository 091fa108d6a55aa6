"""Layer shapes shared by tests and benchmarks: one SSM layer of Nemotron-H, Qwen3.5, Qwen3.5-122B and Kimi-Linear."""

import replayssm as rs

MODEL_SPECS = {
    "nemotron-h": rs.LayerSpec.mamba2(num_heads=128, head_dim=64, state_dim=128, num_groups=8),
    "qwen3.5": rs.LayerSpec.gdn(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
    "qwen3.5-122b": rs.LayerSpec.gdn(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
    "kimi-linear": rs.LayerSpec.kda(num_k_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128),
}
BATCHES = (1, 64, 256, 512)
WINDOW = 16
