"""Gated DeltaNet / Kimi Delta Attention replay: reference (PyTorch) and kernels."""
