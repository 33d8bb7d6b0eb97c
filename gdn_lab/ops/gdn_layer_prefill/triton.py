"""gdn_layer_prefill's fused Triton backends: `triton-fused` and its control `triton-fused-tiles-by-batch`.

Light on purpose: the kernel modules load on the first run; coverage reads only tensor attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab.ops.gdn_layer_prefill import OP
from gdn_lab.ops.gdn_prefill.triton import check_head_dim
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.gdn_layer_prefill.triton_kernels"


def covered(args: Mapping[str, Any]) -> Check:
    """Tensors where Triton runs, contiguous state pools, a conv state that holds the inputs exactly,
    head_dim a power of two in [16, 256]."""
    ok, reason = triton_device(args, "projected_qkvz")
    if not ok:
        return ok, reason
    for name in ("conv_state", "delta_state"):
        if not args[name].is_contiguous():
            return False, f"{name} must be contiguous (the kernels update it in place by offset)"
    conv_dtype, dtype = args["conv_state"].dtype, args["projected_qkvz"].dtype
    if conv_dtype not in (dtype, torch.float32):
        return (
            False,
            f"conv_state is {conv_dtype} but the inputs are {dtype}: it must hold them exactly (same dtype or float32)",
        )
    ok, reason = check_head_dim("head_dim", args["head_dim"])
    if not ok:
        return ok, reason
    return (
        True,
        "Triton chain: conv (split on the fly), gdn_prefill's prepare, state and output, then norm+fp8+conv state",
    )


register(
    Backend(
        OP,
        "triton-fused",
        lazy(KERNELS, "gdn_layer_prefill_triton_fused"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="Triton chain (chunk 64: conv, prepare, state, output, norm launches; conv and delta states in place); fixed config: batch invariant",
    )
)
register(
    Backend(
        OP,
        "triton-fused-tiles-by-batch",
        lazy(KERNELS, "gdn_layer_prefill_triton_fused_tiles_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: the fused Triton chain with AITER fused_gdn_prefill_qkvz's chunk size for (tokens, batch)",
    )
)
