"""Paged attention: decode (one token per request) and varlen prefill (reference beside the kernels)."""

from gdn_lab.ops.attention import (
    aiter_triton,  # noqa: F401  (registers AITER's Triton kernels from the amd-aiter wheel)
    triton_backends,  # noqa: F401  (registers the Triton backends)
)
from gdn_lab.ops.attention.decode import decode_attention
from gdn_lab.ops.attention.prefill import prefill_attention

__all__ = ["decode_attention", "prefill_attention"]
