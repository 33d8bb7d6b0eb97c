"""What every Triton backend shares: where Triton can run, and the interpreter's limits.

Nothing here imports triton at module load; kernel modules do, and they are loaded lazily.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab.device import triton_mode
from gdn_lab.routing import Check


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> Check:
    """Triton is installed and there is a GPU, or the interpreter is on."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if torch.cuda.is_available():
        return True, "triton on the GPU"
    if interpreting():
        return True, "triton's interpreter (TRITON_INTERPRET=1)"
    return False, "no GPU and TRITON_INTERPRET is not set (set TRITON_INTERPRET=1 to run Triton on the CPU)"


def triton_device(args: Mapping[str, Any], tensor: str) -> Check:
    """The call's tensors are where Triton runs: a GPU, or the CPU under the interpreter."""
    mode, reason = triton_mode(args[tensor].device)
    return (mode is not None), reason
