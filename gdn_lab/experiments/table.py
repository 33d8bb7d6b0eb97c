"""The contract columns of every experiment table, and the row builder that fills them."""

from __future__ import annotations

from typing import Any

import torch

from gdn_lab.checks import dtype_name
from gdn_lab.device import detect

# Every experiment returns at least these columns (ARCHITECTURE.md, public contracts).
COLUMNS = [
    "op",
    "backend",
    "backend_ran",
    "covered",
    "reason",
    "device",
    "arch",
    "dtype",
    "kv_dtype",
    "target_len",
    "batch_size",
    "position",
    "trial",
    "seed",
    "bitwise_equal",
    "n_diff",
    "max_abs",
    "max_ulp",
]


def base_row(
    op: str,
    backend: str,
    device: torch.device | str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None,
    seed: int,
    arch: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A row with the environment columns filled.

    `arch` is the arch the row stands for: given explicitly (an emulated fp8 format, AITER's
    emulation), else, for AITER's Triton backends off ROCm, the arch AITER was told it runs on
    (issue 5: every AITER row records the emulated arch), else the device's own.
    """
    from gdn_lab.aiter_loader import row_arch

    info = detect(device)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        op=op,
        backend=backend,
        device=info.name,
        arch=arch or row_arch(backend, device) or info.arch,
        dtype=dtype_name(dtype),
        kv_dtype=dtype_name(kv_dtype) if kv_dtype is not None else dtype_name(dtype),
        seed=seed,
    )
    row.update(fields)
    return row
