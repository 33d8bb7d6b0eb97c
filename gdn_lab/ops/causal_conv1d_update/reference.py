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
    """Decode: one token per row through the conv, state shifted in place; negative slot -> zeros."""
    out = torch.zeros_like(x)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        y, conv_state[slot] = causal_conv1d_sequence(x[i : i + 1], conv_state[slot], weight, bias, activation)
        out[i] = y[0].to(x.dtype)
    return out
