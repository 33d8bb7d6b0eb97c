"""The matmul reference: the ground truth the kernels are compared with."""

from __future__ import annotations

import torch


def matmul_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w with float64 products and sums, rounded once to x's dtype.

    float64 keeps the rounding of the sums far below the output's ulp, so this is the closeness
    oracle; it is not a batch-invariance claim (the float64 GEMM may still order sums by M).
    """
    return torch.matmul(x.double(), w.double()).to(x.dtype)
