"""matmul: a model layer's projection x [M, K] @ w [K, N] (reference beside the kernels)."""

from gdn_lab.ops.matmul.gemm import matmul

__all__ = ["matmul"]
