"""The layers of the hybrid decoder, on the lab's ops (each call routed to the backend chosen per op).

Shapes: T token rows of a batch (the packed prompts in a prefill, one per request in a decode step),
H = hidden_size. Module names follow Hugging Face's Qwen3-Next (linear_attn, self_attn, q_norm, ...)
so a trace reads the same on both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from gdn_lab.model.config import ModelConfig
from gdn_lab.ops import (
    causal_conv1d_update,
    decode_attention,
    fused_moe,
    gdn_decode,
    gdn_layer_prefill,
    matmul,
    prefill_attention,
    rms_norm,
)

if TYPE_CHECKING:
    from gdn_lab.model.model import Cache

PREFILL, DECODE = "prefill", "decode"


@dataclass
class ForwardBatch:
    """What one forward call needs besides the token ids (built by `Model.prefill`/`decode_step`).

    Attributes:
        mode: "prefill" (packed prompts from an empty cache) or "decode" (one token per request).
        positions: int64 [T], each token's position in its request.
        cu_seqlens: int32 [N+1], token spans (decode: 0, 1, ..., N).
        last_index: int64 [N], the row of each request's last token.
        seq_lens: int32 [N], cached tokens per request once this step's K/V are written.
        kv_indptr, kv_indices: int32 page table covering seq_lens (shuffled pages).
        slot_mapping: int64 [T], where each token's K/V goes in a flattened cache [pages * page_size].
        slots: int32 [N], each request's GDN state slot.
        has_initial_state: bool [N] (False in a prefill: fresh requests).
        cache: the caches the layers read and update.
    """

    mode: str
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    last_index: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    slot_mapping: torch.Tensor
    slots: torch.Tensor
    has_initial_state: torch.Tensor
    cache: Cache = field(repr=False)


class Linear(nn.Module):
    """y = x @ weight.T through the lab's matmul (weight [out, in], as nn.Linear; no bias)."""

    def __init__(self, in_features: int, out_features: int, backends: Mapping[str, str]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.backends = backends

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        return matmul(x, self.weight.t(), backend=self.backends["matmul"])


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm (Qwen3-Next): the weight w is stored, 1 + w applied, in float32."""

    def __init__(self, dim: int, eps: float, backends: Mapping[str, str]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps
        self.backends = backends

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., dim] -> the same shape; rows are normalised over the last dim."""
        y = rms_norm(x.reshape(-1, x.shape[-1]), 1.0 + self.weight.float(), self.eps, backend=self.backends["rms_norm"])
        return y.reshape(x.shape)


class GatedRMSNorm(nn.Module):
    """Qwen3-Next's norm before the GDN output projection: w * rmsnorm(o) * silu(z), in float32.

    The prefill op (gdn_layer_prefill) applies the same formula inside its chain with this weight;
    this module is the decode path's.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z [B, HV, V] -> [B, HV, V] in o's dtype."""
        of = o.float()
        normed = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * normed * F.silu(z.float())).to(o.dtype)


class RotaryEmbedding(nn.Module):
    """Partial RoPE (rotate-half) on the first `dim` channels of each head.

    cos/sin are a fixed table over all positions, computed once in float64: a position's angles
    are then the same bits whatever batch it is in (computing them per batch would round some of
    them in the vector body and others in the scalar tail of the elementwise kernels).
    """

    def __init__(self, dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        inv_freq = theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)  # [P, dim/2]
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        self.dim = dim

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D], positions int64 [T] -> x rotated, in x's dtype (computed in float32)."""
        half = self.dim // 2
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # [T, 1, dim/2]
        xf = x.float()
        x1, x2, rest = xf[..., :half], xf[..., half : self.dim], xf[..., self.dim :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's linear-attention layer: in_proj_qkvz and in_proj_ba, the GDN chain, out_proj.

    Prefill runs the whole chain as one op (gdn_layer_prefill: conv1d, gating, delta rule, gated
    RMSNorm); a decode step runs causal_conv1d_update, gdn_decode and the gated RMSNorm. The
    projections are interleaved per key head: qkvz [q (K) | k (K) | v (r V) | z (r V)], ba [b (r) | a (r)],
    r = HV // HK.
    """

    def __init__(self, config: ModelConfig, layer_index: int, backends: Mapping[str, str]) -> None:
        super().__init__()
        hk, hv, d = config.linear_num_key_heads, config.linear_num_value_heads, config.linear_head_dim
        self.layer_index = layer_index
        self.num_k_heads, self.num_v_heads, self.head_dim = hk, hv, d
        self.eps = config.rms_norm_eps
        self.backends = backends
        self.in_proj_qkvz = Linear(config.hidden_size, hk * (2 * d + 2 * (hv // hk) * d), backends)
        self.in_proj_ba = Linear(config.hidden_size, 2 * hv, backends)
        self.conv_weight = nn.Parameter(torch.empty(config.conv_dim, config.conv_kernel))
        self.A_log = nn.Parameter(torch.empty(hv, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(hv, dtype=torch.float32))
        self.norm = GatedRMSNorm(d, config.rms_norm_eps)
        self.out_proj = Linear(hv * d, config.hidden_size, backends)

    def _split(self, qkvz: torch.Tensor, ba: torch.Tensor):
        """[B, HK*(2K+2rV)], [B, 2HV] -> q, k [B, HK, K]; v, z [B, HV, V]; b, a [B, HV]."""
        b_, hk, hv, d = qkvz.shape[0], self.num_k_heads, self.num_v_heads, self.head_dim
        r = hv // hk
        x = qkvz.reshape(b_, hk, 2 * d + 2 * r * d)
        q, k = x[..., :d], x[..., d : 2 * d]
        v = x[..., 2 * d : 2 * d + r * d].reshape(b_, hv, d)
        z = x[..., 2 * d + r * d :].reshape(b_, hv, d)
        y = ba.reshape(b_, hk, 2 * r)
        return q, k, v, z, y[..., :r].reshape(b_, hv), y[..., r:].reshape(b_, hv)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x [T, H] -> [T, H]; updates this layer's conv and recurrent states in the cache."""
        t, hk, hv, d = x.shape[0], self.num_k_heads, self.num_v_heads, self.head_dim
        qkvz, ba = self.in_proj_qkvz(x), self.in_proj_ba(x)
        conv_state, delta_state = batch.cache.gdn[self.layer_index]
        if batch.mode == PREFILL:
            o, _, _ = gdn_layer_prefill(
                qkvz, ba, conv_state, delta_state, batch.slots, batch.cu_seqlens, batch.has_initial_state,
                self.conv_weight, None, self.A_log, self.dt_bias, self.norm.weight,
                num_k_heads=hk, num_v_heads=hv, head_dim=d, eps=self.eps,
                backend=self.backends["gdn_layer_prefill"], check_indices=False,
            )  # fmt: skip
        else:
            q, k, v, z, b, a = self._split(qkvz, ba)
            mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=1)  # [B, conv_dim]
            y = causal_conv1d_update(
                mixed, conv_state, self.conv_weight, None, batch.slots,
                backend=self.backends["causal_conv1d_update"], check_indices=False,
            )  # fmt: skip
            qc, kc, vc = y.split([hk * d, hk * d, hv * d], dim=1)
            o = gdn_decode(
                qc.reshape(t, hk, d), kc.reshape(t, hk, d), vc.reshape(t, hv, d), a, b, self.A_log, self.dt_bias,
                delta_state, batch.slots, backend=self.backends["gdn_decode"], check_indices=False,
            )  # fmt: skip
            o = self.norm(o, z)
        return self.out_proj(o.reshape(t, hv * d))


class GatedAttention(nn.Module):
    """Qwen3-Next's gated full attention: q_proj doubled into [q | gate] per head, zero-centred
    q_norm/k_norm, partial RoPE, paged causal attention (GQA), output * sigmoid(gate), o_proj."""

    def __init__(self, config: ModelConfig, layer_index: int, backends: Mapping[str, str]) -> None:
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_kv_heads, config.head_dim
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.page_size = config.page_size
        self.backends = backends
        self.q_proj = Linear(config.hidden_size, hq * d * 2, backends)
        self.k_proj = Linear(config.hidden_size, hkv * d, backends)
        self.v_proj = Linear(config.hidden_size, hkv * d, backends)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, backends)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, backends)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.max_position_embeddings)
        self.o_proj = Linear(hq * d, config.hidden_size, backends)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x [T, H] -> [T, H]; writes this step's K/V into the paged cache before attending."""
        t, hq, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qg = self.q_proj(x).reshape(t, hq, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, hq * d)
        k = self.k_proj(x).reshape(t, hkv, d)
        v = self.v_proj(x).reshape(t, hkv, d)
        q = self.rotary_emb(self.q_norm(q), batch.positions)
        k = self.rotary_emb(self.k_norm(k), batch.positions)
        k_cache, v_cache = batch.cache.kv[self.layer_index]
        # K/V go into the cache before the kernel, so cached and new tokens are read the same way.
        k_cache.view(-1, hkv, d).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, hkv, d).index_copy_(0, batch.slot_mapping, v)
        paged = dict(page_size=self.page_size, check_indices=False)
        if batch.mode == PREFILL:
            o = prefill_attention(
                q, k_cache, v_cache, batch.cu_seqlens, batch.kv_indptr, batch.kv_indices, batch.seq_lens,
                causal=True, backend=self.backends["prefill_attention"], **paged,
            )  # fmt: skip
        else:
            o = decode_attention(
                q, k_cache, v_cache, batch.kv_indptr, batch.kv_indices, batch.seq_lens,
                backend=self.backends["decode_attention"], **paged,
            )  # fmt: skip
        return self.o_proj(o.reshape(t, hq * d) * torch.sigmoid(gate))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); the dense stand-in for Qwen3-Next's MoE (and its shared expert)."""

    def __init__(self, config: ModelConfig, backends: Mapping[str, str], intermediate_size: int | None = None) -> None:
        super().__init__()
        width = intermediate_size or config.intermediate_size
        self.gate_proj = Linear(config.hidden_size, width, backends)
        self.up_proj = Linear(config.hidden_size, width, backends)
        self.down_proj = Linear(width, config.hidden_size, backends)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RoutedExperts(nn.Module):
    """The experts of a sparse MoE block, stacked (vLLM's layout): w13 [E, 2I, H] (each expert's gate
    rows, then its up rows) and w2 [E, H, I], run by the lab's fused_moe op."""

    def __init__(self, config: ModelConfig, backends: Mapping[str, str]) -> None:
        super().__init__()
        e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h))
        self.w2 = nn.Parameter(torch.empty(e, h, i))
        self.backends = backends

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], float32 topk_weights and int32 topk_ids [T, top_k] -> [T, H]."""
        return fused_moe(x, self.w13, self.w2, topk_weights, topk_ids, backend=self.backends["fused_moe"],
                         check_indices=False)  # fmt: skip


# Lanes each [T, 1] value is broadcast to before an elementwise op (`_per_row`): a multiple of every CPU
# vector width torch uses (16 float32 or 32 bf16/fp16 lanes with AVX-512).
_ROW_LANES = 64


def _per_row(fn, x: torch.Tensor) -> torch.Tensor:
    """fn of a [T, 1] tensor, each value computed as a full row of vector lanes.

    On a CPU, torch's elementwise loops run a vector body and a scalar tail that can round a
    transcendental differently, and which of them a [T, 1] tensor's last values land in follows T
    (measured on Hugging Face's Qwen3-Next, README). Broadcast to [T, _ROW_LANES], every value takes
    the vector body, whatever T is.
    """
    return fn(x.expand(-1, _ROW_LANES))[:, :1]


class SparseMoE(nn.Module):
    """Qwen3-Next's sparse MoE block: the router (`gate`, softmax over E in float32, the top
    num_experts_per_tok, renormalised), the routed experts (`experts`, fused_moe), and the shared
    expert (`shared_expert`, a SwiGLU) scaled by sigmoid(`shared_expert_gate`(x))."""

    def __init__(self, config: ModelConfig, backends: Mapping[str, str]) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.gate = Linear(config.hidden_size, config.num_experts, backends)
        self.experts = RoutedExperts(config, backends)
        self.shared_expert = MLP(config, backends, config.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(config.hidden_size, 1, backends)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E], one row at a time
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        routed = self.experts(x, weights, ids.to(torch.int32))
        shared = self.shared_expert(x) * _per_row(torch.sigmoid, self.shared_expert_gate(x))
        return routed + shared


class DecoderLayer(nn.Module):
    """Pre-norm residual block: h + mixer(norm(h)), then + mlp(norm(h)); the mixer is GDN
    (`linear_attn`) or gated attention (`self_attn`)."""

    def __init__(self, config: ModelConfig, layer_index: int, backends: Mapping[str, str]) -> None:
        super().__init__()
        self.is_attention = config.layer_types[layer_index] == "full_attention"
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backends)
        if self.is_attention:
            self.self_attn = GatedAttention(config, layer_index, backends)
        else:
            self.linear_attn = GatedDeltaNet(config, layer_index, backends)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backends)
        self.mlp = SparseMoE(config, backends) if config.num_experts else MLP(config, backends)

    def forward(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """h [T, H] -> [T, H]."""
        mixer = self.self_attn if self.is_attention else self.linear_attn
        h = h + mixer(self.input_layernorm(h), batch)
        return h + self.mlp(self.post_attention_layernorm(h))


class GreedySampler(nn.Module):
    """Greedy choice and its log-probability (log_softmax in float32)."""

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [N, V] -> (tokens int64 [N], logprobs float32 [N])."""
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens, logprobs
