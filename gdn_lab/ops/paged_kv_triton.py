"""What our Triton attention kernels share: reading a paged KV cache, the online softmax, scales, grid bounds.

Imports triton at load; the registrations reach this module only through `routing.lazy`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.ops.triton_common import pow2_at_least
from gdn_lab.ops.triton_support import interpreting

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
    PTX_E4M3: tl.constexpr = False,
):
    """Tokens `pos` ([BN], request-relative) of KV head i_kh as a [BN, BD] tile in DTYPE.

    Token p lives in page kv_indices[page_base + p // PAGE_SIZE], slot p % PAGE_SIZE. Masked
    tokens and columns read as 0 (never the cache's padding, which may be NaN). PTX_E4M3: an
    e4m3 cache converted by `e4m3_to_f16` (DTYPE float16; see `ptx_e4m3`).
    """
    page = tl.load(kv_indices_ptr + page_base + pos // PAGE_SIZE, mask=m_pos, other=0).to(tl.int64)
    slot = pos % PAGE_SIZE
    p_kv = cache_ptr + page[:, None] * stride_p + slot[:, None] * stride_t + i_kh * stride_h + o_d[None, :]
    tile = tl.load(p_kv, mask=m_pos[:, None] & m_d[None, :], other=0.0)
    if PTX_E4M3:
        return e4m3_to_f16(tile)
    return tile.to(DTYPE)


@triton.jit
def e4m3_to_f16(x):
    """An e4m3 tile as float16 by PTX's packed cvt.rn.f16x2.e4m3x2: the same exact conversion as
    `.to(tl.float16)`, but declared impure, so Triton keeps the tile's move into the tl.dot operand
    layout after it, on float16. For the pure conversion Triton moves that layout change onto the
    fp8 tile, and a tile whose reduction dim is its rows (V in P V) is then read from shared
    memory one byte per instruction (LDS.U8: 64 per thread per block at D 256 and 8 warps, and
    the spills that come with them; sm_90 compiles of Triton 3.6 and 3.9). Here it moves as
    float16 through ldmatrix.trans, as a bf16 cache's V does."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


def ptx_e4m3(cache_dtype: torch.dtype, operand_dtype: tl.dtype, device: torch.device) -> bool:
    """Whether a cache's tiles go through `e4m3_to_f16`: a float8_e4m3fn cache whose tl.dot operands
    are float16, compiled (the interpreter runs no PTX) for an NVIDIA GPU of sm_89 or newer (PTX's
    e4m3x2 conversion)."""
    if cache_dtype != torch.float8_e4m3fn or operand_dtype != tl.float16 or interpreting():
        return False
    info = detect(device)  # cached per device; inside `gdn_lab.device.compiling_for`, the GPU compiled for
    return info.platform == "cuda" and int(info.arch.removeprefix("sm_")) >= 89


@triton.jit
def online_softmax_block(
    b_q, b_k, b_v, visible, scale, b_m, b_l, b_o, DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr
):
    """Fold one block of keys and values into a running softmax (base 2) of the query rows b_q.

    Args:
        b_q: [BM, BD] queries; b_k, b_v: [BN, BD] keys and values, all in DOT_DTYPE.
        visible: [BM or 1, BN] which keys each row sees; the others get weight exp2(-inf) = 0.
        scale: the logit scale in base 2 (softmax scale * log2(e), times k_scale for fp8).
        b_m, b_l: [BM] float32 running max logit and exp-sum; b_o: [BM, BD] float32 unnormalised output.

    Returns:
        The updated (b_m, b_l, b_o). A row's new max must be finite (the caller's block holds a
        key it sees, or one did before); a row that sees no key of this block keeps its state
        exactly (rescale exp2(0) = 1, weights 0).
    """
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * scale
    b_s = tl.where(visible, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
    alpha = tl.exp2(b_m - b_m_new)
    b_p = tl.exp2(b_s - b_m_new[:, None])
    b_l = b_l * alpha + tl.sum(b_p, 1)
    b_o = b_o * alpha[:, None] + tl.dot(b_p.to(DOT_DTYPE), b_v, input_precision=INPUT_PRECISION)
    return b_m_new, b_l, b_o


@triton.jit
def block_softmax_state(b_q, b_k, b_v, visible, scale, DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """The softmax state of one block of keys on its own: (max logit m, exp-sum l, unnormalised output o).

    Args:
        b_q: [BM, BD] queries; b_k, b_v: [BN, BD] keys and values, all in DOT_DTYPE.
        visible: [BM or 1, BN] which keys each row sees (at least one per row: m must be finite).
        scale: the logit scale in base 2 (softmax scale * log2(e), times k_scale for fp8).

    Returns:
        m [BM] = max_j s_j, l [BM] = sum_j exp2(s_j - m), o [BM, BD] = sum_j exp2(s_j - m) v_j, float32.
    """
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=INPUT_PRECISION) * scale
    b_s = tl.where(visible, b_s, float("-inf"))
    b_m = tl.max(b_s, 1)
    b_p = tl.exp2(b_s - b_m[:, None])
    b_l = tl.sum(b_p, 1)
    b_o = tl.dot(b_p.to(DOT_DTYPE), b_v, input_precision=INPUT_PRECISION)
    return b_m, b_l, b_o


@triton.jit
def fold_softmax_state(m1, l1, o1, m2, l2, o2):
    """Merge softmax state 2 into state 1 (rows: m, l [R]; o [R, BD], float32): state1 (+) state2.

    The same elementwise arithmetic wherever it runs (a program's accumulator, the reduce's
    tiles): a max, two exp2 and explicit FMAs, so no compiler contraction choice can differ
    between two kernels. Folding into the empty state (m = -inf, l = o = 0) returns the other
    state exactly (weights exp2(-inf) = 0 and exp2(0) = 1), and two empty states fold to the
    empty state (the reference max is 0 then, never -inf - -inf).
    """
    b_m = tl.maximum(m1, m2)
    m_ref = tl.where(b_m == float("-inf"), 0.0, b_m)
    w1 = tl.exp2(m1 - m_ref)
    w2 = tl.exp2(m2 - m_ref)
    b_l = tl.fma(l1, w1, l2 * w2)
    b_o = tl.fma(o1, w1[:, None], o2 * w2[:, None])
    return b_m, b_l, b_o


def config_head_dim(head_dim: int) -> int:
    """The head-dim key of the GPU config tables: the head's tile extent, at least 64 (64, 128 or 256)."""
    return max(64, pow2_at_least(head_dim))


def scale_args(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, dummy: torch.Tensor):
    """(k_scale, v_scale, FP8): the scale tensors, or a dummy pointer the kernel never reads."""
    if k_scale is None:
        return dummy, dummy, False
    return k_scale, v_scale, True


def grid_bound(name: str, value: int | None, lengths: Callable[[], torch.Tensor]) -> int:
    """A grid extent's length bound: `value` when given (checked), else max(lengths()) read from
    the device (one host synchronisation; pass the value to capture a CUDA graph)."""
    if value is None:
        found = lengths()
        return int(found.max().item()) if found.numel() else 1  # an empty batch: no program reads it
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"{name}: expected a positive int (an upper bound of the batch's lengths) or None, got {value!r}"
        )
    return value
