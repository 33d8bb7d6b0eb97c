"""Varlen causal prefill attention over the paged KV cache in Triton, and its batch-variant control.

One program per (request, block of BM new tokens, query head). It walks the request's KV in blocks
of BN tokens from position 0 up to the last position its rows may see, with an online softmax in
float32 (`paged_kv_triton.online_softmax_block`, as the decode kernel), and writes its rows.
Nothing in it depends on the other requests: block boundaries are request-relative, the tiles are
fixed per (head_dim, dtypes), and a KV block that lies wholly past a row's causal limit leaves
that row's running max, sum and output exactly unchanged (its weights are exp2(-inf) = 0 and its
rescale factor exp2(0) = 1), so sharing a tile with other rows of the same request does not
change a row either.

The control `prefill_attention_tiles_by_batch` picks its KV block from the batch, as CK's
batch-prefill dispatcher picks a small tile when the batch under-fills the GPU (aiter_contracts.md
§2.3): another KV block (BN // 2, or 2 * BN from 16) when B * Hq * ceil(max_q / 128) < 0.8 * num_SMs. A different
KV block moves the online-softmax rescaling points, so the float32 order changes with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.ops.paged_kv_triton import (
    LOG2E,
    config_head_dim,
    grid_bound,
    load_kv_tile,
    online_softmax_block,
    scale_args,
)
from gdn_lab.ops.triton_common import dot_precision, pow2_at_least
from gdn_lab.ops.triton_support import interpreting
from gdn_lab.rules import ck_batch_prefill


@dataclass(frozen=True)
class PrefillConfig:
    """Tiles of the prefill kernel (a function of head_dim and dtypes only).

    Attributes:
        block_m: new tokens per program.
        block_n: KV tokens per inner block.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the KV loop.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Per (head-dim tile, float32 operands) on the GPU, checked spill-free in sm_90 compiles; float32
# (IEEE FMA) products hold whole operand tiles in registers, hence the small tiles and one stage.
_GPU_CONFIGS = {
    (64, False): PrefillConfig(64, 64, 4, 2),
    (128, False): PrefillConfig(64, 64, 4, 2),
    (256, False): PrefillConfig(64, 32, 8, 2),
    (64, True): PrefillConfig(32, 32, 8, 1),
    (128, True): PrefillConfig(16, 16, 4, 1),
    (256, True): PrefillConfig(16, 16, 4, 1),
}
_INTERPRETER_CONFIG = PrefillConfig(32, 64, 1, 1)


def prefill_config(head_dim: int, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> PrefillConfig:
    """The prefill kernel's fixed tiles for a head dim and the query and cache dtypes."""
    if interpreting():
        return _INTERPRETER_CONFIG
    fp32 = dot_precision(q_dtype, kv_dtype).dtype == tl.float32
    return _GPU_CONFIGS[(config_head_dim(head_dim), fp32)]


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    G: tl.constexpr,
    D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    FP8: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_m = tl.program_id(1)
    i_h = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + i_b)
    q_len = tl.load(qo_indptr_ptr + i_b + 1) - q_start
    if i_m * BM >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + i_b)
    page_base = tl.load(kv_indptr_ptr + i_b)
    i_kh = i_h // G

    o_m = i_m * BM + tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    o_n = tl.arange(0, BN)
    m_m = o_m < q_len
    m_d = o_d < D
    # The new tokens are the last q_len of the request's seq_len cached tokens.
    pos_q = seq_len - q_len + o_m
    # Causal: the block's last row sees up to its own position; the rows before it see less.
    kv_end = seq_len - q_len + tl.minimum((i_m + 1) * BM, q_len) if CAUSAL else seq_len

    rows = (q_start + o_m).to(tl.int64)
    b_q = tl.load(
        q_ptr + rows[:, None] * stride_qt + i_h * stride_qh + o_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.0
    ).to(DOT_DTYPE)
    scale = qk_scale
    if FP8:
        scale = scale * tl.load(k_scale_ptr)

    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_o = tl.zeros([BM, BD], tl.float32)
    for n0 in range(0, kv_end, BN):
        pos = n0 + o_n
        m_n = pos < kv_end
        b_k = load_kv_tile(
            k_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_kp, stride_kt, stride_kh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        b_v = load_kv_tile(
            v_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_vp, stride_vt, stride_vh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        visible = m_n[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= pos_q[:, None])
        # Key 0 is in the first block and visible to every row, so the running max is finite from there on.
        b_m, b_l, b_o = online_softmax_block(b_q, b_k, b_v, visible, scale, b_m, b_l, b_o, DOT_DTYPE, INPUT_PRECISION)
    if FP8:
        b_o = b_o * tl.load(v_scale_ptr)
    b_o = b_o / b_l[:, None]
    p_out = out_ptr + rows[:, None] * stride_ot + i_h * stride_oh + o_d[None, :]
    tl.store(p_out, b_o.to(out_ptr.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])


def _max_q_len(qo_indptr: torch.Tensor, max_q_len: int | None) -> int:
    """The batch's most new tokens: given, or read from the device (one host synchronisation)."""
    return grid_bound("max_q_len", max_q_len, lambda: qo_indptr[1:] - qo_indptr[:-1])


def _launch(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale, k_scale, v_scale,
    max_q_len: int, config: PrefillConfig,
) -> torch.Tensor:  # fmt: skip
    T, HQ, D = q.shape
    G = HQ // k_cache.shape[2]
    B = seq_lens.shape[0]
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(T, HQ, D, dtype=q.dtype, device=q.device)
    ks, vs, fp8 = scale_args(k_scale, v_scale, seq_lens)
    prec = dot_precision(q.dtype, k_cache.dtype)
    _prefill_kernel[(B, triton.cdiv(max_q_len, config.block_m), HQ)](
        q, k_cache, v_cache, out, qo_indptr, kv_indptr, kv_indices, seq_lens, ks, vs,
        qk_scale=scale * LOG2E,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_kp=k_cache.stride(0), stride_kt=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vt=v_cache.stride(1), stride_vh=v_cache.stride(2),
        G=G, D=D, PAGE_SIZE=page_size, CAUSAL=causal, BM=config.block_m, BN=config.block_n,
        BD=pow2_at_least(D), FP8=fp8, DOT_DTYPE=prec.dtype, INPUT_PRECISION=prec.input_precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    causal: bool,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    max_q_len: int | None = None,
) -> torch.Tensor:
    """Batch-invariant varlen prefill attention over the paged cache (fixed tiles, KV from position 0).

    Args:
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale,
            k_scale, v_scale: the validated arguments of `gdn_lab.ops.prefill_attention`.
        max_q_len: an upper bound of the most new tokens of a request, which sizes the grid. None
            reads it from the device (one host synchronisation); pass it to capture a CUDA graph.

    Returns:
        [T, Hq, D] in q's dtype.
    """
    return _launch(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale, k_scale, v_scale,
        max_q_len=_max_q_len(qo_indptr, max_q_len), config=prefill_config(q.shape[2], q.dtype, k_cache.dtype),
    )  # fmt: skip


def ck_small_tile(batch: int, num_q_heads: int, max_q_len: int, num_sms: int) -> bool:
    """CK batch prefill's occupancy rule: the small tile iff B * Hq * ceil(max_q / 128) < 0.8 * CUs.

    The constants are `gdn_lab.rules.ck_batch_prefill`'s; the comparison is in float64 (the rule,
    like CK's C++, compares in float32).
    """
    ck = ck_batch_prefill.CONSTANTS
    return ck_batch_prefill.num_blocks(batch, num_q_heads, max_q_len, ck.block_rows) < ck.min_cu_util_rate * num_sms


def prefill_attention_tiles_by_batch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    causal: bool,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    max_q_len: int | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-VARIANT control: prefill whose KV tile follows the batch, as CK's batch prefill does.

    This is a deliberately batch-variant control, not a kernel to use. When the batch under-fills
    the GPU (`ck_small_tile`: B * Hq * ceil(max_q / 128) < 0.8 * num_sms) the KV block halves (or
    doubles, from 16), which
    changes the online softmax's rescaling points and so a request's bits. CK applies its rule to
    head_dim 128 bf16/fp16 only; the control applies it to every call, so it can prove sensitivity.

    Args:
        q, ..., v_scale: the validated arguments of `gdn_lab.ops.prefill_attention`.
        max_q_len: as `prefill_attention_triton`; here it also feeds the tile rule.
        num_sms: the SM/CU count the rule sees; None takes `gdn_lab.device.detect(q.device).num_sms`.

    Returns:
        [T, Hq, D] in q's dtype.
    """
    mq = _max_q_len(qo_indptr, max_q_len)
    sms = detect(q.device).num_sms if num_sms is None else num_sms
    cfg = prefill_config(q.shape[2], q.dtype, k_cache.dtype)
    if ck_small_tile(seq_lens.shape[0], q.shape[1], mq, sms):
        # Another KV block; tl.dot needs at least 16, so the smallest block doubles instead.
        cfg = replace(cfg, block_n=cfg.block_n // 2 if cfg.block_n >= 32 else 2 * cfg.block_n)
    return _launch(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale, k_scale, v_scale,
        max_q_len=mq, config=cfg,
    )  # fmt: skip
