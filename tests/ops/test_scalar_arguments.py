"""Every op's flags and positive scalars are checked by name before any kernel runs: a flag that is
not a bool, an inf or nan scale or eps (which would turn outputs to NaN) is a clear error."""

from __future__ import annotations

import inspect
import math

import pytest

import gdn_lab.ops  # noqa: F401  (registers every op)
from gdn_lab.ops import spec

BAD = {
    "check_indices": ["x", 1, None],
    "use_qk_l2norm": [1, "yes"],
    "causal": [1],
    "quantize_fp8": [0],
    "scale": [math.inf, math.nan, -1.0, 0],
    "eps": [math.inf, math.nan, 0.0],
}


def _scalars(op: str) -> list[str]:
    return [name for name in inspect.signature(spec.get(op).function).parameters if name in BAD]


@pytest.mark.parametrize("op", [op for op in spec.names() if _scalars(op)])
def test_bad_flags_and_scalars_are_rejected_by_name(op):
    s = spec.get(op)
    args = s.example()
    for name in _scalars(op):
        for value in BAD[name]:
            with pytest.raises(ValueError, match=rf"^{name}: expected "):
                s.function(**{**args, name: value}, backend="torch")
