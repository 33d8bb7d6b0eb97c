"""The PyTorch reference for prefill_attention: the ground truth next to the kernels.

It computes one request at a time on tensors shaped by that request alone, so its result for a
request cannot depend on the batch. Accumulation is float32; the output is rounded once to q's dtype.
"""

from __future__ import annotations

import torch

from gdn_lab.ops.paged_kv import gather_request, grouped, ungrouped


def prefill_attention_torch(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale, k_scale, v_scale
) -> torch.Tensor:
    """Exact softmax attention of each request's new tokens over its whole paged context.

    The new tokens are the last q_len of the request's seq_len cached tokens, so query i of a
    request sits at position seq_len - q_len + i and, when causal, sees keys 0..that position.
    """
    out = torch.empty_like(q)
    qo, indptr, lens = qo_indptr.tolist(), kv_indptr.tolist(), seq_lens.tolist()
    hkv = k_cache.shape[2]
    for b, n in enumerate(lens):
        k = gather_request(k_cache, indptr, kv_indices, b, n, k_scale)
        v = gather_request(v_cache, indptr, kv_indices, b, n, v_scale)
        qb = q[qo[b] : qo[b + 1]]  # [Lq, Hq, D]
        lq = qb.shape[0]
        qg = grouped(qb, hkv).transpose(1, 2)  # [Hkv, G, Lq, D]
        s = torch.matmul(qg, k.permute(1, 2, 0).unsqueeze(1)) * scale  # [Hkv, G, Lq, L]
        if causal:
            pos = torch.arange(n - lq, n, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > pos, float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v.permute(1, 0, 2).unsqueeze(1))  # [Hkv, G, Lq, D]
        out[qo[b] : qo[b + 1]] = ungrouped(o.transpose(1, 2)).to(q.dtype)
    return out
