"""Test setup: Triton's interpreter on CPU-only machines, and NaN-filled torch.empty.

TRITON_INTERPRET must be set before any Triton kernel module is imported (triton.jit reads it
at decoration time), so it is set here, at collection, on machines without a GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# As flash-linear-attention's conftest: uninitialized memory is NaN, so a kernel that reads what
# it never wrote fails loudly instead of passing on leftover zeros.
torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
