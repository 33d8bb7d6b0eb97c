"""Requests, batches, and the seeded content an op's workload builder fills them with.

An invariance experiment runs one target request alone and then inside batches. For the
comparison to mean anything, the target must be the same request every time, so every tensor of a
request comes from its own seed (`randn(request.seed, stream, ...)`), whatever the batch, its
position in it, or where its pages and state slots land (`Batch.placement_seed`). What the requests
of one op share (gate parameters, conv and norm weights) comes from `BuildOptions.weights_seed`.

Each op's folder builds its validated call from a Batch with these helpers
(`OpSpec.build(batch, shape, options)`); `gdn_lab.workloads` composes the batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from gdn_lab import checks
from gdn_lab.cache import PagedKV, build_paged_kv, gdn_state_pool, random_kv

SPARE_SLOTS = 3  # state-pool slots and KV pages no request owns (NaN), so reading the wrong one shows


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from an experiment seed and a path of keys (stable across runs and machines)."""
    text = repr((int(seed), *keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class Request:
    """One request of a batch.

    Attributes:
        length: its tokens: the KV context (attention), the sequence (GDN prefill); 1 for gdn_decode.
        seed: seeds all of its content.
        new_tokens: how many of its last tokens are new queries (prefill over a cached context;
            None: all of them, a plain prefill).
    """

    length: int
    seed: int
    new_tokens: int | None = None

    @property
    def query_tokens(self) -> int:
        return self.length if self.new_tokens is None else min(self.new_tokens, self.length)


@dataclass(frozen=True)
class Batch:
    """Requests in batch order; the target at `position`; `placement_seed` shuffles pages and slots."""

    requests: tuple[Request, ...]
    position: int
    placement_seed: int

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def target(self) -> Request:
        return self.requests[self.position]

    @property
    def lengths(self) -> list[int]:
        return [r.length for r in self.requests]


@dataclass(frozen=True)
class AttentionShape:
    """Heads per TP rank of a full-attention layer (default: Qwen3-8B at TP1, 32/8/128).

    Attributes:
        num_q_heads, num_kv_heads: Hq and Hkv (Hq divisible by Hkv).
        head_dim: D.
        page_size: tokens per KV page (1: SGLang's token pool as AITER sees it).
    """

    param: ClassVar[str] = "attention"

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 1

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "page_size"):
            checks.check_positive(name, getattr(self, name))
        checks.check_divides("num_kv_heads", self.num_kv_heads, "num_q_heads", self.num_q_heads)


@dataclass(frozen=True)
class GDNShape:
    """Heads per TP rank of a Gated DeltaNet layer (default: Qwen3-Next-80B at TP4, 4/8/128).

    Attributes:
        num_k_heads, num_v_heads: HK and HV (HV divisible by HK).
        head_dim: K = V.
        conv_width: the causal conv's kernel width.
    """

    param: ClassVar[str] = "gdn"

    num_k_heads: int = 4
    num_v_heads: int = 8
    head_dim: int = 128
    conv_width: int = 4

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "head_dim", "conv_width"):
            checks.check_positive(name, getattr(self, name))
        checks.check_divides("num_k_heads", self.num_k_heads, "num_v_heads", self.num_v_heads)
        if self.conv_width < 2:
            raise ValueError(f"conv_width: must be at least 2, got {self.conv_width}")

    @property
    def conv_dim(self) -> int:
        return (2 * self.num_k_heads + self.num_v_heads) * self.head_dim


@dataclass(frozen=True)
class LinearShape:
    """A model layer's rows: x [tokens, hidden] (rms_norm), projected to out_features (matmul).

    Attributes:
        hidden: features per token (K of matmul, N of rms_norm).
        out_features: matmul's N.
    """

    param: ClassVar[str] = "linear"

    hidden: int = 4096
    out_features: int = 4096

    def __post_init__(self) -> None:
        for name in ("hidden", "out_features"):
            checks.check_positive(name, getattr(self, name))


@dataclass(frozen=True)
class MoEShape:
    """A routed-expert (MoE) layer per rank (default: Qwen3-Next-80B-A3B at TP4: hidden 2048, 512
    experts with 10 per token, each expert's width 512 cut in 4 by tensor parallelism).

    Attributes:
        hidden: H, features per token.
        num_experts: E.
        top_k: experts per token (at most E).
        intermediate: I, one expert's width per rank (w1 [E, 2I, H], w2 [E, H, I]).
    """

    param: ClassVar[str] = "moe"

    hidden: int = 2048
    num_experts: int = 512
    top_k: int = 10
    intermediate: int = 128

    def __post_init__(self) -> None:
        for name in ("hidden", "num_experts", "top_k", "intermediate"):
            checks.check_positive(name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: must be at most num_experts (={self.num_experts}), got {self.top_k}")


@dataclass(frozen=True)
class BuildOptions:
    """How a batch becomes tensors (the same for the target alone and in its batches).

    Attributes:
        dtype: the compute dtype (q, k, v, projections).
        kv_dtype: the KV-cache dtype (ops with a KV cache); None keeps `dtype`; an fp8 dtype
            quantizes with the fixed scales below (never derived from the batch).
        k_scale, v_scale: per-tensor fp8 dequantization scales.
        device: where the tensors live.
        weights_seed: seeds what the requests share (gate parameters, conv and norm weights).
        initial_state: GDN ops start from a random state of the request's own (True) or zeros.
        quantize_fp8: ops that can also return group-128 fp8 activations do.
        fp8_dtype: their format (None: the device arch's).
    """

    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    weights_seed: int = 0
    initial_state: bool = True
    quantize_fp8: bool = False
    fp8_dtype: torch.dtype | None = None


def randn(seed: int, stream: str, *shape: int, scale: float = 1.0, device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal float32 from (seed, stream), drawn on `device` (one request's tensors never
    share a stream). The same seed gives the same values on every machine of one device type; a
    GPU's generator draws other values than the CPU's, and draws them without a host round trip."""
    g = torch.Generator(device=device).manual_seed(derive_seed(seed, stream))
    return scale * torch.randn(*shape, generator=g, device=device)


def cu_seqlens(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """int32 [N+1] prefix sums of `lengths`, starting at 0."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def slot_table(batch: Batch, device: torch.device) -> tuple[torch.Tensor, int]:
    """Distinct state slots for the requests, scattered over a pool with spare slots: (slots, pool size)."""
    pool = batch.size + SPARE_SLOTS
    g = torch.Generator().manual_seed(batch.placement_seed)
    slots = torch.randperm(pool, generator=g)[: batch.size].to(torch.int32)
    return slots.to(device), pool


def paged_kv(batch: Batch, shape: AttentionShape, opts: BuildOptions) -> PagedKV:
    """Each request's K/V (from its seed) in shuffled pages of a cache with spare NaN pages."""
    kvs = [
        random_kv(r.length, shape.num_kv_heads, shape.head_dim, dtype=opts.dtype, device=opts.device, seed=r.seed)
        for r in batch.requests
    ]
    fp8 = opts.kv_dtype is not None and opts.kv_dtype in checks.FP8_DTYPES
    return build_paged_kv(
        [k for k, _ in kvs],
        [v for _, v in kvs],
        page_size=shape.page_size,
        kv_dtype=opts.kv_dtype,
        k_scale=opts.k_scale if fp8 else None,
        v_scale=opts.v_scale if fp8 else None,
        seed=batch.placement_seed,
        shuffle=True,
        spare_pages=SPARE_SLOTS,
    )


def queries(batch: Batch, shape: AttentionShape, opts: BuildOptions, decode: bool) -> torch.Tensor:
    """Token-packed queries [sum of query tokens (decode: B), Hq, D] from each request's seed."""
    rows = [
        randn(r.seed, "q", 1 if decode else r.query_tokens, shape.num_q_heads, shape.head_dim, device=opts.device)
        for r in batch.requests
    ]
    return torch.cat(rows).to(dtype=opts.dtype)


def gate_params(shape: GDNShape, opts: BuildOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log and dt_bias [HV], shared by every request of the op."""
    hv = shape.num_v_heads
    a_log = randn(opts.weights_seed, "A_log", hv, scale=0.5, device=opts.device)
    dt_bias = randn(opts.weights_seed, "dt_bias", hv, scale=0.5, device=opts.device)
    return a_log, dt_bias


def state_pool(batch: Batch, shape: GDNShape, opts: BuildOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-filled delta-state pool [pool, HV, V, K] with each request's initial state in its (shuffled) slot."""
    slots, pool = slot_table(batch, opts.device)
    d, hv = shape.head_dim, shape.num_v_heads
    state = torch.full((pool, hv, d, d), float("nan"), dtype=torch.float32, device=opts.device)
    for r, slot in zip(batch.requests, slots.tolist()):
        state[slot] = gdn_state_pool(1, hv, d, d, device=opts.device, seed=r.seed if opts.initial_state else None)[0]
    return state, slots


def gdn_tokens(batch: Batch, shape: GDNShape, opts: BuildOptions, decode: bool) -> list[torch.Tensor]:
    """Token-packed q, k [T, HK, K]; v [T, HV, V]; a, b [T, HV] from each request's seed (decode: one token each)."""
    hk, hv, d = shape.num_k_heads, shape.num_v_heads, shape.head_dim
    per_request = []
    for r in batch.requests:
        n = 1 if decode else r.length
        per_request.append(
            [
                randn(r.seed, "q", n, hk, d, device=opts.device),
                randn(r.seed, "k", n, hk, d, device=opts.device),
                randn(r.seed, "v", n, hv, d, device=opts.device),
                randn(r.seed, "a", n, hv, device=opts.device),
                randn(r.seed, "b", n, hv, device=opts.device),
            ]
        )
    return [torch.cat(parts).to(dtype=opts.dtype) for parts in zip(*per_request)]


def rows(batch: Batch, opts: BuildOptions, stream: str, width: int) -> torch.Tensor:
    """Token-packed rows [sum of lengths, width] from each request's seed."""
    return torch.cat([randn(r.seed, stream, r.length, width, device=opts.device) for r in batch.requests]).to(
        opts.dtype
    )


def routing(batch: Batch, shape: MoEShape, opts: BuildOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and weights from its request's seed, as Qwen3-Next routes: softmax over
    random router logits, the top_k largest, renormalised to sum to 1. Returns topk_weights
    float32 and topk_ids int32, [sum of lengths, top_k] (computed per request, so a request's
    routing is the same in any batch)."""
    weights, ids = [], []
    for r in batch.requests:
        probs = torch.softmax(randn(r.seed, "router", r.length, shape.num_experts, device=opts.device), dim=-1)
        w, i = torch.topk(probs, shape.top_k, dim=-1)
        weights.append(w / w.sum(-1, keepdim=True))
        ids.append(i)
    return torch.cat(weights), torch.cat(ids).to(torch.int32)


def request_rows(batch: Batch, request: int) -> slice:
    """Request `request`'s rows of a tensor packed by the batch's lengths."""
    start = sum(batch.lengths[:request])
    return slice(start, start + batch.lengths[request])


def packed_view(cu: torch.Tensor, request: int) -> slice:
    """Request `request`'s rows of a token-packed tensor with boundaries `cu` (one host read)."""
    start, end = (int(x) for x in cu[request : request + 2].tolist())
    return slice(start, end)
