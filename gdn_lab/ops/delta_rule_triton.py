"""The chunked gated delta rule in Triton, batch-invariant by construction: gdn_prefill's kernels,
which gdn_layer_prefill's Triton chain runs too, and the @triton.jit pieces its own kernels use.

Three stages split the work as fla's chunk_gated_delta_rule and AITER's fused prefill do, so
that only the state recurrence walks a sequence, segment by segment:

1. `_prepare_kernel`, one program per (chunk, value head), all chunks at once: the L2 norm
   factors of q and k (the later launches scale the input rows by them: `normalized_rows`), the
   gates (`chunk_gates`), the chunk's cumulative log decay G,
   A = strict_tril(beta_i (k_i . k_j) exp(G_i - G_j)) (k in column pieces) and
   T = (I + A)^-1 (blocked: `_unit_lower_inverse`), into scratch (`Scratch`) with beta.
2. `run_state_kernel`'s launches: `_state_kernel`, one program per (segment, value head, V tile),
   chunk after chunk: it stores the state entering each chunk and
   v_new = T (beta v - beta exp(G) (k S)) (S as [K, V]; fla's u - w S with w = T (beta exp(G) k)
   and u = T (beta v), which are never formed) for the output launch (`Scratch`), updates
   S <- exp(G_last) S + (k exp(G_last - G))^T v_new and writes the final state to the pool.
   Where one sequence's heads leave the GPU idle (`segment_from_of`), a sequence of more than
   SEGMENT_FROM tokens is cut into segments of SEGMENT_CHUNKS chunks, whose entering states come
   from the segments' affine maps (the same kernel, TRANSFER) through `_segment_starts_kernel`; a
   shorter one is one segment (the serial recurrence), and a call in which no sequence can be cut
   is the state kernel alone (FROM_POOL).
3. `_output_kernel`, one program per (chunk, two value heads of a key head, 128 values in tiles of
   OUTPUT_BLOCK_V), chunk-major: o = exp(G) (q S_c) + (tril(q k^T exp(G_i - G_j))) v_new
   (`chunk_output`), rounded to the input dtype.

The layer (`gdn_lab.ops.gdn_layer_prefill.triton_kernels`) runs these three stages between its
own conv and norm launches: the prepare on column views of its conv output and of its
interleaved b/a (`run_prepare_kernel` takes the row strides; the state and output launches read
the same views), the output in float32 over v_new where v_new is float32.
Nothing here knows the layer.

Why the bits cannot follow the batch: chunks and segments start at each sequence's first token,
whether and where a sequence is cut follows from its own length and the model's shape, a program
reads only its own sequence, and the chunk and segment sizes, tiles, num_warps and dot precision
are fixed per shape and dtype, never per batch; there are no atomics, and the one computation
split across programs (a cut sequence's segments, joined through their maps in order) is split by
the sequence's own length. The batch moves where a chunk's scratch lives, not what is computed. The registered
controls (`*_by_batch`) change exactly one thing, the chunk size, following AITER's rule
(benchmarks/bench_gdn_prefill.py adds one that sizes the segments by the batch).

Numerics: everything is float32 but the dots' operands and what only they read. For float32 and
fp16 inputs every dot takes float32 operands ("ieee" for float32 inputs, TF32 for fp16 on GPUs
that have it: `dot_precision(..., float32_operands=True)`). For bf16 inputs on a GPU the
recurrence's and the output's dots take bf16 operands (`chunk_dot_precision`; T, v_new and the
chunk states are stored on that grid), and so does the prepare's k k^T at key head dims of 64 and
more (`prepare_dot_precision`); the prepare's inverse and the segments' entering states stay on
float32 operands. Every dot accumulates in float32. Values that must land
on a narrower grid (outputs; in the fused layer the conv output and fp8) are rounded explicitly
to nearest-even in float32 first (`round_rne`), so the final cast is exact on every backend:
Triton 3.9's interpreter truncates fp32 -> bf16 and drops the carry in fp32 -> fp8 (e.g. 31.86 -> 16
instead of 32).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.ops.delta_rule import CHUNK_SIZE, L2NORM_EPS, SOFTPLUS_THRESHOLD
from gdn_lab.ops.triton_common import DotPrecision, dot_precision, grid_args, round_rne

# --- device helpers (`chunk_rows` serves the layer's own kernels too) ------------------------------


@triton.jit
def _unit_lower_inverse(A, BT: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BT, BT] A (BT 16, 32 or 64), blocked.

    With D = I + the 16 x 16 diagonal blocks of A and E = the rest (strictly below the blocks),
    I + A = D (I + N) with N = D^-1 E strictly block-lower, so N^4 = 0 for up to four blocks and
    (I + A)^-1 = (I - N)(I + N^2) D^-1. D^-1 is forward substitution inside the blocks, all blocks
    at once: 15 row steps on [BT / 16, 16, 16] instead of BT - 1 steps on the whole tile (the row
    steps' cross-thread reductions were most of the prepare kernel's time). The products are dots
    on float32 operands at PREC (TF32 for 16-bit inputs: measured on the H200 at 4096 tokens, the
    same output error against the float64 reference as IEEE float32 dots, and the prepare kernel
    1.6x faster).
    """
    tl.static_assert(BT == 16 or BT == 32 or BT == 64, "_unit_lower_inverse: BT must be 16, 32 or 64")
    NB: tl.constexpr = BT // 16
    o = tl.arange(0, BT)
    same_block = (o // 16)[:, None] == (o // 16)[None, :]
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    # M: -A's diagonal blocks as [NB, 16, 16]; after step i row i of each is that row of D^-1 - I
    o_b = tl.arange(0, NB)
    on_diag = o_b[:, None, None, None] == o_b[None, None, :, None]
    M = tl.sum(tl.where(on_diag, tl.reshape(-A, (NB, 16, NB, 16)), 0.0), 2)
    o_r = tl.arange(0, 16)[None, :, None]
    for i in range(1, 16):
        row = tl.sum(tl.where(o_r == i, M, 0.0), 1)
        row = row + tl.sum(row[:, :, None] * M, 1)
        M = tl.where(o_r == i, row[:, None, :], M)
    d_inv = tl.reshape(tl.where(on_diag, M[:, :, None, :], 0.0), (BT, BT)) + eye
    n = tl.dot(d_inv, tl.where(same_block, 0.0, A), input_precision=PREC)
    n2 = tl.dot(n, n, input_precision=PREC)
    return tl.dot(tl.dot(eye - n, eye + n2, input_precision=PREC), d_inv, input_precision=PREC)


@triton.jit
def _unit_lower_inverse_doubling(A, BT: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BT, BT] A, by doubling the diagonal blocks:
    X starts as the inverse of the 2 x 2 blocks (I minus A inside them); with X the inverse of the
    b x b blocks, that of the 2b x 2b blocks is X - X E X, E A's part in the lower-left b x b
    block of each 2b x 2b block (block forward substitution: [[D1, 0], [E, D2]]^-1 has D2^-1 E D1^-1
    below). Two dots a level at PREC, no row steps."""
    o = tl.arange(0, BT)
    X = tl.where(o[:, None] == o[None, :], 1.0, 0.0) - tl.where((o // 2)[:, None] == (o // 2)[None, :], A, 0.0)
    for level in tl.static_range(1, 6):  # blocks of b = 2, 4, ..., BT / 2 (BT at most 64)
        if (2 << level) <= BT:
            same = (o >> (level + 1))[:, None] == (o >> (level + 1))[None, :]
            E = tl.where(same & ((o >> level)[:, None] != (o >> level)[None, :]), A, 0.0)
            X = X - tl.dot(tl.dot(X, E, input_precision=PREC), X, input_precision=PREC)
    return X


@triton.jit
def chunk_rows(i_c, n, cu_seqlens, chunk_cu, BT: tl.constexpr):
    """Chunk i_c, of sequence n: (bos, length, p_first, p, m_t, rows).

    bos and length are the sequence's first token and token count; p [BT] the chunk's positions
    in the sequence (from p_first); m_t = p < length; rows = bos + p, the token rows.
    """
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    p_first = (i_c - tl.load(chunk_cu + n)).to(tl.int64) * BT
    p = p_first + tl.arange(0, BT)
    length = eos - bos
    return bos, length, p_first, p, p < length, bos + p


@triton.jit
def chunk_gates(b_a, b_b, A_log, dt_bias, gs, rows, m_t, i_h, HV: tl.constexpr, SOFTPLUS_T: tl.constexpr):
    """(G, beta) [BT] of value head i_h from its raw gates b_a, b_b; stores G (the cumulative log decay).

    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); rows past the sequence get g = 0
    and beta = 0, so they change nothing.
    """
    x = b_a + tl.load(dt_bias + i_h).to(tl.float32)
    softplus = tl.where(x > SOFTPLUS_T, x, tl.log(1.0 + tl.exp(x)))
    b_g = tl.where(m_t, -tl.exp(tl.load(A_log + i_h).to(tl.float32)) * softplus, 0.0)
    b_beta = tl.where(m_t, tl.sigmoid(b_b), 0.0)
    b_G = tl.cumsum(b_g, 0)
    tl.store(gs + rows * HV + i_h, b_G, mask=m_t)
    return b_G, b_beta


@triton.jit
def chunk_inverse(kk, b_beta, b_G, BT: tl.constexpr, PREC: tl.constexpr, DOUBLING: tl.constexpr):
    """T = (I + strict_tril(beta_i kk_ij exp(G_i - G_j)))^-1, kk the chunk's normalized k k^T
    (`_unit_lower_inverse_doubling`, or `_unit_lower_inverse` without DOUBLING)."""
    o_t = tl.arange(0, BT)
    strict = o_t[:, None] > o_t[None, :]
    decay = tl.exp(tl.where(strict, b_G[:, None] - b_G[None, :], 0.0))
    A = tl.where(strict, b_beta[:, None] * kk * decay, 0.0)
    if DOUBLING:
        return _unit_lower_inverse_doubling(A, BT, PREC)
    return _unit_lower_inverse(A, BT, PREC)


@triton.jit
def chunk_output(
    q, k, norms, scale, vs, gs, hs, out, rows, m_t, m_live, live, i_c, i_h0, i_v0,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    GH: tl.constexpr, GV: tl.constexpr, QK_ROW: tl.constexpr,
    IO_MANT: tl.constexpr, IO_TINY: tl.constexpr, IO_MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """o = exp(G) (q S_c) + tril(q k^T exp(G_i - G_j)) v_new for GH value heads from i_h0 (of one
    key head) and GV tiles of BV values from tile i_v0, chunk i_c: stored in out, rounded to its
    grid. q and k are normalized here (`normalized_rows`) and q k^T is formed once for them all;
    each tile's two dots are the same [BT, K] x [K, BV] and [BT, BT] x [BT, BV] whatever the
    grouping. The three dots take DOT_DTYPE operands at PREC (`ChunkedRun.dot`), accumulating in
    float32.

    Rows outside m_live, and every row of a padding sequence (live False), read zeros. Callers fix
    the columns per shape, never per batch. Every tiling measured on a GPU gave a column the same
    bits (float32 operands on the H200, bf16 on an H100); under the interpreter tiles of 32 and 64
    values differed in the last bit at head dim 64.
    """
    R: tl.constexpr = HV // HK
    i_kh = i_h0 // R
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    incl = o_t[:, None] >= o_t[None, :]
    b_q = (normalized_rows(q, norms, rows, m_live, i_kh, 0, HK, K, QK_ROW) * scale).to(DOT_DTYPE)
    b_k = normalized_rows(k, norms, rows, m_live, i_kh, 1, HK, K, QK_ROW)
    b_qk = tl.dot(b_q, tl.trans(b_k.to(DOT_DTYPE)), input_precision=PREC)
    for j_h in tl.static_range(GH):
        i_h = i_h0 + j_h
        b_G = tl.load(gs + rows * HV + i_h, mask=m_live, other=0.0)
        # G_i - G_j <= 0 for i >= j inside the sequence; the minimum keeps rows past its end (G = 0) finite
        b_A = tl.where(incl, b_qk * tl.exp(tl.minimum(b_G[:, None] - b_G[None, :], 0.0)), 0.0).to(DOT_DTYPE)
        b_eG = tl.exp(b_G)
        for j_v in tl.static_range(GV):
            o_v = (i_v0 + j_v) * BV + tl.arange(0, BV)
            b_vn = tl.load(vs + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], mask=m_live[:, None], other=0.0)
            b_S = tl.load(hs + (i_c.to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :])
            b_S = tl.where(live, b_S, 0.0)  # a padding sequence's chunk states were never written
            b_o = tl.dot(b_q, b_S.to(DOT_DTYPE), input_precision=PREC) * b_eG[:, None]
            b_o = round_rne(b_o + tl.dot(b_A, b_vn.to(DOT_DTYPE), input_precision=PREC), IO_MANT, IO_TINY, IO_MAGIC)
            tl.store(out + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], b_o, mask=m_t[:, None])


@triton.jit
def tile_head_item(NV: tl.constexpr, HV: tl.constexpr):
    """This program's (V tile, value head, item) on a 1-D grid of NV * HV * items programs, in that
    order: the programs that read one item's rows (a chunk's or a segment's) run one after another,
    so all but the first find them in the L2. With the items first, the other reads came a whole
    head's items later."""
    pid = tl.program_id(0)
    return pid % NV, (pid // NV) % HV, pid // (NV * HV)


@triton.jit
def _raw_rows(x, rows, cols, m_t, ROW: tl.constexpr):
    """x[rows][:, cols] of a row-major [T, ROW] input, in its dtype [BT, len(cols)]; rows outside m_t read 0."""
    return tl.load(x + rows[:, None] * ROW + cols[None, :], mask=m_t[:, None], other=0.0)


@triton.jit
def _load_rows(x, rows, cols, m_t, ROW: tl.constexpr):
    """`_raw_rows` as float32."""
    return _raw_rows(x, rows, cols, m_t, ROW).to(tl.float32)


@triton.jit
def norm_factors(norms, rows, m_t, i_kh, WHICH: tl.constexpr, HK: tl.constexpr):
    """The L2 norm factors [BT] of key head i_kh's rows of q (WHICH 0) or k (1), as the prepare
    kernel stored them in norms ([T, HK, 2]). Rows outside m_t read 0 (never written there: 0
    times whatever the memory holds could be NaN)."""
    return tl.load(norms + rows * (HK * 2) + i_kh * 2 + WHICH, mask=m_t, other=0.0)


@triton.jit
def normalized_rows(
    x, norms, rows, m_t, i_kh, WHICH: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, ROW: tl.constexpr
):
    """Key head i_kh's rows of q (WHICH 0) or k (1), float32 [BT, K], times their `norm_factors`.
    Rows outside m_t read 0."""
    r = norm_factors(norms, rows, m_t, i_kh, WHICH, HK)
    return _load_rows(x, rows, i_kh * K + tl.arange(0, K), m_t, ROW) * r[:, None]


# --- kernels -----------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _prepare_kernel(
    q,
    k,
    a,
    b,
    A_log,
    dt_bias,
    cu_seqlens,
    slots,
    chunk_seq,
    chunk_cu,
    norms,
    ts,
    bs,
    gs,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    QK_ROW: tl.constexpr,
    G_ROW: tl.constexpr,
    G_KH: tl.constexpr,
    L2NORM: tl.constexpr,
    EPS: tl.constexpr,
    SOFTPLUS_T: tl.constexpr,
    PREC: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DOUBLING: tl.constexpr,
):
    """One program per (chunk, value head); k in pieces of KP columns (`column_piece`). k k^T is a
    dot on DOT_DTYPE operands at DOT_PREC (`ChunkedRun.prep`), the inverse's on float32 operands
    at PREC. Stores T's rows in ts's dtype (the state launch's dot operand) and beta.

    q and k are rows of QK_ROW elements ([HK, K] at their start); a and b hold value head h of key
    head h // R at row * G_ROW + (h // R) * G_KH + h % R.
    """
    _, i_h, i_c = tile_head_item(1, HV)  # the R value heads of a key head read its k rows in turn
    n = tl.load(chunk_seq + i_c)
    if n >= N:  # past the last chunk (the grid is an upper bound)
        return
    slot = tl.load(slots + n)
    if slot < 0:  # padding: nothing to prepare
        return
    R: tl.constexpr = HV // HK
    i_kh = i_h // R
    _, _, _, _, m_t, rows = chunk_rows(i_c, n, cu_seqlens, chunk_cu, BT)
    o_k = tl.arange(0, K)
    g_col = i_kh * G_KH + i_h % R
    b_a = tl.load(a + rows * G_ROW + g_col, mask=m_t, other=0.0).to(tl.float32)
    b_b = tl.load(b + rows * G_ROW + g_col, mask=m_t, other=0.0).to(tl.float32)
    b_G, b_beta = chunk_gates(b_a, b_b, A_log, dt_bias, gs, rows, m_t, i_h, HV, SOFTPLUS_T)

    # k in column pieces: fewer tiles live across the inverse. kk comes from the raw rows scaled
    # by their norms. Normalized q and k are not stored: their norm factors are, and the later
    # launches read the raw rows (in the input dtype) and scale them (`normalized_rows`).
    o_kp = tl.arange(0, KP)
    sq = tl.zeros([BT], dtype=tl.float32)
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    for c in tl.static_range(K // KP):
        b_kc = _raw_rows(k, rows, i_kh * K + c * KP + o_kp, m_t, QK_ROW)
        b_kf = b_kc.to(tl.float32)
        sq += tl.sum(b_kf * b_kf, 1)
        b_kd = b_kc.to(DOT_DTYPE)
        kk += tl.dot(b_kd, tl.trans(b_kd), input_precision=DOT_PREC)
    r_k = tl.full([BT], 1.0, tl.float32)
    if L2NORM:
        r_k = tl.math.rsqrt(sq + EPS)
    b_T = chunk_inverse(kk * r_k[:, None] * r_k[None, :], b_beta, b_G, BT, PREC, DOUBLING)
    o_t = tl.arange(0, BT)
    tl.store(ts + rows[:, None] * (HV * BT) + i_h * BT + o_t[None, :], b_T.to(ts.dtype.element_ty), mask=m_t[:, None])
    tl.store(bs + rows * HV + i_h, b_beta, mask=m_t)
    if i_h % R == 0:  # one value head per key head writes the factors of its q and k
        r_q = tl.full([BT], 1.0, tl.float32)
        if L2NORM:
            b_q = _load_rows(q, rows, i_kh * K + o_k, m_t, QK_ROW)
            r_q = tl.math.rsqrt(tl.sum(b_q * b_q, 1) + EPS)
        p_norms = norms + rows * (HK * 2) + i_kh * 2
        tl.store(p_norms, r_q, mask=m_t)
        tl.store(p_norms + 1, r_k, mask=m_t)


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _state_kernel(
    state,
    slots,
    cu_seqlens,
    chunk_cu,
    seg_cu,
    seg_seq,
    k,
    v,
    norms,
    ts,
    bs,
    vs,
    gs,
    hs,
    trans,
    starts,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    BT: tl.constexpr,
    QK_ROW: tl.constexpr,
    V_ROW: tl.constexpr,
    SEG: tl.constexpr,
    TRANSFER: tl.constexpr,
    FROM_POOL: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One program per (segment, value head, column tile); see `run_state_kernel`. The dots take
    DOT_DTYPE operands at DOT_PREC (`ChunkedRun.dot`), accumulating in float32.

    Per chunk, with T, beta, k (normalized) and v of the chunk, w = T (beta exp(G) k) and
    u = T (beta v): S <- A S + B for A = exp(g_last) I - kd^T w and B = kd^T u (kd =
    k exp(g_last - G)), stepped as v_new = T (beta v - beta exp(G) (k S)) = u - w S and
    S <- exp(g_last) S + kd^T v_new. k's raw rows are the k S dot's operands, its norm factor
    scales the product's rows.
    TRANSFER: the segment's affine map (M, D) = (A_m ... A_1, the state it makes of zero), by the
    same step on the augmented columns [S | X], S from 0 with v, X from I with v = 0; stored as
    trans[segment] = [D | M] ([K, V + K]). Otherwise: from the state entering the segment
    (`_segment_starts_kernel`'s), the chunks with their entering states (hs) and v_new (vs)
    stored, and the final state into the pool.
    A segment is SEG chunks, the last one the rest of its sequence. FROM_POOL: no sequence of the
    call is cut (seg_cu, seg_seq, trans and starts unused): program i_s is sequence i_s, from its
    pool state; the same values as through starts, one launch fewer.
    """
    i_v, i_h, i_s = tile_head_item(NV, HV)  # NV tiles of S's columns, or of [S | X]'s
    if FROM_POOL:
        n = i_s
    else:
        n = tl.load(seg_seq + i_s)
        if n >= N:  # past the last segment (the grid is an upper bound)
            return
    slot = tl.load(slots + n)
    if slot < 0:
        return
    R: tl.constexpr = HV // HK
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    c0 = tl.load(chunk_cu + n).to(tl.int64)
    n_chunks = tl.load(chunk_cu + n + 1).to(tl.int64) - c0
    if FROM_POOL:
        s0 = n.to(tl.int64)
        n_segs = 1
    else:
        s0 = tl.load(seg_cu + n).to(tl.int64)
        n_segs = tl.load(seg_cu + n + 1).to(tl.int64) - s0
    s = i_s - s0
    o_k = tl.arange(0, K)
    o_t = tl.arange(0, BT)
    o_c = i_v * BV + tl.arange(0, BV)  # the columns this program owns (of S, or of [S | X])
    p_pool = state + (slot.to(tl.int64) * HV + i_h) * (V * K) + o_c[None, :] * K + o_k[:, None]  # [V, K] as [K, BV]
    if TRANSFER:
        if s == n_segs - 1:  # the last segment's map is never used
            return
        b_S = tl.where(o_k[:, None] == o_c[None, :] - V, 1.0, 0.0)  # 0 on S's columns, I on X's
    elif FROM_POOL:
        b_S = tl.load(p_pool)
    else:
        # always from starts: a choice between the pool and starts (an if block, or two masked
        # loads and a select) made the serial recurrence 11-29 % slower on the H200
        b_S = tl.load(starts + ((s0 + s) * HV + i_h) * (K * V) + o_k[:, None] * V + o_c[None, :])
    j_end = tl.where(s == n_segs - 1, n_chunks, s * SEG + SEG)
    for j in range(s * SEG, j_end):
        rows = bos + j * BT + o_t
        m_t = rows < eos
        if not TRANSFER:
            p_hs = hs + ((c0 + j) * HV + i_h) * (K * V) + o_k[:, None] * V + o_c[None, :]
            tl.store(p_hs, b_S.to(hs.dtype.element_ty))  # the state entering chunk j, for the output kernel
        b_T = tl.load(ts + rows[:, None] * (HV * BT) + i_h * BT + o_t[None, :], mask=m_t[:, None], other=0.0)
        b_beta = tl.load(bs + rows * HV + i_h, mask=m_t, other=0.0)
        b_G = tl.load(gs + rows * HV + i_h, mask=m_t, other=0.0)
        r_k = norm_factors(norms, rows, m_t, i_h // R, 1, HK)
        b_k = _raw_rows(k, rows, (i_h // R) * K + o_k, m_t, QK_ROW)
        # X's columns take v = 0; S's alone keep the row mask (a column mask cost 7 % on the H200)
        m_u = (m_t[:, None] & (o_c < V)[None, :]) if TRANSFER else m_t[:, None]
        b_v = tl.load(v + rows[:, None] * V_ROW + i_h * V + o_c[None, :], mask=m_u, other=0.0).to(tl.float32)
        b_ks = tl.dot(b_k.to(DOT_DTYPE), b_S.to(DOT_DTYPE), input_precision=DOT_PREC)
        b_x = b_beta[:, None] * b_v - (r_k * b_beta * tl.exp(b_G))[:, None] * b_ks
        b_vn = tl.dot(b_T.to(DOT_DTYPE), b_x.to(DOT_DTYPE), input_precision=DOT_PREC)
        if not TRANSFER:
            p_vn = vs + rows[:, None] * (HV * V) + i_h * V + o_c[None, :]
            tl.store(p_vn, b_vn.to(vs.dtype.element_ty), mask=m_u)
        last = tl.minimum(bos + j * BT + BT, eos) - 1
        g_last = tl.load(gs + last * HV + i_h)
        if DOT_DTYPE == tl.float32:  # noqa: SIM300 (a constexpr parameter, not a constant)
            b_kd = b_k.to(tl.float32) * r_k[:, None] * tl.exp(g_last - b_G)[:, None]
            b_kv = tl.dot(tl.trans(b_kd), b_vn, input_precision=DOT_PREC)
        else:
            # k's raw rows are exact 16-bit operands; its norm factor and the decay scale v_new's
            # rows instead, so one rounding, of a [BT, BV] tile, feeds the dot (on float32
            # operands this form made the launch 1.12-1.38x slower on an H100: not used there)
            b_vd = (b_vn * (r_k * tl.exp(g_last - b_G))[:, None]).to(DOT_DTYPE)
            b_kv = tl.dot(tl.trans(b_k.to(DOT_DTYPE)), b_vd, input_precision=DOT_PREC)
        b_S = b_S * tl.exp(g_last) + b_kv
    if TRANSFER:
        tl.store(trans + ((s0 + s) * HV + i_h) * (K * (V + K)) + o_k[:, None] * (V + K) + o_c[None, :], b_S)
    elif s == n_segs - 1:
        tl.store(p_pool, b_S)


@triton.jit
def _segment_starts_kernel(
    state, slots, seg_cu, trans, starts,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (sequence, value head, V tile): the state entering each segment, S_0 = the
    pool's (a copy: the state kernel's last segment overwrites the pool while the others start)
    and S_{i+1} = M_i S_i + D_i, into starts[segment]. A launch of its own: inside the state kernel
    this loop made the serial recurrence 23 % slower (H200)."""
    i_v, i_h, i_n = tile_head_item(V // BV, HV)  # a segment's map is read by its V tiles in turn
    slot = tl.load(slots + i_n)
    s0 = tl.load(seg_cu + i_n).to(tl.int64)
    n_segs = tl.load(seg_cu + i_n + 1).to(tl.int64) - s0
    if slot < 0:
        return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    b_S = tl.load(state + (slot.to(tl.int64) * HV + i_h) * (V * K) + o_v[None, :] * K + o_k[:, None])
    for i in range(n_segs):
        tl.store(starts + ((s0 + i) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :], b_S)
        if i < n_segs - 1:
            p_map = trans + ((s0 + i) * HV + i_h) * (K * (V + K)) + o_k[:, None] * (V + K)
            b_M = tl.load(p_map + V + o_k[None, :])
            b_S = tl.dot(b_M, b_S, input_precision=PREC) + tl.load(p_map + o_v[None, :])


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _output_kernel(
    q,
    k,
    norms,
    scale,
    vs,
    gs,
    hs,
    out,
    chunk_seq,
    chunk_cu,
    cu_seqlens,
    slots,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    QK_ROW: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PREC: tl.constexpr,
    GH: tl.constexpr,
    GV: tl.constexpr,
):
    # GH value heads x GV tiles a program; a key head's programs read its q and k rows in turn
    i_vg, i_hg, i_c = tile_head_item(V // (BV * GV), HV // GH)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    live = tl.load(slots + n) >= 0  # padding rows get zeros
    _, length, _, p, m_t, rows = chunk_rows(i_c, n, cu_seqlens, chunk_cu, BT)
    m_live = p < tl.where(live, length, 0)  # (a scalar boolean cannot mask a block in the interpreter)
    chunk_output(
        q, k, norms, scale, vs, gs, hs, out, rows, m_t, m_live, live, i_c, i_hg * GH, i_vg * GV,
        HK, HV, K, V, BV, BT, GH, GV, QK_ROW, IO_MANT, IO_TINY, IO_MAGIC, DOT_DTYPE, PREC,
    )  # fmt: skip


# --- host --------------------------------------------------------------------------------------

STATE_BLOCK_V = 32  # the state kernel's V tile: fixed per shape, never per batch
# the output kernel's V tile and warps (fixed per shape): on TF32 operands 64 values at 4 warps took
# 0.74-0.78x the time of the whole row at 8 on the H200, 64 at 8 warps 0.82-0.83x, 32 at 4 warps
# 0.90-1.10x, 2 warps 1.5-2.0x; every tiling gave the same bits (scratch probe of 727f5c4 at 16k and
# 64k tokens, 1 to 16 sequences; data/bench/h200/README.md). On bf16 operands (an H100) the whole
# row at 4 warps took 0.94-0.95x the time of 64 values at 4 while the chunk states and v_new were
# float32 (afb0139), but 1.06-1.13x once they are bf16 (98244bf, 8k-64k tokens, both head shapes).
OUTPUT_BLOCK_V = 64
OUTPUT_WARPS = 4
# One output program takes two value heads of a key head (where the heads pair up) and up to 128
# values of each in its V tiles, forming q k^T once for them (the tiles' own dots are unchanged:
# the same bits). On an H100 at 6d46f21 (probe_gdn_prefill_kernels, 4k-64k tokens in 1-16 equal sequences,
# both head shapes; again at 5e29fe9): 0.73-0.78x the time of one (value head, tile) a program, every
# output bitwise equal to its.
OUTPUT_GROUP_HEADS = 2
OUTPUT_GROUP_VALUES = 128
SEGMENT_CHUNKS = 128  # chunks per segment of the state recurrence: fixed, never per batch
SEGMENT_FROM = 16384  # a longer sequence is split into segments at shapes of few heads (never per batch)
# From this many programs in one sequence's serial recurrence (value heads x V tiles) on, its heads
# keep the GPU busy enough that cutting only adds the maps' work (about twice the serial work, and
# more programs than the GPU's 132 SMs). At 65536 tokens in one sequence on an H100
# (probe_gdn_prefill_kernels of ced32d5 and 33890c0, K = V = 128): 8 value heads (32 programs) took
# 1.8 ms cut and 3.0 ms serial, 16 (64) 4.2 and 2.8 ms, 32 (128) 9.1 and 2.8 ms.
SERIAL_FILLS_AT = 64


def state_tile(v_dim: int, k_dim: int, block_v: int = STATE_BLOCK_V) -> int:
    """The state kernel's V tile: block_v values, at most V and K."""
    return min(v_dim, k_dim, block_v)


def segment_from_of(num_v_heads: int, v_dim: int, k_dim: int) -> int:
    """The state recurrence's default cut threshold for a shape: SEGMENT_FROM tokens where one
    sequence's serial recurrence leaves the GPU idle, none (sys.maxsize) where its programs fill
    it. A property of the model's shape, the same for every batch."""
    programs = num_v_heads * (v_dim // state_tile(v_dim, k_dim))
    return SEGMENT_FROM if programs < SERIAL_FILLS_AT else sys.maxsize


@dataclass(frozen=True)
class ChunkPlan:
    """Which chunk belongs to which sequence, computed on the device (no host synchronisation).

    Attributes:
        chunk_size: tokens per chunk (BT).
        max_chunks: the grid's chunk dimension, T // BT + N >= the real number of chunks.
        chunk_cu: int32 [N+1], the index of each sequence's first chunk (prefix sums of ceil(L/BT)).
        chunk_seq: int32 [max_chunks], the sequence of each chunk; N past the last chunk.
    """

    chunk_size: int
    max_chunks: int
    chunk_cu: torch.Tensor
    chunk_seq: torch.Tensor


@triton.jit
def _plan(cu_seqlens, chunk_cu, chunk_seq, N, max_chunks, BT: tl.constexpr, WHOLE: tl.constexpr, BLOCK: tl.constexpr):
    """chunk_cu[n] = the first chunk of sequence n (a prefix sum of its chunk counts: ceil(length /
    BT), one for a sequence of 1 to WHOLE tokens), chunk_seq[c] = the sequence of chunk c (N past
    the last chunk), by binary search."""
    o = tl.arange(0, BLOCK)
    carry = tl.zeros([], dtype=tl.int32)
    tl.store(chunk_cu, carry)
    for n0 in range(0, N, BLOCK):
        m = n0 + o < N
        length = tl.load(cu_seqlens + n0 + o + 1, mask=m, other=0) - tl.load(cu_seqlens + n0 + o, mask=m, other=0)
        count = tl.where(length <= WHOLE, tl.minimum(length, 1), (length + BT - 1) // BT)
        ends = tl.cumsum(count, 0) + carry
        tl.store(chunk_cu + n0 + o + 1, ends, mask=m)
        carry = tl.max(tl.where(m, ends, 0), 0)
    tl.debug_barrier()  # chunk_cu is read back below, by other threads of this program
    steps = tl.ceil(tl.log2(N.to(tl.float32) + 1.0)).to(tl.int32)
    for c0 in range(0, max_chunks, BLOCK):
        c = c0 + o
        # the first n in [0, N] with chunk_cu[n + 1] > c (N past the last chunk)
        lo = tl.zeros([BLOCK], dtype=tl.int32)
        hi = tl.zeros([BLOCK], dtype=tl.int32) + N
        for _ in range(steps):
            mid = (lo + hi) // 2
            above = tl.load(chunk_cu + mid + 1, mask=mid < N, other=0) > c
            hi = tl.where(above & (mid < N), mid, hi)
            lo = tl.where(above | (mid >= N), lo, mid + 1)
        tl.store(chunk_seq + c, lo, mask=c < max_chunks)


@triton.jit(do_not_specialize=["N", "max_0", "max_1"])
def _plan_kernel(
    cu_seqlens, cu_0, seq_0, cu_1, seq_1, N, max_0, max_1,
    BT_0: tl.constexpr, WHOLE_0: tl.constexpr, BT_1: tl.constexpr, WHOLE_1: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program p computes plan p (`_plan`): one launch for the chunks and the segments of a call."""
    if tl.program_id(0) == 0:
        _plan(cu_seqlens, cu_0, seq_0, N, max_0, BT_0, WHOLE_0, BLOCK)
    else:
        _plan(cu_seqlens, cu_1, seq_1, N, max_1, BT_1, WHOLE_1, BLOCK)


def plan_chunks(cu_seqlens: torch.Tensor, total_tokens: int, *sizes: tuple[int, int]) -> list[ChunkPlan]:
    """One ChunkPlan per (chunk_size, whole_until) in sizes (one or two), in one launch: chunks of
    chunk_size tokens starting at each sequence's first token, a sequence of at most whole_until
    tokens one chunk (the last chunk of a sequence is the rest of it). With the torch ops it
    replaces, about ten launches, the plan and scratch took 140-340 us per call on the H200; 7-64
    us in one launch (benchmarks/probe_gdn_prefill_kernels.py)."""
    if not 1 <= len(sizes) <= 2:
        raise ValueError(f"plan_chunks: sizes takes one or two (chunk_size, whole_until) pairs, got {len(sizes)}")
    n = cu_seqlens.numel() - 1
    dev = cu_seqlens.device
    plans = []
    for chunk_size, _ in sizes:
        max_chunks = total_tokens // chunk_size + n
        chunk_seq = torch.empty(max_chunks, dtype=torch.int32, device=dev)
        plans.append(ChunkPlan(chunk_size, max_chunks, torch.empty(n + 1, dtype=torch.int32, device=dev), chunk_seq))
    (bt_0, whole_0), (bt_1, whole_1) = sizes[0], sizes[-1]
    p_0, p_1 = plans[0], plans[-1]
    _plan_kernel[(len(sizes),)](
        cu_seqlens, p_0.chunk_cu, p_0.chunk_seq, p_1.chunk_cu, p_1.chunk_seq, n, p_0.max_chunks, p_1.max_chunks,
        BT_0=bt_0, WHOLE_0=whole_0, BT_1=bt_1, WHOLE_1=whole_1, BLOCK=1024, num_warps=4,
    )  # fmt: skip
    return plans


@dataclass(frozen=True)
class Scratch:
    """The intermediates between the launches (token-major, so chunks need no padding): float32,
    but for what only dots read, kept in their operand dtype (`ChunkedRun.dot`): each value is
    rounded to it once, where it is stored, as the dot would round it (round to nearest even), so
    the bits are those of float32 scratch.

    Attributes:
        norms: [T, HK, 2] the L2 norm factors of q and k (1 without the norm): the later launches
            normalize the input rows themselves, which reads half the bytes of normalized float32
            copies and writes none.
        ts: [T, HV, BT] each token's row of its chunk's T = (I + A)^-1, in the operand dtype
            (the state launch's dot alone reads it); bs: [T, HV] beta; gs: [T, HV] cumulative log
            decay. Where the prepare stored w = T (beta exp(G) k) and u = T (beta v) instead
            ([T, HV, K] and [T, HV, V]), at 16/32 heads of 128 on an H100 the call took 1.07-1.16x
            the time of a scratch variant of this form (16k and 64k tokens, 1 to 16 sequences;
            probe_fused_fb617e2.log, data/bench/h100/README.md).
        vs: [T, HV, V] v_new, from the state launch for the output's dots.
        hs: [max_chunks, HV, K, V] the state entering each chunk, for the output's dots. On bf16
            operands v_new and the chunk states are half the bytes the launches write and read
            (on an H100 at 16/32 heads, 16k and 64k tokens: the output launch 0.78-0.81x its
            time, the state launch 0.91-0.94x, the call 0.92-0.93x; data/bench/h100/README.md).
        trans: [max_segments, HV, K, V + K] each segment's map [D | M] (`_state_kernel`).
        starts: [max_segments, HV, K, V] the state entering each segment (`_segment_starts_kernel`).
            trans and starts are None when no sequence of the call can be cut.
    """

    norms: torch.Tensor
    ts: torch.Tensor
    bs: torch.Tensor
    vs: torch.Tensor
    gs: torch.Tensor
    hs: torch.Tensor
    trans: torch.Tensor | None
    starts: torch.Tensor | None


@dataclass(frozen=True)
class ChunkedRun:
    """What the launches of one call share.

    Attributes:
        plan: the chunks of the call's sequences.
        segments: the call's segments of the state recurrence (a ChunkPlan whose chunk_size is
            a segment's tokens): `segment_chunks` chunks each in a sequence of more than
            `segment_from` tokens, one segment for a shorter sequence; None when the call has
            too few tokens for any sequence to be cut (every sequence one segment).
        segment_chunks: chunks per segment.
        scratch: the intermediates.
        prec: the tl.dot input_precision of the float32 dots: the prepare's inverse and the
            segment entering states ("ieee" or "tf32").
        dot: the operands of the state recurrence's and the output's dots (`chunk_dot_precision`).
        prep: the operands of the prepare's k k^T dots (`prepare_dot_precision`).
    """

    plan: ChunkPlan
    segments: ChunkPlan | None
    segment_chunks: int
    scratch: Scratch
    prec: str
    dot: DotPrecision
    prep: DotPrecision


def chunked_run(
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    num_k_heads: int,
    head_k_dim: int,
    chunk_size: int,
    segment_chunks: int = SEGMENT_CHUNKS,
    segment_from: int | None = None,
) -> ChunkedRun:
    """The plans, scratch and dot precision of a call writing `out` ([T, HV, V] in the input dtype);
    segment_from None: the shape's default (`segment_from_of`)."""
    T, HV, V = out.shape
    HK, K, device = num_k_heads, head_k_dim, out.device
    if segment_from is None:
        segment_from = segment_from_of(HV, V, K)
    segment = chunk_size * segment_chunks
    cut_from = max(segment_from, segment)
    if cut_from < T:  # some sequence may be cut
        plan, segments = plan_chunks(cu_seqlens, T, (chunk_size, 0), (segment, cut_from))
    else:
        (plan,), segments = plan_chunks(cu_seqlens, T, (chunk_size, 0)), None
    prec = dot_precision(out.dtype, out.dtype, float32_operands=True, device=device)
    dot = chunk_dot_precision(prec, out.dtype)
    prep = prepare_dot_precision(prec, dot, K)
    f32 = {"dtype": torch.float32, "device": device}
    narrow = dot.dtype != tl.float32  # the dots take the input dtype's operands
    operand = {"dtype": out.dtype, "device": device} if narrow else f32
    scratch = Scratch(
        torch.empty(T, HK, 2, **f32),
        torch.empty(T, HV, chunk_size, **operand),
        torch.empty(T, HV, **f32),
        torch.empty(T, HV, V, **operand),
        torch.empty(T, HV, **f32),
        torch.empty(plan.max_chunks, HV, K, V, **operand),
        None if segments is None else torch.empty(segments.max_chunks, HV, K, V + K, **f32),
        None if segments is None else torch.empty(segments.max_chunks, HV, K, V, **f32),
    )
    return ChunkedRun(plan, segments, segment_chunks, scratch, prec.input_precision, dot, prep)


def chunk_dot_precision(chunk: DotPrecision, dtype: torch.dtype) -> DotPrecision:
    """The operands of the state recurrence's and the output's dots, fixed by the input dtype (and
    the GPU), never by the batch.

    For bf16 inputs, on a GPU, bf16, accumulating in float32, as fla's chunk kernels feed theirs:
    the recurrence's k S, T (beta v - ...) and k^T v_new (T stored in bf16; S, the bracket and the
    scaled v_new rounded) and the output's. fp16 inputs keep the chunk's float32 operands
    (`chunk`): the state and v_new are not bounded by fp16's range. The prepare's dots follow `prepare_dot_precision`.
    On an H100, bf16 operands in the output launch took 0.69-0.70x the time of TF32 ones at 16/32
    heads (afb0139); in the state launch, when it read w stored in bf16 (its w S dot in place of
    k S and T (...)), 0.51-0.64x at 16k and 64k tokens (both head shapes; a scratch probe of
    fe57a0e, data/bench/h100/README.md).
    Under the interpreter every dot is float32, as `dot_precision` says.
    """
    if dtype != torch.bfloat16:
        return chunk
    return dot_precision(dtype, dtype)


def prepare_dot_precision(chunk: DotPrecision, dot: DotPrecision, k_dim: int) -> DotPrecision:
    """The operands of the prepare's k k^T dots, fixed by the input dtype, the key head dim (and
    the GPU), never by the batch.

    `dot`, the recurrence's (`chunk_dot_precision`: bf16 for bf16 inputs on a GPU, as fla's chunk
    kernels feed theirs) where the key head dim is cut into `column_piece`s of 32 or more columns;
    otherwise `chunk`, the float32 operands: on pieces of 16 (head dims 16 and 32; 32-byte bf16
    rows) the prepare's bf16 dots gave values of 1e33 to inf, some different on each run, with
    Triton 3.6 on an H100 (b67bb93; not isolated further: Triton has had Hopper wgmma bugs on
    narrow 16-bit tiles, e.g. triton-lang/triton#7830). The inverse stays on float32 operands
    whatever the dtype. When the prepare also formed w and u on these operands, on an H100 at
    16/32 heads of 128 (9901008 against cb5dcc7, one machine, 16k and 64k tokens): the prepare
    0.72-0.73x its time, the call 0.83-0.85x; the output error fla chunk's (rel_mae 0.00382
    against its 0.00388 at 4096 tokens, TF32 0.00329). data/bench/h100/README.md.
    """
    return dot if column_piece(k_dim) >= 32 else chunk


def num_warps_for(*tile_elems: int, at: int = 8192) -> int:
    """A fixed warp count per shape (never per batch): 8 once a tile has `at`+ fp32 elements."""
    return 8 if max(tile_elems) >= at else 4


def column_piece(d: int) -> int:
    """The prepare kernel's column pieces of a head dim d, fixed per shape: halves, down to tl.dot's 16."""
    return d // 2 if d >= 32 else d


# the prepare kernel's tiles of 64 x 128 took 0.66x the time at 4 warps as at 8 on the H200, at
# every size and stage count (probe_gdn_prefill_kernels.csv of 76a8564); 8 only past that
PREPARE_WARPS_AT = 16384
# T's inverse: "rows" (`_unit_lower_inverse`) or "doubling" (`_unit_lower_inverse_doubling`, ten
# 64 x 64 dots instead of 15 row steps and four dots: the prepare took 1.03-1.30x the time on an H100
# at 1297673, probe_gdn_prefill_kernels at 4k-64k tokens, both head shapes; data/bench/h100/README.md)
INVERSES = ("rows", "doubling")
PREPARE_INVERSE = "rows"


def _launch_options(num_warps: int, num_stages: int | None) -> dict:
    return {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}


def run_prepare_kernel(
    run: ChunkedRun,
    q, k, a, b, A_log, dt_bias, cu_seqlens, slots, use_qk_l2norm,
    num_warps: int | None = None,
    num_stages: int | None = None,
    inverse: str = PREPARE_INVERSE,
):  # fmt: skip
    """Launch 1, every chunk at once: q's and k's norm factors, gates, beta and T into run's scratch.

    q and k [T, HK, K] may be column slices of wider rows (the layer's conv output) with heads
    packed; a and b are [T, HV], or [T, HK, HV // HK] views of an interleaved projection. The
    launch options are arguments only for the kernel probe (benchmarks/probe_gdn_prefill_kernels.py);
    the backends use the defaults (`num_warps_for` the tiles, Triton's stages).
    """
    T, HK, K = q.shape
    s, bt = run.scratch, run.plan.chunk_size
    HV = s.gs.shape[1]
    a, b = a.view(T, HK, HV // HK), b.view(T, HK, HV // HK)
    if q.stride() != k.stride() or q.stride()[1:] != (K, 1):
        raise ValueError(f"q and k need one layout with packed heads: strides {q.stride()}, {k.stride()}")
    if a.stride() != b.stride() or a.stride(2) != 1:
        raise ValueError(f"a and b need one layout with packed heads: strides {a.stride()}, {b.stride()}")
    if inverse not in INVERSES:
        raise ValueError(f"run_prepare_kernel: inverse {inverse!r} is not one of {INVERSES}")
    warps = num_warps_for(bt * K, at=PREPARE_WARPS_AT) if num_warps is None else num_warps
    _prepare_kernel[(run.plan.max_chunks * HV,)](
        q=q, k=k, a=a, b=b, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens, slots=slots,
        chunk_seq=run.plan.chunk_seq, chunk_cu=run.plan.chunk_cu,
        norms=s.norms, ts=s.ts, bs=s.bs, gs=s.gs, N=slots.numel(),
        HK=HK, HV=HV, K=K, BT=bt, KP=column_piece(K),
        QK_ROW=q.stride(0), G_ROW=a.stride(0), G_KH=a.stride(1), L2NORM=use_qk_l2norm,
        EPS=L2NORM_EPS, SOFTPLUS_T=SOFTPLUS_THRESHOLD, PREC=run.prec,
        DOT_DTYPE=run.prep.dtype, DOT_PREC=run.prep.input_precision, DOUBLING=inverse == "doubling",
        **_launch_options(warps, num_stages),
    )  # fmt: skip


def run_state_kernel(
    run: ChunkedRun,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    block_v: int = STATE_BLOCK_V,
    num_warps: int = 4,
    num_stages: int | None = None,
):
    """The state recurrence, segment-parallel: reads and writes state[slots] ([num_slots, HV, V, K]
    float32, contiguous); k is the prepare's, v ([T, HV, V]) may be a column slice of wider rows
    with its heads packed.

    The recurrence over a sequence's chunks is affine in the state (S <- A_j S + B_j), so, as in
    the parallel scans of linear recurrences (Blelloch, "Prefix sums and their applications",
    1990; Martin & Cundy, "Parallelizing linear recurrent neural nets over sequence length",
    ICLR 2018), a segment of chunks is one affine map that can be built before its entering state
    is known. A sequence of more than the shape's threshold (`segment_from_of`: SEGMENT_FROM
    tokens where one sequence's heads leave the GPU idle, none where they fill it) is cut into
    segments of `SEGMENT_CHUNKS` chunks (the last one the rest); then three launches: every
    segment's map (M, D) at once, all but each sequence's last, by the chunk step itself on
    [K, V + K] columns (`_state_kernel`, TRANSFER; only where some sequence is cut); each
    sequence's segment entering states, through the maps in order (`_segment_starts_kernel`, a
    [K, K] x [K, V] product per segment; for an uncut sequence a copy of its pool state); every
    segment from its entering state at once. The delta rule's A_j = exp(g) I - kd^T w is a full [K, K], so a map costs K
    more columns, about twice a segment's serial work; the columns are independent, which makes
    the tiles free. A shorter sequence is one segment: the serial recurrence. What is cut, and
    where, follows from the sequence's own length and the model's shape, so the bits depend on
    the request only; the threshold keeps the maps' extra work to sequences long enough, and
    heads few enough, for the parallel segments to pay (benchmarks/probe_gdn_prefill_kernels.py
    times both). A call of too few tokens for any sequence to be cut is one launch, each sequence
    from its pool state (FROM_POOL; the same values as through starts, so the same bits): the
    segment plan and the entering-state copy took two of a 1k-token call's six launches, whose
    host side bounds its time.

    The tile and launch options are arguments only for the kernel probe
    (benchmarks/probe_gdn_prefill_kernels.py); the backends use the defaults.
    """
    HV, V, K = state.shape[1:]
    if v.stride()[1:] != (V, 1):
        raise ValueError(f"v needs packed heads: strides {v.stride()}")
    s = run.scratch
    bv = state_tile(V, K, block_v)
    segs, n = run.segments, slots.numel()
    args = dict(
        state=state, slots=slots, cu_seqlens=cu_seqlens, chunk_cu=run.plan.chunk_cu,
        seg_cu=None if segs is None else segs.chunk_cu, seg_seq=None if segs is None else segs.chunk_seq,
        k=k, v=v, norms=s.norms, ts=s.ts, bs=s.bs, vs=s.vs, gs=s.gs, hs=s.hs, trans=s.trans, starts=s.starts,
        N=n, HK=k.shape[1], HV=HV, K=K, V=V, BV=bv, BT=run.plan.chunk_size, QK_ROW=k.stride(0), V_ROW=v.stride(0),
        SEG=run.segment_chunks, DOT_DTYPE=run.dot.dtype, DOT_PREC=run.dot.input_precision,
        **_launch_options(num_warps, num_stages),
    )  # fmt: skip
    nv, nv_maps = V // bv, (V + K) // bv  # the V tiles of S, and of a map's [S | X]
    if segs is None:
        _state_kernel[(n * HV * nv,)](**args, NV=nv, TRANSFER=False, FROM_POOL=True)
        return
    _state_kernel[(segs.max_chunks * HV * nv_maps,)](**args, NV=nv_maps, TRANSFER=True, FROM_POOL=False)
    _segment_starts_kernel[(n * HV * nv,)](
        state=state, slots=slots, seg_cu=segs.chunk_cu, trans=s.trans, starts=s.starts,
        HV=HV, K=K, V=V, BV=bv, PREC=run.prec, num_warps=4,
    )  # fmt: skip
    _state_kernel[(segs.max_chunks * HV * nv,)](**args, NV=nv, TRANSFER=False, FROM_POOL=False)


def _output_groups(r: int, v: int, bv: int, heads: int | None, tiles: int | None) -> tuple[int, int]:
    """The output programs' grouping, fixed per shape: the given one, else OUTPUT_GROUP_HEADS value
    heads where they divide the r per key head (else 1) and the V tiles of up to OUTPUT_GROUP_VALUES."""
    if heads is None:
        heads = OUTPUT_GROUP_HEADS if r % OUTPUT_GROUP_HEADS == 0 else 1
    if tiles is None:
        tiles = max(1, min(v, OUTPUT_GROUP_VALUES) // bv)
    return heads, tiles


def run_output_kernel(
    run: ChunkedRun,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slots: torch.Tensor,
    block_v: int = OUTPUT_BLOCK_V,
    num_warps: int = OUTPUT_WARPS,
    num_stages: int | None = None,
    group_heads: int | None = None,
    group_tiles: int | None = None,
):
    """Launch 3, every chunk and V tile at once: out ([T, HV, V]) from the prepare's q and k (q
    times `scale` after its norm), run's scratch and chunk states. The tile, grouping (value heads
    of one key head, V tiles: one program each, sharing q k^T) and launch options are for the
    kernel probe, as `run_prepare_kernel`'s."""
    HV, V = out.shape[1], out.shape[2]
    HK, K = q.shape[1], q.shape[2]
    s = run.scratch
    bv = min(V, block_v)
    group_heads, group_tiles = _output_groups(HV // HK, V, bv, group_heads, group_tiles)
    if (HV // HK) % group_heads or (V // bv) % group_tiles:
        raise ValueError(
            f"run_output_kernel: group_heads {group_heads} must divide {HV // HK} value heads per "
            f"key head and group_tiles {group_tiles} the {V // bv} V tiles"
        )
    _output_kernel[(run.plan.max_chunks * (HV // group_heads) * (V // bv // group_tiles),)](
        q=q, k=k, norms=s.norms, scale=scale, vs=s.vs, gs=s.gs, hs=s.hs, out=out,
        chunk_seq=run.plan.chunk_seq, chunk_cu=run.plan.chunk_cu, cu_seqlens=cu_seqlens, slots=slots, N=slots.numel(),
        HK=HK, HV=HV, K=K, V=V, BV=bv, BT=run.plan.chunk_size, QK_ROW=q.stride(0), **grid_args("IO", out.dtype),
        DOT_DTYPE=run.dot.dtype, PREC=run.dot.input_precision, GH=group_heads, GV=group_tiles,
        **_launch_options(num_warps, num_stages),
    )  # fmt: skip


def gdn_prefill_chunked(
    q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm,
    chunk_size: int = CHUNK_SIZE,
    segment_chunks: int = SEGMENT_CHUNKS,
    segment_from: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """gdn_prefill with the chunked kernels (arguments as gdn_prefill's validate()); returns [T, HV, V].

    state ([num_slots, HV, V, K] float32, contiguous) is updated in place at `slots`. The backends
    use the default chunk and segment sizes; the tests shrink the segment to reach it on tiny shapes.
    """
    q, k, v, a, b = (x.contiguous() for x in (q, k, v, a, b))
    HK, K = q.shape[1], q.shape[2]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    run = chunked_run(cu_seqlens, out, HK, K, chunk_size, segment_chunks, segment_from)
    run_prepare_kernel(run, q, k, a, b, A_log, dt_bias, cu_seqlens, slots, use_qk_l2norm)
    run_state_kernel(run, k, v, state, slots, cu_seqlens)
    run_output_kernel(run, q, k, scale, out, cu_seqlens, slots)
    return out


def gdn_prefill_triton(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm) -> torch.Tensor:
    """The `triton` backend: chunk 64 (the reference's CHUNK_SIZE) for every batch (batch invariant)."""
    return gdn_prefill_chunked(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm)


def gdn_prefill_triton_chunk_by_batch(
    q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm
) -> torch.Tensor:
    """CONTROL (`triton-chunk-by-batch`): the same kernels with the chunk size AITER's fused GDN prefill
    picks for this (tokens, batch) (gdn_lab.rules.aiter_fused_gdn_prefill), so a sequence's bits
    follow its batch wherever the rule changes the chunk."""
    from gdn_lab.rules.aiter_fused_gdn_prefill import control_chunk_size

    chunk = control_chunk_size(q.shape[0], slots.numel())
    return gdn_prefill_chunked(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm, chunk)
