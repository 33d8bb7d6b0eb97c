"""RMSNorm references: the float64 ground truth, and the straightforward float32 torch version."""

from __future__ import annotations

import torch


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight in float64, rounded once to x's dtype (the closeness oracle)."""
    xd = x.double()
    return (xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Batch-variant control: the straightforward float32 torch RMSNorm, as model code writes it.

    Its row reduction is torch's: on the GPU the reduction's block shape follows the number of
    rows; on the CPU a row of >= 32768 elements is split across threads when there are fewer rows
    than threads, so with 2+ threads a lone row can round differently from the same row in a batch
    (only sometimes visible after the rsqrt: use `triton-splitk-by-batch` as the control that
    varies on every machine).
    """
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
