"""A caller's index, length and per-head parameter tensors may be strided views (a column of a
table, `lens[:, 1]`). Validation hands every backend contiguous ones, so each covered backend gives
the bits of the contiguous call; before, the Triton kernels read them with a stride of 1 and
returned wrong outputs without an error."""

from __future__ import annotations

import pytest
import torch

import gdn_lab.ops  # noqa: F401  (registers every op)
from gdn_lab import routing
from gdn_lab.ops import spec

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _vectors(op: str, args: dict) -> list[str]:
    """The call's 1-D tensor arguments that are only read (not a state written in place)."""
    return [k for k, v in args.items() if isinstance(v, torch.Tensor) and v.dim() == 1 and k not in spec.get(op).states]


CASES = [
    pytest.param(op, b.name, id=f"{op}-{b.name}")
    for op in spec.names()
    if _vectors(op, spec.get(op).example())  # matmul has none
    for b in routing.backends(op)
]


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view of stride 2 (every other element of a buffer twice as long)."""
    wide = torch.zeros(2 * t.numel(), dtype=t.dtype, device=t.device)
    view = wide[::2]
    view.copy_(t)
    return view


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT[t.element_size()])


def _outputs(result) -> list[torch.Tensor]:
    return [t for t in (result if isinstance(result, tuple) else (result,)) if isinstance(t, torch.Tensor)]


def _copy(args: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def test_validation_takes_its_own_output():
    # what the cases below rely on: validated arguments pass validation again, unchanged
    for op in spec.names():
        s = spec.get(op)
        args = s.example(device="cpu", dtype=torch.float32)
        again = s.validate(**args)
        assert again.keys() == args.keys(), op
        for k, v in args.items():
            assert again[k] is v if isinstance(v, torch.Tensor) else again[k] == v, (op, k)


@pytest.mark.parametrize("op, backend", CASES)
def test_strided_vectors_give_the_bits_of_contiguous_ones(op, backend, device):
    s = spec.get(op)
    args = s.example(device=device, dtype=torch.float16)
    decision = routing.decide(op, dict(args), backend)
    if decision.backend is None:
        pytest.skip(f"{backend} does not run here: {decision.reason}")
    vectors = _vectors(op, args)
    base = _copy(args)
    want = _outputs(routing.dispatch(op, base, backend)[0])
    for name in vectors:
        mine = _copy(args)
        mine[name] = _every_other(mine[name])
        got = _outputs(routing.dispatch(op, s.validate(**mine), backend)[0])
        assert all(torch.equal(_bits(g), _bits(w)) for g, w in zip(got, want)), f"{backend}: {name} strided"
        for state in s.states:
            assert torch.equal(_bits(mine[state]), _bits(base[state])), f"{backend}: {name} strided, {state}"
