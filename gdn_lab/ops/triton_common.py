"""What our Triton kernels share: tl.dot operand precision and tile extents.

Imports triton at load; registrations reach kernel modules only through `routing.lazy`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.ops.triton_support import interpreting

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


def dot_precision(a_dtype: torch.dtype, b_dtype: torch.dtype) -> DotPrecision:
    """Operand precision of a tl.dot, fixed by the input dtypes alone (never by the batch).

    On the GPU the operands are a's dtype when b holds that dtype or fp8 (an e4m3 value converts
    to bf16/fp16 exactly), else float32. Under the interpreter they are always float32: Triton
    3.9's interpreter computes tl.dot on bf16 operands wrongly.
    """
    if interpreting() or a_dtype == torch.float32:
        return DotPrecision(tl.float32, "ieee")
    if b_dtype == a_dtype or b_dtype.itemsize == 1:
        return DotPrecision(_TL_DTYPES[a_dtype], None)
    return DotPrecision(tl.float32, "ieee")


def pow2_at_least(n: int, floor: int = 16) -> int:
    """The tile extent for n rows or columns: a power of two, at least `floor` (tl.dot needs 16)."""
    return max(floor, triton.next_power_of_2(n))
