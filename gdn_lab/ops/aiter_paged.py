"""What AITER's Triton attention backends share: layout conversions, contracts, emulation (amd-aiter 0.1.7.post2.dev18).

The kernels come from the `amd-aiter` wheel through `gdn_lab.aiter` (its route and the
emulated arch are in the fingerprint). Off ROCm they run on an NVIDIA GPU, or on the CPU under
Triton's interpreter, with AITER told it runs on the emulated arch (gfx950 unless
`aiter.emulate` says otherwise); every experiment row records that arch.

| backend | op | AITER function | batch dependence (rule) |
|---|---|---|---|
| `aiter-triton-pa` | decode_attention | `aiter.ops.triton.pa_decode.paged_attention_decode` | V1/V2 (`gdn_lab.rules.aiter_pa_decode`) |
| `aiter-triton-unified` | decode_attention | `aiter.ops.triton.unified_attention.unified_attention` | 2D/3D split (`gdn_lab.rules.aiter_unified_attention`) |
| `aiter-triton-mha` | prefill_attention | `aiter.ops.triton.mha.flash_attn_varlen_func` | none (`gdn_lab.rules.aiter_flash_attn_varlen`) |

The lab's cache is `[num_pages, page_size, Hkv, D]` with a `kv_indptr`/`kv_indices` page table.
What each kernel reads instead, and the explicit conversion (copies; the lab's tensors are never
modified):

- paged_attention_decode: `key_cache`/`value_cache` `[num_blks, Hkv, blk, D]` (the lab's pages
  transposed, `to_head_major`) and `block_tables` int32 `[B, max_blocks]` (`block_table`: row b
  holds request b's pages, padded with page 0, never read); `max_seq_len` = the batch's longest
  context, as vLLM and SGLang pass it; `compute_type` = q's dtype; `k_scale`/`v_scale` float32 [1]
  (ones for bf16/fp16 caches; fp8 caches are dequantized in the kernel).
- unified_attention: the lab's cache layout as it is, `block_table` as above, `cu_seqlens_q` =
  0..B (one query per request), `seqused_k` = seq_lens, causal, no window, no softcap,
  `k_descale`/`v_descale` for fp8. Its kernels load whole KV blocks when the tile equals the block
  (they mask the scores, not the loads), so the unused slots of each request's last page must hold
  finite values: the lab's builders fill them with NaN, and the conversion zeroes them in a copy
  (`zero_unused_slots`). Any finite content gives the same bits, since those scores are -inf.
- flash_attn_varlen_func: contiguous K/V `[sum(seq_lens), Hkv, D]` (`gather_contiguous`),
  `cu_seqlens_k` from seq_lens, `cu_seqlens_q` = qo_indptr; its causal mask is aligned bottom
  right, i.e. the new tokens are the last of the context, the lab's convention.

Contracts (`covered`): q bf16/fp16 (bf16 not under Triton's CPU interpreter, whose tl.dot gets
bf16 wrong); the cache in q's dtype, or (decode only) the emulated arch's fp8 e4m3 format with
per-tensor scales; pages of a power of two >= 16 tokens for the decode kernels (the block is a
tl.dot dimension); head_dim >= 16. None of them is picked by `auto` (they are batch-variant by
design, and AMD code off AMD hardware): name them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.checks import dtype_name
from gdn_lab.device import fp8_dtype_for
from gdn_lab.ops.triton_support import interpreting, triton_device
from gdn_lab.routing import Check
from gdn_lab.rules.base import RuleEnv

MIN_HEAD_DIM = 16  # tl.dot needs an inner dimension of at least 16
MIN_BLOCK = 16


# --- layout conversions ---------------------------------------------------------------------


def block_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """The lab's page table as a vLLM block table: int32 [B, max_pages], row b = request b's pages.

    Entries past a request's pages are 0 (a valid page id): the kernels never read them, since they
    stop at the request's own length.
    """
    counts = (kv_indptr[1:] - kv_indptr[:-1]).long()
    width = max(int(counts.max()), 1) if num_seqs else 1
    table = torch.zeros(num_seqs, width, dtype=torch.int32, device=kv_indices.device)
    rows = torch.repeat_interleave(torch.arange(num_seqs, device=kv_indices.device), counts)
    cols = torch.arange(kv_indices.numel(), device=kv_indices.device) - kv_indptr[:-1].long()[rows]
    table[rows, cols] = kv_indices
    return table


def to_head_major(cache: torch.Tensor) -> torch.Tensor:
    """[num_pages, page_size, Hkv, D] -> [num_pages, Hkv, page_size, D] (a contiguous copy)."""
    return cache.permute(0, 2, 1, 3).contiguous()


def zero_unused_slots(
    cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """A copy of the cache whose slots past each request's length, in its last page, are zero."""
    page = cache.shape[1]
    out = cache.clone()
    last_pages = kv_indices[(kv_indptr[1:] - 1).long()].long()
    used = seq_lens.long() - (kv_indptr[1:] - kv_indptr[:-1]).long().sub(1) * page  # tokens in the last page
    slot = torch.arange(page, device=cache.device)
    mask = slot[None, :] >= used[:, None]  # [B, page]
    rows, cols = mask.nonzero(as_tuple=True)
    out.view(torch.uint8 if cache.element_size() == 1 else cache.dtype)[last_pages[rows], cols] = 0
    return out


def gather_contiguous(
    cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """Every request's tokens, in batch order, as one contiguous [sum(seq_lens), Hkv, D] tensor."""
    page = cache.shape[1]
    flat = cache.reshape(-1, cache.shape[2], cache.shape[3])
    counts = (kv_indptr[1:] - kv_indptr[:-1]).long()
    owner = torch.repeat_interleave(torch.arange(counts.numel(), device=cache.device), counts * page)
    slots = (kv_indices.long()[:, None] * page + torch.arange(page, device=cache.device)).reshape(-1)
    start = torch.repeat_interleave(kv_indptr[:-1].long() * page, counts * page)
    keep = torch.arange(slots.numel(), device=cache.device) - start < seq_lens.long()[owner]
    return flat[slots[keep]]


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """int32 [B+1] prefix sums of lengths, starting at 0."""
    return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)


# --- contracts ------------------------------------------------------------------------------


def _emulation_note(device: torch.device) -> str:
    if aiter.on_rocm():
        return f"ROCm {aiter.effective_arch(device)}"
    arch = aiter.effective_arch(device)
    return f"AITER told {arch}, {aiter.effective_num_cus(device)} CUs"


def _dtype_contract(args: Mapping[str, Any], allow_fp8: bool) -> Check:
    q, k_cache = args["q"], args["k_cache"]
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, f"q must be bf16 or fp16 (AITER's compute types), got {dtype_name(q.dtype)}"
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and interpreting():
        return False, "bf16 under Triton's CPU interpreter: its tl.dot computes bf16 wrongly; use fp16 on the CPU"
    if k_cache.dtype == q.dtype:
        return True, ""
    if k_cache.element_size() != 1 or not allow_fp8:
        return False, f"the cache must be in q's dtype ({dtype_name(q.dtype)}), got {dtype_name(k_cache.dtype)}"
    want = fp8_dtype_for(aiter.effective_arch(q.device))
    if k_cache.dtype != want:
        return False, (
            f"fp8 cache {dtype_name(k_cache.dtype)} is not the format of {aiter.effective_arch(q.device)} "
            f"({dtype_name(want)})"
        )
    return True, ""


def _covered(args: Mapping[str, Any], *, paged_kernel: bool, allow_fp8: bool) -> Check:
    ok, where = triton_device(args, "q")
    if not ok:
        return False, where
    ok, why = _dtype_contract(args, allow_fp8)
    if not ok:
        return False, why
    d = args["q"].shape[-1]
    if d < MIN_HEAD_DIM:
        return False, f"head_dim {d} < {MIN_HEAD_DIM} (a tl.dot dimension)"
    page = args["page_size"]
    if paged_kernel and (page < MIN_BLOCK or page & (page - 1)):
        return (
            False,
            f"page_size {page}: AITER's paged kernels need a power of two >= {MIN_BLOCK} (the block is a tl.dot dimension)",
        )
    return True, f"{where}; {_emulation_note(args['q'].device)}"


def covered_paged(args: Mapping[str, Any]) -> Check:
    """The paged decode kernels' contract (paged_attention_decode, unified_attention): pages of a
    power of two >= 16 tokens, the cache in q's dtype or the emulated arch's fp8."""
    return _covered(args, paged_kernel=True, allow_fp8=True)


def covered_mha(args: Mapping[str, Any]) -> Check:
    """flash_attn_varlen_func's contract (pages gathered into contiguous K/V; no fp8 cache)."""
    return _covered(args, paged_kernel=False, allow_fp8=False)


def compute_type(dtype: torch.dtype) -> Any:
    """The Triton dtype AITER's kernels take as compute_type."""
    import triton.language as tl

    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def available(kernel: str) -> Callable[[], Check]:
    """The availability probe of a backend running AITER kernel module `kernel`."""

    def probe() -> Check:
        return aiter.kernel_available(kernel)

    return probe


def emulated_arch() -> str | None:
    """The arch AITER is told off ROCm (the current emulation), None on ROCm (it asks the device)."""
    return None if aiter.on_rocm() else aiter.current_emulation().arch


def rule_env(device: torch.device) -> RuleEnv:
    """What AITER's dispatch sees here: the arch it dispatches for and the CU count."""
    return RuleEnv(aiter.effective_arch(device), aiter.effective_num_cus(device))
