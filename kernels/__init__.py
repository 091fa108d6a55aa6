"""replayssm kernels: one folder per op family, each a PyTorch reference beside its Triton kernels."""
