"""fused_moe: the routed experts of an MoE layer (gate/up projection, SiLU-and-multiply, down
projection, the top-k weighted sum), with batch-invariant and variant backends.

The contract is vLLM's and SGLang's `fused_experts(hidden_states, w1, w2, topk_weights, topk_ids)`
(AITER's `fused_moe` takes the same five tensors): routing happens before the op, which sees each
token's experts and weights. A token's output must not depend on which other tokens share its
experts. MoE kernels group the tokens of a batch by expert and pick their tiles, splits or
reduction mode from the token count, so the same token can be summed another way in another batch.

The op's folder: this spec (with the torch reference backend), the reference (`reference.py`),
our Triton kernels (`triton.py`: `triton`, fixed tiles and a fixed top-k order, and the control
`triton-atomic-by-batch`), AITER's Triton MoE GEMM on any GPU (`aiter_triton.py`) and AITER's own
MoE on ROCm (`aiter.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, MoEShape, Request, randn, request_rows, routing, rows
from gdn_lab.ops.fused_moe.reference import fused_moe_torch
from gdn_lab.ops.spec import Tolerance
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "fused_moe"

# |x - torch| <= atol + rtol * |torch| against the float64 reference, by dtype. Every rounding point
# is shared with the reference, so only float32 accumulation differs; it can flip one of gate, up,
# act or y by an ulp (measured in the interpreter, H 96, I 48, E 8, top 3, 27 tokens, 6 seeds:
# at most 4.8e-4 in fp16 and 2.4e-4 in bf16 at |out| <= 3.1, 6e-7 in fp32), and the bounds give
# two ulps of the largest outputs.
TOLERANCES = {
    ("torch", "out", dt): Tolerance("allclose", atol=a, rtol=r)
    for dt, (a, r) in {"float32": (2e-6, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}.items()
}


def validate(x, w1, w2, topk_weights, topk_ids, *, check_indices: bool = True) -> dict[str, Any]:
    """Check a fused_moe call; return the arguments every backend's `run` receives.

    `check_indices` reads topk_ids on the host (one synchronisation): every id in [0, E), no
    expert twice in a row.
    """
    dims = checks.Dims()
    checks.check_tensor("x", x, "M H", dims, checks.FLOAT_DTYPES)
    checks.check_tensor("w1", w1, "E N H", dims, (x.dtype,), x.device)
    checks.check_tensor("w2", w2, "E H I", dims, (x.dtype,), x.device)
    checks.check_tensor("topk_weights", topk_weights, "M top_k", dims, (torch.float32,), x.device)
    checks.check_tensor("topk_ids", topk_ids, "M top_k", dims, (torch.int32,), x.device)
    for label in ("H", "E", "I", "top_k"):  # M = 0 is an empty batch: an empty result
        if dims[label] == 0:
            raise ValueError(f"{label}: must be > 0 ({dims.where(label)})")
    if dims["N"] != 2 * dims["I"]:
        raise ValueError(
            f"w1: expected shape [E, 2*I, H] with 2*I={2 * dims['I']} ({dims.where('I')}), got {tuple(w1.shape)}; "
            "its rows are the gate projection, then the up projection"
        )
    if dims["top_k"] > dims["E"]:
        raise ValueError(f"topk_ids: {dims['top_k']} experts per token, more than E={dims['E']} ({dims.where('E')})")
    checks.check_bool("check_indices", check_indices)
    if check_indices and topk_ids.numel():
        checks.check_index_range("topk_ids", topk_ids, dims["E"], "E, the experts of w1")
        ids = topk_ids.sort(dim=1).values
        repeated = (ids[:, 1:] == ids[:, :-1]).any(dim=1).nonzero()
        if repeated.numel():
            m = int(repeated[0])
            raise ValueError(
                f"topk_ids: row {m} routes to an expert twice ({topk_ids[m].tolist()}); accepted: distinct experts per token"
            )
    return {
        "x": x,
        "w1": w1,
        "w2": w2,
        "topk_weights": checks.dense(topk_weights),
        "topk_ids": checks.dense(topk_ids),
    }


def fused_moe(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    backend: str = "auto",
    check_indices: bool = True,
) -> torch.Tensor:
    """The routed experts' weighted sum for each token (Qwen3-Next's sparse MoE, shared expert apart).

    For token m and k < top_k, with e = topk_ids[m, k]: gate, up = x[m] @ w1[e]^T (split in two
    halves), act = silu(gate) * up, y_k = topk_weights[m, k] * (act @ w2[e]^T); out[m] = sum_k y_k.
    Products accumulate in float32 (the `torch` reference: float64), and the kernels round to x's
    dtype where vLLM's and AITER's Triton MoE kernels do: gate and up, act, each y_k, and the sum.

    Args:
        x: [M, H] bf16, fp16 or fp32 (M rows: tokens).
        w1: [E, 2*I, H] in x's dtype, each expert's gate rows then its up rows (vLLM's w13).
        w2: [E, H, I] in x's dtype.
        topk_weights: float32 [M, top_k], each token's expert weights.
        topk_ids: int32 [M, top_k], each token's experts (distinct, in [0, E)).
        backend: "auto" or a name from `gdn_lab.routing.backend_names("fused_moe")`: `torch` (the
            float64 reference), `triton` (batch-invariant), `triton-atomic-by-batch` (the
            batch-variant control).
        check_indices: check topk_ids' values (one host synchronisation).

    Returns:
        [M, H] in x's dtype.

    Raises:
        ValueError: bad input (the message names the parameter and what is accepted).
        NotCovered: the named backend cannot run this call.

    Example:
        >>> import torch
        >>> x, w1, w2 = torch.randn(3, 8), torch.randn(4, 10, 8), torch.randn(4, 8, 5)
        >>> ids = torch.tensor([[0, 2], [1, 3], [2, 0]], dtype=torch.int32)
        >>> fused_moe(x, w1, w2, torch.full((3, 2), 0.5), ids, backend="torch").shape
        torch.Size([3, 8])
    """
    args = validate(x, w1, w2, topk_weights, topk_ids, check_indices=check_indices)
    return dispatch(OP, args, backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Validated arguments of a tiny call (two requests of 5 and 3 tokens; H 48, E 6, top_k 3, I 24)."""
    shape = MoEShape(hidden=48, num_experts=6, top_k=3, intermediate=24)
    batch = Batch((Request(5, 1), Request(3, 2)), 0, 0)
    return build(batch, shape, BuildOptions(dtype=dtype, device=torch.device(device)))


def build(batch: Batch, shape: MoEShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: each request's token rows and routing from its own seed,
    one set of expert weights."""
    h, e, inter = shape.hidden, shape.num_experts, shape.intermediate
    w1 = randn(opts.weights_seed, "w1", e, 2 * inter, h, scale=h**-0.5, device=opts.device)
    w2 = randn(opts.weights_seed, "w2", e, h, inter, scale=inter**-0.5, device=opts.device)
    topk_weights, topk_ids = routing(batch, shape, opts)
    return validate(rows(batch, opts, "x", h), w1.to(opts.dtype), w2.to(opts.dtype), topk_weights, topk_ids)


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns its `length` rows, packed in batch order."""
    return spec.View(request_rows(batch, request))


SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=fused_moe,
        validate=validate,
        example=example,
        shape=MoEShape,
        build=build,
        outputs=("out",),
        view=view,
        tolerances=TOLERANCES,
        description="the routed experts of an MoE layer (w1, SiLU-and-multiply, w2, top-k sum), one output row per token",
    )
)

register(
    Backend(
        OP,
        "torch",
        fused_moe_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="float64 products and sums, rounded where the kernels round (ground truth)",
    )
)

from gdn_lab.ops.fused_moe import aiter, aiter_triton, triton  # noqa: E402, F401  (their backends)
