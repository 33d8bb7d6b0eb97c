"""Paged decode attention in Triton: fixed 256-token partitions (batch-invariant) and its control.

Two launches, as AITER's paged_attention_ragged:

1. `_decode_partition_kernel`, grid (B, Hkv, partitions): one program reads one partition of one
   request for one KV head, with the GQA query heads of that KV head together (the group padded
   to a power of two, at least 16 rows, for tl.dot). It walks the partition in blocks of BN
   tokens with an online softmax (`paged_kv_triton.online_softmax_block`, as the prefill kernel)
   and writes the partition's max logit m_p (base 2), its exp-sum l_p and its unnormalised output
   o_p to a float32 workspace. Programs whose partition starts at or beyond the request's length
   exit at once.
2. `_decode_reduce_kernel`, grid (B, Hq): one program merges one request's partitions for one
   query head: M = max_p m_p, w_p = exp2(m_p - M), out = sum_p w_p o_p / sum_p w_p l_p, in one
   pass over chunks of BP partitions (a running max rescales the sums between chunks).

Why the result of `decode_attention_triton` cannot depend on the batch: a partition is the
request's absolute positions p*256 .. p*256+255 and its blocks sit at fixed offsets inside it; a
program only reads its own request; the tile configuration is a function of (head_dim, dtypes)
alone; the reduce visits the request's partitions in a fixed order (chunks of BP partitions in
sequence, a fixed-shape tree inside a chunk; positions past the request's last partition add
exact zeros; BP depends on D only); and no kernel receives an integer that depends on the batch and could change its
compilation (the workspace's partition extent is not specialised on).

The control `decode_attention_splitk_by_batch` runs the same two kernels, but each request is cut
into `num_splits` splits of ceil(len / num_splits) tokens, with num_splits chosen from the batch
size, the KV heads and the SM count as FlashAttention-2's split-KV heuristic does: when the batch
grows, the splits (and the order of the sums) move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.ops.paged_kv import PARTITION_SIZE
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

_REDUCE_TILE = 8192  # partitions x head-dim elements the reduce loads at once (64 for D = 128)


@dataclass(frozen=True)
class DecodeConfig:
    """The launch configuration of the partition kernel (a function of head_dim and dtypes only).

    Attributes:
        block_n: tokens per inner block; divides PARTITION_SIZE.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the token loop.
    """

    block_n: int
    num_warps: int
    num_stages: int


# Fixed per (head-dim tile, operand kind) on the GPU. D = 128 and 256 come from the H200 sweep
# (`--sweep` in benchmarks/bench_decode_attention.py; data/bench/h200/bench_decode_attention_sweep.csv):
# the best geometric mean over B = 1, 8, 64, 256. 4 warps beat 8 by 5-10 % in bf16 and by up to
# 40 % with fp8 at D = 128 (the fp8 -> bf16 widening is spread over fewer, longer-lived tiles);
# block_n and stages moved the time by under 3 %. D = 64 has no H200 measurement: it keeps the
# choice made from sm_90 compiles (no spills, 2-5 programs per SM).
# The kinds: "16bit" (bf16/fp16 cache and operands), "fp8" (an e4m3 cache widened to the
# query's 16-bit dtype), "fp32" (float32 operands: IEEE FMA products, which hold whole operand
# tiles in registers: one stage and 8 warps keep them from spilling).
_GPU_CONFIGS = {
    (64, "16bit"): DecodeConfig(128, 4, 3),
    (128, "16bit"): DecodeConfig(128, 4, 3),
    (256, "16bit"): DecodeConfig(64, 8, 3),
    (64, "fp8"): DecodeConfig(64, 4, 3),
    (128, "fp8"): DecodeConfig(128, 4, 3),
    (256, "fp8"): DecodeConfig(64, 4, 4),
    (64, "fp32"): DecodeConfig(32, 8, 1),
    (128, "fp32"): DecodeConfig(32, 8, 1),
    (256, "fp32"): DecodeConfig(32, 8, 1),
}
_INTERPRETER_CONFIG = DecodeConfig(64, 1, 1)


def operand_kind(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
    """ "fp32", "fp8" or "16bit": what the kernel's tl.dot operands are (see `dot_precision`)."""
    if dot_precision(q_dtype, kv_dtype).dtype == tl.float32:
        return "fp32"
    return "fp8" if kv_dtype.itemsize == 1 else "16bit"


def decode_config(head_dim: int, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> DecodeConfig:
    """The partition kernel's fixed configuration for a head dim and the query and cache dtypes."""
    if interpreting():
        return _INTERPRETER_CONFIG
    return _GPU_CONFIGS[(config_head_dim(head_dim), operand_kind(q_dtype, kv_dtype))]


@triton.jit
def _partition_length(seq_len, num_splits, PARTITION: tl.constexpr):
    """Tokens per partition: PARTITION (> 0) or, for the control, ceil(seq_len / num_splits)."""
    if PARTITION > 0:
        return PARTITION
    else:
        return tl.cdiv(seq_len, num_splits)


@triton.jit(do_not_specialize=["num_splits", "max_parts"])
def _decode_partition_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    ws_o_ptr,
    ws_m_ptr,
    ws_l_ptr,
    qk_scale,
    num_splits,
    max_parts,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    HQ: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PARTITION: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
    BN: tl.constexpr,
    FP8: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_kh = tl.program_id(1)
    i_p = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + i_b)
    part_len = _partition_length(seq_len, num_splits, PARTITION)
    start = i_p * part_len
    if start >= seq_len:
        return
    end = tl.minimum(start + part_len, seq_len)
    page_base = tl.load(kv_indptr_ptr + i_b)

    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    o_n = tl.arange(0, BN)
    m_h = o_h < G
    m_d = o_d < D
    heads = i_kh * G + o_h
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_h[:, None] & m_d[None, :], other=0.0).to(DOT_DTYPE)
    # Logits in base 2; an fp8 cache's k_scale folds into the logit scale, v_scale into the output.
    scale = qk_scale
    if FP8:
        scale = scale * tl.load(k_scale_ptr)

    b_m = tl.full([BH], float("-inf"), tl.float32)
    b_l = tl.zeros([BH], tl.float32)
    b_o = tl.zeros([BH, BD], tl.float32)
    for n0 in range(start, end, BN):
        pos = n0 + o_n
        m_n = pos < end
        b_k = load_kv_tile(
            k_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_kp, stride_kt, stride_kh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        b_v = load_kv_tile(
            v_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_vp, stride_vt, stride_vh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        # Every block holds at least one valid token (n0 < end), so the running max stays finite.
        b_m, b_l, b_o = online_softmax_block(
            b_q, b_k, b_v, m_n[None, :], scale, b_m, b_l, b_o, DOT_DTYPE, INPUT_PRECISION
        )
    if FP8:
        b_o = b_o * tl.load(v_scale_ptr)

    # Workspace rows: (request, query head, partition); the offsets' divisibility is D's alone.
    row = (i_b.to(tl.int64) * HQ + heads) * max_parts + i_p
    tl.store(ws_m_ptr + row, b_m, mask=m_h)
    tl.store(ws_l_ptr + row, b_l, mask=m_h)
    tl.store(ws_o_ptr + row[:, None] * D + o_d[None, :], b_o, mask=m_h[:, None] & m_d[None, :])


@triton.jit(do_not_specialize=["num_splits", "max_parts"])
def _decode_reduce_kernel(
    out_ptr,
    seq_lens_ptr,
    ws_o_ptr,
    ws_m_ptr,
    ws_l_ptr,
    num_splits,
    max_parts,
    stride_ob,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
    PARTITION: tl.constexpr,
    BD: tl.constexpr,
    BP: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + i_b)
    n_parts = tl.cdiv(seq_len, _partition_length(seq_len, num_splits, PARTITION))
    base = (i_b.to(tl.int64) * HQ + i_h) * max_parts
    o_p = tl.arange(0, BP)
    o_d = tl.arange(0, BD)
    m_d = o_d < D

    # One pass over chunks p0 = 0, BP, 2*BP, ... in order, rescaling the running sums to the
    # running max (a request with at most BP partitions is one chunk: no rescale at all).
    b_max = float("-inf")
    b_den = 0.0
    b_num = tl.zeros([BD], tl.float32)
    for p0 in range(0, n_parts, BP):
        m_p = p0 + o_p < n_parts
        b_m = tl.load(ws_m_ptr + base + p0 + o_p, mask=m_p, other=float("-inf"))
        b_l = tl.load(ws_l_ptr + base + p0 + o_p, mask=m_p, other=0.0)
        b_o = tl.load(
            ws_o_ptr + (base + p0 + o_p)[:, None] * D + o_d[None, :], mask=m_p[:, None] & m_d[None, :], other=0.0
        )
        b_max_new = tl.maximum(b_max, tl.max(b_m, 0))
        alpha = tl.exp2(b_max - b_max_new)
        b_w = tl.exp2(b_m - b_max_new)
        b_den = b_den * alpha + tl.sum(b_l * b_w, 0)
        b_num = b_num * alpha + tl.sum(b_o * b_w[:, None], 0)
        b_max = b_max_new
    p_out = out_ptr + i_b.to(tl.int64) * stride_ob + i_h * stride_oh + o_d
    tl.store(p_out, (b_num / b_den).to(out_ptr.dtype.element_ty), mask=m_d)


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_parts: int,
    partition: int,
    num_splits: int,
    config: DecodeConfig,
) -> torch.Tensor:
    """Both launches for a grid of `num_parts` partitions per request (fixed size or split count)."""
    B, HQ, D = q.shape
    HKV = k_cache.shape[2]
    G = HQ // HKV
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(B, HQ, D, dtype=q.dtype, device=q.device)
    ws_o = torch.empty(B, HQ, num_parts, D, dtype=torch.float32, device=q.device)
    ws_m = torch.empty(B, HQ, num_parts, dtype=torch.float32, device=q.device)
    ws_l = torch.empty_like(ws_m)
    ks, vs, fp8 = scale_args(k_scale, v_scale, ws_m)
    prec = dot_precision(q.dtype, k_cache.dtype)
    bd = pow2_at_least(D)
    _decode_partition_kernel[(B, HKV, num_parts)](
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, ks, vs, ws_o, ws_m, ws_l,
        qk_scale=scale * LOG2E, num_splits=num_splits, max_parts=num_parts,
        stride_qb=q.stride(0), stride_qh=q.stride(1),
        stride_kp=k_cache.stride(0), stride_kt=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vt=v_cache.stride(1), stride_vh=v_cache.stride(2),
        HQ=HQ, G=G, D=D, PAGE_SIZE=page_size, PARTITION=partition,
        BH=pow2_at_least(G), BD=bd, BN=config.block_n, FP8=fp8,
        DOT_DTYPE=prec.dtype, INPUT_PRECISION=prec.input_precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    _decode_reduce_kernel[(B, HQ)](
        out, seq_lens, ws_o, ws_m, ws_l, num_splits=num_splits, max_parts=num_parts,
        stride_ob=out.stride(0), stride_oh=out.stride(1),
        HQ=HQ, D=D, PARTITION=partition, BD=bd, BP=max(1, _REDUCE_TILE // bd),
        num_warps=1 if interpreting() else 8,
    )  # fmt: skip
    return out


def _max_len(seq_lens: torch.Tensor, max_seq_len: int | None) -> int:
    """The batch's longest context: given, or read from the device (one host synchronisation)."""
    return grid_bound("max_seq_len", max_seq_len, lambda: seq_lens)


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    max_seq_len: int | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Batch-invariant paged decode attention: fixed 256-token partitions, fixed-order merge.

    The partials are kept in float32 (max logit, exp-sum and the unnormalised partial output):
    AITER rounds each partition's normalised output to bf16/fp16 before the merge, which adds one
    rounding per partition (relative 2^-9 in bf16) to every output; float32 partials keep the
    merge within float32 rounding, so the output's only rounding to q's dtype is the last one.
    The cost is workspace traffic of G * D * 4 bytes written and read back per (request, KV head,
    partition): about 3 % of the partition's 128 KB KV read at D = 128, G = 4 with a bf16 cache
    (6 % with fp8), against 1.5 % for bf16 partials.

    Args:
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale:
            the validated arguments of `gdn_lab.ops.decode_attention` (its docstring has the shapes).
        max_seq_len: an upper bound of max(seq_lens), which sizes the grid's partition axis. None
            reads it from the device (one host synchronisation); pass it to capture a CUDA graph
            (extra partitions exit at once; the result does not depend on the bound).
        config: the partition kernel's configuration; None takes `decode_config(D, q dtype, cache dtype)`.
            An override is for tuning (benchmarks): a different block_n changes the bits.

    Returns:
        [B, Hq, D] in q's dtype.
    """
    num_parts = triton.cdiv(_max_len(seq_lens, max_seq_len), PARTITION_SIZE)
    cfg = config or decode_config(q.shape[2], q.dtype, k_cache.dtype)
    return _launch(
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale,
        num_parts=num_parts, partition=PARTITION_SIZE, num_splits=1, config=cfg,
    )  # fmt: skip


def fa2_block_n(head_dim: int) -> int:
    """FlashAttention-2's split-KV key block: 256 tokens for D <= 64, 128 for D <= 128, else 64."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128) -> int:
    """FlashAttention-2's split-KV count (anchors.md §4), restated.

    One split when the batch's (request, head, query block) programs nearly fill the machine
    (>= 80 % of `num_sms` slots). Otherwise, among the split counts 1..min(max_splits, num_sms,
    num_n_blocks) that change the blocks per split, the smallest whose wave efficiency
    (waves / ceil(waves)) is at least 85 % of the best.
    """
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    top = min(max_splits, num_sms, num_n_blocks)
    efficiency = {}
    for s in range(1, top + 1):
        if s > 1 and math.ceil(num_n_blocks / s) == math.ceil(num_n_blocks / (s - 1)):
            continue  # the same blocks per split as s - 1: not a distinct split
        waves = batch_nheads_mblocks * s / num_sms
        efficiency[s] = waves / math.ceil(waves)
    best = max(efficiency.values())
    return min(s for s, e in efficiency.items() if e >= 0.85 * best)


def splits_for_batch(batch: int, num_kv_heads: int, head_dim: int, max_seq_len: int, num_sms: int) -> int:
    """The control's split count: FA2's heuristic as its decode path calls it.

    FA2 folds a GQA decode's query group into the query-block axis (one block), and counts two
    128-thread programs per SM.
    """
    n_blocks = triton.cdiv(max_seq_len, fa2_block_n(head_dim))
    return num_splits_heuristic(batch * num_kv_heads, 2 * num_sms, n_blocks)


def decode_attention_splitk_by_batch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    max_seq_len: int | None = None,
    num_sms: int | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Batch-VARIANT control: split-KV decode whose split count follows the batch (flash-decoding).

    This is a deliberately batch-variant control, not a kernel to use: each request is cut into
    `splits_for_batch(B, Hkv, D, max_len, num_sms)` splits of ceil(len / num_splits) tokens, so a
    request's splits, and the order of its sums, change with the batch size and the batch's
    longest context (and with the GPU's SM count). Same kernels and partials as
    `decode_attention_triton` otherwise.

    Args:
        q, ..., v_scale: the validated arguments of `gdn_lab.ops.decode_attention`.
        max_seq_len: as `decode_attention_triton`; here it also feeds the split heuristic.
        num_sms: the SM count the heuristic sees; None takes `gdn_lab.device.detect(q.device).num_sms`
            (on the CPU, torch's thread count).
        config: as `decode_attention_triton`.

    Returns:
        [B, Hq, D] in q's dtype.
    """
    max_len = _max_len(seq_lens, max_seq_len)
    sms = detect(q.device).num_sms if num_sms is None else num_sms
    splits = splits_for_batch(q.shape[0], k_cache.shape[2], q.shape[2], max_len, sms)
    cfg = config or decode_config(q.shape[2], q.dtype, k_cache.dtype)
    return _launch(
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale,
        num_parts=splits, partition=0, num_splits=splits, config=cfg,
    )  # fmt: skip
