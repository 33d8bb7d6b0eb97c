"""decode_attention through AITER's HIP `paged_attention_ragged`, called as SGLang's AiterAttnBackend does (ROCm only).

`aiter` (library aiter, rule `gdn_lab.rules.aiter_pa_ragged`): `aiter.ops.attention.paged_attention_ragged`,
called positionally exactly as SGLang's `forward_decode` (aiter_backend.py @003c5589,
aiter_contracts.md 1.2 and 1.4):

    paged_attention_ragged(out, workspace, query, key_cache, value_cache, scale, kv_indptr,
        kv_indices, kv_last_page_lens, block_size, max_num_partitions, None, kv_cache_dtype, "NHD",
        0.0, k_scale, v_scale, None, 256)

- Token-level pages (SGLang's call, the default): the lab's cache [num_pages, page_size, Hkv, D]
  viewed, without a copy, as [num_pages * page_size, 1, Hkv, D] (SGLang's token pool as AITER sees
  it), `kv_indptr = cumsum(seq_lens)`, `kv_indices` each request's token slots in order
  (`aiter_native.token_table`), `kv_last_page_lens` ones (ignored at block size 1), block size 1.
- Native pages (`aiter_pa_ragged.deployment(token_pages=False)`, a variant SGLang does not run):
  the cache and page table as they are, block size = page_size, `kv_last_page_lens = seq_lens -
  (pages - 1) * page_size`.
- `max_num_partitions = ceil(max_context / 256)` from the deployment setting
  (`gdn_lab.rules.aiter_pa_ragged.deployment`, default max_context 40960: SGLang's context_len for
  Qwen3-8B), held for a whole run; the workspace is SGLang's uint8 buffer for the call's batch:
  `B * Hq * P * D * 4 + 2 * B * Hq * P * 4` bytes (exp_sums and max_logits float32 [B, Hq, P],
  tmp_out [B, Hq, P, D] in the query dtype need `B * Hq * P * (8 + 2 * D)`; SGLang budgets tmp_out
  at 4 bytes). Every row records P and max_context in its `reason`.
- `kv_cache_dtype` "auto" for a cache in q's dtype, "fp8_e4m3" for the arch's fp8 cache (read
  natively); scale = the call's softmax scale (SGLang: 1/sqrt(D)); partition size 256 (the QK
  kernel hard-codes 256; anything else is silently wrong); no alibi, NHD layout, no soft cap
  (SGLang passes `layer.logit_cap`, 0 for Qwen), no fp8 output scale.
- k_scale / v_scale: SGLang passes its backend's 1.0 tensors, never `layer.k_scale`, although it
  writes an fp8 cache with `layer.k_scale` (aiter_contracts.md 1.4 and open question 7). The lab's
  fp8 caches carry real scales, so the lab passes its own `k_scale`/`v_scale` (float32 [1]); for a
  cache in q's dtype it passes ones, as SGLang. With unit scales the two calls are identical; with
  others SGLang would compute with the wrong scale.

Contract (`covered`): ROCm tensors on the GPU; q bf16 or fp16; the cache in q's dtype or the
arch's fp8 e4m3 format; a contiguous cache (the token view is a reshape); every context within the
deployment's max_context (the workspace holds P partitions per request). Not picked by `auto`:
AMD code is named, never chosen silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab.ops import aiter_native
from gdn_lab.ops.decode_attention import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import aiter_pa_ragged

KERNEL, FUNCTION = "paged_attention_ragged", "paged_attention_ragged"
QUERY_DTYPES = (torch.bfloat16, torch.float16)
KV_LAYOUT = "NHD"
LOGITS_SOFT_CAP = 0.0  # Qwen's attention has no logit cap


def workspace_bytes(num_seqs: int, num_heads: int, max_num_partitions: int, head_dim: int) -> int:
    """SGLang's workspace size in bytes (tmp_out budgeted at 4 bytes per element)."""
    cells = num_seqs * num_heads * max_num_partitions
    return cells * head_dim * 4 + 2 * cells * 4


def min_workspace_bytes(num_seqs: int, num_heads: int, max_num_partitions: int, head_dim: int, q_bytes: int) -> int:
    """What the kernel reads and writes: exp_sums, max_logits (float32) and tmp_out in q's dtype."""
    cells = num_seqs * num_heads * max_num_partitions
    return cells * (8 + q_bytes * head_dim)


def decode_attention_aiter(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """decode_attention through `paged_attention_ragged`, as SGLang calls it (see the module docstring).

    Args:
        q ... v_scale: decode_attention's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [B, Hq, D] in q's dtype.
    """
    fn = kernel or aiter_native.function(KERNEL, FUNCTION)
    setting = aiter_pa_ragged.current_deployment()
    num_seqs, num_heads, head_dim = q.shape
    hkv = k_cache.shape[2]
    if setting.token_pages:
        indptr, indices = aiter_native.token_table(kv_indptr, kv_indices, seq_lens, page_size)
        key_cache = k_cache.view(-1, 1, hkv, head_dim)  # SGLang's k_cache.view(-1, 1, H_kv, D)
        value_cache = v_cache.view(-1, 1, hkv, v_cache.shape[3])
        last_page_lens = torch.ones(num_seqs, dtype=torch.int32, device=q.device)
        block_size = 1
    else:
        indptr, indices, key_cache, value_cache = kv_indptr, kv_indices, k_cache, v_cache
        pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
        last_page_lens = (seq_lens - (pages - 1) * page_size).to(torch.int32)
        block_size = page_size
    P = setting.max_num_partitions
    workspace = torch.empty(workspace_bytes(num_seqs, num_heads, P, head_dim), dtype=torch.uint8, device=q.device)
    out = torch.empty_like(q)
    ks, vs = aiter_native.scales_or_unit(k_scale, v_scale, q.device)
    fn(
        out,
        workspace,
        q,
        key_cache,
        value_cache,
        float(scale),
        indptr,
        indices,
        last_page_lens,
        block_size,
        P,
        None,
        aiter_pa_ragged.kv_cache_string(k_cache.element_size() == 1),
        KV_LAYOUT,
        LOGITS_SOFT_CAP,
        ks,
        vs,
        None,
        aiter_pa_ragged.PARTITION_SIZE,
    )
    return out


def covered(args: Mapping[str, Any]) -> Check:
    """paged_attention_ragged's contract, with SGLang's call (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "q")
    if not ok:
        return False, why
    q, k_cache = args["q"], args["k_cache"]
    if q.dtype not in QUERY_DTYPES:
        return False, f"q is {aiter_native.dtype_names(q.dtype)}; paged_attention_ragged takes bf16 or fp16 queries"
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        return False, "q's heads and head dim must be contiguous (the kernel takes only q.stride(0))"
    fp8 = k_cache.element_size() == 1
    if not fp8 and k_cache.dtype != q.dtype:
        return False, f"the cache must be in q's dtype or fp8, got {aiter_native.dtype_names(k_cache.dtype)}"
    for name in ("k_cache", "v_cache"):
        if not args[name].is_contiguous():
            return False, f"{name} must be contiguous (SGLang's token view is a reshape of the pool)"
    setting = aiter_pa_ragged.current_deployment()
    longest = int(args["seq_lens"].max())
    if longest > setting.max_context:
        return False, (
            f"a request of {longest} tokens > the deployment's max_context {setting.max_context} "
            f"(the workspace holds {setting.max_num_partitions} partitions of 256): "
            "raise it with gdn_lab.rules.aiter_pa_ragged.deployment(max_context=...)"
        )
    pages = "block_size 1 (SGLang's token-level pages)" if setting.token_pages else f"block_size {args['page_size']}"
    return True, (
        f"paged_attention_ragged, {pages}, max_num_partitions {setting.max_num_partitions} "
        f"(max_context {setting.max_context}), partition 256, kv {aiter_pa_ragged.kv_cache_string(fp8)!r}, "
        f"{'the lab' if fp8 else 'unit'} k/v scales"
    )


register(
    Backend(
        OP,
        "aiter",
        decode_attention_aiter,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's HIP paged_attention_ragged"),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=aiter_pa_ragged.RULE,
        description="AITER HIP paged_attention_ragged as SGLang's AiterAttnBackend calls it (token pages, P fixed per deployment)",
    )
)
