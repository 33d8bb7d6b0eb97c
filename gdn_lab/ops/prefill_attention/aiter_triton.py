"""prefill_attention through AITER's own Triton `flash_attn_varlen_func` (amd-aiter wheel), on any machine.

`aiter-triton-mha`: the forward of `aiter.ops.triton.mha.flash_attn_varlen_func` over contiguous
K/V gathered from the lab's pages (`gdn_lab.ops.aiter_paged`); one tile per arch and dtype
(`gdn_lab.rules.aiter_flash_attn_varlen`). Not picked by `auto`: name it.
"""

from __future__ import annotations

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_paged import available, covered_mha, cu_seqlens, emulated_arch, gather_contiguous
from gdn_lab.ops.prefill_attention import OP
from gdn_lab.routing import LIBRARY_AITER_TRITON, PRIORITY_AMD, Backend, register
from gdn_lab.rules import aiter_flash_attn_varlen


def prefill_attention_aiter_mha(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, seq_lens, page_size, causal, scale, k_scale, v_scale
) -> torch.Tensor:
    """prefill_attention through AITER's Triton `flash_attn_varlen_func` (forward only)."""
    if q.shape[0] == 0:  # no new tokens: nothing to launch (the max lengths below need a request)
        return torch.empty_like(q)
    arch, cus = aiter.effective_arch(q.device), aiter.effective_num_cus(q.device)
    module = aiter.load("mha", arch)
    new_tokens = qo_indptr[1:] - qo_indptr[:-1]
    with aiter.shims(arch, cus), torch.no_grad():
        return module.flash_attn_varlen_func(
            q,
            gather_contiguous(k_cache, kv_indptr, kv_indices, seq_lens),
            gather_contiguous(v_cache, kv_indptr, kv_indices, seq_lens),
            cu_seqlens_q=qo_indptr,
            cu_seqlens_k=cu_seqlens(seq_lens),
            max_seqlen_q=int(new_tokens.max()),
            max_seqlen_k=int(seq_lens.max()),
            softmax_scale=scale,
            causal=causal,
        )


register(
    Backend(
        OP,
        "aiter-triton-mha",
        prefill_attention_aiter_mha,
        library=LIBRARY_AITER_TRITON,
        available=available("mha"),
        covered=covered_mha,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        rule=aiter_flash_attn_varlen.DISPATCH,
        description="AITER's Triton flash_attn_varlen_func forward (amd-aiter wheel): one tile per arch and dtype",
    )
)
