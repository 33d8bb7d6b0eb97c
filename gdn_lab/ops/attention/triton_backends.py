"""Registrations of our Triton attention backends (light: triton is imported only when one runs).

decode_attention: `triton` (fixed 256-token partitions, batch-invariant) and
`triton-splitk-by-batch` (the batch-variant control). prefill_attention: `triton` (batch-invariant
varlen causal) and `triton-tiles-by-batch` (the control whose tiles follow the batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gdn_lab.ops.attention import decode, prefill
from gdn_lab.ops.triton_support import triton_available, triton_device
from gdn_lab.routing import PRIORITY_TRITON, Backend, Check, lazy, register

MAX_HEAD_DIM = 256


def covered(args: Mapping[str, Any]) -> Check:
    """The call's tensors are where Triton runs, D <= 256, and the caches' last dim is contiguous."""
    ok, reason = triton_device(args, "q")
    if not ok:
        return ok, reason
    d = args["q"].shape[-1]
    if d > MAX_HEAD_DIM:
        return False, f"head_dim {d} > {MAX_HEAD_DIM} (one tile holds a whole head)"
    for name in ("k_cache", "v_cache"):
        if args[name].stride(-1) != 1:
            return False, f"{name}'s last dim must be contiguous (stride 1), got stride {args[name].stride(-1)}"
    return True, f"{reason}; head_dim {d}"


_DECODE = "gdn_lab.ops.attention.triton_decode"
_PREFILL = "gdn_lab.ops.attention.triton_prefill"

register(
    Backend(
        decode.OP,
        "triton",
        lazy(_DECODE, "decode_attention_triton"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="our Triton paged decode: fixed 256-token partitions, float32 partials, fixed-order merge",
    )
)
register(
    Backend(
        decode.OP,
        "triton-splitk-by-batch",
        lazy(_DECODE, "decode_attention_splitk_by_batch"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: split-KV decode, split count from batch size, KV heads and SMs (FA2 heuristic)",
    )
)
register(
    Backend(
        prefill.OP,
        "triton",
        lazy(_PREFILL, "prefill_attention_triton"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        description="our Triton varlen prefill over the paged cache: fixed tiles, KV blocks from position 0",
    )
)
register(
    Backend(
        prefill.OP,
        "triton-tiles-by-batch",
        lazy(_PREFILL, "prefill_attention_tiles_by_batch"),
        available=triton_available,
        covered=covered,
        priority=PRIORITY_TRITON,
        auto=False,
        variant_control=True,
        description="CONTROL: varlen prefill whose KV tile follows the batch (CK batch-prefill occupancy rule)",
    )
)
