"""AITER's Triton varlen flash-attention forward: one tile config per (device, dtype), as data plus a predictor.

Read from amd-aiter 0.1.7.post2.dev18: `aiter/ops/triton/mha.py::_flash_attn_forward` takes its
config from `aiter/ops/triton/_triton_kernels/mha.py::_get_config`, which reads
`aiter/ops/triton/configs/{device}-MHA-DEFAULT.json` (device = MI350X for gfx950, MI300X for
gfx942) and picks `fwd.default`, or `fwd.dropout_or_fp32` for fp32 inputs (no dropout, no
positional-encoding split in the lab's calls). The grid is one program per (request, query head,
BLOCK_M query rows), and each program walks only its own request's keys in BLOCK_N steps, so
nothing about a launch depends on the batch: the predictor names the tile and predicts every
request's bits batch invariant (the H200 measured 16 of 16 invariant).

Example:
    >>> import torch
    >>> predict("gfx950", torch.bfloat16).variant
    'fwd:128x64'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_lab import checks
from gdn_lab.rules.base import CallRule

SOURCE = (
    "amd-aiter 0.1.7.post2.dev18, aiter/ops/triton/_triton_kernels/mha.py::_get_config + configs/*-MHA-DEFAULT.json"
)

# (BLOCK_M, BLOCK_N) of fwd.default and fwd.dropout_or_fp32 in each device's MHA-DEFAULT.json.
FWD_TILES = {
    "gfx950": {"default": (128, 64), "dropout_or_fp32": (32, 32)},
    "gfx942": {"default": (128, 64), "dropout_or_fp32": (32, 32)},
}
CONFIG_FILES = {"gfx950": "MI350X-MHA-DEFAULT.json", "gfx942": "MI300X-MHA-DEFAULT.json"}


@dataclass(frozen=True)
class Prediction:
    """The tile one launch takes.

    Attributes:
        variant: "fwd:<BLOCK_M>x<BLOCK_N>".
        config: the config key ("default" or "dropout_or_fp32").
        reason: why, in words.
    """

    variant: str
    config: str
    reason: str


def predict(arch: str, dtype: torch.dtype) -> Prediction:
    """The forward tile for an arch and input dtype (the batch plays no part).

    Args:
        arch: the arch AITER is told ("gfx950" or "gfx942").
        dtype: q's dtype.
    """
    checks.check_choice("arch", arch, tuple(FWD_TILES))
    key = "dropout_or_fp32" if dtype == torch.float32 else "default"
    m, n = FWD_TILES[arch][key]
    return Prediction(f"fwd:{m}x{n}", key, f"{CONFIG_FILES[arch]} fwd.{key}; no batch-dependent choice")


def numerics_key(prediction: Prediction, seq_len: int) -> str:
    """What a request's bits depend on: the tile only."""
    return prediction.variant


def expect(alone_key: str, batch_key: str) -> str:
    """ "equal" when both launches give the request the same numerics key, else "switch"."""
    return "equal" if alone_key == batch_key else "switch"


# The rule as the lab's backend carries it (`gdn_lab.rules.base.DispatchRule`).
DISPATCH = CallRule(
    "aiter_flash_attn_varlen",
    SOURCE,
    lambda args, env: predict(env.arch, args["q"].dtype),
    lambda p, args, i: numerics_key(p, int(args["seq_lens"][i])),
    expect,
)
