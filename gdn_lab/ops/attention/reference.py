"""PyTorch references for paged attention: the ground truth next to the kernels.

Every reference computes one request at a time on tensors shaped by that request alone, so its
result for a request cannot depend on the batch (the property the kernels are tested for).
Accumulation is float32; the output is rounded once to the query's dtype.
"""

from __future__ import annotations

import torch

from gdn_lab.quant import dequantize

PARTITION_SIZE = 256  # AITER paged_attention_ragged's hard-coded T_PAR_SIZE


def gather_request(
    cache: torch.Tensor, kv_indptr: list[int], kv_indices: torch.Tensor, b: int, length: int, scale: torch.Tensor | None
) -> torch.Tensor:
    """Request b's first `length` tokens from a paged cache: [length, Hkv, D] float32, dequantized."""
    pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
    tokens = cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:length]
    return dequantize(tokens, scale)


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[..., Hq, D] -> [Hkv, ..., G, D]: query head h reads KV head h // G."""
    *lead, hq, d = q.shape
    g = hq // num_kv_heads
    x = q.float().reshape(*lead, num_kv_heads, g, d)
    return x.movedim(-3, 0)


def _ungrouped(o: torch.Tensor) -> torch.Tensor:
    """[Hkv, ..., G, D] -> [..., Hq, D]."""
    x = o.movedim(0, -3)
    return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])


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
        qg = _grouped(q[b], hkv)  # [Hkv, G, D]
        s = torch.matmul(qg, k.permute(1, 2, 0)) * scale  # [Hkv, G, L]
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v.permute(1, 0, 2))  # [Hkv, G, D]
        out[b] = _ungrouped(o).to(q.dtype)
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
        qg = _grouped(q[b], hkv)
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
        out[b] = _ungrouped(acc / (total[..., None] + 1e-6)).to(q.dtype)
    return out


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
        qg = _grouped(qb, hkv).transpose(1, 2)  # [Hkv, G, Lq, D]
        s = torch.matmul(qg, k.permute(1, 2, 0).unsqueeze(1)) * scale  # [Hkv, G, Lq, L]
        if causal:
            pos = torch.arange(n - lq, n, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n, device=q.device)[None, :] > pos, float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v.permute(1, 0, 2).unsqueeze(1))  # [Hkv, G, Lq, D]
        out[qo[b] : qo[b + 1]] = _ungrouped(o.transpose(1, 2)).to(q.dtype)
    return out
