"""gdn_prefill through AITER's `chunk_gated_delta_rule_opt_vk`, called as SGLang's AiterGDNKernel.extend does (ROCm only).

`aiter-vk` (library aiter, rule `gdn_lab.rules.aiter_gdn_prefill_vk`: the HIP state-recurrence
kernel for one sequence, AITER's Triton one for several):
`aiter.ops.triton.gated_delta_net.gated_delta_rule.chunk_gated_delta_rule_opt_vk`, called by keyword
as SGLang's `AiterGDNKernel.extend` (fork apinge/sglang @1de3bf01, `gdn_aiter.py`; aiter_contracts.md
3.7):

    chunk_gated_delta_rule_opt_vk(q=q[None], k=k[None], v=v[None], o=empty [1, T, HV, V], g=g[None],
        beta=beta[None], scale=scale, initial_state=state, initial_state_indices=slots,
        output_final_state=True, inplace_final_state=True, use_qk_l2norm_in_kernel=False,
        cu_seqlens=cu_seqlens, use_chunk_hip=(one sequence), state_dtype=state.dtype,
        use_exp2=True) -> (o, final_state)

- Before the call, as SGLang: q and k are L2-normalized outside the kernel (SGLang's
  `fused_l2norm_qk`; here x * rsqrt(sum x^2 + 1e-6) in float32, stored in q's dtype as a separate
  kernel would), hence `use_qk_l2norm_in_kernel=False`; the gates are computed apart in float32,
  `g = -exp(A_log) * softplus(a + dt_bias)` (log-space decay) and `beta = sigmoid(b)`, [1, T, HV]
  (SGLang's `fused_gdn_gating`).
- The state pool [slots, HV, V, K] ("VK") is updated in place at `slots` (`inplace_final_state`);
  varlen is B = 1 with `cu_seqlens`.

Contract (`covered`): ROCm tensors on the GPU; q, k, v bf16 with K = V = 128 (SGLang's runtime
contract); a contiguous fp32 or bf16 state with shape[1] == HV; no padding sequences (negative
slots: the kernel has no skip). Not picked by `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab.ops import aiter_native
from gdn_lab.ops.delta_rule import gates, l2norm
from gdn_lab.ops.gdn_prefill import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import aiter_gdn_prefill_vk

KERNEL, FUNCTION = "gdn_prefill_vk", "chunk_gated_delta_rule_opt_vk"
HEAD_DIM = 128


def gdn_prefill_aiter_vk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """gdn_prefill through `chunk_gated_delta_rule_opt_vk`, as SGLang calls it (see the module docstring).

    Args:
        q ... use_qk_l2norm: gdn_prefill's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [T, HV, V] in q's dtype; `state` updated in place at `slots`.
    """
    fn = kernel or aiter_native.function(KERNEL, FUNCTION)
    if use_qk_l2norm:
        q, k = l2norm(q.float()).to(q.dtype), l2norm(k.float()).to(k.dtype)
    g, beta = gates(a, b, A_log, dt_bias)  # float32 [T, HV]
    out, _ = fn(
        q=q.unsqueeze(0).contiguous(),
        k=k.unsqueeze(0).contiguous(),
        v=v.unsqueeze(0).contiguous(),
        o=v.new_empty((1, *v.shape)),
        g=g.unsqueeze(0).contiguous(),
        beta=beta.unsqueeze(0).contiguous(),
        scale=scale,
        initial_state=state,
        initial_state_indices=slots,
        output_final_state=True,
        inplace_final_state=True,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=cu_seqlens,
        use_chunk_hip=aiter_gdn_prefill_vk.k5_kernel(cu_seqlens.numel() - 1) == "hip",
        state_dtype=state.dtype,
        use_exp2=True,
    )
    return out.reshape(v.shape)


def covered(args: Mapping[str, Any]) -> Check:
    """chunk_gated_delta_rule_opt_vk's contract with SGLang's call (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "q")
    if not ok:
        return False, why
    q, v, state = args["q"], args["v"], args["state"]
    if q.dtype != torch.bfloat16:
        return False, f"q, k, v are {aiter_native.dtype_names(q.dtype)}: SGLang's AITER prefill takes bfloat16"
    if q.shape[2] != HEAD_DIM or v.shape[2] != HEAD_DIM:
        return False, f"K={q.shape[2]} V={v.shape[2]}: SGLang's AITER prefill takes K = V = 128"
    if state.dtype not in (torch.float32, torch.bfloat16) or not state.is_contiguous():
        return False, "state must be a contiguous fp32 or bf16 VK pool"
    if bool((args["slots"] < 0).any()):
        return False, "padding sequences (negative slots): chunk_gated_delta_rule_opt_vk has no skip"
    n = args["cu_seqlens"].numel() - 1
    return True, f"chunk_gated_delta_rule_opt_vk, {n} sequence(s), K5 {aiter_gdn_prefill_vk.k5_kernel(n)}"


register(
    Backend(
        OP,
        "aiter-vk",
        gdn_prefill_aiter_vk,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's chunk_gated_delta_rule_opt_vk (HIP K5)"),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=aiter_gdn_prefill_vk.RULE,
        description="AITER chunk_gated_delta_rule_opt_vk as SGLang's AiterGDNKernel.extend calls it (HIP K5 for one sequence)",
    )
)
