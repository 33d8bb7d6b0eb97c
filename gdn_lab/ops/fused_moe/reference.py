"""The fused_moe reference: float64 products and sums, rounded to the input dtype where the kernels round."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float64 tensor rounded to `dtype` (nearest-even) and held in float64 again."""
    return t.to(dtype).double()


def fused_moe_torch(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The routed experts' sum in float64, rounded to x's dtype at the op's four points.

    For each token m and each of its experts e = topk_ids[m, k]: gate and up = x[m] @ w1[e]^T
    (rounded), act = silu(gate) * up (rounded), y_k = topk_weights[m, k] * (act @ w2[e]^T)
    (rounded); out[m] = sum_k y_k (rounded). float64 keeps every sum's own rounding far below the
    output's ulp, so this is the closeness oracle, not a batch-invariance claim. Each expert's
    tokens are gathered and multiplied together (one matmul per expert that has any).
    """
    dtype = x.dtype
    tokens, top_k = topk_ids.shape
    inter = w2.shape[2]
    x64, weights = x.double(), topk_weights.double()
    y = torch.zeros(tokens, top_k, w2.shape[1], dtype=torch.float64, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        rows, ks = (topk_ids == e).nonzero(as_tuple=True)
        gate_up = _rounded(x64[rows] @ w1[e].double().t(), dtype)
        act = _rounded(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], dtype)
        y[rows, ks] = _rounded((act @ w2[e].double().t()) * weights[rows, ks, None], dtype)
    return y.sum(1).to(dtype)
