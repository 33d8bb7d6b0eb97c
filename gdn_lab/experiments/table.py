"""The contract columns of every experiment table, and the one row builder that fills them."""

from __future__ import annotations

from typing import Any

import torch

from gdn_lab.checks import dtype_name
from gdn_lab.device import detect
from gdn_lab.routing import Backend

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
# ...and the loop adds these to every row (`gdn_lab.experiments.loop`).
RUN_COLUMNS = [
    "tensor",
    "is_control",
    "status",
    "platform",
    "library",
    "hardware_note",
    "batch_tokens",
    "batch_max_len",
]


def base_row(
    backend: Backend,
    device: torch.device | str,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None,
    seed: int,
    arch: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A row of `backend` with the environment columns filled from the backend's metadata.

    `arch` is the arch the row stands for when the experiment emulates one (an fp8 format), else
    the backend's: the arch its library was told when it runs emulated (AITER's Triton kernels off
    ROCm), else the device's own. `hardware_note` marks AMD libraries' results obtained off ROCm.
    """
    info = detect(device)
    row: dict[str, Any] = dict.fromkeys(COLUMNS + RUN_COLUMNS)
    row.update(
        op=backend.op,
        backend=backend.name,
        device=info.name,
        arch=arch or backend.row_arch(info.arch),
        dtype=dtype_name(dtype),
        kv_dtype=dtype_name(kv_dtype) if kv_dtype is not None else dtype_name(dtype),
        seed=seed,
        is_control=backend.variant_control,
        platform=info.platform,
        library=backend.library.name,
        hardware_note=backend.hardware_note([info.platform]),
    )
    row.update(fields)
    return row
