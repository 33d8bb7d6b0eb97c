"""Batch-invariant matmul in Triton, and a split-K control whose split follows the batch.

`matmul_triton`: one program per (BM x BN) output tile walks K from 0 in BK steps into one float32
accumulator. The tiles are fixed per dtype (never chosen from M, N or K) and K is never split,
so an output row is the same sequence of multiply-adds whatever M is; M only sizes the grid and
the row mask, and it is not specialised on at compilation.

`matmul_splitk_by_batch` (the control) cuts K into S slices when the output tiles under-fill the
SMs, S = min(K blocks, SMs // tiles), as split-K GEMM heuristics do; the partial products are
summed afterwards, so a row's sum order changes with M.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.ops.triton_common import dot_acc, dot_precision
from gdn_lab.ops.triton_support import interpreting


@dataclass(frozen=True)
class MatmulConfig:
    """Tiles and launch options (a function of the dtype only)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# As batch_invariant_ops: 128 x 128 tiles, BK 64 for 16-bit inputs and 32 for float32.
_GPU_CONFIGS = {
    torch.bfloat16: MatmulConfig(128, 128, 64, 8, 3),
    torch.float16: MatmulConfig(128, 128, 64, 8, 3),
    torch.float32: MatmulConfig(128, 128, 32, 8, 3),
}
_INTERPRETER_CONFIG = MatmulConfig(16, 32, 32, 1, 1)


# Under the interpreter the dot is row-exact (`triton_common.dot_acc`): numpy's matmul can sum a row
# by where it sits in the tile. The GPU keeps tl.dot (the constexpr branch leaves its kernel as it was).


def matmul_config(dtype: torch.dtype) -> MatmulConfig:
    """The fixed tiles for a dtype."""
    return _INTERPRETER_CONFIG if interpreting() else _GPU_CONFIGS[dtype]


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_wn,
    stride_os,
    stride_om,
    stride_on,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    ROW_EXACT_DOT: tl.constexpr,
):
    i_m = tl.program_id(0)
    i_n = tl.program_id(1)
    i_s = tl.program_id(2)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    o_k = tl.arange(0, BK)
    m_m = o_m < M
    m_n = o_n < N
    k_lo = i_s * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    b_acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        m_k = k0 + o_k < k_hi
        p_x = x_ptr + o_m[:, None].to(tl.int64) * stride_xm + (k0 + o_k)[None, :] * stride_xk
        p_w = w_ptr + (k0 + o_k)[:, None].to(tl.int64) * stride_wk + o_n[None, :] * stride_wn
        b_x = tl.load(p_x, mask=m_m[:, None] & m_k[None, :], other=0.0).to(DOT_DTYPE)
        b_w = tl.load(p_w, mask=m_k[:, None] & m_n[None, :], other=0.0).to(DOT_DTYPE)
        b_acc = dot_acc(b_acc, b_x, b_w, INPUT_PRECISION, ROW_EXACT_DOT)
    p_out = out_ptr + i_s * stride_os + o_m[:, None].to(tl.int64) * stride_om + o_n[None, :] * stride_on
    tl.store(p_out, b_acc.to(out_ptr.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def _launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, splits: int, cfg: MatmulConfig) -> torch.Tensor:
    """Run the kernel into out ([M, N], or [splits, M, N] float32 partials when splits > 1)."""
    M, K = x.shape
    N = w.shape[1]
    k_per_split = triton.cdiv(triton.cdiv(K, splits), cfg.block_k) * cfg.block_k
    prec = dot_precision(x.dtype, x.dtype)
    so = out.stride(0) if out.dim() == 3 else 0
    grid = (triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), splits)
    _matmul_kernel[grid](
        x, w, out, M, N, K, k_per_split,
        stride_xm=x.stride(0), stride_xk=x.stride(1), stride_wk=w.stride(0), stride_wn=w.stride(1),
        stride_os=so, stride_om=out.stride(-2), stride_on=out.stride(-1),
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k,
        DOT_DTYPE=prec.dtype, INPUT_PRECISION=prec.input_precision, ROW_EXACT_DOT=interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def matmul_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Batch-invariant x @ w: fixed tiles per dtype, K walked in order, float32 accumulation.

    Args:
        x: [M, K] bf16/fp16/fp32.
        w: [K, N] in x's dtype, any strides.

    Returns:
        [M, N] in x's dtype.
    """
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    return _launch(x, w, out, 1, matmul_config(x.dtype))


def splitk_for_batch(m: int, n: int, k: int, cfg: MatmulConfig, num_sms: int) -> int:
    """The control's K slices: split while the output tiles fill fewer than all SMs."""
    tiles = max(1, triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n))  # M = 0: an empty batch
    return max(1, min(triton.cdiv(k, cfg.block_k), num_sms // tiles))


def matmul_splitk_by_batch(x: torch.Tensor, w: torch.Tensor, *, num_sms: int | None = None) -> torch.Tensor:
    """Batch-variant control: split-K matmul whose split count follows M (and the SM count).

    This is a deliberately batch-variant control, not a kernel to use: with few rows the K axis
    is cut into `splitk_for_batch(M, N, K, ...)` slices whose float32 partials are summed after
    the kernel, so a row's bits change with the number of rows it is multiplied with.

    Args:
        x, w: as `matmul_triton`.
        num_sms: the SM count the rule sees; None takes `gdn_lab.device.detect(x.device).num_sms`
            (on the CPU, torch's thread count).

    Returns:
        [M, N] in x's dtype.
    """
    cfg = matmul_config(x.dtype)
    sms = detect(x.device).num_sms if num_sms is None else num_sms
    splits = splitk_for_batch(x.shape[0], w.shape[1], x.shape[1], cfg, sms)
    if splits == 1:
        return matmul_triton(x, w)
    partials = torch.empty(splits, x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    return _launch(x, w, partials, splits, cfg).sum(0).to(x.dtype)
