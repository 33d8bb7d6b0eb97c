"""Batch-invariant RMSNorm in Triton, and a split-row control whose split follows the batch.

`rms_norm_triton`: one program per row. It sums x^2 in float32 over chunks of BLOCK elements into
a BLOCK-wide accumulator (element j of chunk c lands in lane j), reduces the lanes with one
fixed-shape tree, and scales the row. BLOCK is a function of N alone, so a row's arithmetic never
depends on M, which only sizes the grid.

`rms_norm_splitk_by_batch` (the control) cuts each row into S slices when the rows under-fill the
SMs (S = min(chunks, 4 * SMs // M)), sums the slices' partial sums after the kernel, and so
changes a row's reduction order with M.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.interpreter import skip_repeated_work
from gdn_lab.ops.triton_support import interpreting

skip_repeated_work()  # under the interpreter, as triton_common does for the other kernel modules

_GPU_MAX_BLOCK = 4096
_INTERPRETER_MAX_BLOCK = 256


def row_block(n: int) -> int:
    """Elements per chunk of a row: the next power of two of N, capped (a function of N only)."""
    cap = _INTERPRETER_MAX_BLOCK if interpreting() else _GPU_MAX_BLOCK
    return min(cap, triton.next_power_of_2(n))


def _num_warps(block: int) -> int:
    return 1 if interpreting() else (4 if block <= 1024 else 8)


@triton.jit
def _sum_squares(x_row, lo, hi, BLOCK: tl.constexpr):
    """sum(x[lo:hi]^2) in float32: lane j accumulates elements lo + c * BLOCK + j, then one tree."""
    o = tl.arange(0, BLOCK)
    b_acc = tl.zeros([BLOCK], tl.float32)
    for n0 in range(lo, hi, BLOCK):
        b_x = tl.load(x_row + n0 + o, mask=n0 + o < hi, other=0.0).to(tl.float32)
        b_acc += b_x * b_x
    return tl.sum(b_acc, 0)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, eps, stride_xm, stride_om, BLOCK: tl.constexpr):
    i_m = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + i_m * stride_xm
    out_row = out_ptr + i_m * stride_om
    rstd = 1.0 / tl.sqrt_rn(_sum_squares(x_row, 0, N, BLOCK) / N + eps)
    o = tl.arange(0, BLOCK)
    for n0 in range(0, N, BLOCK):
        m = n0 + o < N
        b_x = tl.load(x_row + n0 + o, mask=m, other=0.0).to(tl.float32)
        b_w = tl.load(w_ptr + n0 + o, mask=m, other=0.0).to(tl.float32)
        tl.store(out_row + n0 + o, (b_x * rstd * b_w).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _partial_sum_squares_kernel(x_ptr, ws_ptr, N, slice_len, stride_xm, S: tl.constexpr, BLOCK: tl.constexpr):
    i_m = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)
    lo = i_s * slice_len
    hi = tl.minimum(lo + slice_len, N)
    tl.store(ws_ptr + i_m * S + i_s, _sum_squares(x_ptr + i_m * stride_xm, lo, hi, BLOCK))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Batch-invariant RMSNorm: one row per program, a fixed reduction order per N.

    Args:
        x: [M, N] bf16/fp16/fp32 (the last dim must be contiguous; it is copied otherwise).
        weight: [N].
        eps: added to the mean square.

    Returns:
        [M, N] in x's dtype.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    M, N = x.shape
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block = row_block(N)
    _rms_norm_kernel[(M,)](x, weight, out, N, eps, x.stride(0), out.stride(0), BLOCK=block, num_warps=_num_warps(block))
    return out


def row_splits_for_batch(m: int, n: int, num_sms: int) -> int:
    """The control's slices per row: split while the rows fill fewer than 4 programs per SM."""
    return max(1, min(triton.cdiv(n, row_block(n)), 4 * num_sms // max(m, 1)))  # m = 0: an empty batch


def rms_norm_splitk_by_batch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, num_sms: int | None = None
) -> torch.Tensor:
    """Batch-variant control: RMSNorm whose row sums are split into a count that follows M.

    This is a deliberately batch-variant control, not a kernel to use: with few rows each row's
    sum of squares is cut into `row_splits_for_batch(M, N, ...)` slices whose partial sums are
    added after the kernel (then the row is scaled in float32 torch), so a row's bits change with
    the number of rows normalised with it.

    Args:
        x, weight, eps: as `rms_norm_triton`.
        num_sms: the SM count the rule sees; None takes `gdn_lab.device.detect(x.device).num_sms`.

    Returns:
        [M, N] in x's dtype.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    M, N = x.shape
    sms = detect(x.device).num_sms if num_sms is None else num_sms
    splits = row_splits_for_batch(M, N, sms)
    block = row_block(N)
    slice_len = triton.cdiv(triton.cdiv(N, splits), block) * block
    partial = torch.empty(M, splits, dtype=torch.float32, device=x.device)
    _partial_sum_squares_kernel[(M, splits)](
        x, partial, N, slice_len, x.stride(0), S=splits, BLOCK=block, num_warps=_num_warps(block)
    )
    rstd = torch.rsqrt(partial.sum(1, keepdim=True) / N + eps)
    return (x.float() * rstd * weight.float()).to(x.dtype)
