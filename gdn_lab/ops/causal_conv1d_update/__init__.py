"""causal_conv1d_update: one decode token per request through the depthwise causal conv.

The op's folder: this spec and the PyTorch reference (`reference.py`), which the GDN layer's
prefill chain also uses per sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.cache import conv_state_pool
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, GDNShape, randn, slot_table
from gdn_lab.ops.causal_conv1d_update import reference
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "causal_conv1d_update"


def validate(x, conv_state, weight, bias, slots, *, activation: str | None = "silu", check_indices: bool = True):
    """Check a causal_conv1d_update call; return the arguments every backend's `run` receives."""
    dims = checks.Dims()
    checks.check_tensor("x", x, "B C", dims, checks.FLOAT_DTYPES)
    checks.check_tensor("conv_state", conv_state, "S C Wm1", dims, checks.FLOAT_DTYPES, x.device)
    checks.check_tensor("weight", weight, "C W", dims, checks.FLOAT_DTYPES, x.device)
    if dims["Wm1"] != dims["W"] - 1:
        raise ValueError(f"conv_state: dim 2 must be the conv width - 1 (={dims['W'] - 1}), got {dims['Wm1']}")
    checks.check_optional("bias", bias, "C", dims, checks.FLOAT_DTYPES, x.device)
    checks.check_tensor("slots", slots, "B", dims, (torch.int32,), x.device)
    checks.check_choice("activation", activation, ("silu", None))
    checks.check_bool("check_indices", check_indices)
    if check_indices:
        checks.check_index_range("slots", slots, dims["S"], "conv_state.shape[0]", allow_negative=True)
        checks.check_distinct("slots", slots)
    return {
        "x": x,
        "conv_state": conv_state,
        "weight": weight,
        "bias": checks.dense(bias),
        "slots": checks.dense(slots),
        "activation": activation,
    }


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slots: torch.Tensor,
    *,
    activation: str | None = "silu",
    backend: str = "auto",
    check_indices: bool = True,
) -> torch.Tensor:
    """One token per request through a depthwise causal conv, shifting each slot's conv state.

    y[c] = act(sum_w weight[c, w] * window[c, w] + bias[c]), window = [state[slot, c, :], x[c]].

    Args:
        x: [B, C], the new token's channels.
        conv_state: [num_slots, C, W - 1], the last W - 1 inputs per slot; updated in place.
        weight: [C, W]; bias: [C] or None.
        slots: int32 [B], distinct; negative = padding (zeros out, state untouched).
        activation: "silu" or None.
        backend: "auto" or a backend name.
        check_indices: check slot values (one host synchronisation).

    Returns:
        [B, C] in x's dtype.

    Example:
        >>> import torch
        >>> x, state, w = torch.randn(2, 8), torch.zeros(3, 8, 3), torch.randn(8, 4)
        >>> causal_conv1d_update(x, state, w, None, torch.tensor([0, 2], dtype=torch.int32)).shape
        torch.Size([2, 8])
    """
    args = validate(x, conv_state, weight, bias, slots, activation=activation, check_indices=check_indices)
    return dispatch(OP, args, backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Validated arguments of a tiny call (3 rows, 48 channels, width 4, one padded row)."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    slots = torch.tensor([1, -1, 0], dtype=torch.int32, device=device)
    return validate(rnd(3, 48), rnd(2, 48, 3), rnd(48, 4), rnd(48), slots)


def build(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: one token of conv_dim channels per request, histories in shuffled slots."""
    slots, pool = slot_table(batch, opts.device)
    c, w, dev, dtype = shape.conv_dim, shape.conv_width, opts.device, opts.dtype
    state = torch.full((pool, c, w - 1), float("nan"), dtype=dtype, device=dev)
    for r, slot in zip(batch.requests, slots.tolist()):
        state[slot] = conv_state_pool(1, c, w, dtype=dtype, device=dev, seed=r.seed)[0]
    x = torch.cat([randn(r.seed, "x", 1, c, device=dev) for r in batch.requests]).to(dtype=dtype)
    ws = opts.weights_seed
    weight = randn(ws, "conv_weight", c, w, scale=0.5, device=dev).to(dtype=dtype)
    bias = randn(ws, "conv_bias", c, scale=0.1, device=dev).to(dtype=dtype)
    return validate(x, state, weight, bias, slots)


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns output row `request` and conv-state slot slots[request]."""
    return spec.View(slice(request, request + 1), int(args["slots"][request]))


SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=causal_conv1d_update,
        validate=validate,
        example=example,
        shape=GDNShape,
        build=build,
        outputs=("out",),
        states=("conv_state",),
        view=view,
        fixed_length=1,
        description="one decode token per request through the depthwise causal conv, conv state shifted in place",
    )
)

register(
    Backend(
        OP,
        "torch",
        reference.causal_conv1d_update_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="window dot product per request, fp32",
    )
)
