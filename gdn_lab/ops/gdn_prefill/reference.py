"""The PyTorch references of gdn_prefill, float32 per sequence (see `gdn_lab.ops.delta_rule`):
the chunked form (`torch`) and the token-by-token definition (`torch-recurrent`)."""

from __future__ import annotations

import torch

from gdn_lab.ops.delta_rule import chunked_sequence, gates, prepare_qk, recurrent_sequence


def _prefill(sequence_fn, q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    hv = v.shape[1]
    cu = cu_seqlens.tolist()
    for n, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        s, e = cu[n], cu[n + 1]
        qn, kn = prepare_qk(q[s:e], k[s:e], hv, scale, use_qk_l2norm)
        g, beta = gates(a[s:e], b[s:e], A_log, dt_bias)
        o, S = sequence_fn(qn, kn, v[s:e].float(), g, beta, state[slot])
        state[slot] = S
        out[s:e] = o.to(q.dtype)
    return out


def gdn_prefill_torch(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    """Varlen prefill in the chunked form (chunk 64); state[slots] initial in, final out."""
    return _prefill(chunked_sequence, q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm)


def gdn_prefill_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    """Varlen prefill token by token (the definition)."""
    return _prefill(recurrent_sequence, q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm)
