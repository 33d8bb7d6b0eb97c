"""matmul: x [M, K] @ w [K, N], the projection of a model layer, with batch-invariant and variant backends.

A row of the output must not depend on how many rows (tokens) are multiplied with it. cuBLAS
picks its kernel, tiles and split-K from M, so `torch.matmul` is the batch-variant control
(`torch-native`); our Triton kernel (`triton`) keeps one tile configuration per dtype and never
splits K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops.matmul.reference import matmul_torch
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import PRIORITY_REFERENCE, PRIORITY_TRITON, Backend, Check, dispatch, lazy, register

OP = "matmul"


def validate(x, w) -> dict[str, Any]:
    """Check a matmul call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("x", x, "M K", dims, checks.FLOAT_DTYPES)
    checks.check_tensor("w", w, "K N", dims, (x.dtype,), x.device)
    for label in ("M", "K", "N"):
        if dims[label] == 0:
            raise ValueError(f"{label}: must be > 0 ({dims.where(label)})")
    return {"x": x, "w": w}


def matmul(x: torch.Tensor, w: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """x @ w with float32 accumulation (float64 for the `torch` reference), rounded once to x's dtype.

    Args:
        x: [M, K] bf16, fp16 or fp32 (M rows: tokens).
        w: [K, N] in x's dtype; any strides (pass `linear.weight.t()` for an nn.Linear weight).
        backend: "auto" or a name from `gdn_lab.routing.backend_names("matmul")`: `torch` (the
            float64 reference), `triton` (batch-invariant), `torch-native` (torch.matmul: the
            batch-variant control), `triton-splitk-by-batch` (a split-K control).

    Returns:
        [M, N] in x's dtype.

    Raises:
        ValueError: bad input (the message names the parameter and what is accepted).
        NotCovered: the named backend cannot run this call.

    Example:
        >>> import torch
        >>> x, w = torch.randn(3, 8), torch.randn(8, 5)
        >>> matmul(x, w, backend="torch").shape
        torch.Size([3, 5])
    """
    return dispatch(OP, validate(x, w), backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Validated arguments of a tiny call (M 3, K 40, N 24)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(40, 24, generator=g).to(device=device, dtype=dtype)
    return validate(x, w)


def matmul_native(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Batch-variant control: torch.matmul in x's dtype, whose kernel choice follows M.

    cuBLAS on the GPU (measured on the H200: bf16 K=N=4096 differs from M=64 up). On the CPU, float32
    goes through a different path for M < 8 than for larger M (differs); bf16/fp16 did not vary
    with M in our checks (torch 2.13, 2 threads), so there it may prove no sensitivity: use
    `triton-splitk-by-batch` as the control that varies everywhere.
    """
    return torch.matmul(x, w)


def covered(args: Mapping[str, Any]) -> Check:
    return triton_device(args, "x")


register(
    Backend(
        OP,
        "torch",
        matmul_torch,
        priority=PRIORITY_REFERENCE,
        description="float64 accumulation, rounded once (ground truth)",
    )
)
register(
    Backend(
        OP,
        "triton",
        lazy("gdn_lab.ops.matmul.triton_matmul", "matmul_triton"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="batch-invariant Triton matmul: one tile config per dtype, no split-K",
    )
)
register(
    Backend(
        OP,
        "torch-native",
        matmul_native,
        priority=PRIORITY_REFERENCE,
        auto=False,
        variant_control=True,
        description="CONTROL: torch.matmul (cuBLAS on the GPU picks kernels by M)",
    )
)
register(
    Backend(
        OP,
        "triton-splitk-by-batch",
        lazy("gdn_lab.ops.matmul.triton_matmul", "matmul_splitk_by_batch"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: Triton matmul that splits K when the row tiles under-fill the SMs",
    )
)
