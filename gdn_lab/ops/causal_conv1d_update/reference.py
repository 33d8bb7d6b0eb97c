"""The PyTorch reference of the depthwise causal conv1d, float32: per sequence (the GDN layer's
prefill chain uses it) and one decode token per row (causal_conv1d_update)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_sequence(x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor, bias, activation: bool):
    """One sequence's causal conv. x [L, C]; history [C, W-1]; weight [C, W]; bias [C] or None.

    Returns (y [L, C] float32, new history [C, W-1] in history's dtype): the last W-1 inputs.
    """
    width = weight.shape[1]
    full = torch.cat([history.float(), x.float().T], dim=1)  # [C, W-1+L]
    windows = full.unfold(1, width, 1)  # [C, L, W]
    y = (windows * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        y = y + bias.float()[:, None]
    if activation:
        y = F.silu(y)
    return y.T, full[:, full.shape[1] - (width - 1) :].to(history.dtype)


def causal_conv1d_update_torch(x, conv_state, weight, bias, slots, activation):
    """Decode: one token per row through the conv, state shifted in place; negative slot -> zeros.

    All rows at once, and still batch-invariant: each output is its own row's taps added one after
    another in tap order (elementwise ops only, no reduction kernel whose split could follow the
    batch).
    """
    out = torch.zeros_like(x)
    rows = torch.nonzero(slots >= 0).flatten()
    if rows.numel() == 0:
        return out
    idx = slots[rows].long()
    full = torch.cat([conv_state[idx].float(), x[rows].float()[:, :, None]], dim=2)  # [R, C, W]
    w = weight.float()
    y = full[:, :, 0] * w[:, 0]
    for tap in range(1, w.shape[1]):
        y = y + full[:, :, tap] * w[:, tap]
    if bias is not None:
        y = y + bias.float()
    if activation == "silu":
        y = F.silu(y)
    conv_state[idx] = full[:, :, 1:].to(conv_state.dtype)
    out[rows] = y.to(x.dtype)
    return out
