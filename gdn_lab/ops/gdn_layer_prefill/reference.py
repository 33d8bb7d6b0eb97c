"""PyTorch reference of the whole Gated DeltaNet prefill chain (the unfused chain), float32.

Qwen3-Next's linear-attention layer after its input projections:

1. split the interleaved projections: per key head, qkvz holds [q (K) | k (K) | v (r*V) | z (r*V)]
   and ba holds [b (r) | a (r)], r = HV // HK (Hugging Face's fix_query_key_value_ordering);
2. causal depthwise conv1d (width W) over the channels [q of all heads | k | v], continuing from the
   slot's conv state (W - 1 previous inputs), then SiLU; the output is rounded to the input dtype,
   as an unfused chain stores it between kernels;
3. gates g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), and the gated delta rule
   (L2-normalized q and k, scale K ** -0.5) from the slot's recurrent state (chunked, chunk 64);
4. gated RMSNorm per value head: w * o * rsqrt(mean(o^2) + eps) * silu(z), rounded to the input dtype;
5. optionally, group-128 fp8 of the normalized output ([T, HV * V], one scale per 128 values).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_lab.ops.causal_conv1d_update.reference import causal_conv1d_sequence
from gdn_lab.ops.delta_rule import chunked_sequence, gates, prepare_qk
from gdn_lab.quant import FP8_GROUP, quantize_groups


def split_qkvz(qkvz: torch.Tensor, ba: torch.Tensor, num_k_heads: int, num_v_heads: int, head_dim: int):
    """[L, HK*(2K + 2rV)], [L, 2HV] -> q, k [L, HK, D]; v, z [L, HV, D]; b, a [L, HV]."""
    L, r, d = qkvz.shape[0], num_v_heads // num_k_heads, head_dim
    x = qkvz.reshape(L, num_k_heads, 2 * d + 2 * r * d)
    q, k = x[..., :d], x[..., d : 2 * d]
    v = x[..., 2 * d : 2 * d + r * d].reshape(L, num_v_heads, d)
    z = x[..., 2 * d + r * d :].reshape(L, num_v_heads, d)
    y = ba.reshape(L, num_k_heads, 2 * r)
    return q, k, v, z, y[..., :r].reshape(L, num_v_heads), y[..., r:].reshape(L, num_v_heads)


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """w * o * rsqrt(mean(o^2) + eps) * silu(z) over the last dim, float32."""
    o = o.float()
    return weight.float() * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)) * F.silu(z.float())


def gdn_layer_prefill_torch(
    projected_qkvz,
    projected_ba,
    conv_state,
    delta_state,
    cache_indices,
    cu_seqlens,
    has_initial_state,
    conv_weight,
    conv_bias,
    A_log,
    dt_bias,
    norm_weight,
    num_k_heads,
    num_v_heads,
    head_dim,
    eps,
    quantize_fp8,
    fp8_dtype,
):
    """The unfused chain per sequence; conv and delta states of each slot updated in place."""
    T, dtype, d = projected_qkvz.shape[0], projected_qkvz.dtype, head_dim
    hk_dim = num_k_heads * d
    normalized = torch.zeros(T, num_v_heads, d, dtype=dtype, device=projected_qkvz.device)
    cu = cu_seqlens.tolist()
    for n, (slot, has_init) in enumerate(zip(cache_indices.tolist(), has_initial_state.tolist())):
        if slot < 0:
            continue
        s, e = cu[n], cu[n + 1]
        q, k, v, z, b, a = split_qkvz(projected_qkvz[s:e], projected_ba[s:e], num_k_heads, num_v_heads, d)
        mixed = torch.cat([q.reshape(e - s, -1), k.reshape(e - s, -1), v.reshape(e - s, -1)], dim=1)
        history = conv_state[slot] if has_init else torch.zeros_like(conv_state[slot])
        y, conv_state[slot] = causal_conv1d_sequence(mixed, history, conv_weight, conv_bias, activation=True)
        y = y.to(dtype)
        qc = y[:, :hk_dim].reshape(e - s, num_k_heads, d)
        kc = y[:, hk_dim : 2 * hk_dim].reshape(e - s, num_k_heads, d)
        vc = y[:, 2 * hk_dim :].reshape(e - s, num_v_heads, d)
        qn, kn = prepare_qk(qc, kc, num_v_heads, d**-0.5, True)
        g, beta = gates(a, b, A_log, dt_bias)
        o, delta_state[slot] = chunked_sequence(qn, kn, vc.float(), g, beta, delta_state[slot])
        normalized[s:e] = gated_rmsnorm(o, z, norm_weight, eps).to(dtype)
    if not quantize_fp8:
        return normalized, None, None
    quantized, scales = quantize_groups(normalized.flatten(1), fp8_dtype, FP8_GROUP)  # flatten: T may be 0
    return normalized, quantized, scales
