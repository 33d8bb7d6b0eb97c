"""What AITER's AMD-only backends share (HIP, CK, FlyDSL, Gluon): availability, loading, the call seam.

| backend | op | AITER function (module) | rule |
|---|---|---|---|
| `aiter` | decode_attention | `paged_attention_ragged` (aiter.ops.attention) | `rules.aiter_pa_ragged` |
| `aiter` | prefill_attention | `mha_batch_prefill_func` (aiter.ops.mha) | `rules.ck_batch_prefill` |
| `aiter-hip` | gdn_decode | `hip_fused_sigmoid_gating_delta_rule_update` (aiter.ops.hip.gated_delta_net.hip_gdn_decode) | none known |
| `aiter-flydsl` | gdn_decode | `flydsl_gdr_decode` (aiter.ops.flydsl.linear_attention_kernels) | `rules.flydsl_gdr_decode` |
| `sglang-aiter` | gdn_decode | SGLang's AiterGDNKernel routing among the three GDN decodes | `rules.sglang_gdn` (decode) |
| `aiter-vk` | gdn_prefill | `chunk_gated_delta_rule_opt_vk` (aiter.ops.triton.gated_delta_net.gated_delta_rule) | `rules.aiter_gdn_prefill_vk` |
| `aiter-fused` | gdn_layer_prefill | `fused_gdn_prefill_qkvz` (aiter.ops.triton.gated_delta_net.fused_gdn_prefill_qkvz) | `rules.aiter_fused_gdn_prefill` |
| `aiter` | fused_moe | `fused_moe` (aiter.fused_moe: CK 2-stage or ASM 1-stage) | none (stage 2 may add atomically) |

Every module is loaded through `gdn_lab.aiter.load` (kernel names in `aiter.ROCM_ONLY`): only on
ROCm, by AITER's official import, when a call runs or a probe asks; registering the backends
imports nothing. Off ROCm `available()` says so without touching aiter. They run natively (no
emulated arch): a row's arch is the device's.

The call seam: every adapter takes a keyword-only `kernel=` (the AITER function to call; None
loads AITER's own). Tests pass a *test double* there, a function with the documented signature
that records the call, so the marshalling is checked on any machine; the backends' `run` never
passes it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.routing import Check

# The parameters each AITER function must take, in this order (the documented signatures the
# adapters call; an older aiter whose function lacks them is reported, not called).
SIGNATURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("paged_attention_ragged", "paged_attention_ragged"): (
        "out", "workspace_buffer", "query", "key_cache", "value_cache", "scale", "kv_indptr", "kv_page_indices",
        "kv_last_page_lens", "block_size", "max_num_partitions", "alibi_slopes", "kv_cache_dtype", "kv_cache_layout",
        "logits_soft_cap", "k_scale", "v_scale", "fp8_out_scale", "partition_size",
    ),
    ("mha_batch_prefill", "mha_batch_prefill_func"): (
        "q", "k", "v", "cu_seqlens_q", "kv_indptr", "kv_page_indices", "max_seqlen_q", "max_seqlen_k",
    ),
    ("flydsl_gdr_decode", "flydsl_gdr_decode"): (
        "query", "key", "value", "a", "b", "dt_bias", "A_log", "indices", "state", "out", "use_qk_l2norm",
        "need_shuffle_state",
    ),
    ("hip_gdn_decode", "hip_fused_sigmoid_gating_delta_rule_update"): (
        "A_log", "a", "dt_bias", "softplus_beta", "softplus_threshold", "q", "k", "v", "b", "initial_state_source",
        "initial_state_indices",
    ),
    ("gdn_prefill_vk", "chunk_gated_delta_rule_opt_vk"): ("q", "k", "v"),
    ("fused_gdn_prefill", "fused_gdn_prefill_qkvz"): (
        "projected_qkvz", "projected_ba", "conv_state", "delta_state", "cache_indices", "cu_seqlens",
        "has_initial_state", "conv_weight", "conv_bias", "a_log", "dt_bias", "norm_weight",
    ),
    ("ck_moe", "fused_moe"): ("hidden_states", "w1", "w2", "topk_weight", "topk_ids", "expert_mask", "activation",
                              "quant_type"),
    ("fused_gdn_prefill", "fused_gdn_prefill_qkvz_supported"): (
        "projected_qkvz", "projected_ba", "conv_state", "delta_state", "cache_indices", "cu_seqlens",
        "has_initial_state", "conv_weight", "conv_bias", "quant_dtype",
    ),
}  # fmt: skip
# Keyword parameters SGLang's call passes beyond the positional ones (a newer aiter than 0.1.7 has them).
KEYWORDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("mha_batch_prefill", "mha_batch_prefill_func"): ("sink_ptr", "q_descale", "k_descale", "v_descale"),
    ("gdn_prefill_vk", "chunk_gated_delta_rule_opt_vk"): (
        "initial_state_indices",
        "inplace_final_state",
        "use_chunk_hip",
    ),
}


def check_signature(fn: Callable[..., Any], positional: Sequence[str], keywords: Sequence[str] = ()) -> Check:
    """Whether `fn` takes `positional` first, in that order, and accepts every name in `keywords`."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or a torch custom op without a Python signature
        return True, "signature not inspectable"
    names = list(params)
    if names[: len(positional)] != list(positional):
        return False, f"expects ({', '.join(positional)}, ...), has ({', '.join(names[: len(positional)])}, ...)"
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [k for k in keywords if k not in params and not takes_kwargs]
    if missing:
        return False, f"has no {', '.join(missing)} (an older aiter than the call needs)"
    return True, "signature as documented"


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block (SGLang's settings around an AITER call), restore after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def function(kernel: str, attr: str, env: Mapping[str, str] | None = None) -> Callable[..., Any]:
    """AITER's `attr` from kernel module `kernel` (`gdn_lab.aiter.load`; ROCm only for ROCM_ONLY kernels).

    Raises:
        AiterUnavailable: not on ROCm, aiter is missing, or the module does not import.
        AttributeError: the module has no `attr` (another aiter version).
    """
    with environment(env or {}):
        module = aiter.load(kernel)
    return getattr(module, attr)


def available(kernel: str, attr: str, what: str, env: Mapping[str, str] | None = None) -> Callable[[], Check]:
    """The availability probe of a backend calling AITER's `attr` from `kernel`.

    Off ROCm it answers at once, importing nothing; on ROCm the first probe imports the module
    (AITER's official import; a failure is remembered by the loader) and checks the signature.

    Args:
        kernel, attr: the loader's kernel name and the function in its module.
        what: the kernel in words, for the reason ("AITER's HIP paged_attention_ragged").
        env: environment variables set while the module imports (SGLang's settings).
    """

    def probe() -> Check:
        if kernel in aiter.ROCM_ONLY and not aiter.on_rocm():
            return False, f"{what} runs on ROCm only; this torch has no ROCm (torch.version.hip is None)"
        p = aiter.probe()
        if not p.installed:
            return False, p.reason
        try:
            fn = function(kernel, attr, env)
        except aiter.AiterUnavailable as exc:
            return False, str(exc)
        except AttributeError:
            return False, f"aiter {p.version}: {aiter.KERNEL_MODULES[kernel][-1]} has no {attr}"
        ok, why = check_signature(fn, SIGNATURES.get((kernel, attr), ()), KEYWORDS.get((kernel, attr), ()))
        if not ok:
            return False, f"aiter {p.version}: {attr} {why}"
        return True, f"aiter {p.version} ({p.route}): {attr} on {aiter.effective_arch()}"

    return probe


def on_device(args: Mapping[str, Any], tensor: str) -> Check:
    """The call's tensors are on the GPU (AITER's AMD kernels take no CPU tensors)."""
    device = args[tensor].device
    if device.type != "cuda":
        return False, f"{tensor} is on {device}: AITER's AMD kernels run on the GPU"
    return True, ""


def unit_scale(device: torch.device) -> torch.Tensor:
    """A float32 [1] scale of 1.0: what AITER's kernels take where a cache or query has no scale."""
    return torch.ones(1, dtype=torch.float32, device=device)


def scales_or_unit(
    k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's k/v scales, or unit scales for a cache stored without them."""
    one = unit_scale(device)
    return (one if k_scale is None else k_scale), (one if v_scale is None else v_scale)


def dtype_names(*dtypes: torch.dtype) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def token_table(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lab's page table as SGLang's token-level one: (kv_indptr = cumsum(seq_lens), token slots).

    SGLang's KV pool holds one token per slot and `create_flashinfer_kv_indices_triton` lists each
    request's slots in order; the lab's cache [num_pages, page_size, Hkv, D] viewed as
    [num_pages * page_size, 1, Hkv, D] is such a pool, in which token t of request b sits in slot
    kv_indices[kv_indptr[b] + t // page_size] * page_size + t % page_size.

    Returns:
        (int32 [B+1] token prefix sums, int32 [sum(seq_lens)] token slots, request after request).
    """
    lens = seq_lens.long()
    indptr = torch.nn.functional.pad(torch.cumsum(lens, 0), (1, 0))
    owner = torch.repeat_interleave(torch.arange(lens.numel(), device=lens.device), lens)
    pos = torch.arange(int(indptr[-1]), device=lens.device) - indptr[:-1][owner]
    pages = kv_indices.long()[kv_indptr[:-1].long()[owner] + pos // page_size]
    slots = pages * page_size + pos % page_size
    return indptr.to(torch.int32), slots.to(torch.int32)
