"""rms_norm's Triton backends: `triton` (one row per program) and the control `triton-splitk-by-batch`.

Light on purpose: the kernel module (`triton_kernels`, which imports triton) loads on the first run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gdn_lab.ops.rms_norm import OP
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.rms_norm.triton_kernels"


def covered(args: Mapping[str, Any]) -> Check:
    return triton_device(args, "x")


register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "rms_norm_triton"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="batch-invariant Triton RMSNorm: one row per program, a fixed reduction order per N",
    )
)
register(
    Backend(
        OP,
        "triton-splitk-by-batch",
        lazy(KERNELS, "rms_norm_splitk_by_batch"),
        library=LIBRARY_TRITON,
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: Triton RMSNorm that splits each row's sum when the rows under-fill the SMs",
    )
)
