"""The row stage of `gdn_lab.trace.hashing` as one fused Triton kernel per tensor (CUDA/ROCm).

Same bits as the torch ops (tests compare them under TRITON_INTERPRET=1). The torch ops take about
15 launches per tensor; a launch-bound forward with hundreds of hashed tensors pays for each, so on
the GPU one program per block of rows loads the words, mixes each with its column and sums the row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_lab.trace.mixing import M1, M2, G

_G = tl.constexpr(G)
_M1 = tl.constexpr(M1)
_M2 = tl.constexpr(M2)
_MASK30 = tl.constexpr((1 << 34) - 1)
_MASK27 = tl.constexpr((1 << 37) - 1)
_MASK31 = tl.constexpr((1 << 33) - 1)
MAX_TILE = 2048  # BLOCK_R * BLOCK_F: int64 accumulators held per program


@triton.jit
def _mix(z):
    # splitmix64's finalizer; `>>` on int64 is arithmetic, the masks make it logical.
    z = z ^ ((z >> 30) & _MASK30)
    z = z * _M1
    z = z ^ ((z >> 27) & _MASK27)
    z = z * _M2
    return z ^ ((z >> 31) & _MASK31)


@triton.jit
def _row_values_kernel(x_ptr, out_ptr, R, F, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    i_r = tl.program_id(0)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = o_r < R
    o_r64 = o_r.to(tl.int64)
    b_acc = tl.zeros([BLOCK_R, BLOCK_F], dtype=tl.int64)
    for f0 in range(0, F, BLOCK_F):
        o_f = f0 + tl.arange(0, BLOCK_F)
        m_x = m_r[:, None] & (o_f < F)[None, :]
        p_x = x_ptr + o_r64[:, None] * F + o_f[None, :]
        b_w = tl.load(p_x, mask=m_x, other=0).to(tl.int64)
        b_z = _mix(b_w + (o_f.to(tl.int64)[None, :] + 1) * _G)
        b_acc += tl.where(m_x, b_z, 0)
    tl.store(out_ptr + o_r, tl.sum(b_acc, axis=1), mask=m_r)


def row_values_triton(words: torch.Tensor, out: torch.Tensor) -> None:
    """out[r] = sum_j mix(words[r, j] + (j + 1) * G), as `hashing.row_values` (words: integer [R, F], contiguous)."""
    r, f = words.shape
    block_f = min(triton.next_power_of_2(max(f, 1)), 1024)
    block_r = max(1, min(64, MAX_TILE // block_f))
    _row_values_kernel[(triton.cdiv(r, block_r),)](x_ptr=words, out_ptr=out, R=r, F=f, BLOCK_R=block_r, BLOCK_F=block_f)
