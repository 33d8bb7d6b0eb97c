"""rms_norm: a model layer's RMSNorm over the last dim of x [M, N] (reference beside the kernels)."""

from gdn_lab.ops.rmsnorm.rmsnorm import rms_norm

__all__ = ["rms_norm"]
