"""gdn_layer_prefill in Triton: the whole GDN prefill chain, batch invariant.

gdn_prefill's chunked delta rule (`gdn_lab.ops.delta_rule_triton`: its prepare, state and output
launches) between the layer's own first and last launches:

1. `_conv_kernel` (per chunk and block of conv channels): causal conv1d of the interleaved
   projection with the slot's conv history (zeros where has_initial_state is False) + SiLU
   (`_conv_silu_rows`; `_conv_silu_tile` under the interpreter), stored in the input dtype as
   [q of every key head | k | v of every value head];
2. `run_prepare_kernel` on column views of that output and of the interleaved b/a: gates, L2 norm
   and the chunk factors; `run_state_kernel` (reading v's column view): reads and writes the
   delta-state slot; `run_output_kernel`: the delta rule's output in float32, over its v_new
   scratch where that is float32;
3. `_layer_norm_kernel` (per chunk and value head, or per group of heads sharing an fp8 group):
   gated RMSNorm with z, the store in the input dtype, group-128 fp8 with float32 scales, and, in
   each sequence's last chunk, the conv-state update (`_conv_state_update`, after every launch-1
   read of the old history).

Before, the conv ran inside the prepare (recomputed per value head, four taps per tile) and the
norm inside an output kernel of whole value rows: at 65536 tokens in 4 sequences on the H200 those
two launches took 2065 and 1258 us against gdn_prefill's 864 and 786 (torch.profiler;
data/bench/h200/README.md).

Rounding choice: the conv output is rounded to the input dtype before the delta rule, exactly as
the unfused chain stores it between its conv and delta-rule kernels. Keeping it in float32 would
be slightly more accurate, but then the fused kernel would differ from the chain it replaces by
that rounding (about 2^-9 relative in bf16) on every token; rounding keeps the parity measurement
about the delta-rule arithmetic alone. Everything after the conv stays float32 until the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_lab.ops.delta_rule import CHUNK_SIZE
from gdn_lab.ops.delta_rule_triton import (
    SEGMENT_CHUNKS,
    chunk_rows,
    chunked_run,
    run_output_kernel,
    run_prepare_kernel,
    run_state_kernel,
)
from gdn_lab.ops.triton_common import grid_args, grid_of, pow2_at_least, round_rne
from gdn_lab.ops.triton_support import interpreting
from gdn_lab.quant import AMAX_FLOOR, FP8_GROUP

# --- the layer's stages ------------------------------------------------------------------------


@triton.jit
def _conv_silu_tile(
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
    """SiLU(causal depthwise conv) at sequence positions p [BT] for the channels ch [D] (qkvz columns col),
    as one tile: each tap a shifted load of the whole tile (the interpreter's form, `_conv_kernel`).

    Tap w reads position p - (W - 1 - w). Before the sequence start it reads the slot's conv history
    entry p + w where p + w < hist_len: the caller passes W - 1 for a sequence's first chunk when it
    has an initial state, else 0. The history taps are added in a second pass that only such a
    chunk runs (`_conv_silu_rows` adds the same terms in the same order).
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
def _conv_silu_rows(
    qkvz,
    conv_state,
    conv_weight,
    conv_bias,
    mixed,
    bos,
    length,
    p_first,
    state_base,
    hist_len,
    col,
    ch,
    ROW: tl.constexpr,
    CONV_DIM: tl.constexpr,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
):
    """`_conv_silu_tile`'s values, rounded and stored one row at a time (the compiled form, `_conv_kernel`).

    Each input row is read once into a window of the last W rows (a tuple: the rows unrolled), so a
    program holds W vectors where the tile form holds W shifted tiles (48 registers in an sm_90
    compile, against the tile form's 188 on the H200) and the launch moves 2.1x the bytes per
    second at 65536 tokens (data/bench/h200/README.md). Every output element sums the same terms
    in the same order as the tile form: the W taps (zeros before the sequence start), then in a
    chunk with history the W - 1 history taps (zeros past its end), the bias, SiLU, the rounding:
    the same bits (tests/ops/gdn_layer_prefill).
    """
    zero = tl.zeros([BC], dtype=tl.int64)  # positions as vectors: the interpreter masks no block with a scalar
    wts = ()
    for w in tl.static_range(W):
        wts = wts + (tl.load(conv_weight + ch * W + w).to(tl.float32),)
    if HAS_BIAS:
        bias = tl.load(conv_bias + ch).to(tl.float32)
    win = ()
    for j in tl.static_range(W - 1):
        src = zero + (p_first - (W - 1) + j)
        win = win + (tl.load(qkvz + (bos + src) * ROW + col, mask=src >= 0, other=0.0).to(tl.float32),)
    for r in tl.static_range(BT):
        p = zero + (p_first + r)
        m = p < length
        win = win + (tl.load(qkvz + (bos + p) * ROW + col, mask=m, other=0.0).to(tl.float32),)
        acc = tl.zeros([BC], dtype=tl.float32)
        for w in tl.static_range(W):
            acc += win[r + w] * wts[w]
        if hist_len > 0:
            for w in tl.static_range(W - 1):
                if r + w < W - 1:
                    acc += tl.load(conv_state + state_base + ch * (W - 1) + (r + w)).to(tl.float32) * wts[w]
                else:  # the tile form's masked tap: it can turn a -0.0 sum into +0.0
                    acc += tl.zeros([BC], dtype=tl.float32) * wts[w]
        if HAS_BIAS:
            acc += bias
        y = round_rne(acc * tl.sigmoid(acc), IO_MANT, IO_TINY, IO_MAGIC)
        p_x = mixed + (bos + p) * CONV_DIM + ch
        tl.store(p_x, y.to(p_x.dtype.element_ty), mask=m)


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


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _conv_kernel(
    qkvz,
    conv_state,
    conv_weight,
    conv_bias,
    has_initial_state,
    cu_seqlens,
    slots,
    chunk_seq,
    chunk_cu,
    mixed,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    D: tl.constexpr,
    BC: tl.constexpr,
    BT: tl.constexpr,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
):
    """One program per (chunk, BC conv channels): the conv output [q of every key head | k | v of
    every value head] of the chunk's rows in the input dtype, as the unfused chain stores it. BC
    divides D, so a block lies in one head. ROWS: a row at a time (`_conv_silu_rows`, compiled),
    else as one tile (`_conv_silu_tile`, the interpreter: its cost is per operation, and the row
    form runs BT times as many); the same bits."""
    i_c, i_b = tl.program_id(0), tl.program_id(1)
    n = tl.load(chunk_seq + i_c)
    if n >= N:  # past the last chunk (the grid is an upper bound)
        return
    slot = tl.load(slots + n)
    if slot < 0:  # padding: its rows are never read
        return
    R: tl.constexpr = HV // HK
    # Qwen3-Next's interleaved projection: per key head [q | k | v (R heads) | z (R heads)]
    HEAD: tl.constexpr = 2 * D + 2 * R * D
    CONV_DIM: tl.constexpr = 2 * HK * D + HV * D
    bos, length, p_first, p, m_t, rows = chunk_rows(i_c, n, cu_seqlens, chunk_cu, BT)
    c0 = i_b * BC
    i_v = tl.maximum(c0 - 2 * HK * D, 0) // D  # the value head of a v block
    col0 = tl.where(
        c0 < HK * D,
        (c0 // D) * HEAD + c0 % D,
        tl.where(
            c0 < 2 * HK * D,
            ((c0 - HK * D) // D) * HEAD + D + c0 % D,
            (i_v // R) * HEAD + 2 * D + (i_v % R) * D + c0 % D,
        ),
    )
    o_c = tl.arange(0, BC)
    # the slot's conv history reaches only the first chunk (and a scalar boolean cannot mask a
    # block in the interpreter: a history length stands in)
    hist_len = tl.where(p_first == 0, tl.where(tl.load(has_initial_state + n) != 0, W - 1, 0), 0)
    state_base = slot.to(tl.int64) * CONV_DIM * (W - 1)
    if ROWS:
        _conv_silu_rows(
            qkvz, conv_state, conv_weight, conv_bias, mixed, bos, length, p_first, state_base, hist_len, col0 + o_c,
            c0 + o_c, HK * HEAD, CONV_DIM, W, HAS_BIAS, BT, BC, IO_MANT, IO_TINY, IO_MAGIC,
        )  # fmt: skip
    else:
        b_x = _conv_silu_tile(
            qkvz, conv_state, conv_weight, conv_bias, bos, p, m_t, state_base, hist_len, col0 + o_c, c0 + o_c,
            HK * HEAD, W, HAS_BIAS, BT, BC,
        )  # fmt: skip
        p_x = mixed + rows[:, None] * CONV_DIM + c0 + o_c[None, :]
        tl.store(p_x, round_rne(b_x, IO_MANT, IO_TINY, IO_MAGIC).to(p_x.dtype.element_ty), mask=m_t[:, None])


@triton.jit(do_not_specialize=["N"])  # one compiled kernel for every batch size
def _layer_norm_kernel(
    o32,
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
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    AMAX_FLOOR: tl.constexpr,
    IO_MANT: tl.constexpr,
    IO_TINY: tl.constexpr,
    IO_MAGIC: tl.constexpr,
    F8_MANT: tl.constexpr,
    F8_TINY: tl.constexpr,
    F8_MAGIC: tl.constexpr,
    F8_MAX: tl.constexpr,
):
    """One program per (chunk, group of HPG value heads): the delta rule's float32 output o32
    [T, HV, V] gated, RMS-normalized and stored in the input dtype (fp8 too with QUANT); in each
    live sequence's last chunk, the slot's new conv history."""
    i_c, i_g = tl.program_id(0), tl.program_id(1)
    n = tl.load(chunk_seq + i_c)
    if n >= N:
        return
    slot = tl.load(slots + n)
    live = slot >= 0  # padding rows get zeros
    R: tl.constexpr = HV // HK
    bos, length, _, p, m_t, rows = chunk_rows(i_c, n, cu_seqlens, chunk_cu, BT)
    m_live = p < tl.where(live, length, 0)  # (a scalar boolean cannot mask a block in the interpreter)
    o_k = tl.arange(0, K)
    o_v = tl.arange(0, V)
    # constexprs are defined out of the head loop: an unrolled loop would reassign them (a compile
    # error on the GPU, which the interpreter does not raise)
    ROW: tl.constexpr = HK * (2 * K + 2 * R * V)
    CONV_DIM: tl.constexpr = 2 * HK * K + HV * V
    for i_hh in tl.static_range(HPG):
        i_h = i_g * HPG + i_hh
        i_kh = i_h // R
        p_o = o32 + rows[:, None] * (HV * V) + i_h * V + o_v[None, :]
        b_o = tl.load(p_o, mask=m_live[:, None], other=0.0)
        # gated RMSNorm with z
        base = i_kh * (2 * K + 2 * R * V)
        z_col = base + 2 * K + R * V + (i_h % R) * V + o_v
        b_z = tl.load(qkvz + rows[:, None] * ROW + z_col[None, :], mask=m_live[:, None], other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(b_o * b_o, 1) / V + eps)
        b_o = tl.load(norm_weight + o_v).to(tl.float32)[None, :] * (b_o * rstd[:, None]) * (b_z * tl.sigmoid(b_z))
        if tl.where(live, i_c, -1) == tl.load(chunk_cu + n + 1) - 1:  # a live sequence's last chunk
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
        b_o = round_rne(b_o, IO_MANT, IO_TINY, IO_MAGIC)
        tl.store(out + rows[:, None] * (HV * V) + i_h * V + o_v[None, :], b_o, mask=m_t[:, None])
    if QUANT:
        # group-wise fp8 of the stored (rounded) rows, as the unfused chain quantizes its output
        # (`gdn_lab.quant.quantize_groups`): this program's HPG heads hold NG whole groups
        NG: tl.constexpr = HPG * V // GROUP
        tl.debug_barrier()  # the rows just stored by every lane are read back below
        o_c = tl.arange(0, HPG * V)
        p_x = rows[:, None] * (HV * V) + i_g * (HPG * V) + o_c[None, :]
        b_x = tl.load(out + p_x, mask=m_t[:, None], other=0.0, cache_modifier=".cg").to(tl.float32)
        b_x = tl.reshape(b_x, [BT, NG, GROUP])
        b_s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(b_x), 2), AMAX_FLOOR), F8_MAX)
        b_y = tl.math.div_rn(b_x, b_s[:, :, None])
        b_y = round_rne(tl.minimum(tl.maximum(b_y, -F8_MAX), F8_MAX), F8_MANT, F8_TINY, F8_MAGIC)
        b_y = tl.reshape(b_y, [BT, HPG * V])
        tl.store(quantized + p_x, b_y.to(quantized.dtype.element_ty), mask=m_t[:, None])
        o_g = tl.arange(0, NG)
        p_s = scales + rows[:, None] * (HV * V // GROUP) + i_g * NG + o_g[None, :]
        tl.store(p_s, b_s, mask=m_t[:, None])


# --- host --------------------------------------------------------------------------------------

# the conv launch's channel block and warps, fixed (each channel's bits do not depend on them): rows
# of 128 channels at 2 warps took 275 us at 65536 tokens on the H200, 336-353 at 1 or 4 warps or
# in blocks of 64, against 581 for the tile form's best (64 channels, 2 warps; data/bench/h200/README.md).
# Under the interpreter the tile form, in blocks of 64.
CONV_BLOCK_C = 128
CONV_WARPS = 2
CONV_BLOCK_C_INTERPRETED = 64


def run_conv_kernel(
    qkvz, conv_state, conv_weight, conv_bias, has_initial_state, cu_seqlens, cache_indices, plan, mixed,
    HK: int, HV: int, D: int, chunk_size: int, rows: bool | None = None,
) -> None:  # fmt: skip
    """`_conv_kernel` into mixed [T, 2 HK D + HV D] over plan's chunks; rows: its row form (default:
    unless interpreting; the tests force both)."""
    if rows is None:
        rows = not interpreting()
    # head dims are powers of two: a block lies in one head
    block_c = min(D, CONV_BLOCK_C if rows else CONV_BLOCK_C_INTERPRETED)
    _conv_kernel[(plan.max_chunks, mixed.shape[1] // block_c)](
        qkvz=qkvz, conv_state=conv_state, conv_weight=conv_weight.contiguous(),
        conv_bias=conv_bias, has_initial_state=has_initial_state,
        cu_seqlens=cu_seqlens, slots=cache_indices, chunk_seq=plan.chunk_seq, chunk_cu=plan.chunk_cu,
        mixed=mixed, N=cache_indices.numel(), HK=HK, HV=HV, D=D, BC=block_c, BT=chunk_size, W=conv_weight.shape[1],
        HAS_BIAS=conv_bias is not None, ROWS=rows, **grid_args("IO", qkvz.dtype), num_warps=CONV_WARPS,
    )  # fmt: skip


def gdn_layer_prefill_fused(
    projected_qkvz,
    projected_ba,
    conv_state,
    delta_state,
    cache_indices,
    cu_seqlens,
    has_initial_state,
    conv_weight,
    conv_bias,
    A_log,
    dt_bias,
    norm_weight,
    num_k_heads,
    num_v_heads,
    head_dim,
    eps,
    quantize_fp8,
    fp8_dtype,
    chunk_size: int = CHUNK_SIZE,
    segment_chunks: int = SEGMENT_CHUNKS,
    segment_from: int | None = None,
):
    """gdn_layer_prefill (arguments as its validate() returns them: vectors contiguous) with the
    fused kernels; chunk 64 and the state recurrence's default segments for the shape
    (`run_state_kernel`) unless given (the controls change them).

    conv_state and delta_state (contiguous) are updated in place at cache_indices.

    Returns:
        (normalized [T, HV, V], quantized [T, HV*V] or None, scales float32 [T, HV*V/128] or None).
    """
    T, device, dtype = projected_qkvz.shape[0], projected_qkvz.device, projected_qkvz.dtype
    HK, HV, D = num_k_heads, num_v_heads, head_dim
    normalized = torch.empty(T, HV, D, dtype=dtype, device=device)
    quantized = scales = None
    if quantize_fp8:
        quantized = torch.empty(T, HV * D, dtype=fp8_dtype, device=device)
        scales = torch.empty(T, HV * D // FP8_GROUP, dtype=torch.float32, device=device)
    qkvz = projected_qkvz.contiguous()
    width = conv_weight.shape[1]
    io = grid_args("IO", dtype)
    run = chunked_run(cu_seqlens, normalized, HK, D, chunk_size, segment_chunks, segment_from)
    s, N = run.scratch, cache_indices.numel()
    mixed = torch.empty(T, 2 * HK * D + HV * D, dtype=dtype, device=device)
    run_conv_kernel(qkvz, conv_state, conv_weight, conv_bias, has_initial_state, cu_seqlens, cache_indices, run.plan,
                    mixed, HK, HV, D, chunk_size)  # fmt: skip
    ba = projected_ba.contiguous().view(T, HK, 2 * (HV // HK))
    q, k = mixed[:, : HK * D].view(T, HK, D), mixed[:, HK * D : 2 * HK * D].view(T, HK, D)
    v = mixed[:, 2 * HK * D :].view(T, HV, D)
    b, a = ba[..., : HV // HK], ba[..., HV // HK :]
    run_prepare_kernel(run, q, k, a, b, A_log, dt_bias, cu_seqlens, cache_indices, True)
    run_state_kernel(run, k, v, delta_state, cache_indices, cu_seqlens)
    # the delta rule's output in float32, over v_new where v_new is float32 (on float32 operands):
    # each output program reads only the rows and values it overwrites, and reads them first
    o32 = s.vs if s.vs.dtype == torch.float32 else torch.empty(T, HV, D, dtype=torch.float32, device=device)
    run_output_kernel(run, q, k, D**-0.5, o32, cu_seqlens, cache_indices)
    # the norm launch at 4 warps (its tiles are [BT, V]; 8 was not compared on the H200)
    heads_per_group = max(1, FP8_GROUP // D) if quantize_fp8 else 1
    f8 = grid_of(fp8_dtype if quantize_fp8 else torch.float8_e4m3fn)
    _layer_norm_kernel[(run.plan.max_chunks, HV // heads_per_group)](
        o32=o32, out=normalized,
        chunk_seq=run.plan.chunk_seq, chunk_cu=run.plan.chunk_cu, cu_seqlens=cu_seqlens, slots=cache_indices,
        qkvz=qkvz, norm_weight=norm_weight, conv_state=conv_state, has_initial_state=has_initial_state,
        quantized=quantized, scales=scales, eps=eps, N=N,
        HK=HK, HV=HV, K=D, V=D, BT=chunk_size, HPG=heads_per_group, W=width, WP=pow2_at_least(width - 1, floor=1),
        QUANT=quantize_fp8, GROUP=FP8_GROUP, AMAX_FLOOR=AMAX_FLOOR, **io,
        F8_MANT=f8.mant, F8_TINY=f8.tiny, F8_MAGIC=f8.magic, F8_MAX=f8.max, num_warps=4,
    )  # fmt: skip
    return normalized, quantized, scales


def gdn_layer_prefill_triton_fused(**args):
    """The `triton-fused` backend: chunk 64 (the reference's CHUNK_SIZE) for every batch (batch invariant)."""
    return gdn_layer_prefill_fused(**args)


def gdn_layer_prefill_triton_fused_tiles_by_batch(**args):
    """CONTROL (`triton-fused-tiles-by-batch`): the fused kernels with the chunk size AITER's
    fused_gdn_prefill_qkvz schedule picks for this (tokens, batch) (gdn_lab.rules.aiter_fused_gdn_prefill),
    so a sequence's bits follow its batch wherever the rule changes the chunk."""
    from gdn_lab.rules.aiter_fused_gdn_prefill import control_chunk_size

    chunk = control_chunk_size(args["projected_qkvz"].shape[0], args["cache_indices"].numel())
    return gdn_layer_prefill_fused(**args, chunk_size=chunk)
