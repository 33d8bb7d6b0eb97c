"""prefill_attention through AITER's CK `mha_batch_prefill_func`, called as SGLang's forward_extend does (ROCm only).

`aiter` (library aiter, rule `gdn_lab.rules.ck_batch_prefill`: CK's hdim-128 tile switch at
0.8 x CUs): `aiter.ops.mha.mha_batch_prefill_func`, called as SGLang's `forward_extend` (non-MLA NHD
path, aiter_backend.py @003c5589, aiter_contracts.md 2.1-2.3):

    mha_batch_prefill_func(q.contiguous().view(-1, Hq, D), k_pool, v_pool, qo_indptr, kv_indptr,
        kv_indices, max_q_len, max_kv_len, causal=True, logits_soft_cap=0.0, alibi_slopes=None,
        return_lse=False, return_attn_probs=False, window_size=(-1, -1), sink_ptr=None,
        q_descale=..., k_descale=..., v_descale=...)

- `k_pool`, `v_pool`: SGLang's 3-D token pool [tokens, Hkv, D] (page size 1): the lab's cache
  [num_pages, page_size, Hkv, D] viewed without a copy as [num_pages * page_size, Hkv, D];
  `kv_indptr = cumsum(seq_lens)` and `kv_indices` each request's token slots in order
  (`aiter_native.token_table`), followed by SGLang's 256 padding entries, all equal to
  `kv_indices[0]` (its workaround for the kernel's 128-wide reads past the last token);
  `qo_indptr` the call's own (cumsum of new tokens); max_q_len and max_kv_len the batch's longest.
- bf16/fp16 cache: no descales. fp8 cache: as SGLang, q is cast to the cache's fp8 dtype (no
  scaling) and the output cast back to q's dtype (the fp8bf16 kernel returns bf16). SGLang passes
  `q_descale = layer.k_scale` (1.0 for its default checkpoints); since q is cast unscaled the lab
  passes q_descale = 1.0 and its real `k_scale`/`v_scale` as k/v descales. With unit scales the
  two calls are identical.
- The softmax scale is the function's default (1/sqrt(D)), as SGLang leaves it; another `scale`
  is passed as `softmax_scale`.

Contract (`covered`): ROCm tensors on the GPU; q bf16 or fp16; the cache in q's dtype or the
arch's fp8; head dim <= 256 and a multiple of the 16-byte vector; contiguous caches (the token view
is a reshape). On gfx950 an fp8 cache with head dim 256 is not covered: SGLang runs
`flash_attn_varlen_fp8_pertensor_func` (ASM) there instead. Not picked by `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops import aiter_native
from gdn_lab.ops.prefill_attention import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import ck_batch_prefill

KERNEL, FUNCTION = "mha_batch_prefill", "mha_batch_prefill_func"
KV_INDICES_PADDING = 256  # SGLang's AiterIndicesUpdaterPrefill pads kv_indices by 256 entries
QUERY_DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
VECTOR_BYTES = 16


def padded_kv_indices(slots: torch.Tensor) -> torch.Tensor:
    """SGLang's kv_indices: the token slots, then 256 entries equal to the first slot."""
    return torch.cat([slots, slots[:1].expand(KV_INDICES_PADDING)])


def prefill_attention_aiter(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    causal: bool,
    scale: float,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """prefill_attention through `mha_batch_prefill_func`, as SGLang calls it (see the module docstring).

    Args:
        q ... v_scale: prefill_attention's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [T, Hq, D] in q's dtype.
    """
    fn = kernel or aiter_native.function(KERNEL, FUNCTION)
    _, num_heads, head_dim = q.shape
    hkv = k_cache.shape[2]
    k_pool = k_cache.view(-1, hkv, head_dim)  # SGLang's token pool [tokens, Hkv, D]
    v_pool = v_cache.view(-1, hkv, v_cache.shape[3])
    indptr, slots = aiter_native.token_table(kv_indptr, kv_indices, seq_lens, page_size)
    new_tokens = qo_indptr[1:] - qo_indptr[:-1]
    fp8 = k_cache.element_size() == 1
    descales: dict[str, Any] = {"q_descale": None, "k_descale": None, "v_descale": None}
    query = q
    if fp8:
        query = q.to(k_cache.dtype)  # SGLang: q = q.to(fp8_dtype)
        descales = {"q_descale": aiter_native.unit_scale(q.device), "k_descale": k_scale, "v_descale": v_scale}
    extra = {} if scale == head_dim**-0.5 else {"softmax_scale": scale}
    out = fn(
        query.contiguous().view(-1, num_heads, head_dim),
        k_pool,
        v_pool,
        qo_indptr,
        indptr,
        padded_kv_indices(slots),
        int(new_tokens.max()),
        int(seq_lens.max()),
        causal=causal,
        logits_soft_cap=0.0,
        alibi_slopes=None,
        return_lse=False,
        return_attn_probs=False,
        window_size=(-1, -1),
        sink_ptr=None,
        **descales,
        **extra,
    )
    if isinstance(out, tuple):
        out = out[0]
    return out if out.dtype == q.dtype else out.to(q.dtype)


def covered(args: Mapping[str, Any]) -> Check:
    """mha_batch_prefill_func's contract, with SGLang's call (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "q")
    if not ok:
        return False, why
    q, k_cache = args["q"], args["k_cache"]
    if q.dtype not in QUERY_DTYPES:
        return False, f"q is {aiter_native.dtype_names(q.dtype)}; mha_batch_prefill_func takes bf16 or fp16"
    fp8 = k_cache.element_size() == 1
    if not fp8 and k_cache.dtype != q.dtype:
        return False, f"the cache must be in q's dtype or fp8, got {aiter_native.dtype_names(k_cache.dtype)}"
    d = q.shape[2]
    vector = VECTOR_BYTES // k_cache.element_size()
    if d > MAX_HEAD_DIM or d % vector:
        return False, f"head_dim {d}: CK batch prefill takes <= {MAX_HEAD_DIM}, a multiple of {vector} (16 bytes)"
    arch = aiter.effective_arch(q.device)
    if fp8 and arch == "gfx950" and d == MAX_HEAD_DIM:
        return False, (
            "fp8 KV with head_dim 256 on gfx950: SGLang runs flash_attn_varlen_fp8_pertensor_func (ASM) there, "
            "not mha_batch_prefill_func"
        )
    for name in ("k_cache", "v_cache"):
        if not args[name].is_contiguous():
            return False, f"{name} must be contiguous (SGLang's token pool view is a reshape)"
    kind = ck_batch_prefill.dtype_key(q.dtype, k_cache.dtype)
    return True, (
        f"mha_batch_prefill_func ({kind}) on {arch}, SGLang's token-level pool, kv_indices + "
        f"{KV_INDICES_PADDING} padding entries"
    )


register(
    Backend(
        OP,
        "aiter",
        prefill_attention_aiter,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's CK mha_batch_prefill_func"),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=ck_batch_prefill.RULE,
        description="AITER CK mha_batch_prefill_func as SGLang's forward_extend calls it (CK tile by blocks vs 0.8 x CUs)",
    )
)
