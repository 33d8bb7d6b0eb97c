"""fused_moe's Triton backends: `triton` (fixed tiles, the token's own top-k order) and the control
`triton-atomic-by-batch`.

Light on purpose: the kernel module (`triton_kernels`, which imports triton) loads on the first run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gdn_lab.ops.fused_moe import OP
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.fused_moe.triton_kernels"


def covered(args: Mapping[str, Any]) -> Check:
    return triton_device(args, "x")


def covered_control(args: Mapping[str, Any]) -> Check:
    """As `covered`, with top_k >= 3: the control reorders a token's top-k sum, and two terms add
    to the same bits in either order."""
    ok, where = covered(args)
    if not ok:
        return ok, where
    top_k = args["topk_ids"].shape[1]
    if top_k < 3:
        return False, f"top_k={top_k}: the control varies the order of the top-k sum, which needs 3 or more terms"
    return True, "CONTROL: the top-k sum reversed, with rounded (atomic-style) adds, when M > E"


register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "moe_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="batch-invariant Triton MoE: one tile config per dtype, no split, each token's top-k sum in its own order",
    )
)
register(
    Backend(
        OP,
        "triton-atomic-by-batch",
        lazy(KERNELS, "moe_atomic_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered_control,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: Triton MoE whose top-k sum is atomic-style (reversed, rounded adds) above E tokens",
    )
)
