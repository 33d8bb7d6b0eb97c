"""matmul's Triton backends: `triton` (fixed tiles, no split-K) and the control `triton-splitk-by-batch`.

Light on purpose: the kernel module (`triton_kernels`, which imports triton) loads on the first run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gdn_lab.ops.matmul import OP
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.matmul.triton_kernels"


def covered(args: Mapping[str, Any]) -> Check:
    return triton_device(args, "x")


register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "matmul_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="batch-invariant Triton matmul: one tile config per dtype, no split-K",
    )
)
register(
    Backend(
        OP,
        "triton-splitk-by-batch",
        lazy(KERNELS, "matmul_splitk_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: Triton matmul that splits K when the row tiles under-fill the SMs",
    )
)
