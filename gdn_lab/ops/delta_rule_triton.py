"""The chunked gated delta rule in Triton, batch-invariant by construction (gdn_prefill, and the fused layer).

Three launches split the work as fla's chunk_gated_delta_rule and AITER's fused prefill do, so
that only the state recurrence walks a sequence serially:

1. `_prepare_kernel`, one program per (chunk, value head), all chunks at once: the inputs (plain
   q/k/v, or the fused layer's causal conv1d of the interleaved projection + SiLU), the L2 norm,
   the gates, the chunk's cumulative log decay G, A = strict_tril(beta_i (k_i . k_j) exp(G_i - G_j)),
   T = (I + A)^-1 by forward substitution, w = T (beta exp(G) k) and u = T (beta v), into fp32
   scratch.
2. `_state_kernel`, one program per (sequence, value head, V tile), chunk after chunk: it stores
   the state entering each chunk, turns u into v_new = u - w S (S as [K, V]), updates
   S <- exp(G_last) S + (k exp(G_last - G))^T v_new and writes the final state to the pool.
3. `_output_kernel`, one program per (chunk, group of value heads): o = exp(G) (q S_c) +
   (tril(q k^T exp(G_i - G_j))) v_new, then either the plain output or the fused layer's epilogue
   (gated RMSNorm, group-128 fp8, conv state update).

Why the bits cannot follow the batch: chunks start at each sequence's first token, a program reads
only its own sequence, and the chunk size, tiles, num_warps and dot precision are fixed per shape
and dtype, never per batch; there are no atomics and no reduction split across programs. The batch
moves where a chunk's scratch lives, not what is computed. The controls
(`*_by_batch` in the wrappers) change exactly one thing, the chunk size, following AITER's rule.

Numerics: everything is float32; dots take float32 operands ("ieee" for float32 inputs, TF32 for
bf16/fp16 inputs on GPUs that have it). Values that must land on a narrower grid (the conv output
in the fused layer, outputs, fp8) are rounded explicitly to nearest-even in float32 first
(`_round_rne`), so the final cast is exact on every backend: Triton 3.9's interpreter truncates
fp32 -> bf16 and drops the carry in fp32 -> fp8 (e.g. 31.86 -> 16 instead of 32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gdn_lab.ops.triton_support import interpreting

CHUNK_SIZE = 64  # the batch-invariant kernels' chunk, as fla's chunk_gated_delta_rule
L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0  # torch's softplus default, as fla and AITER use
MAX_HEAD_DIM = 256  # the [K, V] state tile of the output kernel lives in registers
FP8_GROUP = 128


@dataclass(frozen=True)
class Grid:
    """Where a dtype's values lie, for `_round_rne`: mantissa bits, smallest normal, subnormal rounder.

    Attributes:
        mant: explicit mantissa bits (23 for float32: no rounding).
        tiny: the smallest normal magnitude (2 ** emin).
        magic: 2 ** (emin - mant + 23): adding and subtracting it rounds |x| < tiny to the
            subnormal spacing in float32.
        max: the largest finite value.
    """

    mant: int
    tiny: float
    magic: float
    max: float


def grid_of(dtype: torch.dtype) -> Grid:
    """The rounding grid of a float dtype (bf16, fp16, fp32, float8_e4m3fn, float8_e4m3fnuz)."""
    info = torch.finfo(dtype)
    mant = round(-math.log2(info.eps))
    emin = round(math.log2(info.tiny))
    return Grid(mant, float(info.tiny), float(2.0 ** (emin - mant + 23)), float(info.max))


def dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    """'ieee' for float32 inputs (fp32 end to end); 'tf32' for half inputs where the GPU has TF32."""
    if dtype == torch.float32 or device.type != "cuda" or interpreting():
        return "ieee"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return "tf32" if arch == "gfx942" else "ieee"  # Triton offers TF32 (xf32) on AMD only on gfx942
    return "tf32"


# --- device helpers ----------------------------------------------------------------------------


@triton.jit
def _round_rne(x, MANT: tl.constexpr, TINY: tl.constexpr, MAGIC: tl.constexpr):
    """x rounded to the nearest value with MANT mantissa bits (ties to even), still in float32."""
    if MANT < 23:
        SHIFT: tl.constexpr = 23 - MANT
        ax = tl.abs(x)
        bits = ax.to(tl.int32, bitcast=True)
        # round-half-even on the bits: the carry moves into the exponent when the mantissa overflows
        bits = ((bits + ((1 << (SHIFT - 1)) - 1) + ((bits >> SHIFT) & 1)) >> SHIFT) << SHIFT
        normal = bits.to(tl.float32, bitcast=True)
        subnormal = (ax + MAGIC) - MAGIC  # the float32 add rounds to the subnormal spacing
        r = tl.where(ax < TINY, subnormal, normal)
        x = tl.where(x < 0, -r, r)
    return x


@triton.jit
def _l2norm_rows(x, EPS: tl.constexpr):
    return x * tl.math.rsqrt(tl.sum(x * x, 1) + EPS)[:, None]


@triton.jit
def _unit_lower_inverse(A, BT: tl.constexpr):
    """(I + A)^-1 for a strictly lower-triangular [BT, BT] A, by forward substitution row by row.

    M holds -A; after step i its row i is row i of (I + A)^-1 - I, built from the rows above it.
    """
    o = tl.arange(0, BT)
    M = -A
    for i in range(1, BT):
        row = tl.sum(tl.where(o[:, None] == i, M, 0.0), 0)
        row = row + tl.sum(row[:, None] * M, 0)
        M = tl.where(o[:, None] == i, row[None, :], M)
    return M + tl.where(o[:, None] == o[None, :], 1.0, 0.0)


@triton.jit
def _conv_silu(
    qkvz,
    conv_state,
    conv_weight,
    conv_bias,
    bos,
    p,
    m_t,
    state_base,
    hist_len,
    col,
    ch,
    ROW: tl.constexpr,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BT: tl.constexpr,
    D: tl.constexpr,
):
    """SiLU(causal depthwise conv) at sequence positions p [BT] for the channels ch [D] (qkvz columns col).

    Tap w reads position p - (W - 1 - w). Before the sequence start it reads the slot's conv history
    entry p + w where p + w < hist_len: the caller passes W - 1 for a sequence's first chunk when it
    has an initial state, else 0. The history taps are added in a second pass that only such a
    chunk runs, so the other chunks carry no history addressing (it cost registers and spills).
    """
    acc = tl.zeros([BT, D], dtype=tl.float32)
    for w in tl.static_range(W):
        src = p - (W - 1 - w)
        x = tl.load(qkvz + (bos + src)[:, None] * ROW + col[None, :], mask=(m_t & (src >= 0))[:, None], other=0.0)
        acc += x.to(tl.float32) * tl.load(conv_weight + ch * W + w).to(tl.float32)[None, :]
    if hist_len > 0:
        for w in tl.static_range(W - 1):
            hist = tl.load(
                conv_state + state_base + ch[None, :] * (W - 1) + (p + w)[:, None],
                mask=(m_t & (p + w < hist_len))[:, None],
                other=0.0,
            )
            acc += hist.to(tl.float32) * tl.load(conv_weight + ch * W + w).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(conv_bias + ch).to(tl.float32)[None, :]
    return acc * tl.sigmoid(acc)


@triton.jit
def _conv_state_update(
    qkvz, conv_state, bos, length, state_base, hist_len, col, ch, ROW: tl.constexpr, W: tl.constexpr, WP: tl.constexpr
):
    """The slot's new conv history: the last W - 1 inputs of [old history (or zeros) | sequence] (WP >= W - 1).

    hist_len is W - 1 when the old history counts (has_initial_state), else 0.
    """
    o_i = tl.arange(0, WP)
    m_i = o_i < W - 1
    src = length + o_i - (W - 1)  # sequence position of entry i; negative: an old history entry
    x = tl.load(qkvz + (bos + src)[None, :] * ROW + col[:, None], mask=(m_i & (src >= 0))[None, :], other=0.0)
    old = tl.load(
        conv_state + state_base + ch[:, None] * (W - 1) + (o_i + length)[None, :],
        mask=(m_i & (src < 0) & (o_i + length < hist_len))[None, :],
        other=0.0,
    )
    new = tl.where((src >= 0)[None, :], x.to(tl.float32), old.to(tl.float32))
    tl.debug_barrier()  # every lane has read the old history before any lane overwrites it
    p_state = conv_state + state_base + ch[:, None] * (W - 1) + o_i[None, :]
    tl.store(p_state, new.to(p_state.dtype.element_ty), mask=m_i[None, :])


# --- kernels -----------------------------------------------------------------------------------


@triton.jit
def _input_tile(
    x,
    qkvz,
    conv_state,
    conv_weight,
    conv_bias,
    bos,
    p,
    m_t,
    state_base,
    hist_len,
    x_col,
    x_row: tl.constexpr,
    col,
    ch,
    ROW: tl.constexpr,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FUSED: tl.constexpr,
    BT: tl.constexpr,
    D: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
):
    """One [BT, D] float32 tile of q, k or v: columns x_col of the plain input x ([T, x_row]), or
    (FUSED) the conv of the projection's columns col (conv channels ch), rounded to the input dtype."""
    if FUSED:
        t = _conv_silu(
            qkvz, conv_state, conv_weight, conv_bias, bos, p, m_t, state_base, hist_len, col, ch, ROW, W, HAS_BIAS, BT, D,
        )  # fmt: skip
        # the unfused chain stores the conv output in the input dtype; so does this kernel (parity)
        t = _round_rne(t, IO_MANT, IO_TINY, IO_MAGIC)
    else:
        t = tl.load(x + (bos + p)[:, None] * x_row + x_col[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
    return t


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _prepare_kernel(
    q,
    k,
    v,
    a,
    b,
    qkvz,
    ba,
    conv_state,
    conv_weight,
    conv_bias,
    has_initial_state,
    A_log,
    dt_bias,
    cu_seqlens,
    slots,
    chunk_seq,
    chunk_cu,
    qs,
    ks,
    ws,
    us,
    gs,
    scale,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    W: tl.constexpr,
    FUSED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    L2NORM: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
    PREC: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    n = tl.load(chunk_seq + i_c)
    if n >= N:  # past the last chunk (the grid is an upper bound)
        return
    slot = tl.load(slots + n)
    if slot < 0:  # padding: nothing to prepare
        return
    R: tl.constexpr = HV // HK
    i_kh = i_h // R
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    p_first = (i_c - tl.load(chunk_cu + n)).to(tl.int64) * BT
    p = p_first + tl.arange(0, BT)  # positions in the sequence
    m_t = p < eos - bos
    rows = bos + p
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    # Qwen3-Next's interleaved projection: per key head [q | k | v (R heads) | z (R heads)]; the
    # conv channels are [q of every key head | k | v of every value head]
    ROW: tl.constexpr = HK * (2 * K + 2 * R * V)
    base = i_kh * (2 * K + 2 * R * V)
    if FUSED:
        state_base = slot.to(tl.int64) * (2 * HK * K + HV * V) * (W - 1)
        # the slot's conv history reaches only the first chunk (and a scalar boolean cannot mask a
        # block in the interpreter: a history length stands in)
        hist_len = tl.where(p_first == 0, tl.where(tl.load(has_initial_state + n) != 0, W - 1, 0), 0)
        ba_col = i_kh * 2 * R + i_h % R  # per key head [b (R) | a (R)]
        b_b = tl.load(ba + rows * (2 * HV) + ba_col, mask=m_t, other=0.0).to(tl.float32)
        b_a = tl.load(ba + rows * (2 * HV) + ba_col + R, mask=m_t, other=0.0).to(tl.float32)
    else:
        state_base = 0
        hist_len = 0
        b_a = tl.load(a + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
        b_b = tl.load(b + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
    # gates; rows past the sequence get g = 0 and beta = 0, so they change nothing
    x = b_a + tl.load(dt_bias + i_h).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    b_g = tl.where(m_t, -tl.exp(tl.load(A_log + i_h).to(tl.float32)) * softplus, 0.0)
    b_beta = tl.where(m_t, tl.sigmoid(b_b), 0.0)
    b_G = tl.cumsum(b_g, 0)
    tl.store(gs + rows * HV + i_h, b_G, mask=m_t)

    # tiles are made in the order they are consumed, so that few are alive at once
    b_k = _input_tile(
        k, qkvz, conv_state, conv_weight, conv_bias, bos, p, m_t, state_base, hist_len, i_kh * K + o_k, HK * K,
        base + K + o_k, HK * K + i_kh * K + o_k, ROW, W, HAS_BIAS, FUSED, BT, K, IO_MANT, IO_TINY, IO_MAGIC,
    )  # fmt: skip
    if L2NORM:
        b_k = _l2norm_rows(b_k, 1e-6)
    if i_h % R == 0:  # one value head per key head writes the shared normalized q and k
        p_qk = rows[:, None] * (HK * K) + i_kh * K + o_k[None, :]
        tl.store(ks + p_qk, b_k, mask=m_t[:, None])
        b_q = _input_tile(
            q, qkvz, conv_state, conv_weight, conv_bias, bos, p, m_t, state_base, hist_len, i_kh * K + o_k, HK * K,
            base + o_k, i_kh * K + o_k, ROW, W, HAS_BIAS, FUSED, BT, K, IO_MANT, IO_TINY, IO_MAGIC,
        )  # fmt: skip
        if L2NORM:
            b_q = _l2norm_rows(b_q, 1e-6)
        tl.store(qs + p_qk, b_q * scale, mask=m_t[:, None])

    o_t = tl.arange(0, BT)
    strict = o_t[:, None] > o_t[None, :]
    decay = tl.exp(tl.where(strict, b_G[:, None] - b_G[None, :], 0.0))
    kk = tl.dot(b_k, tl.trans(b_k), input_precision=PREC)
    b_T = _unit_lower_inverse(tl.where(strict, b_beta[:, None] * kk * decay, 0.0), BT)
    b_w = tl.dot(b_T, b_k * (b_beta * tl.exp(b_G))[:, None], input_precision=PREC)
    tl.store(ws + rows[:, None] * (HV * K) + i_h * K + o_k[None, :], b_w, mask=m_t[:, None])
    b_v = _input_tile(
        v, qkvz, conv_state, conv_weight, conv_bias, bos, p, m_t, state_base, hist_len, i_h * V + o_v, HV * V,
        base + 2 * K + (i_h % R) * V + o_v, 2 * HK * K + i_h * V + o_v, ROW, W, HAS_BIAS, FUSED, BT, V,
        IO_MANT, IO_TINY, IO_MAGIC,
    )  # fmt: skip
    b_u = tl.dot(b_T, b_v * b_beta[:, None], input_precision=PREC)
    tl.store(us + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], b_u, mask=m_t[:, None])


@triton.jit
def _state_kernel(
    state,
    slots,
    cu_seqlens,
    chunk_cu,
    ks,
    ws,
    us,
    gs,
    hs,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    PREC: tl.constexpr,
):
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i_n)
    if slot < 0:
        return
    R: tl.constexpr = HV // HK
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    c0 = tl.load(chunk_cu + i_n).to(tl.int64)
    n_chunks = tl.load(chunk_cu + i_n + 1).to(tl.int64) - c0
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    # S as [K, BV]: the transpose of the pool's [V, K] rows this program owns
    p_state = state + (slot.to(tl.int64) * HV + i_h) * (V * K) + o_v[None, :] * K + o_k[:, None]
    b_S = tl.load(p_state)
    for j in range(n_chunks):
        rows = bos + j * BT + o_t
        m_t = rows < eos
        p_hs = hs + ((c0 + j) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :]
        tl.store(p_hs, b_S)  # the state entering chunk j, for the output kernel
        b_w = tl.load(ws + rows[:, None] * (HV * K) + i_h * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        p_u = us + rows[:, None] * (HV * V) + i_h * V + o_v[None, :]
        b_vn = tl.load(p_u, mask=m_t[:, None], other=0.0) - tl.dot(b_w, b_S, input_precision=PREC)
        tl.store(p_u, b_vn, mask=m_t[:, None])  # u becomes v_new in place
        last = tl.minimum(bos + j * BT + BT, eos) - 1
        g_last = tl.load(gs + last * HV + i_h)
        b_G = tl.load(gs + rows * HV + i_h, mask=m_t, other=0.0)
        b_k = tl.load(ks + rows[:, None] * (HK * K) + (i_h // R) * K + o_k[None, :], mask=m_t[:, None], other=0.0)
        b_kd = b_k * tl.exp(g_last - b_G)[:, None]
        b_S = b_S * tl.exp(g_last) + tl.dot(tl.trans(b_kd), b_vn, input_precision=PREC)
    tl.store(p_state, b_S)


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _output_kernel(
    qs,
    ks,
    us,
    gs,
    hs,
    out,
    chunk_seq,
    chunk_cu,
    cu_seqlens,
    slots,
    qkvz,
    norm_weight,
    conv_state,
    has_initial_state,
    quantized,
    scales,
    eps,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    HPG: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    FUSED: tl.constexpr,
    QUANT: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
    F8_MANT: tl.constexpr,
    F8_TINY: tl.constexpr,
    F8_MAGIC: tl.constexpr,
    F8_MAX: tl.constexpr,
    PREC: tl.constexpr,
):
    i_c, i_g = tl.program_id(0), tl.program_id(1)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    slot = tl.load(slots + n)
    live = slot >= 0  # padding rows get zeros
    R: tl.constexpr = HV // HK
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    length = tl.load(cu_seqlens + n + 1).to(tl.int64) - bos
    p = (i_c - tl.load(chunk_cu + n)).to(tl.int64) * BT + tl.arange(0, BT)
    m_t = p < length
    m_live = p < tl.where(live, length, 0)  # (a scalar boolean cannot mask a block in the interpreter)
    rows = bos + p
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    incl = o_t[:, None] >= o_t[None, :]
    for i_hh in tl.static_range(HPG):
        i_h = i_g * HPG + i_hh
        i_kh = i_h // R
        p_qk = rows[:, None] * (HK * K) + i_kh * K + o_k[None, :]
        b_q = tl.load(qs + p_qk, mask=m_live[:, None], other=0.0)
        b_k = tl.load(ks + p_qk, mask=m_live[:, None], other=0.0)
        b_G = tl.load(gs + rows * HV + i_h, mask=m_live, other=0.0)
        b_vn = tl.load(us + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], mask=m_live[:, None], other=0.0)
        b_S = tl.load(hs + (i_c.to(tl.int64) * HV + i_h) * (K * V) + o_k[:, None] * V + o_v[None, :])
        b_S = tl.where(live, b_S, 0.0)  # a padding sequence's chunk states were never written
        b_A = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
        # G_i - G_j <= 0 for i >= j inside the sequence; the minimum keeps rows past its end (G = 0) finite
        b_A = tl.where(incl, b_A * tl.exp(tl.minimum(b_G[:, None] - b_G[None, :], 0.0)), 0.0)
        b_o = tl.dot(b_q, b_S, input_precision=PREC) * tl.exp(b_G)[:, None] + tl.dot(b_A, b_vn, input_precision=PREC)
        if FUSED:
            ROW: tl.constexpr = HK * (2 * K + 2 * R * V)
            base = i_kh * (2 * K + 2 * R * V)
            z_col = base + 2 * K + R * V + (i_h % R) * V + o_v
            b_z = tl.load(qkvz + rows[:, None] * ROW + z_col[None, :], mask=m_live[:, None], other=0.0).to(tl.float32)
            rstd = tl.math.rsqrt(tl.sum(b_o * b_o, 1) / V + eps)
            b_o = tl.load(norm_weight + o_v).to(tl.float32)[None, :] * (b_o * rstd[:, None]) * (b_z * tl.sigmoid(b_z))
            if tl.where(live, i_c, -1) == tl.load(chunk_cu + n + 1) - 1:  # a live sequence's last chunk
                CONV_DIM: tl.constexpr = 2 * HK * K + HV * V
                state_base = slot.to(tl.int64) * CONV_DIM * (W - 1)
                hist_len = tl.where(tl.load(has_initial_state + n) != 0, W - 1, 0)
                _conv_state_update(
                    qkvz, conv_state, bos, length, state_base, hist_len,
                    base + 2 * K + (i_h % R) * V + o_v, 2 * HK * K + i_h * V + o_v, ROW, W, WP,
                )  # fmt: skip
                if i_h % R == 0:
                    _conv_state_update(
                        qkvz, conv_state, bos, length, state_base, hist_len,
                        base + o_k, i_kh * K + o_k, ROW, W, WP,
                    )  # fmt: skip
                    _conv_state_update(
                        qkvz, conv_state, bos, length, state_base, hist_len,
                        base + K + o_k, HK * K + i_kh * K + o_k, ROW, W, WP,
                    )  # fmt: skip
        b_o = _round_rne(b_o, IO_MANT, IO_TINY, IO_MAGIC)
        tl.store(out + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], b_o, mask=m_t[:, None])
    if QUANT:
        # group-128 fp8 of the stored (rounded) rows, as the unfused chain quantizes its output:
        # this program's HPG heads hold NG whole groups
        NG: tl.constexpr = HPG * V // 128
        tl.debug_barrier()  # the rows just stored by every lane are read back below
        o_c = tl.arange(0, HPG * V)
        p_x = rows[:, None] * (HV * V) + i_g * (HPG * V) + o_c[None, :]
        b_x = tl.load(out + p_x, mask=m_t[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        b_x = tl.reshape(b_x, [BT, NG, 128])
        b_s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(b_x), 2), 1e-12), F8_MAX)
        b_y = tl.math.div_rn(b_x, b_s[:, :, None])
        b_y = _round_rne(tl.minimum(tl.maximum(b_y, -F8_MAX), F8_MAX), F8_MANT, F8_TINY, F8_MAGIC)
        b_y = tl.reshape(b_y, [BT, HPG * V])
        tl.store(quantized + p_x, b_y.to(quantized.dtype.element_ty), mask=m_t[:, None])
        o_g = tl.arange(0, NG)
        p_s = scales + rows[:, None] * (HV * V // 128) + i_g * NG + o_g[None, :]
        tl.store(p_s, b_s, mask=m_t[:, None])


# --- host --------------------------------------------------------------------------------------


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


def plan_chunks(cu_seqlens: torch.Tensor, total_tokens: int, chunk_size: int) -> ChunkPlan:
    """Chunks of `chunk_size` tokens starting at each sequence's first token."""
    n = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    chunk_cu = torch.zeros(n + 1, dtype=torch.int64, device=cu_seqlens.device)
    chunk_cu[1:] = torch.cumsum((lengths + chunk_size - 1) // chunk_size, 0)
    max_chunks = total_tokens // chunk_size + n
    chunk_ids = torch.arange(max_chunks, dtype=torch.int64, device=cu_seqlens.device)
    chunk_seq = torch.searchsorted(chunk_cu[1:].contiguous(), chunk_ids, right=True)
    return ChunkPlan(chunk_size, max_chunks, chunk_cu.to(torch.int32), chunk_seq.to(torch.int32))


@dataclass(frozen=True)
class Scratch:
    """float32 intermediates between the three launches (token-major, so chunks need no padding).

    Attributes:
        qs, ks: [T, HK, K] normalized q (scaled) and k.
        ws: [T, HV, K]; us: [T, HV, V] (u, then v_new in place); gs: [T, HV] cumulative log decay.
        hs: [max_chunks, HV, K, V] the state entering each chunk.
    """

    qs: torch.Tensor
    ks: torch.Tensor
    ws: torch.Tensor
    us: torch.Tensor
    gs: torch.Tensor
    hs: torch.Tensor


def _scratch(T: int, HK: int, HV: int, K: int, V: int, max_chunks: int, device) -> Scratch:
    f32 = {"dtype": torch.float32, "device": device}
    return Scratch(
        torch.empty(T, HK, K, **f32),
        torch.empty(T, HK, K, **f32),
        torch.empty(T, HV, K, **f32),
        torch.empty(T, HV, V, **f32),
        torch.empty(T, HV, **f32),
        torch.empty(max_chunks, HV, K, V, **f32),
    )


def _grid_args(prefix: str, dtype: torch.dtype) -> dict[str, float | int]:
    g = grid_of(dtype)
    return {f"{prefix}_MANT": g.mant, f"{prefix}_TINY": g.tiny, f"{prefix}_MAGIC": g.magic}


def _num_warps(*tile_elems: int) -> int:
    """A fixed warp count per shape (never per batch): 8 once a tile has 8192+ fp32 elements."""
    return 8 if max(tile_elems) >= 8192 else 4


@dataclass(frozen=True)
class LayerInputs:
    """The fused layer's extra inputs (see gdn_layer_prefill); None fields are absent."""

    qkvz: torch.Tensor
    ba: torch.Tensor
    conv_state: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    has_initial_state: torch.Tensor
    norm_weight: torch.Tensor
    eps: float
    quantized: torch.Tensor | None
    scales: torch.Tensor | None


def run_chunked(
    *,
    q: torch.Tensor | None,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    layer: LayerInputs | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    out: torch.Tensor,
    num_k_heads: int,
    scale: float,
    use_qk_l2norm: bool,
    chunk_size: int,
) -> None:
    """Launch the three kernels for gdn_prefill (q/k/v/a/b given) or the fused layer (`layer` given).

    Args:
        q, k, v, a, b: gdn_prefill's inputs (contiguous), or None for the fused layer.
        layer: the fused layer's inputs, or None for gdn_prefill.
        A_log, dt_bias: [HV]. cu_seqlens: int32 [N+1]. slots: int32 [N].
        state: [num_slots, HV, V, K] float32, contiguous, updated in place.
        out: [T, HV, V] in the input dtype, written (gdn_prefill's output or the layer's normalized).
        num_k_heads: HK.
        scale: the query scale. use_qk_l2norm: L2-normalize q and k.
        chunk_size: BT (32 or 64; 64 for the batch-invariant backends).
    """
    T, HV, V = out.shape
    K = state.shape[3]
    HK, N = num_k_heads, slots.numel()
    fused = layer is not None
    device = out.device
    plan = plan_chunks(cu_seqlens, T, chunk_size)
    s = _scratch(T, HK, HV, K, V, plan.max_chunks, device)
    prec = dot_precision(out.dtype, device)
    io = _grid_args("IO", out.dtype)
    quant = fused and layer.quantized is not None
    width = layer.conv_weight.shape[1] if fused else 2
    f8 = layer.quantized.dtype if quant else torch.float8_e4m3fn
    _prepare_kernel[(plan.max_chunks, HV)](
        q=q, k=k, v=v, a=a, b=b,
        qkvz=layer.qkvz if fused else None, ba=layer.ba if fused else None,
        conv_state=layer.conv_state if fused else None, conv_weight=layer.conv_weight if fused else None,
        conv_bias=layer.conv_bias if fused else None,
        has_initial_state=layer.has_initial_state if fused else None,
        A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens, slots=slots,
        chunk_seq=plan.chunk_seq, chunk_cu=plan.chunk_cu,
        qs=s.qs, ks=s.ks, ws=s.ws, us=s.us, gs=s.gs, scale=scale, N=N,
        HK=HK, HV=HV, K=K, V=V, BT=chunk_size, W=width, FUSED=fused,
        HAS_BIAS=fused and layer.conv_bias is not None, L2NORM=use_qk_l2norm, **io, PREC=prec,
        num_warps=_num_warps(chunk_size * K, chunk_size * V),
    )  # fmt: skip
    block_v = min(V, 32)
    _state_kernel[(N, HV, V // block_v)](
        state=state, slots=slots, cu_seqlens=cu_seqlens, chunk_cu=plan.chunk_cu,
        ks=s.ks, ws=s.ws, us=s.us, gs=s.gs, hs=s.hs,
        HK=HK, HV=HV, K=K, V=V, BV=block_v, BT=chunk_size, PREC=prec, num_warps=4,
    )  # fmt: skip
    heads_per_group = max(1, FP8_GROUP // V) if quant else 1
    f8_grid = grid_of(f8)
    _output_kernel[(plan.max_chunks, HV // heads_per_group)](
        qs=s.qs, ks=s.ks, us=s.us, gs=s.gs, hs=s.hs, out=out,
        chunk_seq=plan.chunk_seq, chunk_cu=plan.chunk_cu, cu_seqlens=cu_seqlens, slots=slots,
        qkvz=layer.qkvz if fused else None, norm_weight=layer.norm_weight if fused else None,
        conv_state=layer.conv_state if fused else None,
        has_initial_state=layer.has_initial_state if fused else None,
        quantized=layer.quantized if quant else None, scales=layer.scales if quant else None,
        eps=layer.eps if fused else 0.0, N=N,
        HK=HK, HV=HV, K=K, V=V, BT=chunk_size, HPG=heads_per_group, W=width,
        WP=triton.next_power_of_2(width - 1), FUSED=fused, QUANT=quant, **io,
        F8_MANT=f8_grid.mant, F8_TINY=f8_grid.tiny, F8_MAGIC=f8_grid.magic, F8_MAX=f8_grid.max, PREC=prec,
        num_warps=_num_warps(K * V),
    )  # fmt: skip


def gdn_prefill_chunked(
    q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm, chunk_size: int = CHUNK_SIZE
) -> torch.Tensor:
    """gdn_prefill with the chunked kernels (arguments as gdn_prefill's validate()); returns [T, HV, V]."""
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    run_chunked(
        q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), a=a.contiguous(), b=b.contiguous(), layer=None,
        A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens, state=state, slots=slots, out=out,
        num_k_heads=q.shape[1], scale=scale, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
    )  # fmt: skip
    return out


def gdn_prefill_triton(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm) -> torch.Tensor:
    """The `triton` backend: chunk 64 for every batch (batch invariant)."""
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
