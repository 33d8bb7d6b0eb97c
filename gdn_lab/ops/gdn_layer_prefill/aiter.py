"""gdn_layer_prefill through AITER's fused Gluon prefill, `fused_gdn_prefill_qkvz` (gfx950 only).

`aiter-fused` (library aiter, rule `gdn_lab.rules.aiter_fused_gdn_prefill`: the tile, chunk size, V
tile and scan by (tokens, sequences)): `aiter.ops.triton.gated_delta_net.fused_gdn_prefill_qkvz`
(aiter PR #5606), behind its own predicate `fused_gdn_prefill_qkvz_supported`, as SGLang's
fail-closed adapter uses it (PR #39873, `python/sglang/kernels/ops/attention/gdn_fused_prefill_aiter.py`;
aiter_contracts.md 3.8):

    covered: activation SiLU (the kernel fuses a SiLU output gate; the lab's chain is SiLU),
        conv_bias required, then fused_gdn_prefill_qkvz_supported(projected_qkvz, projected_ba,
        conv_state, delta_state, cache_indices, cu_seqlens, has_initial_state, conv_weight,
        conv_bias, quant_dtype, a_log=A_log, dt_bias=dt_bias, norm_weight=norm_weight)
    run: fused_gdn_prefill_qkvz(projected_qkvz, projected_ba, conv_state, delta_state,
        cache_indices, cu_seqlens, has_initial_state, conv_weight, conv_bias, A_log, dt_bias,
        norm_weight, scale=head_dim ** -0.5, eps=eps)
        -> (normalized bf16 [T, 8, 128], conv_state, delta_state, quantized e4m3fn [T, 1024],
            scales float32 [T, 8])

The predicate also receives the gate and norm parameters (SGLang's adapter leaves them out; then
AITER checks them only when the kernel runs), so a call it would refuse is "not covered" with
AITER's reason rather than an error. `scale` is the query scale: AITER's test reference
(`ref_gdn_prefill` in op_tests/triton_tests/.../test_fused_gdn_prefill_qkvz.py) multiplies the
L2-normalized q by it and passes `head_dim ** -0.5`, which settles the docstring's "RMSNorm/quant
scale" (aiter_contracts.md open question 6). The layouts of the packed projections are the lab's
(per key head [q | k | v (r heads) | z (r heads)] and [b (r) | a (r)]), the same split as that
reference. The lab holds gate parameters in float32; AITER takes A_log in float32 and dt_bias in
bf16 (a bf16 checkpoint's), so the adapter passes `dt_bias.to(bfloat16)` (the torch chain keeps
float32: parity with it includes that rounding). The kernel always quantizes; with
quantize_fp8=False the adapter returns (normalized, None, None).

The shape is baked in: Qwen3-Next-80B (or Qwen3.5-35B) at TP4, (HK, HV) = (4, 8), head dim 128,
conv width 4; 1024..16384 tokens, 1..64 sequences; gfx950 and Triton >= 3.8 with Gluon (the
predicate checks both). Negative cache indices (skipped sequences) are not covered: the kernel has
no skip. Not picked by `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab.ops import aiter_native
from gdn_lab.ops.gdn_layer_prefill import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import aiter_fused_gdn_prefill

KERNEL, FUNCTION, PREDICATE = "fused_gdn_prefill", "fused_gdn_prefill_qkvz", "fused_gdn_prefill_qkvz_supported"
QUANT_DTYPE = torch.float8_e4m3fn  # the only fp8 format the gfx950 tiles emit


def kernel_inputs(args: Mapping[str, Any]) -> dict[str, Any]:
    """The tensors as the kernel takes them: the lab's, with A_log in float32 and dt_bias in bf16."""
    return {
        **{n: args[n] for n in ("projected_qkvz", "projected_ba", "conv_state", "delta_state", "cache_indices",
                                "cu_seqlens", "has_initial_state", "conv_weight", "conv_bias", "norm_weight")},
        "A_log": args["A_log"].float(),
        "dt_bias": args["dt_bias"].to(torch.bfloat16),
    }  # fmt: skip


def gdn_layer_prefill_aiter_fused(
    projected_qkvz: torch.Tensor,
    projected_ba: torch.Tensor,
    conv_state: torch.Tensor,
    delta_state: torch.Tensor,
    cache_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    num_k_heads: int,
    num_v_heads: int,
    head_dim: int,
    eps: float,
    quantize_fp8: bool,
    fp8_dtype: torch.dtype | None,
    *,
    kernel: Callable[..., Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """gdn_layer_prefill through `fused_gdn_prefill_qkvz` (see the module docstring).

    Args:
        projected_qkvz ... fp8_dtype: gdn_layer_prefill's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        (normalized [T, HV, V], quantized [T, HV*V] e4m3fn or None, scales [T, HV] or None); the
        conv and delta states updated in place.
    """
    fn = kernel or aiter_native.function(KERNEL, FUNCTION)
    x = kernel_inputs(
        dict(projected_qkvz=projected_qkvz, projected_ba=projected_ba, conv_state=conv_state, delta_state=delta_state,
             cache_indices=cache_indices, cu_seqlens=cu_seqlens, has_initial_state=has_initial_state,
             conv_weight=conv_weight, conv_bias=conv_bias, A_log=A_log, dt_bias=dt_bias, norm_weight=norm_weight)
    )  # fmt: skip
    normalized, _, _, quantized, scales = fn(
        x["projected_qkvz"],
        x["projected_ba"],
        x["conv_state"],
        x["delta_state"],
        x["cache_indices"],
        x["cu_seqlens"],
        x["has_initial_state"],
        x["conv_weight"],
        x["conv_bias"],
        x["A_log"],
        x["dt_bias"],
        x["norm_weight"],
        scale=head_dim**-0.5,
        eps=eps,
    )
    if not quantize_fp8:
        return normalized, None, None
    return normalized, quantized, scales


def covered(args: Mapping[str, Any], predicate: Callable[..., Any] | None = None) -> Check:
    """SGLang's adapter's checks, then AITER's own `fused_gdn_prefill_qkvz_supported`.

    Args:
        args: gdn_layer_prefill's validated arguments.
        predicate: the predicate to ask in AITER's place (a test double); None loads AITER's own.
    """
    if args["conv_bias"] is None:
        return False, "conv bias is required (SGLang's adapter; pass zeros for a model without one)"
    if args["quantize_fp8"] and args["fp8_dtype"] != QUANT_DTYPE:
        return False, f"fp8 output {args['fp8_dtype']}: the gfx950 tiles emit {QUANT_DTYPE} only"
    if bool((args["cache_indices"] < 0).any()):
        return False, "skipped sequences (negative cache_indices): the fused kernel has no skip"
    check = predicate or aiter_native.function(KERNEL, PREDICATE)
    x = kernel_inputs(args)
    ok, reason = check(
        x["projected_qkvz"], x["projected_ba"], x["conv_state"], x["delta_state"], x["cache_indices"],
        x["cu_seqlens"], x["has_initial_state"], x["conv_weight"], x["conv_bias"], QUANT_DTYPE,
        a_log=x["A_log"], dt_bias=x["dt_bias"], norm_weight=x["norm_weight"],
    )  # fmt: skip
    if not ok:
        return False, f"fused_gdn_prefill_qkvz_supported: {reason}"
    tokens, batch = args["projected_qkvz"].shape[0], args["cache_indices"].numel()
    s = aiter_fused_gdn_prefill.schedule(tokens, batch)
    return True, f"fused_gdn_prefill_qkvz: {aiter_fused_gdn_prefill.schedule_key(s)}"


register(
    Backend(
        OP,
        "aiter-fused",
        gdn_layer_prefill_aiter_fused,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's gfx950 Gluon fused_gdn_prefill_qkvz"),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=aiter_fused_gdn_prefill.RULE,
        description="AITER fused_gdn_prefill_qkvz behind its own predicate (gfx950, Qwen3-Next TP4 heads 4/8)",
    )
)
