"""gdn_decode and gdn_prefill through flash-linear-attention (fla-core), the de facto GDN kernels.

Loaded only when an fla backend runs (it imports fla). What the wrappers do around fla's calls:

- gates: fla computes g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) in its own
  kernels (`use_gate_in_kernel=True`, `use_beta_sigmoid_in_kernel=True`, fla-core >= 0.6), from the
  raw a and b passed as `g=` and `beta=` **by keyword**: `fused_recurrent_gated_delta_rule(q, k, v,
  g, gk, gv, beta, ...)` would take a positional beta as `gk`. Computing the gates here with torch
  over the whole batch would make the fla backends batch-variant on the CPU, where torch's
  vectorized elementwise kernels round a row differently depending on the tensor's length
  (measured: softplus of rows 0..1 of a [64, 4] tensor differs from the same rows as [2, 4]).
- state layout: the lab's pool is "VK" [slot, HV, V, K]; fla's default state is [N, HV, K, V].
  fla-core >= 0.6 takes `state_v_first=True` (older releases named it `transpose_state_layout`);
  where neither exists the state is transposed explicitly on the way in and out.
- slots: the initial states are gathered from the pool, the final states written back; a
  negative slot is padding: that row's output is zeros and its slot is not touched. Finding the
  live rows reads `slots` on the host (one synchronisation; fla is a comparison backend, not the
  lab's fast path).
- varlen prefill: tokens are packed with batch dim 1 and `cu_seqlens` (int64), as fla requires.
- determinism: fla's chunk op can be dispatched to other kernels (TileLang, FlashQLA, intra-card
  context parallel whose splits follow the SM count). FLA_DISABLE_BACKEND_DISPATCH=1 turns that
  off; it is read when fla is first imported, so it is set here (unless the caller set it) and a
  warning says when fla was imported earlier with dispatch on.
"""

from __future__ import annotations

import os
import sys
import warnings

DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
if "fla" not in sys.modules:
    os.environ.setdefault(DISPATCH_ENV, "1")
if os.environ.get(DISPATCH_ENV) != "1":
    warnings.warn(
        f"fla backend dispatch is on ({DISPATCH_ENV} is not 1 when fla was imported): fla's chunk op may "
        "route to kernels whose numerics follow the SM count; set FLA_DISABLE_BACKEND_DISPATCH=1 before importing fla",
        stacklevel=2,
    )

import inspect  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule  # noqa: E402


def _v_first_keyword(fn: Callable) -> str | None:
    """The keyword that makes `fn` take [N, HV, V, K] states, or None if this fla lacks one."""
    params = inspect.signature(fn).parameters
    for name in ("state_v_first", "transpose_state_layout"):
        if name in params:
            return name
    return None


_V_FIRST = {fn: _v_first_keyword(fn) for fn in (fused_recurrent_gated_delta_rule, chunk_gated_delta_rule)}


def _call(fn: Callable, q, k, v, a, b, A_log, dt_bias, scale, h0, use_qk_l2norm, cu_seqlens=None):
    """fla's call on [1 or B, T, H, D] inputs (a, b [1 or B, T, HV] raw) with a VK initial state
    [N, HV, V, K]; returns (o, VK final state)."""
    kw = _V_FIRST[fn]
    layout = {kw: True} if kw else {}
    o, ht = fn(
        q,
        k,
        v,
        g=a,
        beta=b,
        use_gate_in_kernel=True,
        A_log=A_log,
        dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True,
        scale=scale,
        initial_state=h0 if kw else h0.transpose(-1, -2).contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
        cu_seqlens=cu_seqlens,
        **layout,
    )
    return o, ht if kw else ht.transpose(-1, -2)


def _live(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, their slots) of the rows with a non-negative slot (reads slots on the host)."""
    rows = torch.nonzero(slots >= 0).flatten()
    return rows, slots[rows].long()


def gdn_decode_fla(q, k, v, a, b, A_log, dt_bias, state, slots, scale, use_qk_l2norm):
    """gdn_decode with fla's `fused_recurrent_gated_delta_rule` (one token per request)."""
    out = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    rows, live = _live(slots)
    if rows.numel() == 0:
        return out
    o, ht = _call(
        fused_recurrent_gated_delta_rule,
        q[rows, None],
        k[rows, None],
        v[rows, None],
        a[rows, None],
        b[rows, None],
        A_log,
        dt_bias,
        scale,
        state[live],
        use_qk_l2norm,
    )
    state[live] = ht
    out[rows] = o[:, 0]
    return out


def _prefill(fn: Callable, q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    n, hv, vd, kd = slots.shape[0], state.shape[1], state.shape[2], state.shape[3]
    rows, live = _live(slots)
    h0 = torch.zeros((n, hv, vd, kd), dtype=state.dtype, device=state.device)
    h0[rows] = state[live]
    o, ht = _call(
        fn, q[None], k[None], v[None], a[None], b[None], A_log, dt_bias, scale, h0, use_qk_l2norm, cu_seqlens.long()
    )
    state[live] = ht[rows]
    # A padded sequence ran on a zero state; its tokens' outputs are zeros, as the contract says.
    seq_of_token = torch.repeat_interleave(torch.arange(n, device=q.device), cu_seqlens.diff().long())
    dead = (slots < 0)[seq_of_token]
    return o[0].masked_fill(dead[:, None, None], 0)


def gdn_prefill_fla(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    """gdn_prefill with fla's `chunk_gated_delta_rule` (varlen, chunk 64; GPU only)."""
    return _prefill(
        chunk_gated_delta_rule, q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm
    )


def gdn_prefill_fla_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, state, slots, scale, use_qk_l2norm):
    """gdn_prefill with fla's `fused_recurrent_gated_delta_rule` over varlen sequences (what fla's
    layer uses for short inputs at inference; runs under the interpreter too)."""
    return _prefill(
        fused_recurrent_gated_delta_rule,
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        cu_seqlens,
        state,
        slots,
        scale,
        use_qk_l2norm,
    )
