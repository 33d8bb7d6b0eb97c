"""gdn_decode in Triton: one fused kernel per decode step, batch-invariant by construction.

One program per (request, value head, V tile). It loads its [BV, K] slice of the request's fp32
"VK" state into registers, computes the gates (g = -exp(A_log) * softplus(a + dt_bias),
beta = sigmoid(b)), optionally L2-normalizes q and k, scales q, applies the delta rule and writes
the state back in place and the output in q's dtype. A negative slot is padding: its output row
is zeros and no state is read or written.

Every K reduction (h.k, h.q and the two L2-norm sums) is computed as `k_split` partial sums over
contiguous chunks of K/k_split elements, which are then combined; this is the knob AITER's FlyDSL
decode turns with WARP_THREADS_K (aiter_contracts.md 3.3). Nothing in a program depends on the
batch: the grid grows with B, but every program runs the same code on its own request, with a
config (block_v, num_warps, k_split) that is fixed per head size. So a request's bits do not
depend on what it is batched with. `gdn_decode_triton_ksplit_by_batch` is the deliberate
counterexample: the same kernel with k_split picked from the batch size by FlyDSL's tuned table.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from gdn_lab.ops.delta_rule import L2NORM_EPS, SOFTPLUS_THRESHOLD
from gdn_lab.ops.triton_common import launch_cached, pow2_at_least
from gdn_lab.rules import flydsl_gdr_decode

# The fixed config. k_split 8 mirrors FlyDSL's untuned default (WARP_THREADS_K = 8). block_v and
# num_warps only tile V, but stay fixed so that the register layout of every K reduction is the
# same for every batch. One warp over an [8, K] tile (like fla's decode) keeps each reduction inside
# the warp, needs 64 registers at K = 128 (so 32 programs fit on an SM), and each warp-wide load
# is one contiguous 512-byte row of the VK state (sm_90 AOT compiles with Triton 3.6 and 3.9:
# 16-byte vector loads and stores, no spills). benchmarks/bench_gdn_decode.py sweeps the rest.
DEFAULT_K_SPLIT = 8
DEFAULT_BLOCK_V = 8
DEFAULT_NUM_WARPS = 1
# Launch through the compiled kernel's own launcher after the first call (`launch_cached`); False
# takes `kernel[grid](...)` every time (the benchmark times both).
CACHED_LAUNCH = True


@triton.jit
def _gdn_decode_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state,
    slots,
    o,
    scale,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    KS: tl.constexpr,
    KC: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    EPS: tl.constexpr,
    SOFTPLUS_T: tl.constexpr,
):
    i_pid = tl.program_id(0)
    i_v = i_pid % NV
    i_bh = i_pid // NV
    i_hv = i_bh % HV
    i_b = i_bh // HV
    i_hk = i_hv // (HV // HK)

    # K is seen as [KS, KC]: partial sum s covers elements s*KC .. s*KC + KC - 1. q and k are
    # loaded as [1, KS, KC], in the state tile's own layout: a 2-D load broadcast later costs a
    # layout conversion and, with Triton 3.6, 109 instead of 64 registers at K = 128.
    o_k = (tl.arange(0, KS)[:, None] * KC + tl.arange(0, KC)[None, :])[None, :, :]
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V

    slot = tl.load(slots + i_b).to(tl.int64)
    live = slot >= 0
    # A padding row (negative slot) masks off every state row: nothing is read or written.
    m_live = o_v < tl.where(live, V, 0)
    p_h = state + slot * (HV * V * K) + i_hv * (V * K) + o_v[:, None, None] * K + o_k
    m_h = m_live[:, None, None] & m_k
    b_h = tl.load(p_h, mask=m_h, other=0.0)

    b_q = tl.load(q + i_b * (HK * K) + i_hk * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_b * (HK * K) + i_hk * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + i_b * (HV * V) + i_hv * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(tl.sum(tl.sum(b_q * b_q, axis=2), axis=1), axis=0) + EPS)
        b_k = b_k * tl.rsqrt(tl.sum(tl.sum(tl.sum(b_k * b_k, axis=2), axis=1), axis=0) + EPS)
    b_q = b_q * scale

    b_x = tl.load(a + i_b * HV + i_hv).to(tl.float32) + tl.load(dt_bias + i_hv).to(tl.float32)
    b_softplus = tl.where(b_x > SOFTPLUS_T, b_x, tl.log(1.0 + tl.exp(b_x)))
    b_g = -tl.exp(tl.load(A_log + i_hv).to(tl.float32)) * b_softplus
    b_beta = tl.sigmoid(tl.load(b + i_b * HV + i_hv).to(tl.float32))

    b_h = b_h * tl.exp(b_g)
    b_hk = tl.sum(tl.sum(b_h * b_k, axis=2), axis=1)  # [BV]: KS partial sums, then combined
    b_u = b_beta * (b_v - b_hk)
    b_h = b_h + b_u[:, None, None] * b_k
    b_o = tl.sum(tl.sum(b_h * b_q, axis=2), axis=1)  # [BV]

    tl.store(p_h, b_h, mask=m_h)
    b_o = tl.where(live, b_o, 0.0)
    tl.store(o + i_b * (HV * V) + i_hv * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


# Triton decorated the kernel for its interpreter or for the GPU as this module loaded (a kernel
# runs only in that mode): an interpreted one has no compiled kernel to launch directly.
_INTERPRETED = type(_gdn_decode_kernel).__name__ == "InterpretedFunction"  # (no import of the interpreter on a GPU)


def _check_power_of_two(name: str, value: object, high: int, why: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value > high or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two in [1, {high}] ({why}), got {value!r}")


def default_k_split(head_k_dim: int) -> int:
    """The fixed k_split for a head size: DEFAULT_K_SPLIT, or the padded K when K is smaller."""
    return min(DEFAULT_K_SPLIT, pow2_at_least(head_k_dim, floor=1))


def gdn_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    *,
    k_split: int | None = None,
    block_v: int = DEFAULT_BLOCK_V,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> torch.Tensor:
    """One gated-delta-rule decode step with the fused Triton kernel.

    The tensors are those `gdn_lab.ops.gdn_decode.validate(...)` returns (call
    `gdn_decode(..., backend="triton")` for checked input, or
    `gdn_decode_triton(**validate(...), k_split=4)` to sweep the config).

    Args:
        q, k: [B, HK, K]; v: [B, HV, V]; a, b: [B, HV]; A_log, dt_bias: [HV].
        state: [num_slots, HV, V, K] float32, contiguous, updated in place at `slots`.
        slots: int32 [B]; a negative slot is padding (zeros out, state untouched).
        scale: the query scale.
        use_qk_l2norm: L2-normalize q and k in the kernel.
        k_split: how many partial sums each K reduction is split into (a power of two up to the
            padded K); None takes the fixed default (8, or the padded K when K < 8). Another
            value changes the floating-point order of h.k, h.q and the L2 norms. On the GPU, with
            the default tile at K = 128, 1 and 32 compile to one order (four elements per lane,
            then a 32-lane butterfly; sm_90 PTX of Triton 3.6 and 3.9), so the distinct orders
            there are 1 (= 32), 2, 4, 8 and 16; in the interpreter 1 equals the padded K instead.
        block_v: V rows per program (a power of two); with num_warps it only tiles V, but it can
            change the register layout of the reductions, so keep it fixed across batches.
        num_warps: warps per program (a power of two up to 32).

    Returns:
        [B, HV, V] in q's dtype.

    Raises:
        ValueError: a config value out of range, or a non-contiguous state.
    """
    B, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    config = (HK, HV, K, V, k_split, block_v, num_warps, use_qk_l2norm)
    try:
        NV, consts = _config(*config)
    except TypeError:  # an unhashable config value: the checks name it
        NV, consts = _config.__wrapped__(*config)
    if not state.is_contiguous():
        raise ValueError("state: must be contiguous (it is updated in place); got a strided view")
    out = q.new_empty((B, HV, V))  # q's dtype and device (cheaper than torch.empty spelling them out)
    if B == 0:
        return out
    q, k, v, a, b = q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous(), b.contiguous()
    # Every parameter in signature order (the tensors, scale, then the constexprs).
    args = (q, k, v, a, b, A_log, dt_bias, state, slots, out, float(scale), *consts)
    grid = (B * HV * NV, 1, 1)
    if not CACHED_LAUNCH or _INTERPRETED:
        _gdn_decode_kernel[grid](*args, num_warps=num_warps)
        return out
    # What the compilation depends on besides the device: constexprs and warps, the ten pointers'
    # dtypes (out's is q's) and whether all are 16-byte aligned (Triton specialises pointers on it;
    # a misaligned one makes its own key). The launcher takes the pointers as ints.
    dtypes = (q.dtype, k.dtype, v.dtype, a.dtype, b.dtype, A_log.dtype, dt_bias.dtype, state.dtype, slots.dtype)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(), A_log.data_ptr(),
            dt_bias.data_ptr(), state.data_ptr(), slots.data_ptr(), out.data_ptr())  # fmt: skip
    aligned = (
        ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6] | ptrs[7] | ptrs[8] | ptrs[9]
    ) & 15 == 0
    key = (num_warps, consts, dtypes, aligned or tuple(ptr & 15 for ptr in ptrs))
    launch_cached(_gdn_decode_kernel, grid, args, key, (*ptrs, *args[10:]), num_warps=num_warps)
    return out


@lru_cache(maxsize=256, typed=True)  # typed: True == 1, but only the int passes the checks
def _config(
    HK: int, HV: int, K: int, V: int, k_split: int | None, block_v: int, num_warps: int, use_qk_l2norm: bool
) -> tuple[int, tuple]:
    """(NV, the constexpr arguments HK ... SOFTPLUS_T) for one shape and config, checked once per
    config: the eager step repeats one (an invalid one raises, and is not cached)."""
    padded_k = pow2_at_least(K, floor=1)
    if k_split is None:
        k_split = default_k_split(K)
    else:
        _check_power_of_two("k_split", k_split, padded_k, f"K={K} is padded to {padded_k}")
    _check_power_of_two("block_v", block_v, 1024, "V rows per program")
    _check_power_of_two("num_warps", num_warps, 32, "warps per program")
    BV = min(block_v, pow2_at_least(V, floor=1))
    NV = -(-V // BV)  # V tiles per head
    return NV, (HK, HV, K, V, BV, NV, k_split, padded_k // k_split, use_qk_l2norm, L2NORM_EPS, SOFTPLUS_THRESHOLD)


def control_k_split(
    batch_size: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    dtype: torch.dtype,
    arch: str = flydsl_gdr_decode.DEFAULT_ARCH,
) -> tuple[int, flydsl_gdr_decode.Prediction]:
    """The control's k_split for a batch: FlyDSL's WARP_THREADS_K for it, capped at the padded K.

    Returns:
        (k_split, the rule's prediction, which says which tuned row or default it used and
        whether the shape was the nearest tuned one rather than the exact one).
    """
    pred = flydsl_gdr_decode.control_prediction(
        arch, batch_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, dtype, torch.float32
    )
    return min(pred.wtk, pow2_at_least(head_k_dim, floor=1)), pred


def gdn_decode_triton_ksplit_by_batch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    *,
    arch: str = flydsl_gdr_decode.DEFAULT_ARCH,
) -> torch.Tensor:
    """The batch-variant CONTROL: the Triton kernel with k_split chosen from the batch size.

    k_split follows the WARP_THREADS_K that AITER's FlyDSL decode takes from its tuned table for
    this batch size on `arch` (gfx950 by default); shapes the table lacks use the nearest tuned
    shape's rule, so the control varies with the batch on every shape. It exists to prove that an
    invariance run can see batch variance; never use it for results.

    Args:
        q ... use_qk_l2norm: as `gdn_decode_triton`.
        arch: the emulated AMD arch, "gfx950" or "gfx942".

    Returns:
        [B, HV, V] in q's dtype.
    """
    B, HK, K = q.shape
    k_split, _ = control_k_split(max(B, 1), HK, v.shape[1], K, v.shape[2], q.dtype, arch)  # B = 0: an empty batch
    return gdn_decode_triton(q, k, v, a, b, A_log, dt_bias, state, slots, scale, use_qk_l2norm, k_split=k_split)
