"""prefill_attention's Triton backends: `triton` (fixed tiles) and the control `triton-tiles-by-batch`.

Light on purpose: the kernel module (`triton_kernels`, which imports triton) loads on the first run.
"""

from __future__ import annotations

from gdn_lab.ops.paged_kv import triton_covered
from gdn_lab.ops.prefill_attention import OP
from gdn_lab.ops.triton_support import triton_available
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, lazy, register

KERNELS = "gdn_lab.ops.prefill_attention.triton_kernels"

register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "prefill_attention_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=triton_covered,
        priority=PRIORITY_TRITON,
        description="our Triton varlen prefill over the paged cache: fixed tiles, KV blocks from position 0",
    )
)
register(
    Backend(
        OP,
        "triton-tiles-by-batch",
        lazy(KERNELS, "prefill_attention_tiles_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=triton_covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: varlen prefill whose KV tile follows the batch (CK batch-prefill occupancy rule)",
    )
)
