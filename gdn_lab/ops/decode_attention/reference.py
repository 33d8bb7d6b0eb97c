"""PyTorch references for decode_attention: the ground truth next to the kernels.

Every reference computes one request at a time on tensors shaped by that request alone, so its
result for a request cannot depend on the batch (the property the kernels are tested for).
`decode_attention_torch` accumulates in float32 and rounds the output once to the query's dtype;
`decode_attention_partitioned` mirrors AITER's partitioned numerics; `decode_attention_exact` is
float64 dense attention, the oracle errors are measured against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab.ops.paged_kv import PARTITION_SIZE, gather_request, grouped, ungrouped


def decode_attention_torch(
    q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale
) -> torch.Tensor:
    """Exact softmax attention of one query token per request over its paged context."""
    out = torch.empty_like(q)
    indptr, lens = kv_indptr.tolist(), seq_lens.tolist()
    hkv = k_cache.shape[2]
    for b, n in enumerate(lens):
        k = gather_request(k_cache, indptr, kv_indices, b, n, k_scale)  # [L, Hkv, D]
        v = gather_request(v_cache, indptr, kv_indices, b, n, v_scale)
        qg = grouped(q[b], hkv)  # [Hkv, G, D]
        s = torch.matmul(qg, k.permute(1, 2, 0)) * scale  # [Hkv, G, L]
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v.permute(1, 0, 2))  # [Hkv, G, D]
        out[b] = ungrouped(o).to(q.dtype)
    return out


def decode_attention_partitioned(
    q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale
) -> torch.Tensor:
    """Decode attention with AITER paged_attention_ragged's numerics.

    Each request's context is cut into 256-token partitions of its own positions. Per partition:
    the max logit m_p, the exp-sum s_p = sum(exp(l - m_p)) and the partial output
    o_p = (exp(l - m_p) @ V) / s_p, rounded to the query dtype (AITER's tmp_out). With an fp8
    cache, k_scale is folded into the softmax scale, the probabilities are rounded to the cache's
    fp8 format before the PV product and v_scale applies after it, as AITER's MFMA path does. The merge rescales r_p = s_p * exp(m_p - M)
    with M = max m_p, sums sum_p r_p and sum_p o_p * r_p sequentially over p = 0, 1, 2, ..., and
    divides by (sum r_p + 1e-6).
    """
    out = torch.empty_like(q)
    indptr, lens = kv_indptr.tolist(), seq_lens.tolist()
    hkv = k_cache.shape[2]
    fp8 = k_cache.dtype if k_cache.element_size() == 1 else None
    for b, n in enumerate(lens):
        # AITER folds k_scale into the QK scale and applies v_scale after the PV product.
        k = gather_request(k_cache, indptr, kv_indices, b, n, None)
        v = gather_request(v_cache, indptr, kv_indices, b, n, None)
        qk_scale = scale if k_scale is None else scale * k_scale.float()
        qg = grouped(q[b], hkv)
        num_parts = -(-n // PARTITION_SIZE)
        pad = num_parts * PARTITION_SIZE - n
        kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(num_parts, PARTITION_SIZE, hkv, -1)
        vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(num_parts, PARTITION_SIZE, hkv, -1)
        s = torch.matmul(qg.unsqueeze(1), kp.permute(2, 0, 3, 1)) * qk_scale  # [Hkv, P, G, 256]
        valid = torch.arange(num_parts * PARTITION_SIZE, device=q.device).reshape(num_parts, 1, PARTITION_SIZE) < n
        s = s.masked_fill(~valid, float("-inf"))
        m = s.amax(-1)  # [Hkv, P, G]
        e = torch.exp(s - m[..., None])
        sums = e.sum(-1)
        if fp8 is not None:
            e = e.to(fp8).float()
        o = torch.matmul(e, vp.permute(2, 0, 1, 3))  # [Hkv, P, G, D]
        if v_scale is not None:
            o = o * v_scale.float()
        o = (o / sums[..., None]).to(q.dtype)
        mx = m.amax(1)  # [Hkv, G]
        r = sums * torch.exp(m - mx[:, None])  # [Hkv, P, G]
        total = torch.zeros_like(mx)
        acc = torch.zeros(o.shape[0], o.shape[2], o.shape[3], dtype=torch.float32, device=q.device)
        for p in range(num_parts):
            total = total + r[:, p]
            acc = acc + o[:, p].float() * r[:, p, :, None]
        out[b] = ungrouped(acc / (total[..., None] + 1e-6)).to(q.dtype)
    return out


def decode_attention_exact(args: Mapping[str, Any]) -> torch.Tensor:
    """Float64 dense softmax attention of every request over its (dequantized) paged context.

    Independent of the torch backend's code path: it gathers the tokens and calls SDPA in float64.

    Args:
        args: validated decode_attention arguments.

    Returns:
        [B, Hq, D] float64.
    """
    q = args["q"]
    indptr = args["kv_indptr"].tolist()
    hq, hkv = q.shape[1], args["k_cache"].shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(args["seq_lens"].tolist()):
        k = gather_request(args["k_cache"], indptr, args["kv_indices"], b, n, args["k_scale"]).double()
        v = gather_request(args["v_cache"], indptr, args["kv_indices"], b, n, args["v_scale"]).double()
        kh = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [Hq, L, D]
        vh = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        qh = q[b].double()[:, None, :]  # [Hq, 1, D]
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, scale=args["scale"])
        out[b] = o[:, 0, :]
    return out
