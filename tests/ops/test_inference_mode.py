"""Serving engines run their models under torch.inference_mode (vLLM's model runner, SGLang on
request): every covered backend of every op takes inference tensors, validation included, and
returns the bits of the same call made outside it."""

from __future__ import annotations

import pytest
import torch

import gdn_lab.ops  # noqa: F401  (registers every op)
from gdn_lab import routing
from gdn_lab.ops import spec

CASES = [pytest.param(op, b.name, id=f"{op}-{b.name}") for op in spec.names() for b in routing.backends(op)]


def _outputs(result) -> list[torch.Tensor]:
    return [t for t in (result if isinstance(result, tuple) else (result,)) if isinstance(t, torch.Tensor)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's raw bits as integers (NaNs and fp8 compare as bits)."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.mark.parametrize("op, backend", CASES)
def test_a_call_under_inference_mode_gives_the_bits_of_one_outside(op, backend, device):
    s = spec.get(op)
    args = s.example(device=device, dtype=torch.float16)
    decision = routing.decide(op, dict(args), backend)
    if decision.backend is None:
        pytest.skip(f"{backend} does not run here: {decision.reason}")
    outside = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    want = _outputs(routing.dispatch(op, outside, backend)[0])
    with torch.inference_mode():
        inside = s.example(device=device, dtype=torch.float16)  # built and validated as inference tensors
        assert all(v.is_inference() for v in inside.values() if isinstance(v, torch.Tensor))
        got = _outputs(routing.dispatch(op, inside, backend)[0])
    if not decision.backend.reproducible:
        return
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(_bits(g), _bits(w))
    for state in s.states:
        assert torch.equal(_bits(inside[state]), _bits(outside[state])), state
