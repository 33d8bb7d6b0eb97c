"""decode_attention: one query token per request over a paged KV cache.

The op's folder: this spec (validation, the public function, an example call, the workload
builder, row views and tolerances), the PyTorch references (`reference.py`) and one file per
library with its backends (`triton.py`, `aiter_triton.py`, `aiter.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import AttentionShape, Batch, BuildOptions, paged_kv, queries
from gdn_lab.ops.decode_attention import reference
from gdn_lab.ops.paged_kv import OUTPUT_TOLERANCE, check_paged_cache, resolve_scale
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "decode_attention"


def validate(
    q,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    seq_lens,
    *,
    page_size: int = 1,
    scale: float | None = None,
    k_scale=None,
    v_scale=None,
    check_indices: bool = True,
) -> dict[str, Any]:
    """Check a decode_attention call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("q", q, "B Hq D", dims, checks.FLOAT_DTYPES)
    check_paged_cache(
        dims, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, k_scale, v_scale, q.device, check_indices
    )
    checks.check_divides("Hkv", dims["Hkv"], "Hq", dims["Hq"])
    return {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "kv_indptr": checks.dense(kv_indptr),
        "kv_indices": checks.dense(kv_indices),
        "seq_lens": checks.dense(seq_lens),
        "page_size": page_size,
        "scale": resolve_scale(scale, dims["D"]),
        "k_scale": k_scale,
        "v_scale": v_scale,
    }


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    page_size: int = 1,
    scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    check_indices: bool = True,
) -> torch.Tensor:
    """Softmax attention of one new token per request over its paged KV context.

    Args:
        q: [B, Hq, D] bf16, fp16 or fp32, one query token per request.
        k_cache, v_cache: [num_pages, page_size, Hkv, D] in bf16/fp16/fp32, or an fp8 e4m3 dtype
            the device's arch stores (float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950, NVIDIA;
            either on the CPU). Hq must be divisible by Hkv; query head h reads KV head h // (Hq // Hkv).
        kv_indptr: int32 [B+1], prefix sums of the pages each request owns.
        kv_indices: int32 [total_pages], page ids; request b owns kv_indices[kv_indptr[b]:kv_indptr[b+1]].
        seq_lens: int32 [B], context tokens per request (its pages hold between
            (pages - 1) * page_size + 1 and pages * page_size of them).
        page_size: tokens per page (must equal k_cache.shape[1]).
        scale: softmax scale, default D ** -0.5.
        k_scale, v_scale: float32 [1] dequantization scales, required for fp8 caches, else None.
        backend: "auto" or a name from `gdn_lab.routing.backend_names("decode_attention")`.
        check_indices: check the page table's values (one host synchronisation); pass False only
            for a table known to be good, e.g. inside CUDA-graph capture.

    Returns:
        [B, Hq, D] in q's dtype.

    Raises:
        ValueError: bad input (the message names the parameter and what is accepted).
        NotCovered: the named backend cannot run this call.

    Example:
        >>> import torch
        >>> from gdn_lab.cache import random_paged_kv
        >>> kv = random_paged_kv([5, 300], num_kv_heads=2, head_dim=64, dtype=torch.float32)
        >>> q = torch.randn(2, 4, 64)
        >>> decode_attention(q, **kv.op_kwargs(), backend="torch").shape
        torch.Size([2, 4, 64])
    """
    args = validate(
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        seq_lens,
        page_size=page_size,
        scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
        check_indices=check_indices,
    )
    return dispatch(OP, args, backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Validated arguments of a tiny call (GQA 4/2, D 64, contexts 5 and 300), for explain() and tests."""
    from gdn_lab.cache import random_paged_kv

    kv = random_paged_kv([5, 300], 2, 64, dtype=dtype, kv_dtype=kv_dtype, device=device, seed=0)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    return validate(q, **kv.op_kwargs())


def build(batch: Batch, shape: AttentionShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: one query per request over its `length`-token context."""
    return validate(queries(batch, shape, opts, decode=True), **paged_kv(batch, shape, opts).op_kwargs())


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns output row `request`."""
    return spec.View(slice(request, request + 1))


# Closeness of the output, per reference:
# - "torch" and "exact" (the float32 and float64 softmax over the cache as read), by output dtype:
#   |out - ref| <= atol + rtol * |ref|; bf16/fp16: a couple of output ulps (AITER rounds each
#   partition's partial to the query dtype, then the merged result once more); fp32: the
#   accumulation order over up to 16k tokens;
# - "unquantized" (float64 softmax over the K/V before they were stored), by cache dtype, as
#   flash-linear-attention's RMS ratio: a cache in the compute dtype only adds the kernel's
#   rounding; e4m3 keeps 3 mantissa bits (relative step 1/8 .. 1/16), so K and V carry ~2-4 % noise,
#   averaged down by the softmax.
_UNQUANTIZED = {"fp8": 0.1, "bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}
TOLERANCES = {
    **{
        (ref, "out", dt): spec.Tolerance("allclose", atol=t, rtol=t)
        for ref in ("torch", "exact")
        for dt, t in OUTPUT_TOLERANCE.items()
    },
    **{("unquantized", "out", dt): spec.Tolerance("rms_ratio", limit=t) for dt, t in _UNQUANTIZED.items()},
}

SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=decode_attention,
        validate=validate,
        example=example,
        shape=AttentionShape,
        build=build,
        outputs=("out",),
        view=view,
        tolerances=TOLERANCES,
        exact=reference.decode_attention_exact,
        kv_cache=True,
        description="one query token per request over its paged KV context (AITER paged_attention_ragged)",
    )
)

register(
    Backend(
        OP,
        "torch",
        reference.decode_attention_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="exact softmax per request, fp32 accumulation (ground truth)",
    )
)
register(
    Backend(
        OP,
        "torch-partitioned",
        reference.decode_attention_partitioned,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        auto=False,
        description="AITER paged_attention_ragged numerics: 256-token partitions, partials in q's dtype, fixed-order merge",
    )
)

from gdn_lab.ops.decode_attention import aiter, aiter_triton, triton  # noqa: E402, F401  (their backends)
