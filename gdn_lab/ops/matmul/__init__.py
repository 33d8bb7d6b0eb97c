"""matmul: x [M, K] @ w [K, N], the projection of a model layer, with batch-invariant and variant backends.

The op's folder: this spec (with the torch backends), the reference (`reference.py`), our
Triton kernels (`triton.py`) and AITER's Triton gemm_a16w16 (`aiter_triton.py`).

A row of the output must not depend on how many rows (tokens) are multiplied with it. cuBLAS
picks its kernel, tiles and split-K from M, so `torch.matmul` is the batch-variant control
(`torch-native`); our Triton kernel (`triton`) keeps one tile configuration per dtype and never
splits K. AITER's `gemm_a16w16` (`aiter-triton-gemm`) picks its tiles from JSON tables keyed by M,
so like cuBLAS it can change a row's bits as the batch grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, LinearShape, randn, request_rows, rows
from gdn_lab.ops.matmul.reference import matmul_native, matmul_splitk_torch, matmul_torch
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "matmul"


def validate(x, w) -> dict[str, Any]:
    """Check a matmul call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("x", x, "M K", dims, checks.FLOAT_DTYPES)
    checks.check_tensor("w", w, "K N", dims, (x.dtype,), x.device)
    for label in ("K", "N"):  # M = 0 is an empty batch: an empty result
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
            batch-variant control), `triton-splitk-by-batch` (a split-K control from the SM count),
            `torch-splitk-by-batch` (a split-K control from M alone, varying on every device).

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


def build(batch: Batch, shape: LinearShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: each request's `length` token rows, one shared weight."""
    w = randn(opts.weights_seed, "w", shape.hidden, shape.out_features, scale=shape.hidden**-0.5, device=opts.device)
    return validate(rows(batch, opts, "x", shape.hidden), w.to(opts.dtype))


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns its `length` rows, packed in batch order."""
    return spec.View(request_rows(batch, request))


SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=matmul,
        validate=validate,
        example=example,
        shape=LinearShape,
        build=build,
        outputs=("out",),
        view=view,
        description="a projection x [M, K] @ w [K, N], one output row per token",
    )
)

register(
    Backend(
        OP,
        "torch",
        matmul_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="float64 accumulation, rounded once (ground truth)",
    )
)
register(
    Backend(
        OP,
        "torch-native",
        matmul_native,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        auto=False,
        variant_control=True,
        description="CONTROL: torch.matmul (cuBLAS on the GPU picks kernels by M)",
    )
)

register(
    Backend(
        OP,
        "torch-splitk-by-batch",
        matmul_splitk_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        auto=False,
        variant_control=True,
        description="CONTROL: torch split-K, K slices = next_pow2(ceil(64 / M)) (fewer rows, more slices), any device",
    )
)

from gdn_lab.ops.matmul import aiter_triton, triton  # noqa: E402, F401  (their backends)
