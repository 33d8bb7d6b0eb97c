"""What every Triton backend shares: the availability and placement checks built on `device.triton_mode`.

Whether Triton runs here is decided in one place, `gdn_lab.device.triton_mode` (and
`device.interpreting()` for TRITON_INTERPRET); this module turns it into the `(ok, reason)` checks
backends register. `interpreting` is re-exported here because the kernel modules import it from
this path. Nothing here imports triton at module load; kernel modules do, and they are loaded lazily.

It also fixes Triton's floating-point contraction default for every kernel the lab compiles (the
backends' registrations import this module before any kernel module loads): FMA fusion on, as in
every Triton the lab has run (3.6 on the H200, 3.9 here). Triton 3.9 warns that 3.10 turns it off
by default, which would change the bits of every compiled kernel whose sums contract, and with
them the H200 goldens. A value the user set is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import Any

import torch

from gdn_lab.device import interpreting, triton_mode
from gdn_lab.routing import Check

__all__ = ["interpreting", "triton_available", "triton_device"]

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def triton_available() -> Check:
    """Triton runs on this machine's default device: installed, and a GPU or the interpreter is on."""
    mode, reason = triton_mode()
    return mode is not None, reason


@cache
def _on_gpu() -> Check:
    mode, reason = triton_mode(torch.device("cuda"))
    return mode is not None, reason


def triton_device(args: Mapping[str, Any], tensor: str) -> Check:
    """The call's tensors are where Triton runs: a GPU, or the CPU under the interpreter."""
    t = args[tensor]
    if t.is_cuda:  # ROCm tensors too; the answer for a GPU is fixed per process (routing asks every call)
        return _on_gpu()
    mode, reason = triton_mode(t.device)
    return mode is not None, reason
