"""matmul through AITER's Triton `gemm_a16w16` (amd-aiter wheel), on any machine.

`aiter-triton-gemm` (library aiter-triton, rule `gdn_lab.rules.aiter_gemm_a16w16`: the config by M
from the installed aiter's JSON tables): `aiter.ops.triton.gemm_a16w16.gemm_a16w16(x, w, dtype=...)`,
loaded through `gdn_lab.aiter` with the arch emulated off ROCm (gfx950 reads the MI350X tables,
gfx942 the MI300X ones), like the other `aiter-triton-*` backends: on any GPU, and on the CPU under
Triton's interpreter.

Layout: AITER computes Y = X @ W^T with `w` [N, K] (the nn.Linear weight layout; it transposes the
view inside and reads it by strides). The lab's `w` is [K, N], so the adapter passes
`w.t().contiguous()`, an explicit [N, K] copy with strides (K, 1), as an nn.Linear weight is
stored. The output dtype is x's; no bias, no activation, no preallocated output, AITER's own
config (`config=None`: `_get_config(M, N, K)`). Every row of a launch shares its config, so a
row's bits follow M, the number of rows (tokens) in the launch, where the table switches
(`aiter_gemm_a16w16.switch_points`).

Contract (`covered`): x where Triton runs; fp16 or bf16 (AITER's 16-bit contract; bf16 not under
the CPU interpreter, whose tl.dot gets bf16 wrong), or fp32 (outside AITER's name but its kernel
takes it: an fp32 accumulator over `tl.dot(..., input_precision="ieee")`; for CPU tests); M >= 1;
and a config entry for M in the table (AITER raises KeyError where a table has none). Not picked by
`auto`: name it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_paged import available, emulated_arch
from gdn_lab.ops.matmul import OP
from gdn_lab.ops.triton_support import interpreting, triton_device
from gdn_lab.routing import LIBRARY_AITER_TRITON, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import aiter_gemm_a16w16

KERNEL, FUNCTION = "gemm_a16w16", "gemm_a16w16"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def matmul_aiter_triton(x: torch.Tensor, w: torch.Tensor, *, kernel: Callable[..., Any] | None = None) -> torch.Tensor:
    """x [M, K] @ w [K, N] through AITER's `gemm_a16w16` (see the module docstring).

    Args:
        x, w: matmul's validated arguments.
        kernel: the function to call in AITER's place (a test double, run outside AITER's shims);
            None loads AITER's own.

    Returns:
        [M, N] in x's dtype.
    """
    scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    if kernel is None:
        arch, cus = aiter.effective_arch(x.device), aiter.effective_num_cus(x.device)
        kernel = getattr(aiter.load(KERNEL, arch), FUNCTION)
        scope = aiter.shims(arch, cus)
    w_nk = w.t().contiguous()  # [N, K], K contiguous: AITER's W of Y = X @ W^T
    with scope:
        return kernel(x, w_nk, dtype=x.dtype)


def covered(args: Mapping[str, Any]) -> Check:
    """gemm_a16w16's contract (see the module docstring)."""
    ok, where = triton_device(args, "x")
    if not ok:
        return False, where
    x, w = args["x"], args["w"]
    if x.dtype not in DTYPES:
        return False, f"x is {x.dtype}; gemm_a16w16 takes fp16 or bf16 (fp32 for tests)"
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and interpreting():
        return False, "bf16 under Triton's CPU interpreter: its tl.dot computes bf16 wrongly; use fp16 or fp32"
    m, k, n = x.shape[0], w.shape[0], w.shape[1]
    if m == 0:
        return False, "an empty batch (M=0): gemm_a16w16's config lookup takes M >= 1"
    arch = aiter.effective_arch(x.device)
    try:
        cfg = aiter_gemm_a16w16.get_config(m, n, k, arch)
    except (aiter_gemm_a16w16.NoConfigEntry, ImportError) as exc:
        return False, str(exc)
    note = "" if x.dtype != torch.float32 else " (fp32: outside AITER's 16-bit contract, its kernel takes it)"
    return True, f"{where}; {cfg.file_name} {cfg.entry} for M={m} on {arch}: {cfg.key}{note}"


register(
    Backend(
        OP,
        "aiter-triton-gemm",
        matmul_aiter_triton,
        library=LIBRARY_AITER_TRITON,
        available=available(KERNEL),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        emulated_arch=emulated_arch,
        rule=aiter_gemm_a16w16.RULE,
        description="AITER Triton gemm_a16w16 (amd-aiter wheel): tile and split-K config from JSON tables by M",
    )
)
