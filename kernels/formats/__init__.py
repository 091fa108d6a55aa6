"""Precision-format helpers for the kernels (reference: replayssm.formats)."""
