"""The matmul references: the float64 ground truth, and torch.matmul as it runs (the batch-variant control)."""

from __future__ import annotations

import torch


def matmul_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w with float64 products and sums, rounded once to x's dtype.

    float64 keeps the rounding of the sums far below the output's ulp, so this is the closeness
    oracle; it is not a batch-invariance claim (the float64 GEMM may still order sums by M).
    """
    return torch.matmul(x.double(), w.double()).to(x.dtype)


def matmul_native(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Batch-variant control: torch.matmul in x's dtype, whose kernel choice follows M.

    cuBLAS on the GPU (measured on the H200: bf16 K=N=4096 differs from M=64 up). On the CPU, float32
    goes through a different path for M < 8 than for larger M (differs); bf16/fp16 did not vary
    with M in our checks (torch 2.13, 2 threads), so there it may prove no sensitivity: use
    `triton-splitk-by-batch` as the control that varies everywhere.
    """
    return torch.matmul(x, w)
