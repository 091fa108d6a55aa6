"""Mamba-2 replay: reference (PyTorch) and kernels."""
