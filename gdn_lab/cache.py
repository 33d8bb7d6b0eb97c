"""Seeded builders for the caches the ops read: paged KV caches and GDN state pools.

Layouts follow SGLang/AITER: a KV cache is `[num_pages, page_size, Hkv, D]` with a
`kv_indptr`/`kv_indices` page table; a GDN recurrent state pool is `[num_slots, HV, V, K]` fp32
("VK"); a conv state pool is `[num_slots, conv_dim, width - 1]`.

The builders place given per-request K/V tensors into pages, so that one request's content can be
put alone or among batchmates, in other physical pages, and read back with the same values.
Unused slots are filled with NaN, so a kernel that reads past a request's context shows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gdn_lab.checks import FLOAT_DTYPES, FP8_DTYPES, check_positive, dtype_name
from gdn_lab.quant import quantize_per_tensor


@dataclass
class PagedKV:
    """A paged KV cache and its page table, ready for `decode_attention`/`prefill_attention`.

    Attributes:
        k_cache, v_cache: [num_pages, page_size, Hkv, D].
        kv_indptr: int32 [B+1], prefix sums of pages per request.
        kv_indices: int32 [total_pages], page ids.
        seq_lens: int32 [B], tokens per request.
        page_size: tokens per page.
        k_scale, v_scale: float32 [1] for fp8 caches, else None.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    seq_lens: torch.Tensor
    page_size: int
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def op_kwargs(self) -> dict:
        """The cache arguments of `decode_attention`/`prefill_attention` as keywords."""
        return {
            "k_cache": self.k_cache,
            "v_cache": self.v_cache,
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "seq_lens": self.seq_lens,
            "page_size": self.page_size,
            "k_scale": self.k_scale,
            "v_scale": self.v_scale,
        }


def pages_needed(seq_len: int, page_size: int) -> int:
    return -(-seq_len // page_size)


def page_table(
    seq_lens: Sequence[int], page_size: int, *, seed: int = 0, shuffle: bool = True, spare_pages: int = 0
) -> tuple[list[int], list[int], int]:
    """Assign pages to requests.

    Args:
        seq_lens: tokens per request (each > 0).
        page_size: tokens per page.
        seed: seeds the page shuffle.
        shuffle: scatter pages over the pool (True) or assign them in order.
        spare_pages: pages in the pool that no request owns.

    Returns:
        (kv_indptr, kv_indices, num_pages) as Python lists and the pool size.
    """
    if page_size <= 0:
        raise ValueError(f"page_size: expected a positive int, got {page_size}")
    counts = []
    for i, n in enumerate(seq_lens):
        if n <= 0:
            raise ValueError(f"seq_lens: every length must be > 0, but entry {i} is {n}")
        counts.append(pages_needed(n, page_size))
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    num_pages = indptr[-1] + spare_pages
    if shuffle:
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_pages, generator=g)[: indptr[-1]].tolist()
    else:
        order = list(range(indptr[-1]))
    return indptr, order, num_pages


def build_paged_kv(
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    *,
    page_size: int = 1,
    kv_dtype: torch.dtype | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    seed: int = 0,
    shuffle: bool = True,
    spare_pages: int = 0,
) -> PagedKV:
    """Place per-request K/V into a paged cache.

    Args:
        keys, values: one [L_i, Hkv, D] tensor per request (same dtype and device).
        page_size: tokens per page (1 as SGLang's token pool; 16 as vLLM/AITER blocks).
        kv_dtype: the cache dtype; None keeps the inputs' dtype; an fp8 dtype quantizes.
        k_scale, v_scale: per-tensor dequantization scales for fp8 (default 1.0, as SGLang's
            backend passes); fixed, never derived from the batch.
        seed: seeds the page shuffle.
        shuffle: scatter pages over the pool.
        spare_pages: extra unowned pages (NaN-filled).

    Returns:
        A PagedKV.
    """
    if len(keys) == 0 or len(keys) != len(values):
        raise ValueError(
            f"keys, values: expected the same non-zero number of requests, got {len(keys)} and {len(values)}"
        )
    k0 = keys[0]
    if k0.dim() != 3:
        raise ValueError(f"keys[0]: expected [L, Hkv, D], got shape {tuple(k0.shape)}")
    hkv, d = k0.shape[1:]
    for i, (k, v) in enumerate(zip(keys, values)):
        if k.shape[1:] != (hkv, d) or v.shape != k.shape:
            raise ValueError(
                f"keys[{i}], values[{i}]: expected [L, {hkv}, {d}] each, got {tuple(k.shape)} and {tuple(v.shape)}"
            )
    store = kv_dtype or k0.dtype
    if store not in FLOAT_DTYPES + FP8_DTYPES:
        raise ValueError(
            f"kv_dtype: {dtype_name(store)} is not accepted; expected bf16, fp16, fp32 or an fp8 e4m3 dtype"
        )
    lens = [k.shape[0] for k in keys]
    indptr, indices, num_pages = page_table(lens, page_size, seed=seed, shuffle=shuffle, spare_pages=spare_pages)
    dev = k0.device
    fp8 = store in FP8_DTYPES
    work = torch.float32 if fp8 else store
    k_cache = torch.full((num_pages, page_size, hkv, d), float("nan"), dtype=work, device=dev)
    v_cache = torch.full_like(k_cache, float("nan"))
    for i, (k, v) in enumerate(zip(keys, values)):
        pages = torch.tensor(indices[indptr[i] : indptr[i + 1]], device=dev, dtype=torch.long)
        n = k.shape[0]
        padded = pages.numel() * page_size
        for cache, x in ((k_cache, k), (v_cache, v)):
            flat = torch.full((padded, hkv, d), float("nan"), dtype=work, device=dev)
            flat[:n] = x.to(work)
            cache[pages] = flat.view(-1, page_size, hkv, d)
    ks = vs = None
    if fp8:
        # NaN padding stays NaN through the cast: both e4m3 formats have a NaN.
        k_cache, ks = quantize_per_tensor(k_cache, store, 1.0 if k_scale is None else k_scale)
        v_cache, vs = quantize_per_tensor(v_cache, store, 1.0 if v_scale is None else v_scale)
    return PagedKV(
        k_cache=k_cache,
        v_cache=v_cache,
        kv_indptr=torch.tensor(indptr, dtype=torch.int32, device=dev),
        kv_indices=torch.tensor(indices, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        page_size=page_size,
        k_scale=ks,
        v_scale=vs,
    )


def random_kv(
    seq_len: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's K and V, [seq_len, Hkv, D], standard normal, from its own seed, drawn on `device`
    (a GPU's generator draws other values than the CPU's, without a host round trip)."""
    g = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=g, device=device).to(dtype=dtype)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=g, device=device).to(dtype=dtype)
    return k, v


def random_paged_kv(
    seq_lens: Sequence[int],
    num_kv_heads: int,
    head_dim: int,
    *,
    page_size: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    device="cpu",
    seed: int = 0,
    shuffle: bool = True,
) -> PagedKV:
    """A paged cache of random requests; request i's content comes from seed `seed + i`.

    Args:
        seq_lens: tokens per request (at least one request, each > 0).
        num_kv_heads, head_dim: Hkv and D (> 0).
        page_size: tokens per page (> 0).
        dtype: the K/V values' dtype; kv_dtype: the cache's (None: dtype; fp8 quantizes).
        device: where the cache lives.
        seed: request i draws from seed + i; the page shuffle from seed.
        shuffle: scatter pages over the pool.

    Raises:
        ValueError: an empty or non-positive size, naming the parameter and the value.
    """
    if isinstance(seq_lens, (str, bytes)) or not isinstance(seq_lens, Sequence) or len(seq_lens) == 0:
        raise ValueError(f"seq_lens: expected a non-empty list of positive ints, got {seq_lens!r}")
    for i, n in enumerate(seq_lens):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"seq_lens: every length must be a positive int, but entry {i} is {n!r}")
    for name, value in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("page_size", page_size)):
        check_positive(name, value)
    kvs = [
        random_kv(n, num_kv_heads, head_dim, dtype=dtype, device=device, seed=seed + i) for i, n in enumerate(seq_lens)
    ]
    return build_paged_kv(
        [k for k, _ in kvs], [v for _, v in kvs], page_size=page_size, kv_dtype=kv_dtype, seed=seed, shuffle=shuffle
    )


def gdn_state_pool(
    num_slots: int, num_v_heads: int, head_v_dim: int, head_k_dim: int, *, device="cpu", seed: int | None = None
) -> torch.Tensor:
    """A recurrent-state pool [num_slots, HV, V, K] fp32: zeros, or small random states from `seed`."""
    shape = (num_slots, num_v_heads, head_v_dim, head_k_dim)
    if seed is None:
        return torch.zeros(shape, dtype=torch.float32, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    return 0.1 * torch.randn(shape, generator=g, device=device)


def conv_state_pool(
    num_slots: int,
    conv_dim: int,
    width: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int | None = None,
) -> torch.Tensor:
    """A causal-conv state pool [num_slots, conv_dim, width - 1]: zeros, or random from `seed`."""
    shape = (num_slots, conv_dim, width - 1)
    if seed is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device).to(dtype=dtype)
