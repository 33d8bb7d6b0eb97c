"""The row hash of `gdn_lab.trace.hashing` as one fused Triton kernel per tensor (CUDA/ROCm).

Same bits as the torch-op definition (tests compare them under TRITON_INTERPRET=1). The torch ops
take about 15 launches per tensor; a launch-bound forward with hundreds of hashed tensors pays for
each, so on the GPU one program per block of rows loads the words, mixes them with their column,
sums each row, mixes the row with its position and writes the contributions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_lab.trace.hashing import M1, M2, G, S

_G = tl.constexpr(G)
_S = tl.constexpr(S)
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
def _hash_rows_kernel(
    x_ptr,
    pos_ptr,
    seg_ptr,
    vals_ptr,
    idx_ptr,
    R,
    F,
    base,
    whole_slot,
    salt,
    LOCAL: tl.constexpr,
    WHOLE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
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
    b_row = tl.sum(b_acc, axis=1)
    if LOCAL:
        b_pos = tl.load(pos_ptr + o_r, mask=m_r, other=0)
        b_seg = tl.load(seg_ptr + o_r, mask=m_r, other=-1)
        tl.store(vals_ptr + o_r, _mix(b_row + salt + (b_pos + 1) * _S), mask=m_r)
        tl.store(idx_ptr + o_r, tl.where(b_seg >= 0, b_seg + base, 0), mask=m_r)
    if WHOLE:
        at = R if LOCAL else 0
        tl.store(vals_ptr + at + o_r, _mix(b_row + salt + (o_r64 + 1) * _S), mask=m_r)
        tl.store(idx_ptr + at + o_r, o_r64 * 0 + whole_slot, mask=m_r)


def contributions_triton(
    words: torch.Tensor,
    salt: int,
    seg: torch.Tensor | None,
    pos: torch.Tensor | None,
    base: int,
    whole_slot: int | None,
    vals: torch.Tensor,
    idx: torch.Tensor,
) -> None:
    """Fill vals/idx as `hashing._contributions_torch` does, in one launch (words: integer [R, F])."""
    r, f = words.shape
    block_f = min(triton.next_power_of_2(max(f, 1)), 1024)
    block_r = max(1, min(64, MAX_TILE // block_f))
    local = seg is not None
    # Unused pointer arguments still need a tensor; vals is never read through them.
    _hash_rows_kernel[(triton.cdiv(r, block_r),)](
        x_ptr=words,
        pos_ptr=pos if local else vals,
        seg_ptr=seg if local else vals,
        vals_ptr=vals,
        idx_ptr=idx,
        R=r,
        F=f,
        base=base,
        whole_slot=whole_slot if whole_slot is not None else 0,
        salt=salt,
        LOCAL=local,
        WHOLE=whole_slot is not None,
        BLOCK_R=block_r,
        BLOCK_F=block_f,
    )
