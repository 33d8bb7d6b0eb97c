"""gdn_decode through AITER's HIP decode, `hip_fused_sigmoid_gating_delta_rule_update`, as SGLang calls it (ROCm only).

`aiter-hip` (library aiter; no dispatch rule: whether the HIP kernel's own arithmetic follows the
batch is not known, its source being newer than the aiter snapshot read, aiter_contracts.md 3.4 and
open question 3): `aiter.ops.hip.gated_delta_net.hip_gdn_decode.hip_fused_sigmoid_gating_delta_rule_update`,
called by keyword as SGLang's `AiterGDNKernel.decode` calls its HIP decode (fork apinge/sglang
@1de3bf01, `gdn_aiter.py`):

    hip_fused_sigmoid_gating_delta_rule_update(A_log=A_log, a=a, dt_bias=dt_bias,
        softplus_beta=1.0, softplus_threshold=20.0, q=q[None], k=k[None], v=v[None], b=b,
        initial_state_source=state, initial_state_indices=slots, scale=scale,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=arange(B + 1), is_kda=False)

q/k [1, B, HK, K] and v [1, B, HV, V] (SGLang's varlen decode layout: one token per sequence,
`cu_seqlens` = 0..B), a/b [B, HV], the VK state pool [slots, HV, V, K] fp32 updated in place at
`slots`; it returns o like v, [1, B, HV, V]. The kernel casts dt_bias to bf16 and the indices to
int32 itself. As SGLang, `HIP_GDN_SORT_IDX_BS=0` is set while the module imports and runs (its
host-side index-sort cache is not CUDA-graph safe). SGLang loads the HIP extension
(`_load_extension()`, a JIT build) before its first use; `hip_ready()` does the same once.

Contract (`covered`): ROCm tensors on the GPU; the specialised Qwen3.5 local heads the kernel is
built for, (HK, HV) in {(16, 32), (2, 8)} ("full heads" and "TP=8"); q, k, v, a, b bf16;
K = V = 128; a contiguous fp32 VK state whose last three dims are (HV, 128, 128); no padding slots
(SGLang trims its padded rows by `active_batch_size`; the kernel's handling of a negative index is
not documented); the arch the extension is built for (`AITER_HIP_GDN_ARCH` or `GPU_ARCHS`, default
gfx942). Not picked by `auto`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops import aiter_native
from gdn_lab.ops.gdn_decode import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register

KERNEL, FUNCTION = "hip_gdn_decode", "hip_fused_sigmoid_gating_delta_rule_update"
SGLANG_ENV = {"HIP_GDN_SORT_IDX_BS": "0"}
LOCAL_HEADS = ((16, 32), (2, 8))  # the HIP kernel's specialised paths (full heads, TP=8)
HEAD_DIM = 128
DEFAULT_ARCH = "gfx942"  # the kernel's default --offload-arch
SOFTPLUS_BETA, SOFTPLUS_THRESHOLD = 1.0, 20.0


@cache
def hip_ready() -> Check:
    """Whether the HIP decode imports and its extension builds (`_load_extension()`), once per process.

    SGLang takes the HIP decode only when both succeed (`_load_aiter_decode_ops`).
    """
    ok, why = aiter_native.available(KERNEL, FUNCTION, "AITER's HIP GDN decode", SGLANG_ENV)()
    if not ok:
        return False, why
    try:
        with aiter_native.environment(SGLANG_ENV):
            aiter_native.function(KERNEL, "_load_extension", SGLANG_ENV)()
    except Exception as exc:  # the JIT build failing is a reason, not a crash
        return False, f"the HIP GDN decode extension does not build: {type(exc).__name__}: {exc}"
    return True, "HIP GDN decode extension built"


def built_archs() -> tuple[str, ...]:
    """The archs the HIP extension is compiled for (AITER_HIP_GDN_ARCH, else GPU_ARCHS, else gfx942)."""
    value = os.environ.get("AITER_HIP_GDN_ARCH") or os.environ.get("GPU_ARCHS") or DEFAULT_ARCH
    return tuple(a.strip() for a in value.replace(",", ";").split(";") if a.strip())


def gdn_decode_aiter_hip(
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
    """gdn_decode through AITER's HIP decode, as SGLang calls it (see the module docstring).

    Args:
        q ... use_qk_l2norm: gdn_decode's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [B, HV, V] in q's dtype; `state` updated in place at `slots`.
    """
    batch = q.shape[0]
    with aiter_native.environment(SGLANG_ENV):
        if kernel is None:
            ok, why = hip_ready()
            if not ok:
                raise aiter.AiterUnavailable(why)
            kernel = aiter_native.function(KERNEL, FUNCTION, SGLANG_ENV)
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
            initial_state_source=state,
            initial_state_indices=slots,
            scale=scale,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
            cu_seqlens=torch.arange(batch + 1, dtype=torch.int32, device=q.device),
            is_kda=False,
        )
    return out.reshape(batch, v.shape[1], v.shape[2])


def covered(args: Mapping[str, Any]) -> Check:
    """The HIP decode's contract (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "q")
    if not ok:
        return False, why
    q, v, state = args["q"], args["v"], args["state"]
    heads = (q.shape[1], v.shape[1])
    if heads not in LOCAL_HEADS:
        return False, f"(HK, HV) = {heads}: the HIP decode is built for {', '.join(map(str, LOCAL_HEADS))} only"
    wrong = [n for n in ("q", "k", "v", "a", "b") if args[n].dtype != torch.bfloat16]
    if wrong:
        return False, f"{', '.join(wrong)} must be bfloat16 (the HIP decode's inputs)"
    if q.shape[2] != HEAD_DIM or v.shape[2] != HEAD_DIM:
        return False, f"K={q.shape[2]} V={v.shape[2]}: the HIP decode takes K = V = {HEAD_DIM}"
    if not state.is_contiguous() or tuple(state.shape[-3:]) != (v.shape[1], HEAD_DIM, HEAD_DIM):
        return False, f"state must be a contiguous fp32 [slots, {v.shape[1]}, 128, 128] VK pool"
    if bool((args["slots"] < 0).any()):
        return False, "padding slots (negative): SGLang trims padded rows before the HIP decode"
    arch = aiter.effective_arch(q.device)
    if arch not in built_archs():
        return False, f"{arch}: the HIP decode extension is built for {', '.join(built_archs())} (AITER_HIP_GDN_ARCH)"
    return True, f"HIP GDN decode (HK, HV) = {heads} on {arch}"


register(
    Backend(
        OP,
        "aiter-hip",
        gdn_decode_aiter_hip,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's HIP GDN decode", SGLANG_ENV),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        description="AITER HIP hip_fused_sigmoid_gating_delta_rule_update as SGLang calls it ((2,8) and (16,32) heads)",
    )
)
