"""PyTorch references for the gated delta rule (Gated DeltaNet), float32 throughout.

Per value head, with the state S in the "VK" layout [V, K] (K contiguous, as SGLang's pool):

    g    = -exp(A_log) * softplus(a + dt_bias)       (log decay, <= 0)
    beta = sigmoid(b)
    q, k = l2norm(q), l2norm(k)                       (optional; x * rsqrt(sum x^2 + 1e-6))
    q    = q * scale                                  (scale = K ** -0.5 by default)
    S    = exp(g) * S
    u    = beta * (v - S k)
    S    = S + u k^T
    o    = S q

Value head h reads query/key head h // (HV // HK). The step form is the definition; the chunked
form (chunk 64, the WY/UT transform solved by a unit-lower-triangular system) computes the same
thing in a different order, as production prefill kernels do. The references of gdn_decode,
gdn_prefill and gdn_layer_prefill compute each request on its own with these functions, so their
result cannot depend on the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Shared with our Triton kernels (gdn_decode, gdn_prefill, the fused gdn_layer_prefill), which
# import them from here: the kernels compute what this reference computes.
CHUNK_SIZE = 64  # the chunked form's chunk, and the batch-invariant kernels' (as fla's chunk_gated_delta_rule)
L2NORM_EPS = 1e-6  # l2norm's epsilon
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it: torch's default, as fla, FlyDSL and AITER use


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """(g, beta) in float32 from the raw gate projections [..., HV]."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), threshold=SOFTPLUS_THRESHOLD)
    return g, torch.sigmoid(b.float())


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float, use_qk_l2norm: bool):
    """[..., HK, K] query/key -> float32 [..., HV, K], normalized, q scaled, heads repeated."""
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    rep = num_v_heads // q.shape[-2]
    return (q * scale).repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)


def step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
    """One token for all heads. S [HV, V, K]; q, k [HV, K]; v [HV, V]; g, beta [HV]. Returns (o [HV, V], S)."""
    S = S * torch.exp(g)[:, None, None]
    u = beta[:, None] * (v - torch.matmul(S, k[:, :, None])[..., 0])
    S = S + u[:, :, None] * k[:, None, :]
    return torch.matmul(S, q[:, :, None])[..., 0], S


def recurrent_sequence(q, k, v, g, beta, S):
    """Token by token. q, k [L, HV, K]; v [L, HV, V]; g, beta [L, HV]; S [HV, V, K]. Returns (o [L, HV, V], S)."""
    outs = []
    for t in range(q.shape[0]):
        o, S = step(S, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
    return torch.stack(outs), S


def chunked_sequence(q, k, v, g, beta, S, chunk_size: int = CHUNK_SIZE):
    """Chunk by chunk (same arguments as `recurrent_sequence`).

    Within a chunk with cumulative log decay G_t, and S_0 the state entering it (as [K, V]):
        u = (I + L)^-1 beta (v - exp(G) k S_0),  L_tj = beta_t exp(G_t - G_j) k_t . k_j  (j < t)
        o_t = exp(G_t) q_t S_0 + sum_{j <= t} exp(G_t - G_j) (q_t . k_j) u_j
        S_C = exp(G_C) S_0 + sum_j exp(G_C - G_j) k_j u_j^T
    """
    S = S.transpose(-1, -2)  # [HV, K, V] inside the chunk algebra
    outs = []
    for c0 in range(0, q.shape[0], chunk_size):
        qc, kc, vc = (x[c0 : c0 + chunk_size].transpose(0, 1) for x in (q, k, v))  # [HV, n, *]
        gc, bc = g[c0 : c0 + chunk_size].T, beta[c0 : c0 + chunk_size].T  # [HV, n]
        n = qc.shape[1]
        G = torch.cumsum(gc, dim=-1)
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")))
        strict = (torch.matmul(kc, kc.transpose(-1, -2)) * decay * bc[:, :, None]).tril(-1)
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        rhs = bc[:, :, None] * (vc - torch.exp(G)[:, :, None] * torch.matmul(kc, S))
        u = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
        o = torch.exp(G)[:, :, None] * torch.matmul(qc, S) + torch.matmul(
            torch.matmul(qc, kc.transpose(-1, -2)) * decay, u
        )
        outs.append(o.transpose(0, 1))
        w = torch.exp(G[:, -1:] - G)  # [HV, n]
        S = torch.exp(G[:, -1])[:, None, None] * S + torch.matmul((kc * w[:, :, None]).transpose(-1, -2), u)
    return torch.cat(outs), S.transpose(-1, -2)
