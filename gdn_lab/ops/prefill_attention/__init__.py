"""prefill_attention: varlen (token-packed) attention of new tokens over a paged KV cache.

The op's folder: this spec, the PyTorch reference (`reference.py`) and one file per library with
its backends (`triton.py`, `aiter_triton.py`, `aiter.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import AttentionShape, Batch, BuildOptions, cu_seqlens, packed_view, paged_kv, queries
from gdn_lab.ops.paged_kv import OUTPUT_TOLERANCE, check_paged_cache, resolve_scale
from gdn_lab.ops.prefill_attention import reference
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "prefill_attention"


def validate(
    q,
    k_cache,
    v_cache,
    qo_indptr,
    kv_indptr,
    kv_indices,
    seq_lens,
    *,
    page_size: int = 1,
    causal: bool = True,
    scale: float | None = None,
    k_scale=None,
    v_scale=None,
    check_indices: bool = True,
) -> dict[str, Any]:
    """Check a prefill_attention call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("q", q, "T Hq D", dims, checks.FLOAT_DTYPES)
    check_paged_cache(
        dims, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, k_scale, v_scale, q.device, check_indices
    )
    checks.check_tensor("qo_indptr", qo_indptr, "B+1", dims, (torch.int32,), q.device)
    checks.check_divides("Hkv", dims["Hkv"], "Hq", dims["Hq"])
    checks.check_bool("causal", causal)
    if check_indices:
        qo = checks.host_ints(qo_indptr)
        checks.check_prefix_sums("qo_indptr", qo, dims["T"], "q.shape[0] (T)")
        for b, n in enumerate(checks.host_ints(seq_lens)):
            lq = qo[b + 1] - qo[b]
            if not 0 < lq <= n:
                raise ValueError(
                    f"qo_indptr: request {b} has {lq} new tokens; accepted: 1..seq_lens[{b}] (={n}), "
                    "since the new tokens are the last ones of the cached context"
                )
    return {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "qo_indptr": checks.dense(qo_indptr),
        "kv_indptr": checks.dense(kv_indptr),
        "kv_indices": checks.dense(kv_indices),
        "seq_lens": checks.dense(seq_lens),
        "page_size": page_size,
        "causal": causal,
        "scale": resolve_scale(scale, dims["D"]),
        "k_scale": k_scale,
        "v_scale": v_scale,
    }


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    page_size: int = 1,
    causal: bool = True,
    scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    check_indices: bool = True,
) -> torch.Tensor:
    """Varlen attention of each request's new tokens over its paged context (extend/prefill).

    The KV of the new tokens is already in the cache (written before the kernel, as batch-invariant
    serving requires): request b's new tokens are the last `qo_indptr[b+1] - qo_indptr[b]` of its
    `seq_lens[b]` cached tokens.

    Args:
        q: [T, Hq, D], the new tokens of all requests packed; request b owns rows
            qo_indptr[b]:qo_indptr[b+1].
        k_cache, v_cache: [num_pages, page_size, Hkv, D] (dtypes as `decode_attention`).
        qo_indptr: int32 [B+1], prefix sums of new tokens per request (ends at T).
        kv_indptr, kv_indices, seq_lens: the page table, as `decode_attention`.
        page_size: tokens per page.
        causal: each query sees keys up to its own position (True) or the whole context.
        scale: softmax scale, default D ** -0.5.
        k_scale, v_scale: float32 [1] for fp8 caches.
        backend: "auto" or a backend name.
        check_indices: check index values (one host synchronisation).

    Returns:
        [T, Hq, D] in q's dtype.

    Example:
        >>> import torch
        >>> from gdn_lab.cache import random_paged_kv
        >>> kv = random_paged_kv([7, 20], num_kv_heads=1, head_dim=32, dtype=torch.float32)
        >>> q = torch.randn(10, 2, 32)  # 3 new tokens for request 0, 7 for request 1
        >>> qo = torch.tensor([0, 3, 10], dtype=torch.int32)
        >>> prefill_attention(q, kv.k_cache, kv.v_cache, qo, kv.kv_indptr, kv.kv_indices, kv.seq_lens).shape
        torch.Size([10, 2, 32])
    """
    args = validate(
        q,
        k_cache,
        v_cache,
        qo_indptr,
        kv_indptr,
        kv_indices,
        seq_lens,
        page_size=page_size,
        causal=causal,
        scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
        check_indices=check_indices,
    )
    return dispatch(OP, args, backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Validated arguments of a tiny call (GQA 4/2, D 64, contexts 7 and 40 with 3 and 9 new tokens)."""
    from gdn_lab.cache import random_paged_kv

    kv = random_paged_kv([7, 40], 2, 64, dtype=dtype, device=device, seed=0)
    q = torch.randn(12, 4, 64, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    qo = torch.tensor([0, 3, 12], dtype=torch.int32, device=device)
    return validate(q, kv.k_cache, kv.v_cache, qo, kv.kv_indptr, kv.kv_indices, kv.seq_lens)


def build(batch: Batch, shape: AttentionShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: each request's last `query_tokens` tokens attend causally."""
    kv = paged_kv(batch, shape, opts)
    qo = cu_seqlens([r.query_tokens for r in batch.requests], opts.device)
    kw = kv.op_kwargs()
    cache = [kw.pop(name) for name in ("k_cache", "v_cache")]
    table = [kw.pop(name) for name in ("kv_indptr", "kv_indices", "seq_lens")]
    return validate(queries(batch, shape, opts, decode=False), *cache, qo, *table, **kw)


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns its new tokens' rows, qo_indptr[request]:qo_indptr[request + 1]."""
    return spec.View(packed_view(args["qo_indptr"], request))


# Closeness to the torch reference (float32 softmax over the cache as read), by output dtype:
# |out - ref| <= atol + rtol * |ref|, a couple of output ulps for bf16/fp16.
TOLERANCES = {("torch", "out", dt): spec.Tolerance("allclose", atol=t, rtol=t) for dt, t in OUTPUT_TOLERANCE.items()}

SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=prefill_attention,
        validate=validate,
        example=example,
        shape=AttentionShape,
        build=build,
        outputs=("out",),
        view=view,
        tolerances=TOLERANCES,
        kv_cache=True,
        description="varlen causal attention of each request's new tokens over its paged context",
    )
)

register(
    Backend(
        OP,
        "torch",
        reference.prefill_attention_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="exact causal softmax per request over its gathered context, fp32 accumulation",
    )
)

from gdn_lab.ops.prefill_attention import aiter, aiter_triton, triton  # noqa: E402, F401  (their backends)
