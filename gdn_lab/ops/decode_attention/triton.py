"""decode_attention's Triton backends: `triton` (fixed per-request blocks and 512- or 1024-token nodes) and the control `triton-splitk-by-batch`.

Light on purpose: the kernel module (`triton_kernels`, which imports triton) loads on the first run.
"""

from __future__ import annotations

from gdn_lab.ops.decode_attention import OP
from gdn_lab.ops.paged_kv import triton_covered
from gdn_lab.ops.triton_support import triton_available
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, lazy, register

KERNELS = "gdn_lab.ops.decode_attention.triton_kernels"

register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "decode_attention_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=triton_covered,
        priority=PRIORITY_TRITON,
        description="our Triton paged decode: per-request blocks folded into fixed nodes (512 or 1024 tokens), float32 partials, fixed-order merges; bit-neutral plans",
    )
)
register(
    Backend(
        OP,
        "triton-splitk-by-batch",
        lazy(KERNELS, "decode_attention_splitk_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=triton_covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: split-KV decode, split count from batch size, KV heads and SMs (FA2 heuristic)",
    )
)
