"""decode_attention through AITER's own Triton kernels (amd-aiter wheel), on any machine.

| backend | AITER function | batch dependence (rule) |
|---|---|---|
| `aiter-triton-pa` | `aiter.ops.triton.pa_decode.paged_attention_decode` | V1/V2 (`gdn_lab.rules.aiter_pa_decode`) |
| `aiter-triton-unified` | `aiter.ops.triton.unified_attention.unified_attention` | 2D/3D split (`gdn_lab.rules.aiter_unified_attention`) |

The layout conversions, contracts and emulation are `gdn_lab.ops.aiter_paged`'s. Neither is picked by
`auto` (batch-variant by design, and AMD code off AMD hardware): name them.
"""

from __future__ import annotations

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_native import scales_or_unit
from gdn_lab.ops.aiter_paged import (
    available,
    block_table,
    compute_type,
    covered_paged,
    emulated_arch,
    to_head_major,
    zero_unused_slots,
)
from gdn_lab.ops.decode_attention import OP
from gdn_lab.routing import LIBRARY_AITER_TRITON, PRIORITY_AMD, Backend, register
from gdn_lab.rules import aiter_pa_decode, aiter_unified_attention


def decode_attention_aiter_pa(
    q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale
) -> torch.Tensor:
    """decode_attention through AITER's Triton `paged_attention_decode` (V1 or V2, as its rule picks)."""
    if q.shape[0] == 0:  # an empty batch: nothing to launch (AITER reads max(seq_lens))
        return torch.empty_like(q)
    arch, cus = aiter.effective_arch(q.device), aiter.effective_num_cus(q.device)
    module = aiter.load("pa_decode", arch)
    out = torch.empty_like(q)
    ks, vs = scales_or_unit(k_scale, v_scale, q.device)
    with aiter.shims(arch, cus):
        module.paged_attention_decode(
            out,
            q,
            to_head_major(k_cache),
            to_head_major(v_cache),
            seq_lens,
            block_table(kv_indptr, kv_indices, q.shape[0]),
            scale,
            int(seq_lens.max()),
            compute_type(q.dtype),
            ks,
            vs,
        )
    return out


def decode_attention_aiter_unified(
    q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, page_size, scale, k_scale, v_scale
) -> torch.Tensor:
    """decode_attention through AITER's Triton `unified_attention` (2D or 3D, as its rule picks)."""
    if q.shape[0] == 0:  # an empty batch: nothing to launch
        return torch.empty_like(q)
    arch, cus = aiter.effective_arch(q.device), aiter.effective_num_cus(q.device)
    module = aiter.load("unified_attention", arch)
    out = torch.empty_like(q)
    with aiter.shims(arch, cus):
        module.unified_attention(
            q=q,
            k=zero_unused_slots(k_cache, kv_indptr, kv_indices, seq_lens),
            v=zero_unused_slots(v_cache, kv_indptr, kv_indices, seq_lens),
            out=out,
            cu_seqlens_q=torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device),
            max_seqlen_q=1,
            seqused_k=seq_lens,
            max_seqlen_k=int(seq_lens.max()),
            softmax_scale=scale,
            causal=True,
            window_size=(-1, -1),
            block_table=block_table(kv_indptr, kv_indices, q.shape[0]),
            softcap=0.0,
            q_descale=None,
            k_descale=k_scale,
            v_descale=v_scale,
        )
    return out


register(
    Backend(
        OP,
        "aiter-triton-pa",
        decode_attention_aiter_pa,
        library=LIBRARY_AITER_TRITON,
        available=available("pa_decode"),
        covered=covered_paged,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        rule=aiter_pa_decode.DISPATCH,
        description="AITER's Triton paged_attention_decode (amd-aiter wheel): V1 or V2 by batch (rules.aiter_pa_decode)",
    )
)
register(
    Backend(
        OP,
        "aiter-triton-unified",
        decode_attention_aiter_unified,
        library=LIBRARY_AITER_TRITON,
        available=available("unified_attention"),
        covered=covered_paged,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        rule=aiter_unified_attention.DISPATCH,
        description="AITER's Triton unified_attention (amd-aiter wheel): 2D or 3D split-KV by batch (rules.aiter_unified_attention)",
    )
)
