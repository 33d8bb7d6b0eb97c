"""What our Triton attention kernels share: reading a paged KV cache, scales, grid bounds.

Imports triton at load; the registrations reach this module only through `routing.lazy`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x) = exp2(x * log2(e))


@triton.jit
def load_kv_tile(
    cache_ptr,
    kv_indices_ptr,
    page_base,
    pos,
    m_pos,
    i_kh,
    stride_p,
    stride_t,
    stride_h,
    o_d,
    m_d,
    PAGE_SIZE: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """Tokens `pos` ([BN], request-relative) of KV head i_kh as a [BN, BD] tile in DTYPE.

    Token p lives in page kv_indices[page_base + p // PAGE_SIZE], slot p % PAGE_SIZE. Masked
    tokens and columns read as 0 (never the cache's padding, which may be NaN).
    """
    page = tl.load(kv_indices_ptr + page_base + pos // PAGE_SIZE, mask=m_pos, other=0).to(tl.int64)
    slot = pos % PAGE_SIZE
    p_kv = cache_ptr + page[:, None] * stride_p + slot[:, None] * stride_t + i_kh * stride_h + o_d[None, :]
    return tl.load(p_kv, mask=m_pos[:, None] & m_d[None, :], other=0.0).to(DTYPE)


def scale_args(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, dummy: torch.Tensor):
    """(k_scale, v_scale, FP8): the scale tensors, or a dummy pointer the kernel never reads."""
    if k_scale is None:
        return dummy, dummy, False
    return k_scale, v_scale, True


def grid_bound(name: str, value: int | None, lengths: Callable[[], torch.Tensor]) -> int:
    """A grid extent's length bound: `value` when given (checked), else max(lengths()) read from
    the device (one host synchronisation; pass the value to capture a CUDA graph)."""
    if value is None:
        return int(lengths().max().item())
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"{name}: expected a positive int (an upper bound of the batch's lengths) or None, got {value!r}"
        )
    return value
