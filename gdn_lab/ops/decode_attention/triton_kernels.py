"""Paged decode attention in Triton: a fixed per-request block/node structure (batch-invariant) and its control.

The numbers a request gets are fixed by the request alone (and the per-(head dim, dtype) config):

1. Block j holds the request's tokens j*BN .. j*BN+BN-1. Its softmax state is computed on its own
   (`paged_kv_triton.block_softmax_state`): m_j = max logit (base 2), l_j = sum exp2(s - m_j),
   o_j = sum exp2(s - m_j) v (float32, the GQA query heads of one KV head together).
2. Node n is blocks n*R .. n*R+R-1 (R = `node_blocks`; 512 or 1024 tokens on the GPU): its
   state is the left fold of its blocks' states, in order (`paged_kv_triton.fold_softmax_state`).
3. The request's output merges its nodes in a fixed order (`_decode_reduce_kernel`: chunks of BP
   nodes in sequence, a fixed-shape tree inside a chunk; positions past the last node add exact
   zeros; BP depends on D only; a request of at most two nodes takes a 2-row tile with the same
   bits, and a fine plan's 3 to 8 nodes fold on a smaller tile before the BP-row merge) and
   divides by the merged exp-sum.

Who computes what is free, because it never changes an operation: a `DecodePlan` cuts the work
into programs. `unit` is what a program stores to the float32 workspace (a block's state, or a
node's), `span` how many consecutive units one program walks. A coarse plan (nodes, several per
program when the batch is large) folds blocks into nodes in registers and writes one row per
node; a fine plan (a program per few blocks, for small batches that would leave the GPU
idle) writes every block's state, and the reduce folds them into nodes with the same
`fold_softmax_state`, in the same order, then merges the nodes with the same code. Folding into
the empty state is exact, so a block stored alone and a block folded first into a fresh
accumulator are the same bits. `decode_plan` picks the plan from the batch (its size, KV heads,
the grid bound and the SM count); tests force every plan on the same inputs and require equal bits.

Two launches, as AITER's paged_attention_ragged:

- `_decode_partition_kernel`, grid (B, Hkv, ceil(max_len / span)): one program walks its span of
  one request for one KV head, block by block; programs whose span starts at or beyond the
  request's length exit at once.
- `_decode_reduce_kernel`, grid (B, Hq, D / 64): one program folds one request's stored units into
  nodes (fine plans), merges the nodes, and writes its 64 columns of the output row (each column's
  sums are its own; the tile shape is fixed per D).

An fp8 (e4m3) cache runs both dots in float16 on the GPU: e4m3 -> fp16 is one packed conversion
per two values (e4m3 -> bf16 costs a further conversion per value, which bounded the fp8 kernel
by arithmetic), q converts to fp16 exactly for |q| in [2^-14, 65504] (larger values overflow;
smaller ones keep fp16's subnormal precision), and P in [0, 1] keeps 3 more bits than in bf16.
V converts through `paged_kv_triton.e4m3_to_f16` on sm_89+ (its docstring says why).

The control `decode_attention_splitk_by_batch` runs the same two kernels, but each request is cut
into `num_splits` splits of ceil(len / num_splits) tokens (one unit and one program each), with
num_splits chosen from the batch size, the KV heads and the SM count as FlashAttention-2's split-KV
heuristic does: when the batch grows, the splits (and the order of the sums) move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gdn_lab.device import detect
from gdn_lab.ops.paged_kv_triton import (
    LOG2E,
    block_softmax_state,
    config_head_dim,
    fold_softmax_state,
    grid_bound,
    load_kv_tile,
    ptx_e4m3,
    scale_args,
)
from gdn_lab.ops.triton_common import DotPrecision, dot_precision, pow2_at_least
from gdn_lab.ops.triton_support import interpreting

_REDUCE_TILE = 4096  # nodes x head-dim elements: BP, the nodes merged at once (16 for D = 256), is this over D
# The reduce's programs each own this many of D's columns (the softmax statistics, the same in
# every program, are recomputed by each): with whole [BP, D] tiles a fine plan's unrolled fold of
# D = 256's 16 blocks held [16, 256] per load; in 64-column programs the calls took 0.94x (D 128)
# and 0.96x (D 256) the time on the H200 (data/bench/h200/bench_decode_attention.csv of a29a1ca)
_REDUCE_COLUMNS = 64
# A fine plan's request of 3 to this many nodes folds them on a tile of 4 or of this many rows
# (`_merge_folded`), the same bits: 0.93-0.98x the time with 3-8 nodes on an H100 (data/bench/h100/README.md)
_FOLD_ROWS = 8


@dataclass(frozen=True)
class DecodeConfig:
    """The partition kernel's configuration and the request structure (a function of head_dim and dtypes only).

    Attributes:
        block_n: tokens per block, the finest unit of a request's structure.
        node_blocks: blocks per node (the unit a coarse plan stores); changes the bits.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the token loop.
        max_registers: a register cap per thread (ptxas .maxnreg) that lets more programs share an
            SM, or None (the compiler's choice).
        coarse_fill: nodes per SM from which `decode_plan` picks a coarse plan (bit-neutral). A
            fine plan writes G * D * 4 bytes of workspace per block and the reduce folds a node's
            blocks in sequence: with D = 256 (G = 8) that outweighs a coarse plan's idle SMs
            sooner than with D = 128.
    """

    block_n: int
    node_blocks: int
    num_warps: int
    num_stages: int
    max_registers: int | None = None
    coarse_fill: float = 0.5

    @property
    def node_tokens(self) -> int:
        return self.block_n * self.node_blocks


@dataclass(frozen=True)
class DecodePlan:
    """How one call's work is cut into programs; it never changes a result bit.

    Attributes:
        unit_blocks: blocks per stored workspace row: 1 (fine: every block's state) or the
            config's node_blocks (coarse: node states folded in registers).
        span_blocks: blocks one program walks, a positive multiple of unit_blocks.
    """

    unit_blocks: int
    span_blocks: int


# Fixed per (head-dim tile, operand kind) on the GPU; `--sweep` in benchmarks/bench_decode_attention.py
# measures the alternatives. Chosen from sm_90 compiles (Triton 3.6: registers, spills, shared
# memory, buffers) and H200 timings against the control (B 1..256 x ctx 1k..16k):
# - D = 128: 128-token blocks in 512-token nodes, 4 warps, no register cap; 3 stages (16-bit),
#   5 (fp8). A fine plan's reduce then folds 4 blocks per node in sequence instead of 16, which is
#   what a one-request decode waits for. With the unrolled reduce and these plans, against the
#   code before (64-token blocks in 1024-token nodes; data/bench/h200/bench_decode_attention.csv
#   of a5317a3 and of 4a9067d), the calls took 0.85x (16-bit) and 0.80x (fp8) the time
#   (geometric means over 30 cases each);
# - 16-bit D = 256: 64-token blocks, 8 warps, one buffer, 128 registers (one spilled reload per
#   block): 2 programs per SM, 64 KB each in flight (169 uncapped registers allow only one).
#   512- and 256-token nodes made small batches faster and large ones slower than the control
#   (an H200 probe of 2026-12-02 at B 1..256, ctx 1k..16k). So did a level of 256-token
#   subnodes inside the 1024-token nodes (commit 20c6a81, reverted): plans storing a subnode per
#   row took B = 8, ctx 4k from 0.81-0.84 to 0.88-0.92 of the control, but the coarse plans,
#   with a second accumulator under the 128-register cap (its spills not counted), were 4-17 %
#   slower (fp8 the most), and 31 of 60 D = 256 cases met the control target instead of 43
#   (H200, both in one run);
# - fp8 D = 256: 8 warps capped at 128 registers and two buffers. With V through
#   `e4m3_to_f16` it compiles to 122 registers and no spills (128 and 40 bytes of spills before);
#   uncapped it took 1.09-1.23x the time, at 3 or 4 stages 0.93-1.03x (H200,
#   data/bench/h200/probe_decode_e4m3_v_a035390.csv);
# - fp32 operands: IEEE FMA products hold whole operand tiles in registers: one stage, 8 warps.
# The workspace costs G * D * 4 bytes written and read back per node of a KV head: 3 % of the KV
# read for bf16 at D = 128 (G = 4, 512-token nodes), under 2 % at D = 256 (G = 8, 1024 tokens).
_GPU_CONFIGS = {
    (64, "16bit"): DecodeConfig(64, 16, 4, 5, 128),
    (128, "16bit"): DecodeConfig(128, 4, 4, 3, coarse_fill=1.0),
    (256, "16bit"): DecodeConfig(64, 16, 8, 3, 128),
    (64, "fp8"): DecodeConfig(64, 16, 4, 5),
    (128, "fp8"): DecodeConfig(128, 4, 4, 5, coarse_fill=1.0),
    (256, "fp8"): DecodeConfig(64, 16, 8, 5, 128),
    (64, "fp32"): DecodeConfig(32, 32, 8, 1),
    (128, "fp32"): DecodeConfig(32, 32, 8, 1),
    (256, "fp32"): DecodeConfig(32, 32, 8, 1),
}
# AMD: Triton's HIP backend keeps the pipeline's stages in LDS, of which CDNA3 has 64 KB a
# workgroup: the most stages that fit there on gfx942 (its compiles in Triton 3.6 and 3.9 by
# gdn_lab.ops.offline_compile): 16-bit caches 2 (64 KB; 3 took 65,792-66,048 B in 3.6), fp8 3
# (32-33 KB; 4 took 65,536-66,048 B). CDNA4's 160 KB (gfx950) holds the NVIDIA stage counts.
_LDS_STAGES = {("gfx942", "16bit"): 2, ("gfx942", "fp8"): 3}
# Small nodes under the interpreter, so tiny tests cross node edges (256 tokens).
_INTERPRETER_CONFIG = DecodeConfig(64, 4, 1, 1)

# Plan policy (bit-neutral): coarse once the batch has at least the config's coarse_fill nodes
# per SM; a coarse plan's programs then walk the nodes per PROGRAMS_PER_SM-per-SM slot, rounded to
# the nearest (rounding down cost up to 10 % at 1.5-2 and 3.5-4 nodes a slot with fp8 on an H100:
# data/bench/h100/probe_decode_coarse_rule_dde0bec.log), a fine plan's as few blocks as keep at
# most PROGRAMS_PER_SM. Spans divide the request's nodes (coarse) or a node's blocks (fine): a
# shorter last span leaves its SM idle.
PROGRAMS_PER_SM = 2


def operand_kind(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
    """ "fp32", "fp8" or "16bit": what the kernel's tl.dot operands are (see `decode_dot_precision`)."""
    if dot_precision(q_dtype, kv_dtype).dtype == tl.float32:
        return "fp32"
    return "fp8" if kv_dtype.itemsize == 1 else "16bit"


def decode_dot_precision(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> DotPrecision:
    """The dots' operand precision: `dot_precision`, except fp16 operands for an fp8 cache on a GPU."""
    prec = dot_precision(q_dtype, kv_dtype)
    if kv_dtype.itemsize == 1 and prec.dtype != tl.float32:
        return DotPrecision(tl.float16, None)
    return prec


def decode_config(head_dim: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, arch: str | None = None) -> DecodeConfig:
    """The partition kernel's fixed configuration for a head dim, the query and cache dtypes and
    the GPU's arch (None: the default device's). On AMD GPUs the NVIDIA config without its register
    cap (Triton's HIP backend rejects `maxnreg`) and with at most `_LDS_STAGES` stages; the bits
    are the same (neither changes an operation)."""
    if interpreting():
        return _INTERPRETER_CONFIG
    return table_config(head_dim, operand_kind(q_dtype, kv_dtype), detect().arch if arch is None else arch)


def table_config(head_dim: int, kind: str, arch: str) -> DecodeConfig:
    """The GPU's config for a head dim, an `operand_kind` and an arch (`decode_config` off the
    interpreter; also for replaying a GPU run's plans on any machine)."""
    config = _GPU_CONFIGS[(config_head_dim(head_dim), kind)]
    if arch.startswith("gfx"):
        stages = min(config.num_stages, _LDS_STAGES.get((arch, kind), config.num_stages))
        config = replace(config, num_stages=stages, max_registers=None)
    return config


def decode_plan(batch: int, num_kv_heads: int, max_len: int, num_sms: int, config: DecodeConfig) -> DecodePlan:
    """The plan for a batch (its size, KV heads, the grid bound, the SM count): bit-neutral.

    Coarse (a node per stored row) when the batch holds at least `config.coarse_fill` nodes per
    SM, with the most nodes per program (a divisor of the request's nodes) up to the nodes per
    PROGRAMS_PER_SM-per-SM slot rounded to the nearest; else fine (every block stored), with the
    fewest blocks per program (a divisor of a node's blocks) that keep at most PROGRAMS_PER_SM.
    """
    pairs = batch * num_kv_heads
    n_blocks = triton.cdiv(max_len, config.block_n)
    n_nodes = triton.cdiv(n_blocks, config.node_blocks)
    slots = PROGRAMS_PER_SM * num_sms
    if pairs * n_nodes >= config.coarse_fill * num_sms:
        most = max(1, (2 * pairs * n_nodes + slots) // (2 * slots))
        return DecodePlan(config.node_blocks, _divisor_from(n_nodes, min(most, n_nodes), -1) * config.node_blocks)
    least = max(1, -(-pairs * n_blocks // slots))
    return DecodePlan(1, _divisor_from(config.node_blocks, min(least, config.node_blocks), 1))


def _divisor_from(n: int, start: int, step: int) -> int:
    """The first divisor of n from `start` (in [1, n]) in direction `step`; 1 and n end either walk.
    It runs on every call: the walk usually stops at once (powers of two), not after n steps."""
    d = start
    while n % d:
        d += step
    return d


def _check_plan(plan: DecodePlan, config: DecodeConfig) -> None:
    if plan.unit_blocks not in (1, config.node_blocks):
        raise ValueError(f"plan.unit_blocks: {plan.unit_blocks} is not 1 or node_blocks (={config.node_blocks})")
    if plan.span_blocks <= 0 or plan.span_blocks % plan.unit_blocks:
        raise ValueError(
            f"plan.span_blocks: {plan.span_blocks} is not a positive multiple of unit_blocks (={plan.unit_blocks})"
        )


@triton.jit(do_not_specialize=["unit", "span", "num_splits", "max_units"])
def _decode_partition_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    ws_o_ptr,
    ws_m_ptr,
    ws_l_ptr,
    qk_scale,
    unit,
    span,
    num_splits,
    max_units,
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
    SPLIT_BY_COUNT: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
    BN: tl.constexpr,
    FP8: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    PTX_E4M3_V: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_kh = tl.program_id(1)
    i_p = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + i_b)
    if SPLIT_BY_COUNT:  # the control: one unit of ceil(len / num_splits) tokens per program
        unit = tl.cdiv(seq_len, num_splits)
        span = unit
    start = i_p * span
    if start >= seq_len:
        return
    end = tl.minimum(start + span, seq_len)
    page_base = tl.load(kv_indptr_ptr + i_b)

    o_h = tl.arange(0, BH)
    o_d = tl.arange(0, BD)
    o_n = tl.arange(0, BN)
    m_h = o_h < G
    m_d = o_d < D
    heads = i_kh * G + o_h
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_h[:, None] & m_d[None, :], other=0.0).to(DOT_DTYPE)
    # Logits in base 2; an fp8 cache's k_scale folds into the logit scale (v_scale: in the reduce).
    scale = qk_scale
    if FP8:
        scale = scale * tl.load(k_scale_ptr)
    # Workspace rows: (request, query head, unit); the offsets' divisibility is D's alone.
    rows = (i_b.to(tl.int64) * HQ + heads) * max_units

    acc_m = tl.full([BH], float("-inf"), tl.float32)
    acc_l = tl.zeros([BH], tl.float32)
    acc_o = tl.zeros([BH, BD], tl.float32)
    for n0 in range(start, end, BN):
        pos = n0 + o_n
        m_n = pos < end
        b_k = load_kv_tile(
            k_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_kp, stride_kt, stride_kh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        b_v = load_kv_tile(
            v_ptr, kv_indices_ptr, page_base, pos, m_n, i_kh, stride_vp, stride_vt, stride_vh, o_d, m_d,
            PAGE_SIZE, DOT_DTYPE, PTX_E4M3_V,
        )  # fmt: skip
        # Every block holds at least one valid token (n0 < end), so its max logit is finite.
        b_m, b_l, b_o = block_softmax_state(b_q, b_k, b_v, m_n[None, :], scale, DOT_DTYPE, INPUT_PRECISION)
        acc_m, acc_l, acc_o = fold_softmax_state(acc_m, acc_l, acc_o, b_m, b_l, b_o)
        n1 = n0 + BN
        if (n1 % unit == 0) | (n1 >= end):  # the unit ends here: store it, start the next empty
            row = rows + n0 // unit
            tl.store(ws_m_ptr + row, acc_m, mask=m_h)
            tl.store(ws_l_ptr + row, acc_l, mask=m_h)
            tl.store(ws_o_ptr + row[:, None] * D + o_d[None, :], acc_o, mask=m_h[:, None] & m_d[None, :])
            acc_m = tl.full([BH], float("-inf"), tl.float32)
            acc_l = tl.zeros([BH], tl.float32)
            acc_o = tl.zeros([BH, BD], tl.float32)


@triton.jit
def _node_states(
    ws_o_ptr, ws_m_ptr, ws_l_ptr, o_base, ml_base, p0, limit, o_d, m_d,
    D: tl.constexpr, BD: tl.constexpr, STEPS: tl.constexpr, O_STEP: tl.constexpr, ML_STEP: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    """The states (m, l [ROWS], o [ROWS, BD]) of nodes p0 .. p0 + ROWS - 1, each folded from its STEPS
    stored states in order, as a program would have folded them: node n's step r reads o at row
    o_base + n * O_STEP + r and m, l at ml_base + n * ML_STEP + r, which exists while that index
    is below `limit` (past it: the empty state, so a node past the last is exact zeros)."""
    nodes = p0 + tl.arange(0, ROWS)
    c_m = tl.full([ROWS], float("-inf"), tl.float32)
    c_l = tl.zeros([ROWS], tl.float32)
    c_o = tl.zeros([ROWS, BD], tl.float32)
    # Unrolled (STEPS is a constant), so the compiler issues the blocks' loads ahead of their
    # folds: a runtime loop waited for each load in turn, and at one request 16 such waits
    # were most of the call. The two compiled variants (GROUP 1 and node_blocks) must merge
    # nodes with the same arithmetic; one kernel with a runtime group guaranteed it, so the
    # plan tests and the benchmark's `plans` and invariance rows check it on each GPU (a
    # masked unroll in one kernel, tried in an H200 probe, slowed coarse plans at large batches).
    for r in tl.static_range(STEPS):
        u = nodes * O_STEP + r
        i_ml = nodes * ML_STEP + r
        m_u = i_ml < limit
        e_m = tl.load(ws_m_ptr + ml_base + i_ml, mask=m_u, other=float("-inf"))
        e_l = tl.load(ws_l_ptr + ml_base + i_ml, mask=m_u, other=0.0)
        e_o = tl.load(ws_o_ptr + (o_base + u)[:, None] * D + o_d[None, :], mask=m_u[:, None] & m_d[None, :], other=0.0)
        c_m, c_l, c_o = fold_softmax_state(c_m, c_l, c_o, e_m, e_l, e_o)
    return c_m, c_l, c_o


@triton.jit
def _merge_nodes(
    ws_o_ptr, ws_m_ptr, ws_l_ptr, o_base, ml_base, p0, limit, o_d, m_d, b_max, b_den, b_num,
    D: tl.constexpr, BD: tl.constexpr, STEPS: tl.constexpr, O_STEP: tl.constexpr, ML_STEP: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    """Merge the states of nodes p0 .. p0 + ROWS - 1 (`_node_states`) into the running (max, sums)."""
    c_m, c_l, c_o = _node_states(
        ws_o_ptr, ws_m_ptr, ws_l_ptr, o_base, ml_base, p0, limit, o_d, m_d, D, BD, STEPS, O_STEP, ML_STEP, ROWS
    )
    b_max_new = tl.maximum(b_max, tl.max(c_m, 0))
    alpha = tl.exp2(b_max - b_max_new)
    b_w = tl.exp2(c_m - b_max_new)
    b_den = b_den * alpha + tl.sum(c_l * b_w, 0)
    b_num = b_num * alpha + tl.sum(c_o * b_w[:, None], 0)
    return b_max_new, b_den, b_num


@triton.jit
def _merge_folded(
    ws_o_ptr, ws_m_ptr, ws_l_ptr, nodes_m_ptr, nodes_l_ptr, base, n_base, n_units, n_nodes, o_d, m_d, b_max, b_den,
    b_num, D: tl.constexpr, BD: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, BP: tl.constexpr,
):  # fmt: skip
    """Merge a request's n_nodes <= ROWS nodes as the BP-row tile merges them, folding them on ROWS rows.

    The folds run on the small tile (on the BP-row tile, its other rows were masked work in each of
    the GROUP steps). Each node's state goes to memory: o over its first unit's row of ws_o (this
    program's own columns, which no other program reads), m and l to this program's rows of
    nodes_m/nodes_l (every column program computes them and reads ws_m/ws_l, so those stay
    untouched). The BP-row tile then reads the states back as one step of `_merge_nodes`, and
    folding a state into the empty one returns it exactly: the sums over the rows keep the BP-row
    tile's reduction order, so the bits are those of the BP-row tile folding the blocks itself (a
    4- or 8-row tile's own sums changed bits).
    """
    s_m, s_l, s_o = _node_states(
        ws_o_ptr, ws_m_ptr, ws_l_ptr, base, base, 0, n_units, o_d, m_d, D, BD, GROUP, GROUP, GROUP, ROWS
    )
    nodes = tl.arange(0, ROWS)
    m_n = nodes < n_nodes
    tl.store(ws_o_ptr + (base + nodes * GROUP)[:, None] * D + o_d[None, :], s_o, mask=m_n[:, None] & m_d[None, :])
    tl.store(nodes_m_ptr + n_base + nodes, s_m, mask=m_n)
    tl.store(nodes_l_ptr + n_base + nodes, s_l, mask=m_n)
    tl.debug_barrier()  # the program's stores visible to all its threads before the BP-row tile reads them
    return _merge_nodes(
        ws_o_ptr, nodes_m_ptr, nodes_l_ptr, base, n_base, 0, n_nodes, o_d, m_d, b_max, b_den, b_num,
        D, BD, 1, GROUP, 1, BP,
    )  # fmt: skip


@triton.jit(do_not_specialize=["unit", "num_splits", "max_units"])
def _decode_reduce_kernel(
    out_ptr,
    seq_lens_ptr,
    v_scale_ptr,
    ws_o_ptr,
    ws_m_ptr,
    ws_l_ptr,
    nodes_m_ptr,
    nodes_l_ptr,
    unit,
    num_splits,
    max_units,
    stride_ob,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
    SPLIT_BY_COUNT: tl.constexpr,
    GROUP: tl.constexpr,
    FP8: tl.constexpr,
    BD: tl.constexpr,
    BP: tl.constexpr,
    FOLD_ROWS: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    i_d = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + i_b)
    if SPLIT_BY_COUNT:
        unit = tl.cdiv(seq_len, num_splits)
    n_units = tl.cdiv(seq_len, unit)
    # A fine plan stored blocks (GROUP = node_blocks, else 1): fold each node's blocks first, in
    # order, as a program would have folded them.
    n_nodes = tl.cdiv(n_units, GROUP)
    base = (i_b.to(tl.int64) * HQ + i_h) * max_units
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D

    # One pass over chunks of BP nodes in order, rescaling the running sums to the running max
    # (a request with at most BP nodes is one chunk: no rescale at all). A request of one or two
    # nodes (up to 1k tokens at D 128, 2k at D 256) folds and merges them on a 2-row tile, with
    # the bits of the BP-row tile, whose other rows would be masked work in each GROUP fold step:
    # each element's fold is the same arithmetic whatever the tile (`fold_softmax_state`), and a
    # column's sum over the rows then adds two values and exact zeros, which is a + b in any
    # order (the sum is added to +0, so a -0 from a zero row comes out +0 either way). With
    # three nodes or more the order of the adds is the tile's reduction tree: 4- and 8-row tiles
    # changed bits on an H100 (data/bench/h100/README.md), so up to 8 nodes of a fine plan fold
    # on those tiles and merge on the BP-row tile (`_merge_folded`), and the rest fold and merge
    # on the BP-row tile, outside the loop when it is the only chunk: the loop's first pass, 1.3
    # us faster at D 256, B 1, 4k tokens on an H100 than inside it.
    b_max = float("-inf")
    b_den = 0.0
    b_num = tl.zeros([BD], tl.float32)
    # 4 or 8 rows where they are fewer than BP's (in the interpreter's tiny shapes too: BP >= 16)
    FOLD: tl.constexpr = GROUP > 1 and BP > FOLD_ROWS
    if n_nodes <= 2:
        b_max, b_den, b_num = _merge_nodes(
            ws_o_ptr, ws_m_ptr, ws_l_ptr, base, base, 0, n_units, o_d, m_d, b_max, b_den, b_num,
            D, BD, GROUP, GROUP, GROUP, 2,
        )  # fmt: skip
    elif FOLD and n_nodes <= FOLD_ROWS:
        n_base = ((i_b.to(tl.int64) * HQ + i_h) * tl.num_programs(2) + i_d) * FOLD_ROWS
        rows: tl.constexpr = FOLD_ROWS // 2
        if n_nodes <= rows:
            b_max, b_den, b_num = _merge_folded(
                ws_o_ptr, ws_m_ptr, ws_l_ptr, nodes_m_ptr, nodes_l_ptr, base, n_base, n_units, n_nodes, o_d, m_d,
                b_max, b_den, b_num, D, BD, GROUP, rows, BP,
            )  # fmt: skip
        else:
            b_max, b_den, b_num = _merge_folded(
                ws_o_ptr, ws_m_ptr, ws_l_ptr, nodes_m_ptr, nodes_l_ptr, base, n_base, n_units, n_nodes, o_d, m_d,
                b_max, b_den, b_num, D, BD, GROUP, FOLD_ROWS, BP,
            )  # fmt: skip
    elif n_nodes <= BP:
        b_max, b_den, b_num = _merge_nodes(
            ws_o_ptr, ws_m_ptr, ws_l_ptr, base, base, 0, n_units, o_d, m_d, b_max, b_den, b_num,
            D, BD, GROUP, GROUP, GROUP, BP,
        )  # fmt: skip
    else:
        for p0 in range(0, n_nodes, BP):
            b_max, b_den, b_num = _merge_nodes(
                ws_o_ptr, ws_m_ptr, ws_l_ptr, base, base, p0, n_units, o_d, m_d, b_max, b_den, b_num,
                D, BD, GROUP, GROUP, GROUP, BP,
            )  # fmt: skip
    b_out = b_num / b_den
    if FP8:
        b_out = b_out * tl.load(v_scale_ptr)
    p_out = out_ptr + i_b.to(tl.int64) * stride_ob + i_h * stride_oh + o_d
    tl.store(p_out, b_out.to(out_ptr.dtype.element_ty), mask=m_d)


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
    *,
    unit: int,
    span: int,
    max_units: int,
    num_programs: int,
    num_splits: int,
    config: DecodeConfig,
) -> torch.Tensor:
    """Both launches: `num_programs` programs per (request, KV head), `max_units` workspace rows.

    num_splits > 0 is the control (units and spans of ceil(len / num_splits) tokens, per request);
    else units of `unit` tokens and spans of `span` tokens.
    """
    B, HQ, D = q.shape
    HKV = k_cache.shape[2]
    G = HQ // HKV
    if q.stride(-1) != 1:
        q = q.contiguous()
    split = num_splits > 0
    out = torch.empty(B, HQ, D, dtype=q.dtype, device=q.device)
    ws_o = torch.empty(B, HQ, max_units, D, dtype=torch.float32, device=q.device)
    ws_m = torch.empty(B, HQ, max_units, dtype=torch.float32, device=q.device)
    ws_l = torch.empty_like(ws_m)
    ks, vs, fp8 = scale_args(k_scale, v_scale, ws_m)
    prec = decode_dot_precision(q.dtype, k_cache.dtype)
    bd = pow2_at_least(D)
    _decode_partition_kernel[(B, HKV, num_programs)](
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, ks, ws_o, ws_m, ws_l,
        qk_scale=scale * LOG2E, unit=unit, span=span, num_splits=num_splits, max_units=max_units,
        stride_qb=q.stride(0), stride_qh=q.stride(1),
        stride_kp=k_cache.stride(0), stride_kt=k_cache.stride(1), stride_kh=k_cache.stride(2),
        stride_vp=v_cache.stride(0), stride_vt=v_cache.stride(1), stride_vh=v_cache.stride(2),
        HQ=HQ, G=G, D=D, PAGE_SIZE=page_size, SPLIT_BY_COUNT=split,
        BH=pow2_at_least(G), BD=bd, BN=config.block_n, FP8=fp8,
        DOT_DTYPE=prec.dtype, INPUT_PRECISION=prec.input_precision, PTX_E4M3_V=ptx_e4m3(k_cache.dtype, prec.dtype, q.device),
        num_warps=config.num_warps, num_stages=config.num_stages, **_register_cap(config),
    )  # fmt: skip
    columns, nodes = min(bd, _REDUCE_COLUMNS), max(1, _REDUCE_TILE // bd)
    group = config.node_blocks if unit == config.block_n else 1
    # a fine plan's node states (m, l) for the reduce's small-tile folds (`_merge_folded`; unread otherwise)
    nodes_m, nodes_l = (
        torch.empty(2, B, HQ, bd // columns, _FOLD_ROWS, dtype=torch.float32, device=q.device)
        if group > 1
        else (ws_m, ws_l)
    )
    _decode_reduce_kernel[(B, HQ, bd // columns)](
        out, seq_lens, vs, ws_o, ws_m, ws_l, nodes_m, nodes_l,
        unit=unit, num_splits=num_splits, max_units=max_units, stride_ob=out.stride(0), stride_oh=out.stride(1),
        HQ=HQ, D=D, SPLIT_BY_COUNT=split, GROUP=group, FP8=fp8, BD=columns, BP=nodes, FOLD_ROWS=_FOLD_ROWS,
        num_warps=1 if interpreting() else 8 if nodes * columns >= _REDUCE_TILE else 4,
    )  # fmt: skip
    return out


def _register_cap(config: DecodeConfig) -> dict:
    """The launch option for the config's register cap (none under the interpreter)."""
    if config.max_registers is None or interpreting():
        return {}
    return {"maxnreg": config.max_registers}


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
    plan: DecodePlan | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Batch-invariant paged decode attention: fixed blocks and nodes per request, fixed-order merges.

    The partials are kept in float32 (max logit, exp-sum and the unnormalised partial output):
    AITER rounds each partition's normalised output to bf16/fp16 before the merge, which adds one
    rounding per partition (relative 2^-9 in bf16) to every output; float32 partials keep the
    merge within float32 rounding, so the output's only rounding to q's dtype is the last one.

    Args:
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale:
            the validated arguments of `gdn_lab.ops.decode_attention` (its docstring has the shapes).
        max_seq_len: an upper bound of max(seq_lens), which sizes the grid. None reads it from the
            device (one host synchronisation); pass it to capture a CUDA graph (extra programs exit
            at once; the result does not depend on the bound).
        config: the partition kernel's configuration; None takes `decode_config(D, q dtype, cache dtype, arch)`.
            An override is for tuning (benchmarks): a different block_n or node_blocks changes the bits.
        plan: how the work is cut into programs; None takes `decode_plan(...)` for this batch. Any
            plan gives the same bits (the tests and the benchmark's invariance rows check it).
        num_sms: the SM count the plan sees; None takes `gdn_lab.device.detect(q.device).num_sms`.

    Returns:
        [B, Hq, D] in q's dtype.
    """
    max_len = _max_len(seq_lens, max_seq_len)
    info = detect(q.device)
    cfg = config or decode_config(q.shape[2], q.dtype, k_cache.dtype, info.arch)
    if plan is None:
        sms = info.num_sms if num_sms is None else num_sms
        plan = decode_plan(q.shape[0], k_cache.shape[2], max_len, sms, cfg)
    else:
        _check_plan(plan, cfg)
    unit = plan.unit_blocks * cfg.block_n
    span = plan.span_blocks * cfg.block_n
    return _launch(
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale,
        unit=unit, span=span, max_units=triton.cdiv(max_len, unit), num_programs=triton.cdiv(max_len, span),
        num_splits=0, config=cfg,
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
    return num_splits_heuristic(max(batch, 1) * num_kv_heads, 2 * num_sms, n_blocks)  # batch 0: an empty batch


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
    info = detect(q.device)
    sms = info.num_sms if num_sms is None else num_sms
    splits = splits_for_batch(q.shape[0], k_cache.shape[2], q.shape[2], max_len, sms)
    cfg = config or decode_config(q.shape[2], q.dtype, k_cache.dtype, info.arch)
    return _launch(
        q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale,
        unit=0, span=0, max_units=splits, num_programs=splits, num_splits=splits, config=cfg,
    )  # fmt: skip
