"""Forms of the same call a caller may pass, which every covered backend of every op must read as
that call and answer with its bits:

- inference tensors: serving engines run their models under torch.inference_mode (vLLM's model
  runner, SGLang on request); validation included, before it raised on gdn_decode's slots.
- strided vectors: index, length and per-head parameter tensors may be views (a column of a
  table, `lens[:, 1]`); validation hands every backend contiguous ones (before, the Triton
  kernels read them with a stride of 1 and returned wrong outputs without an error).
"""

from __future__ import annotations

import pytest
import torch

import gdn_lab.ops  # noqa: F401  (registers every op)
from gdn_lab import routing
from gdn_lab.experiments.compare import compare
from gdn_lab.ops import spec


def _vectors(op: str, args: dict) -> list[str]:
    """The call's 1-D tensor arguments that are only read (not a state written in place)."""
    return [k for k, v in args.items() if isinstance(v, torch.Tensor) and v.dim() == 1 and k not in spec.get(op).states]


def _cases(ops: list[str]) -> list:
    return [pytest.param(op, b.name, id=f"{op}-{b.name}") for op in ops for b in routing.backends(op)]


def _copy(args: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _example(op: str, backend: str, device) -> dict:
    """The op's fp16 example, or a skip where the backend does not run it here."""
    args = spec.get(op).example(device=device, dtype=torch.float16)
    decision = routing.decide(op, dict(args), backend)
    if decision.backend is None:
        pytest.skip(f"{backend} does not run here: {decision.reason}")
    return args


def _run(op: str, args: dict, backend: str) -> list[torch.Tensor]:
    """The call's tensor outputs (`args`' states are updated in place)."""
    result = routing.dispatch(op, args, backend)[0]
    return [t for t in (result if isinstance(result, tuple) else (result,)) if isinstance(t, torch.Tensor)]


def _same_bits(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(compare(g, w)["bitwise_equal"] for g, w in zip(got, want))


@pytest.mark.parametrize("op, backend", _cases(spec.names()))
def test_a_call_under_inference_mode_gives_the_bits_of_one_outside(op, backend, device):
    s = spec.get(op)
    outside = _copy(_example(op, backend, device))
    want = _run(op, outside, backend)
    with torch.inference_mode():
        inside = s.example(device=device, dtype=torch.float16)  # built and validated as inference tensors
        assert all(v.is_inference() for v in inside.values() if isinstance(v, torch.Tensor))
        got = _run(op, inside, backend)
    if not routing.decide(op, dict(outside), backend).backend.reproducible:
        return
    assert _same_bits(got, want)
    for state in s.states:
        assert _same_bits([inside[state]], [outside[state]]), state


def test_validation_takes_its_own_output():
    # what the strided cases rely on: validated arguments pass validation again, unchanged
    for op in spec.names():
        s = spec.get(op)
        args = s.example(device="cpu", dtype=torch.float32)
        again = s.validate(**args)
        assert again.keys() == args.keys(), op
        for k, v in args.items():
            assert again[k] is v if isinstance(v, torch.Tensor) else again[k] == v, (op, k)


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view of stride 2 (every other element of a buffer twice as long)."""
    wide = torch.zeros(2 * t.numel(), dtype=t.dtype, device=t.device)
    view = wide[::2]
    view.copy_(t)
    return view


@pytest.mark.parametrize(
    "op, backend",
    _cases([op for op in spec.names() if _vectors(op, spec.get(op).example())]),  # matmul has none
)
def test_strided_vectors_give_the_bits_of_contiguous_ones(op, backend, device):
    s = spec.get(op)
    args = _example(op, backend, device)
    base = _copy(args)
    want = _run(op, base, backend)
    for name in _vectors(op, args):
        mine = _copy(args)
        mine[name] = _every_other(mine[name])
        assert _same_bits(_run(op, s.validate(**mine), backend), want), f"{backend}: {name} strided"
        for state in s.states:
            assert _same_bits([mine[state]], [base[state]]), f"{backend}: {name} strided, {state}"


@pytest.mark.parametrize("op, backend", _cases(spec.names()))
def test_a_call_writes_no_argument_but_its_states(op, backend, device):
    # The contract the recorder's deferred reads rely on (`record`: a lab op whose state pools hold
    # no queued read runs without a flush): every other tensor it is given keeps its bits.
    s = spec.get(op)
    args = _example(op, backend, device)
    before = _copy(args)
    _run(op, args, backend)
    for name, value in args.items():
        if isinstance(value, torch.Tensor) and name not in s.states:
            assert _same_bits([value], [before[name]]), f"{backend} wrote {name}"
    assert any(not _same_bits([args[state]], [before[state]]) for state in s.states) or not s.states
