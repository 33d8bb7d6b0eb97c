"""What decode and prefill attention share: the paged KV cache's checks, reads, and Triton contract.

A paged KV cache is `[num_pages, page_size, Hkv, D]` with a `kv_indptr`/`kv_indices` page table
(SGLang/AITER layout); request b owns pages kv_indices[kv_indptr[b]:kv_indptr[b+1]].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.device import check_fp8_dtype, detect
from gdn_lab.ops.triton_support import triton_device
from gdn_lab.quant import dequantize
from gdn_lab.routing import Check

PARTITION_SIZE = 256  # AITER paged_attention_ragged's hard-coded T_PAR_SIZE (our kernel's too)
MAX_HEAD_DIM = 256  # our Triton kernels hold one whole head in a tile

# Closeness of an attention output to a float32 / float64 softmax over the cache as read, by output
# dtype (atol = rtol): a couple of output ulps for bf16/fp16 (AITER rounds each partition's partial
# to the query dtype, then the merged result once more); fp32: accumulation order over 16k tokens.
OUTPUT_TOLERANCE = {"bfloat16": 2 * 2**-8, "float16": 2 * 2**-11, "float32": 1e-5}


def check_paged_cache(
    dims: checks.Dims,
    k_cache,
    v_cache,
    kv_indptr,
    kv_indices,
    seq_lens,
    page_size,
    k_scale,
    v_scale,
    device: torch.device,
    check_indices: bool,
) -> None:
    """Check the cache tensors (binding P, page, Hkv, D, B, N) and, when asked, the page table values."""
    checks.check_tensor("k_cache", k_cache, "P page Hkv D", dims, checks.FLOAT_DTYPES + checks.FP8_DTYPES, device)
    checks.check_tensor("v_cache", v_cache, "P page Hkv D", dims, (k_cache.dtype,), device)
    checks.check_positive("page_size", page_size)
    if k_cache.shape[1] != page_size:
        raise ValueError(
            f"page_size: {page_size} does not match k_cache's dim 1 (={k_cache.shape[1]}, tokens per page)"
        )
    checks.check_tensor("kv_indptr", kv_indptr, "B+1", dims, (torch.int32,), device)
    checks.check_tensor("kv_indices", kv_indices, "N", dims, (torch.int32,), device)
    checks.check_tensor("seq_lens", seq_lens, "B", dims, (torch.int32,), device)
    fp8 = k_cache.dtype in checks.FP8_DTYPES
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if fp8:
            if s is None:
                raise ValueError(
                    f"{name}: required for an fp8 KV cache ({checks.dtype_name(k_cache.dtype)}): float32 [1]"
                )
            checks.check_tensor(name, s, "1", dims, (torch.float32,), device)
        elif s is not None:
            raise ValueError(f"{name}: only for fp8 KV caches; pass None for {checks.dtype_name(k_cache.dtype)}")
    if fp8:
        check_fp8_dtype("k_cache", k_cache.dtype, detect(device).arch)
    checks.check_bool("check_indices", check_indices)
    if not check_indices:
        return
    indptr = checks.host_ints(kv_indptr)
    lens = checks.host_ints(seq_lens)
    checks.check_prefix_sums("kv_indptr", indptr, kv_indices.numel(), "len(kv_indices)")
    checks.check_lengths_positive("seq_lens", lens)
    checks.check_index_range("kv_indices", kv_indices, k_cache.shape[0], "the number of pages in k_cache")
    for b, n in enumerate(lens):
        pages = indptr[b + 1] - indptr[b]
        if not (pages - 1) * page_size < n <= pages * page_size:
            raise ValueError(
                f"seq_lens: request {b} has {n} tokens but {pages} pages of {page_size} "
                f"(accepted: {(pages - 1) * page_size + 1}..{pages * page_size} tokens)"
            )


def resolve_scale(scale, head_dim: int) -> float:
    checks.check_positive_float("scale", scale, none="head_dim ** -0.5")
    return float(head_dim**-0.5 if scale is None else scale)


def gather_request(
    cache: torch.Tensor, kv_indptr: list[int], kv_indices: torch.Tensor, b: int, length: int, scale: torch.Tensor | None
) -> torch.Tensor:
    """Request b's first `length` tokens from a paged cache: [length, Hkv, D] float32, dequantized."""
    pages = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
    tokens = cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:length]
    return dequantize(tokens, scale)


def grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[..., Hq, D] -> [Hkv, ..., G, D] float32: query head h reads KV head h // G."""
    *lead, hq, d = q.shape
    g = hq // num_kv_heads
    x = q.float().reshape(*lead, num_kv_heads, g, d)
    return x.movedim(-3, 0)


def ungrouped(o: torch.Tensor) -> torch.Tensor:
    """[Hkv, ..., G, D] -> [..., Hq, D]."""
    x = o.movedim(0, -3)
    return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])


def triton_covered(args: Mapping[str, Any]) -> Check:
    """Our Triton kernels' contract: tensors where Triton runs, D <= 256, caches' last dim contiguous."""
    ok, reason = triton_device(args, "q")
    if not ok:
        return ok, reason
    d = args["q"].shape[-1]
    if d > MAX_HEAD_DIM:
        return False, f"head_dim {d} > {MAX_HEAD_DIM} (one tile holds a whole head)"
    for name in ("k_cache", "v_cache"):
        if args[name].stride(-1) != 1:
            return False, f"{name}'s last dim must be contiguous (stride 1), got stride {args[name].stride(-1)}"
    return True, f"{reason}; head_dim {d}"
