"""rms_norm: y = x / sqrt(mean(x^2) + eps) * weight over the last dim, batch-invariant and variant backends.

A row must normalise to the same bits whatever the number of rows beside it. Torch's reduction
picks its split of a row from the shape, so the straightforward torch RMSNorm is the batch-variant
control (`torch-native`); our Triton kernel (`triton`) reduces one row per program, in a fixed
order that depends on N alone.

The op's folder: this spec (with the torch backends), the references (`reference.py`) and our
Triton kernels (`triton.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, LinearShape, randn, request_rows, rows
from gdn_lab.ops.rms_norm.reference import rms_norm_native, rms_norm_torch
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "rms_norm"


def validate(x, weight, eps: float = 1e-6) -> dict[str, Any]:
    """Check an rms_norm call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("x", x, "M N", dims, checks.FLOAT_DTYPES)
    checks.check_tensor("weight", weight, "N", dims, checks.FLOAT_DTYPES, x.device)
    for label in ("N",):  # M = 0 is an empty batch: an empty result
        if dims[label] == 0:
            raise ValueError(f"{label}: must be > 0 ({dims.where(label)})")
    checks.check_positive_float("eps", eps)
    return {"x": x, "weight": weight, "eps": float(eps)}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, backend: str = "auto") -> torch.Tensor:
    """RMSNorm of each row: x / sqrt(mean(x^2) + eps) * weight, in float32, rounded once to x's dtype.

    Args:
        x: [M, N] bf16, fp16 or fp32 (M rows: tokens).
        weight: [N], any float dtype (multiplied in float32; Qwen3-Next's zero-centred norms pass
            1 + weight).
        eps: added to the mean square.
        backend: "auto" or a name from `gdn_lab.routing.backend_names("rms_norm")`: `torch` (the
            float64 reference), `triton` (batch-invariant), `torch-native` (the straightforward
            float32 torch code: the batch-variant control), `triton-splitk-by-batch` (a split-row
            control).

    Returns:
        [M, N] in x's dtype.

    Raises:
        ValueError: bad input (the message names the parameter and what is accepted).
        NotCovered: the named backend cannot run this call.

    Example:
        >>> import torch
        >>> rms_norm(torch.randn(3, 16), torch.ones(16), backend="torch").shape
        torch.Size([3, 16])
    """
    return dispatch(OP, validate(x, weight, eps), backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Validated arguments of a tiny call (M 3, N 300)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 300, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(300, generator=g)).to(device=device, dtype=dtype)
    return validate(x, w)


def build(batch: Batch, shape: LinearShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: each request's `length` token rows, one shared (zero-centred) weight."""
    w = 1.0 + randn(opts.weights_seed, "norm_weight", shape.hidden, scale=0.1, device=opts.device)
    return validate(rows(batch, opts, "x", shape.hidden), w.to(opts.dtype))


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns its `length` rows, packed in batch order."""
    return spec.View(request_rows(batch, request))


SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=rms_norm,
        validate=validate,
        example=example,
        shape=LinearShape,
        build=build,
        outputs=("out",),
        view=view,
        description="RMSNorm of each token row over its hidden features",
    )
)

register(
    Backend(
        OP,
        "torch",
        rms_norm_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="float64 computation, rounded once (ground truth)",
    )
)
register(
    Backend(
        OP,
        "torch-native",
        rms_norm_native,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        auto=False,
        variant_control=True,
        description="CONTROL: straightforward float32 torch RMSNorm (torch's reduction splits rows by shape)",
    )
)

from gdn_lab.ops.rms_norm import triton  # noqa: E402, F401  (its backends)
