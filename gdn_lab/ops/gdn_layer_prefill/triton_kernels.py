"""gdn_layer_prefill fused in Triton: the whole GDN prefill chain in three launches, batch invariant.

The chunked delta-rule kernels of `gdn_lab.ops.delta_rule_triton` with the layer's
stages folded into their first and last launches:

1. prepare (per chunk and value head): causal conv1d of the interleaved projection with the slot's
   conv history (zeros where has_initial_state is False) + SiLU, split into q, k, v on the fly,
   gates from the interleaved b/a, L2 norm, and the chunk factors;
2. state recurrence (per sequence, value head, V tile): reads and writes the delta-state slot;
3. output (per chunk and value head, or per group of heads sharing an fp8 group): gated RMSNorm
   with z, the store in the input dtype, group-128 fp8 with float32 scales, and, in each
   sequence's last chunk, the conv-state update (after every launch-1 read of the old history).

Rounding choice: the conv output is rounded to the input dtype before the delta rule, exactly as
the unfused chain stores it between its conv and delta-rule kernels. Keeping it in float32 would
be slightly more accurate, but then the fused kernel would differ from the chain it replaces by
that rounding (about 2^-9 relative in bf16) on every token; rounding keeps the parity measurement
about the delta-rule arithmetic alone. Everything after the conv stays float32 until the output.
"""

from __future__ import annotations

import torch

from gdn_lab.ops.delta_rule_triton import CHUNK_SIZE, LayerInputs, run_chunked
from gdn_lab.quant import FP8_GROUP


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
):
    """gdn_layer_prefill (arguments as its validate()) with the fused kernels; chunk 64 unless given.

    Returns:
        (normalized [T, HV, V], quantized [T, HV*V] or None, scales float32 [T, HV*V/128] or None).
    """
    T, device, dtype = projected_qkvz.shape[0], projected_qkvz.device, projected_qkvz.dtype
    normalized = torch.empty(T, num_v_heads, head_dim, dtype=dtype, device=device)
    quantized = scales = None
    if quantize_fp8:
        quantized = torch.empty(T, num_v_heads * head_dim, dtype=fp8_dtype, device=device)
        scales = torch.empty(T, num_v_heads * head_dim // FP8_GROUP, dtype=torch.float32, device=device)
    layer = LayerInputs(
        qkvz=projected_qkvz.contiguous(),
        ba=projected_ba.contiguous(),
        conv_state=conv_state,
        conv_weight=conv_weight.contiguous(),
        conv_bias=None if conv_bias is None else conv_bias.contiguous(),
        has_initial_state=has_initial_state,
        norm_weight=norm_weight.contiguous(),
        eps=eps,
        quantized=quantized,
        scales=scales,
    )
    run_chunked(
        q=None, k=None, v=None, a=None, b=None, layer=layer, A_log=A_log, dt_bias=dt_bias,
        cu_seqlens=cu_seqlens, state=delta_state, slots=cache_indices, out=normalized,
        num_k_heads=num_k_heads, scale=head_dim**-0.5, use_qk_l2norm=True, chunk_size=chunk_size,
    )  # fmt: skip
    return normalized, quantized, scales


def gdn_layer_prefill_triton_fused(**args):
    """The `triton-fused` backend: chunk 64 for every batch (batch invariant)."""
    return gdn_layer_prefill_fused(**args)


def gdn_layer_prefill_triton_fused_tiles_by_batch(**args):
    """CONTROL (`triton-fused-tiles-by-batch`): the fused kernels with the chunk size AITER's
    fused_gdn_prefill_qkvz schedule picks for this (tokens, batch) (gdn_lab.rules.aiter_fused_gdn_prefill),
    so a sequence's bits follow its batch wherever the rule changes the chunk."""
    from gdn_lab.rules.aiter_fused_gdn_prefill import control_chunk_size

    chunk = control_chunk_size(args["projected_qkvz"].shape[0], args["cache_indices"].numel())
    return gdn_layer_prefill_fused(**args, chunk_size=chunk)
