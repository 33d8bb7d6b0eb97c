"""fused_moe in Triton: batch-invariant routed experts, and a control whose top-k sum follows the batch.

Three launches, as vLLM's and AITER's Triton MoE run them (their kernels are one GEMM each; the
activation and the sum are separate there):

1. `_gate_up_kernel`, one program per (block of one expert's token slots, I tile): gate and up
   = x @ w1[e]^T over H in BLOCK_K steps into two float32 accumulators, each rounded to x's dtype,
   then act = silu(gate) * up, rounded, into a [M * top_k, I] scratch.
2. `_down_kernel`, one program per (block, H tile): act @ w2[e]^T in float32, times the slot's
   routing weight, rounded, into a [M * top_k, H] scratch (y).
3. `_combine_kernel`, one program per (token, H tile): out = the sum of the token's top_k rows of
   y in float32, in the token's own top-k order, rounded once.

A slot is one (token, k) pair, m * top_k + k. The plan (`plan`: torch ops on the device, no host
synchronisation) sorts the slots by expert and cuts each expert's slots into blocks of BLOCK_M
rows; the grid is an upper bound on the number of blocks and the programs past the last exit.

Why a token's bits cannot follow the batch (`moe_triton`): the tiles, num_warps and dot precision
are fixed per dtype (never chosen from M, E or the tokens per expert), K is never split, and a
row of a tile is the same sequence of multiply-adds wherever it sits in the tile (tl.dot on the
GPU; in the interpreter the row-exact dot, `triton_common.dot_acc`). The batch changes which rows
share a block, never what a row computes; the top-k sum runs in the token's own order.

The control (`moe_atomic_by_batch`) runs the same kernels, but when the batch has more tokens than
experts it sums each token's top-k rows as a two-stage MoE's atomic stage 2 does (AITER's CK MoE
picks atomic or reduce kernels by the token count, see shared/reference/aiter_contracts.md §8):
each add into an accumulator of x's dtype, rounded at every add. Atomics fix no order; the control
adds in the reverse of the token's top-k order, the one order sure to differ from the reduce's
(with three terms or more), so it changes a token's bits between a batch of at most E tokens and
one of more, deterministically.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.ops.triton_common import dot_acc, dot_precision, grid_args, round_rne
from gdn_lab.ops.triton_support import interpreting


@dataclass(frozen=True)
class MoEConfig:
    """Tiles and launch options (a function of the dtype only).

    Attributes:
        block_m: token slots per program (one expert's).
        block_n: output columns per program (I in the first launch, H in the second).
        block_k: the reduction step (H, then I).
        block_h: columns per program of the top-k sum.
        num_warps, num_stages: launch options of the two GEMM launches.
    """

    block_m: int
    block_n: int
    block_k: int
    block_h: int
    num_warps: int
    num_stages: int


# BLOCK_M 16: a decode step gives most experts one or two slots, and tl.dot takes 16 rows at least.
_GPU_CONFIGS = {
    torch.bfloat16: MoEConfig(16, 64, 64, 256, 4, 3),
    torch.float16: MoEConfig(16, 64, 64, 256, 4, 3),
    torch.float32: MoEConfig(16, 64, 32, 256, 4, 3),
}
# The interpreter's cost is per program and operation, not per element: output tiles of 256 columns
# (one for the tiny models' I of 160 and H of 64) took 0.34-0.69x the time of 32 on the CPU, at 1, 5
# and 40 tokens, bf16 and fp32, with the same bits (the row-exact dot sums each element over K in
# order, whatever the tile's width); BLOCK_K would change them.
_INTERPRETER_CONFIG = MoEConfig(16, 256, 32, 64, 1, 1)


def moe_config(dtype: torch.dtype) -> MoEConfig:
    """The fixed tiles for a dtype."""
    return _INTERPRETER_CONFIG if interpreting() else _GPU_CONFIGS[dtype]


@dataclass(frozen=True)
class Plan:
    """The token slots sorted by expert, cut into blocks of BLOCK_M rows.

    Attributes:
        order: int32 [M * top_k], the slots (m * top_k + k) by expert, ascending, then by slot.
        block_expert: int32 [blocks], each block's expert.
        block_first: int32 [blocks], the block's first row in `order`.
        block_rows: int32 [blocks], its rows (0: a block past the last, whose program exits).
    """

    order: torch.Tensor
    block_expert: torch.Tensor
    block_first: torch.Tensor
    block_rows: torch.Tensor

    @property
    def blocks(self) -> int:
        return self.block_rows.shape[0]


def expert_counts(sorted_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The slots of each expert [E] (int64) from the ids sorted ascending, with no host sync:
    `torch.bincount` on CUDA reads the largest id on the host, which a CUDA graph cannot capture."""
    bounds = torch.arange(num_experts + 1, dtype=sorted_ids.dtype, device=sorted_ids.device)
    firsts = torch.searchsorted(sorted_ids, bounds)
    return firsts[1:] - firsts[:-1]


def plan(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Plan:
    """The slots of `topk_ids` [M, top_k] by expert, in blocks of `block_m` (torch ops, no host sync).

    The number of blocks is data (each expert's slots round up to whole blocks); the grid takes its
    bound from the shapes alone, ceil(M * top_k / block_m) + min(E, M * top_k).
    """
    flat = topk_ids.reshape(-1)
    slots = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = expert_counts(flat[order], num_experts)
    per_expert = (counts + block_m - 1) // block_m
    ends = torch.cumsum(per_expert, 0)
    bound = triton.cdiv(slots, block_m) + min(num_experts, slots)
    b = torch.arange(bound, device=flat.device)
    expert = torch.searchsorted(ends, b, right=True)  # E for the blocks past the last
    e = expert.clamp(max=num_experts - 1)
    j = b - (ends - per_expert)[e]  # the block's index among its expert's
    first = (torch.cumsum(counts, 0) - counts)[e] + j * block_m
    rows = torch.where(expert < num_experts, (counts[e] - j * block_m).clamp(max=block_m), 0)
    i32 = torch.int32
    return Plan(order.to(i32), e.to(i32), first.to(i32), rows.to(i32))


@triton.jit
def silu_mul(gate, up, IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr):
    """silu(gate) * up in float32, rounded to the IO dtype (gate and up already on its grid)."""
    return round_rne(gate / (1.0 + tl.exp(-gate)) * up, IO_MANT, IO_TINY, IO_MAGIC)


@triton.jit
def _silu_mul_kernel(
    gate_up, act, S, I, BR: tl.constexpr, BN: tl.constexpr,
    IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr,
):  # fmt: skip
    o_r = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m = (o_r < S)[:, None] & (o_n < I)[None, :]
    p_gate = gate_up + o_r[:, None] * (2 * I) + o_n[None, :]
    b_gate = tl.load(p_gate, mask=m, other=0.0).to(tl.float32)
    b_up = tl.load(p_gate + I, mask=m, other=0.0).to(tl.float32)
    b_act = silu_mul(b_gate, b_up, IO_MANT, IO_TINY, IO_MAGIC)
    tl.store(act + o_r[:, None] * I + o_n[None, :], b_act.to(act.dtype.element_ty), mask=m)


@triton.jit
def _block_slots(order, block_expert, block_first, block_rows, BM: tl.constexpr):
    """(rows, expert, slots [BM], m_m [BM]) of this program's block; rows 0: nothing to do."""
    i_b = tl.program_id(0)
    rows = tl.load(block_rows + i_b)
    expert = tl.load(block_expert + i_b).to(tl.int64)
    o_m = tl.arange(0, BM)
    m_m = o_m < rows
    slots = tl.load(order + tl.load(block_first + i_b) + o_m, mask=m_m, other=0).to(tl.int64)
    return rows, expert, slots, m_m


@triton.jit
def _gate_up_kernel(
    x, w1, act, order, block_expert, block_first, block_rows,
    H, I, stride_xm, stride_xh, stride_we, stride_wn, stride_wh,
    TOP_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr, ROW_EXACT_DOT: tl.constexpr,
    IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr,
):  # fmt: skip
    rows, expert, slots, m_m = _block_slots(order, block_expert, block_first, block_rows, BM)
    if rows > 0:
        o_n = tl.program_id(1) * BN + tl.arange(0, BN)
        m_n = o_n < I
        p_x = x + (slots // TOP_K)[:, None] * stride_xm
        p_gate = w1 + expert * stride_we + o_n[None, :].to(tl.int64) * stride_wn
        p_up = p_gate + I * stride_wn
        b_gate = tl.zeros([BM, BN], tl.float32)
        b_up = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, H, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < H
            b_x = tl.load(p_x + o_k[None, :] * stride_xh, mask=m_m[:, None] & m_k[None, :], other=0.0).to(DOT_DTYPE)
            m_w = m_k[:, None] & m_n[None, :]
            b_wg = tl.load(p_gate + o_k[:, None] * stride_wh, mask=m_w, other=0.0).to(DOT_DTYPE)
            b_wu = tl.load(p_up + o_k[:, None] * stride_wh, mask=m_w, other=0.0).to(DOT_DTYPE)
            b_gate = dot_acc(b_gate, b_x, b_wg, INPUT_PRECISION, ROW_EXACT_DOT)
            b_up = dot_acc(b_up, b_x, b_wu, INPUT_PRECISION, ROW_EXACT_DOT)
        b_gate = round_rne(b_gate, IO_MANT, IO_TINY, IO_MAGIC)
        b_up = round_rne(b_up, IO_MANT, IO_TINY, IO_MAGIC)
        b_act = silu_mul(b_gate, b_up, IO_MANT, IO_TINY, IO_MAGIC)
        p_act = act + slots[:, None] * I + o_n[None, :]
        tl.store(p_act, b_act.to(act.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _down_kernel(
    act, w2, y, topk_weights, order, block_expert, block_first, block_rows,
    H, I, stride_we, stride_wh, stride_wi,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DOT_DTYPE: tl.constexpr, INPUT_PRECISION: tl.constexpr, ROW_EXACT_DOT: tl.constexpr,
    IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr,
):  # fmt: skip
    rows, expert, slots, m_m = _block_slots(order, block_expert, block_first, block_rows, BM)
    if rows > 0:
        o_n = tl.program_id(1) * BN + tl.arange(0, BN)
        m_n = o_n < H
        p_act = act + slots[:, None] * I
        p_w = w2 + expert * stride_we + o_n[None, :].to(tl.int64) * stride_wh
        b_y = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, I, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < I
            b_a = tl.load(p_act + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0).to(DOT_DTYPE)
            b_w = tl.load(p_w + o_k[:, None] * stride_wi, mask=m_k[:, None] & m_n[None, :], other=0.0).to(DOT_DTYPE)
            b_y = dot_acc(b_y, b_a, b_w, INPUT_PRECISION, ROW_EXACT_DOT)
        b_weight = tl.load(topk_weights + slots, mask=m_m, other=0.0)
        b_y = round_rne(b_y * b_weight[:, None], IO_MANT, IO_TINY, IO_MAGIC)
        tl.store(y + slots[:, None] * H + o_n[None, :], b_y.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _combine_kernel(
    y, out, H, stride_om, stride_oh,
    TOP_K: tl.constexpr, BH: tl.constexpr, ATOMIC: tl.constexpr,
    IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr,
):  # fmt: skip
    i_m = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BH + tl.arange(0, BH)
    m_h = o_h < H
    b_acc = tl.zeros([BH], tl.float32)
    for i in tl.static_range(TOP_K):
        k = TOP_K - 1 - i if ATOMIC else i  # the control's atomic adds: reversed, rounded at every add
        b_acc += tl.load(y + (i_m * TOP_K + k) * H + o_h, mask=m_h, other=0.0).to(tl.float32)
        if ATOMIC:
            b_acc = round_rne(b_acc, IO_MANT, IO_TINY, IO_MAGIC)
    b_out = round_rne(b_acc, IO_MANT, IO_TINY, IO_MAGIC)
    tl.store(out + i_m * stride_om + o_h * stride_oh, b_out.to(out.dtype.element_ty), mask=m_h)


def _run(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    atomic: bool,
) -> torch.Tensor:
    """The three launches (see the module docstring); `atomic`: the control's top-k sum."""
    tokens, h = x.shape
    num_experts, inter, top_k = w1.shape[0], w2.shape[2], topk_ids.shape[1]
    out = torch.empty(tokens, h, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    cfg = moe_config(x.dtype)
    p = plan(topk_ids, num_experts, cfg.block_m)
    prec = dot_precision(x.dtype, x.dtype)
    common = dict(DOT_DTYPE=prec.dtype, INPUT_PRECISION=prec.input_precision, ROW_EXACT_DOT=interpreting(),
                  **grid_args("IO", x.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    blocks = (p.order, p.block_expert, p.block_first, p.block_rows)
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(p.blocks, triton.cdiv(inter, cfg.block_n))](
        x, w1, act, *blocks, h, inter, x.stride(0), x.stride(1), w1.stride(0), w1.stride(1), w1.stride(2),
        TOP_K=top_k, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, **common,
    )  # fmt: skip
    y = torch.empty(tokens * top_k, h, dtype=x.dtype, device=x.device)
    _down_kernel[(p.blocks, triton.cdiv(h, cfg.block_n))](
        act, w2, y, topk_weights, *blocks, h, inter, w2.stride(0), w2.stride(1), w2.stride(2),
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, **common,
    )  # fmt: skip
    return topk_sum(y, tokens, top_k, atomic, out)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """act = silu(gate) * up of gate_up [S, 2I] (contiguous; gate the first I columns, in their own
    dtype's grid), in float32, rounded to that dtype: the first launch's epilogue, for pipelines
    whose GEMM stores gate and up (`fused_moe.aiter_triton`)."""
    slots, inter = gate_up.shape[0], gate_up.shape[1] // 2
    act = torch.empty(slots, inter, dtype=gate_up.dtype, device=gate_up.device)
    if slots:
        cfg = moe_config(gate_up.dtype)
        _silu_mul_kernel[(triton.cdiv(slots, cfg.block_m), triton.cdiv(inter, cfg.block_n))](
            gate_up, act, slots, inter, BR=cfg.block_m, BN=cfg.block_n, **grid_args("IO", gate_up.dtype),
        )  # fmt: skip
    return act


def topk_sum(
    y: torch.Tensor, tokens: int, top_k: int, atomic: bool = False, out: torch.Tensor | None = None
) -> torch.Tensor:
    """out [tokens, H] = the sum of each token's top_k rows of y [tokens * top_k, H] (contiguous,
    slot m * top_k + k), in float32 in k order, rounded once to y's dtype; `atomic`: the control's
    reversed, rounded adds."""
    h = y.shape[1]
    if out is None:
        out = torch.empty(tokens, h, dtype=y.dtype, device=y.device)
    if tokens:
        cfg = moe_config(y.dtype)
        _combine_kernel[(tokens, triton.cdiv(h, cfg.block_h))](
            y, out, h, out.stride(0), out.stride(1),
            TOP_K=top_k, BH=cfg.block_h, ATOMIC=atomic, **grid_args("IO", y.dtype),
        )  # fmt: skip
    return out


def moe_triton(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Batch-invariant fused MoE: fixed tiles per dtype, no split, each token's top-k sum in its own order.

    Args:
        x, w1, w2, topk_weights, topk_ids: fused_moe's validated arguments (any strides for x, w1, w2).

    Returns:
        [M, H] in x's dtype.
    """
    return _run(x, w1, w2, topk_weights, topk_ids, atomic=False)


def atomic_sum_for_batch(tokens: int, num_experts: int) -> bool:
    """The control's reduction mode: atomic (reversed, rounded adds) when the tokens outnumber the experts."""
    return tokens > num_experts


def moe_atomic_by_batch(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """Batch-variant control: `moe_triton` whose top-k sum becomes atomic-style above E tokens.

    This is a deliberately batch-variant control, not a kernel to use: with more tokens than
    experts (`atomic_sum_for_batch`), each token's top-k rows are added into an accumulator of x's
    dtype, rounded at every add, as a two-stage MoE's atomic stage 2 adds them, in the reverse of
    the token's top-k order; otherwise exactly `moe_triton`. A token alone (M = its own length) and
    in a batch of more than E tokens then sums its experts in two ways.
    """
    atomic = atomic_sum_for_batch(x.shape[0], w1.shape[0])
    return _run(x, w1, w2, topk_weights, topk_ids, atomic=atomic)
