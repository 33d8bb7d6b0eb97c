"""What our Triton attention kernels share: reading a paged KV cache, and the dot precision.

Imports triton at load; the registrations reach this module only through `routing.lazy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.ops.triton_support import interpreting

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x) = exp2(x * log2(e))

_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@dataclass(frozen=True)
class DotPrecision:
    """The dtype both tl.dot operands are converted to, and tl.dot's input_precision.

    Attributes:
        dtype: the Triton operand dtype (the accumulator is always float32).
        input_precision: "ieee" for float32 operands (no TF32 rounding), None (Triton's default) else.
    """

    dtype: tl.dtype
    input_precision: str | None


def dot_precision(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> DotPrecision:
    """Operand precision for Q·K and P·V, fixed by the dtypes alone (never by the batch).

    On the GPU the operands are the query's dtype when the cache holds that dtype or fp8 (an e4m3
    value converts to bf16/fp16 exactly), else float32. Under the interpreter they are always
    float32: Triton 3.9's interpreter computes tl.dot on bf16 operands wrongly.
    """
    if interpreting() or q_dtype == torch.float32:
        return DotPrecision(tl.float32, "ieee")
    if kv_dtype == q_dtype or kv_dtype.itemsize == 1:
        return DotPrecision(_TL_DTYPES[q_dtype], None)
    return DotPrecision(tl.float32, "ieee")


def pow2_at_least(n: int, floor: int = 16) -> int:
    """The tile extent for n rows or columns: a power of two, at least `floor` (tl.dot needs 16)."""
    return max(floor, triton.next_power_of_2(n))


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
