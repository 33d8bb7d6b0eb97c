"""The PyTorch reference of gdn_decode: the step form per request, float32 (see `gdn_lab.ops.delta_rule`)."""

from __future__ import annotations

import torch

from gdn_lab.ops.delta_rule import gates, prepare_qk, step


def gdn_decode_torch(q, k, v, a, b, A_log, dt_bias, state, slots, scale, use_qk_l2norm):
    """One step per row, state updated in place at `slots`; rows with a negative slot get zeros."""
    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    hv = v.shape[1]
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        qi, ki = prepare_qk(q[i], k[i], hv, scale, use_qk_l2norm)
        g, beta = gates(a[i], b[i], A_log, dt_bias)
        o, S = step(state[slot], qi, ki, v[i].float(), g, beta)
        state[slot] = S
        out[i] = o.to(q.dtype)
    return out
