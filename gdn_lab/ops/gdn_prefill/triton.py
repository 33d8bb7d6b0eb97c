"""gdn_prefill's Triton backends: `triton` (chunked, batch invariant) and its control `triton-chunk-by-batch`.

Light on purpose: the kernel module (`gdn_lab.ops.delta_rule_triton`, which imports triton) loads on the first run;
coverage reads only tensor attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gdn_lab.ops.gdn_prefill import OP
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.delta_rule_triton"
# tl.dot needs 16+; the output kernels hold [K, 64] state tiles in registers (the layer: [K, V])
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_head_dim(name: str, d: int) -> Check:
    """A head dim the chunked kernels take: a power of two in [16, 256]."""
    if d < MIN_HEAD_DIM or d > MAX_HEAD_DIM or d & (d - 1):
        return False, f"{name}={d}: the chunked kernels take powers of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]"
    return True, ""


def covered(args: Mapping[str, Any]) -> Check:
    """Tensors where Triton runs, a contiguous state, K and V powers of two in [16, 256]."""
    ok, reason = triton_device(args, "q")
    if not ok:
        return ok, reason
    if not args["state"].is_contiguous():
        return False, "state must be contiguous (the kernels update it in place by offset)"
    for name, d in (("K", args["q"].shape[2]), ("V", args["v"].shape[2])):
        ok, reason = check_head_dim(name, d)
        if not ok:
            return ok, reason
    return True, "chunked Triton kernels (prepare, state recurrence, output)"


register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "gdn_prefill_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="chunked Triton delta rule (chunk 64, 3 launches, in-place VK state); fixed config: batch invariant",
    )
)
register(
    Backend(
        OP,
        "triton-chunk-by-batch",
        lazy(KERNELS, "gdn_prefill_triton_chunk_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: the chunked Triton kernels with AITER fused_gdn_prefill_qkvz's chunk size for (tokens, batch)",
    )
)
