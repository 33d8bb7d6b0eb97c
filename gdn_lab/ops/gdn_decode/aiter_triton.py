"""gdn_decode through AITER's Triton decode, `fused_sigmoid_gating_delta_rule_update`, anywhere Triton runs.

`aiter-triton` (library aiter-triton; no dispatch rule: one program per (V tile, sequence, value
head) with full-K sums and one autotune config per platform, so a request's bits do not follow the
batch, aiter_contracts.md 3.5): `fused_sigmoid_gating_delta_rule_update` from
`aiter/ops/triton/_triton_kernels/gated_delta_rule/decode/fused_sigmoid_gating_recurrent.py`
(newer than the amd-aiter 0.1.7 wheel: an aiter built from source), loaded through `gdn_lab.aiter`
with the arch emulated off ROCm, like the other `aiter-triton-*` backends. Called by keyword with
the documented signature:

    fused_sigmoid_gating_delta_rule_update(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0,
        softplus_threshold=20.0, q=q[None], k=k[None], v=v[None], b=b,
        initial_state_source=kv_state, initial_state_indices=slots, scale=scale,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=arange(B + 1))

Layouts, converted explicitly (copies; the lab's tensors change only where the op says):

- the state: the kernel hard-codes the "KV" layout [slots, HV, K, V]; the lab's pool is "VK"
  [slots, HV, V, K]. The adapter passes `state.transpose(-1, -2).contiguous()` and copies the
  live slots back transposed. (Later aiter adds `state_layout="hvk"`; the documented signature
  has no such argument, so it is not used.)
- q/k [1, B, HK, K], v [1, B, HV, V] with `cu_seqlens = 0..B` (SGLang's varlen decode layout),
  a/b [B, HV]; the output [1, B, HV, V] becomes [B, HV, V].
- a negative slot starts from a zero state and is not written back; its output row is zeroed (the
  lab's padding contract).

On the CPU the interpreter runs it with AITER told the emulated arch (its HIP autotune config,
BV = 64, four warps), calling the function under its `input_guard` (`__wrapped__`), whose device
context is torch.cuda's. Not picked by `auto`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_paged import available, emulated_arch
from gdn_lab.ops.gdn_decode import OP
from gdn_lab.ops.triton_support import triton_device
from gdn_lab.routing import LIBRARY_AITER_TRITON, PRIORITY_AMD, Backend, Check, register

KERNEL, FUNCTION = "gdn_decode_triton", "fused_sigmoid_gating_delta_rule_update"
MAX_HEAD_K_DIM = 256  # NK == 1: the whole K sits in one tile
SOFTPLUS_BETA, SOFTPLUS_THRESHOLD = 1.0, 20.0


def gdn_decode_aiter_triton(
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
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """gdn_decode through AITER's Triton decode (see the module docstring).

    Args:
        q ... use_qk_l2norm: gdn_decode's validated arguments.
        kernel: the function to call in AITER's place (a test double, run outside AITER's shims);
            None loads AITER's own.

    Returns:
        [B, HV, V] in q's dtype (zeros for negative slots); `state` updated in place at `slots`.
    """
    batch, hv, dv = q.shape[0], v.shape[1], v.shape[2]
    scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    if kernel is None:
        arch, cus = aiter.effective_arch(q.device), aiter.effective_num_cus(q.device)
        kernel = getattr(aiter.load(KERNEL, arch), FUNCTION)
        scope = aiter.shims(arch, cus)
        if q.device.type == "cpu":
            kernel = getattr(kernel, "__wrapped__", kernel)  # skip input_guard's torch.cuda device context
    kv_state = state.transpose(-1, -2).contiguous()  # [slots, HV, K, V]: the kernel's layout
    with scope:
        out = kernel(
            A_log=A_log,
            a=a,
            dt_bias=dt_bias,
            softplus_beta=SOFTPLUS_BETA,
            softplus_threshold=SOFTPLUS_THRESHOLD,
            q=q.unsqueeze(0),
            k=k.unsqueeze(0),
            v=v.unsqueeze(0),
            b=b,
            initial_state_source=kv_state,
            initial_state_indices=slots,
            scale=scale,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            cu_seqlens=torch.arange(batch + 1, dtype=torch.int32, device=q.device),
        )
    live = slots >= 0
    rows = slots[live].long()
    state[rows] = kv_state[rows].transpose(-1, -2)
    out = out.reshape(batch, hv, dv)
    out[~live] = 0
    return out


def covered(args: Mapping[str, Any]) -> Check:
    """Tensors where Triton runs, K <= 256 (one tile), a contiguous fp32 state."""
    ok, where = triton_device(args, "q")
    if not ok:
        return False, where
    if args["q"].shape[2] > MAX_HEAD_K_DIM:
        return False, f"K={args['q'].shape[2]} > {MAX_HEAD_K_DIM}: the kernel holds the whole K in one tile (NK == 1)"
    if not args["state"].is_contiguous():
        return False, "state must be contiguous (it is transposed into the kernel's KV layout and back)"
    arch = aiter.effective_arch(args["q"].device)
    return True, f"{where}; AITER's Triton GDN decode for {arch}, state converted VK -> KV -> VK"


register(
    Backend(
        OP,
        "aiter-triton",
        gdn_decode_aiter_triton,
        library=LIBRARY_AITER_TRITON,
        available=available(KERNEL),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        description="AITER Triton fused_sigmoid_gating_delta_rule_update (aiter from source), explicit VK <-> KV state",
    )
)
