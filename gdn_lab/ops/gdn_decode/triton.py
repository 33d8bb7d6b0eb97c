"""gdn_decode's Triton backends: `triton` and its batch-variant control `triton-ksplit-by-batch`.

Light on purpose: the kernel module (triton_kernels, which imports triton) loads on the first run.
The availability probe (`triton_support.triton_available`, i.e. `device.triton_mode`) is cached per
TRITON_INTERPRET value, and coverage reads only tensor attributes and the cached mode, so routing a
decode step costs microseconds (the eager decode path is latency-bound).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from gdn_lab.ops.gdn_decode import OP
from gdn_lab.ops.triton_support import interpreting, triton_available, triton_device
from gdn_lab.routing import LIBRARY_TRITON, PRIORITY_TRITON, Backend, Check, lazy, register

KERNELS = "gdn_lab.ops.gdn_decode.triton_kernels"
MAX_HEAD_K_DIM = 256  # the [block_v, K] fp32 state tile lives in registers


@cache
def _available(interpret: bool) -> Check:
    return triton_available()


def available() -> Check:
    """Triton is installed and there is a GPU, or the interpreter is on (cached per setting)."""
    return _available(interpreting())


def covered(args: Mapping[str, Any]) -> Check:
    """Tensors on a GPU (or on the CPU under the interpreter), a contiguous state, K <= 256."""
    q, state = args["q"], args["state"]
    ok, where = triton_device(args, "q")
    if not ok:
        return False, where
    if not state.is_contiguous():
        return False, "state must be contiguous (the kernel updates it in place by offset)"
    if q.shape[2] > MAX_HEAD_K_DIM:
        return False, f"K={q.shape[2]} > {MAX_HEAD_K_DIM}: the state tile would not fit in registers"
    return True, "fused Triton decode step, fixed k_split"


def covered_control(args: Mapping[str, Any]) -> Check:
    """As `covered`; the reason names the control."""
    ok, reason = covered(args)
    if ok:
        reason = "CONTROL: the Triton step with k_split from FlyDSL's tuned table for this batch size"
    return ok, reason


register(
    Backend(
        OP,
        "triton",
        lazy(KERNELS, "gdn_decode_triton"),
        library=LIBRARY_TRITON,
        available=available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="fused Triton step (gates, l2norm, delta rule, in-place VK state); fixed k_split: batch invariant",
    )
)
register(
    Backend(
        OP,
        "triton-ksplit-by-batch",
        lazy(KERNELS, "gdn_decode_triton_ksplit_by_batch"),
        library=LIBRARY_TRITON,
        available=available,
        covered=covered_control,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: the Triton step with k_split = FlyDSL's tuned WARP_THREADS_K for the batch size (gfx950 table)",
    )
)
