"""fused_moe through AITER's Triton MoE GEMM (`aiter.ops.triton.moe_op.fused_moe`, amd-aiter wheel), on any machine.

`aiter-triton-moe` (library aiter-triton, rule `gdn_lab.rules.aiter_triton_moe`: the config by M
from the installed aiter's JSON tables), loaded through `gdn_lab.aiter` with the arch emulated off
ROCm (gfx950 reads the MI350X tables, gfx942 the MI300X ones), like the other `aiter-triton-*`
backends: on any GPU, and on the CPU under Triton's interpreter.

AITER's `fused_moe` is one grouped GEMM, vLLM's unfused Triton MoE adapted; its callers build the
rest, as AITER's own MoE tests do, and so does this adapter:

1. the slots (m * top_k + k) sorted by expert and padded to whole BLOCK_SIZE_M blocks (vLLM's
   `moe_align_block_size` contract: `align_block_size`, torch ops; where a slot sits in its block
   does not change the row's arithmetic);
2. `fused_moe(x, w1, ...)`: gate and up per slot, rounded to x's dtype;
3. SiLU-and-multiply, rounded (the lab's launch, `triton_kernels.silu_and_mul`: AITER's fused
   SiLU variant, `moe_op_silu_fused`, leaves rows unwritten under Triton 3.9's interpreter);
4. `fused_moe(act, w2, ...)` with the routing weights, over the slots (top_k 1), rounded;
5. the top-k sum per token in k order (the lab's launch, `triton_kernels.topk_sum`).

Both GEMMs take the config AITER's `get_optimal_moe_config(dtype, M=M)` gives for the call's M
tokens (its tests call it so; `fused_moe` itself takes no default). Steps 1, 3 and 5 work per row or
per token, so a token's bits follow the batch only through that config.

Contract (`covered`): x where Triton runs; fp16 or bf16 (AITER's compute types; bf16 not under the
CPU interpreter, whose tl.dot computes bf16 wrongly); at least one token. Not picked by `auto`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_paged import available, emulated_arch
from gdn_lab.ops.fused_moe import OP
from gdn_lab.ops.triton_support import interpreting, triton_device
from gdn_lab.routing import LIBRARY_AITER_TRITON, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import aiter_triton_moe

KERNEL, CONFIGS = "moe_op", "moe_config_utils"
DTYPES = (torch.float16, torch.bfloat16)


def align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's `moe_align_block_size` contract, in torch ops (no host synchronisation).

    Returns:
        sorted_token_ids: int32, the slots of each expert in turn (ascending), each expert's padded
            to a multiple of block_m with the slot count (an invalid slot, masked by the kernel);
            its length is the bound numel + E * (block_m - 1), the tail padded alike.
        expert_ids: int32, each block's expert (blocks past the last: -1, never launched).
        num_tokens_post_padded: int32 [1], the padded slots in use.
    """
    from gdn_lab.ops.fused_moe.triton_kernels import expert_counts

    flat = topk_ids.reshape(-1).long()
    slots, dev = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)  # slots by expert, ascending within each
    experts = flat[order]
    counts = expert_counts(experts, num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    bound = slots + num_experts * (block_m - 1)
    ranks = torch.arange(slots, device=dev) - (torch.cumsum(counts, 0) - counts)[experts]
    sorted_ids = torch.full((bound,), slots, dtype=torch.int32, device=dev)
    sorted_ids[(ends - padded)[experts] + ranks] = order.to(torch.int32)
    blocks = torch.arange(-(-bound // block_m), device=dev) * block_m
    expert = torch.searchsorted(ends, blocks, right=True)
    expert_ids = torch.where(expert < num_experts, expert, -1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


def fused_moe_aiter_triton(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """The routed experts through AITER's Triton `fused_moe` (see the module docstring).

    Args:
        x, w1, w2, topk_weights, topk_ids: fused_moe's validated arguments.
        kernel: the function to call in AITER's place (a test double, run outside AITER's shims,
            with the config the rule gives); None loads AITER's own and its config function.

    Returns:
        [M, H] in x's dtype.
    """
    import triton.language as tl

    from gdn_lab.ops.fused_moe import triton_kernels  # loaded on use: it imports triton

    tokens, top_k = topk_ids.shape
    num_experts, inter, h = w1.shape[0], w2.shape[2], w2.shape[1]
    arch = aiter.effective_arch(x.device)
    scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    if kernel is None:
        kernel = aiter.load(KERNEL, arch).fused_moe
        config = aiter.load(CONFIGS, arch).get_optimal_moe_config
        scope = aiter.shims(arch, aiter.effective_num_cus(x.device))
    else:
        config = aiter_triton_moe_config(arch)
    compute = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[x.dtype]
    with scope:
        cfg = dict(config(x.dtype, M=tokens))
        sorted_ids, expert_ids, padded = align_block_size(topk_ids, num_experts, int(cfg["BLOCK_SIZE_M"]))
        gate_up = torch.empty(tokens, top_k, 2 * inter, dtype=x.dtype, device=x.device)
        kernel(x, w1, gate_up, None, None, None, topk_weights, topk_ids, sorted_ids, expert_ids, padded,
               False, top_k, compute, False, False, False, None, cfg)  # fmt: skip
        act = triton_kernels.silu_and_mul(gate_up.view(tokens * top_k, 2 * inter))
        y = torch.empty(tokens, top_k, h, dtype=x.dtype, device=x.device)
        kernel(act, w2, y, None, None, None, topk_weights, topk_ids, sorted_ids, expert_ids, padded,
               True, 1, compute, False, False, False, None, cfg)  # fmt: skip
    return triton_kernels.topk_sum(y.view(tokens * top_k, h), tokens, top_k)


def aiter_triton_moe_config(arch: str) -> Callable[..., Mapping[str, Any]]:
    """`get_optimal_moe_config(dtype, M=...)` as the rule reads it (for a test double, AITER unloaded)."""

    def config(dtype: torch.dtype, M: int) -> Mapping[str, Any]:  # noqa: N803  (AITER's keyword)
        return aiter_triton_moe.get_config(M, arch, dtype).config

    return config


def covered(args: Mapping[str, Any]) -> Check:
    """AITER's Triton MoE contract (see the module docstring)."""
    ok, where = triton_device(args, "x")
    if not ok:
        return False, where
    x = args["x"]
    if x.dtype not in DTYPES:
        return False, f"x is {x.dtype}; AITER's Triton MoE computes in fp16 or bf16"
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and interpreting():
        return False, "bf16 under Triton's CPU interpreter: its tl.dot computes bf16 wrongly; use fp16"
    if x.shape[0] == 0:
        return False, "an empty batch (M=0): the config lookup takes M >= 1"
    arch = aiter.effective_arch(x.device)
    try:
        cfg = aiter_triton_moe.get_config(x.shape[0], arch, x.dtype)
    except ImportError as exc:
        return False, str(exc)
    return True, f"{where}; {cfg.file_name} {cfg.entry} for M={x.shape[0]} on {arch}: {cfg.key}"


register(
    Backend(
        OP,
        "aiter-triton-moe",
        fused_moe_aiter_triton,
        library=LIBRARY_AITER_TRITON,
        available=available(KERNEL),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        rule=aiter_triton_moe.RULE,
        description="AITER Triton fused_moe GEMMs (amd-aiter wheel): tiles and BLOCK_SIZE_K from JSON tables by M",
    )
)
