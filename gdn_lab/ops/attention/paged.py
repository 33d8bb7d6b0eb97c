"""Validation of a paged KV cache and its page table, shared by decode and prefill attention."""

from __future__ import annotations

import torch

from gdn_lab import checks
from gdn_lab.device import check_fp8_dtype, detect


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
    checks.check_scale("scale", scale)
    return float(head_dim**-0.5 if scale is None else scale)
