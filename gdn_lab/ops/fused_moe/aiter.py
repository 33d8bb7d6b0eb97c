"""fused_moe through AITER's own MoE, `aiter.fused_moe.fused_moe`, as vLLM and SGLang call it on ROCm (ROCm only).

`aiter` (library aiter; no dispatch rule yet): the MoE that vLLM's `rocm_aiter_fused_experts` and
SGLang's AITER MoE path run for unquantized bf16/fp16 experts,

    fused_moe(x, w1, w2, topk_weights, topk_ids, expert_mask=None,
              activation=ActivationType.Silu, quant_type=QuantType.No)

with w1 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I] shuffled once into the CK layout
`shuffle_weight(w, layout=(16, 16))`, as both frameworks do when they load the weights. The shuffle
only reorders each expert's elements; CK then takes its pre-shuffled kernels.

What it runs, by reading amd-aiter 0.1.7's `aiter/fused_moe.py` (aiter_contracts.md section 8):
- `moe_sorting` sorts the slots by expert.
- `get_2stage_cfgs` looks the call up in the tuned table (`configs/tuned_fmoe.csv`) by the CU count
  and the token count padded to 16, the next power of two, or 1024.
- An untuned shape takes two CK stages, with BLOCK_SIZE_M chosen from 32/64/128 by how the slots
  fill the CUs (`get_block_size_M`).
- Stage 2 adds each token's top-k expert outputs into the output: atomically in the default
  kernels, so the order of a token's sum follows the schedule. A row can then change bits with
  the batch, and between runs of the same batch.

The backend is therefore marked not reproducible: a gate records its hashes but never compares them.
The shuffled weights are kept per weight tensor (the same object, version counter and data pointer),
as a framework holds them: shuffling hundreds of experts per call would dominate the call.

Contract (`covered`): ROCm tensors on the GPU; fp16 or bf16 (AITER's `fused_moe` output types);
expert rows a multiple of 16 and reductions a multiple of 32 (the (16, 16) shuffle's tiles: 2I and H
in w1, H and I in w2). Not picked by `auto`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops import aiter_native
from gdn_lab.ops.fused_moe import OP
from gdn_lab.routing import LIBRARY_AITER, PRIORITY_AMD, Backend, Check, register

KERNEL, FUNCTION = "ck_moe", "fused_moe"
SHUFFLE_LAYOUT = (16, 16)  # vLLM's and SGLang's shuffle of MoE weights for AITER
ROWS_MULTIPLE = SHUFFLE_LAYOUT[0]
COLUMNS_MULTIPLE = 2 * SHUFFLE_LAYOUT[1]
DTYPES = (torch.float16, torch.bfloat16)
_SHUFFLED_MAX = 256  # two weight tensors per MoE layer
# weight tensor id -> (weak reference, version, data pointer, its shuffled copy)
_SHUFFLED: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}


def _shuffle(w: torch.Tensor) -> torch.Tensor:
    return aiter_native.function("shuffle", "shuffle_weight")(w.contiguous(), SHUFFLE_LAYOUT)


def shuffled(w: torch.Tensor) -> torch.Tensor:
    """AITER's `shuffle_weight(w, SHUFFLE_LAYOUT)`, made once per unchanged weight tensor (a new
    tensor, an in-place write, which moves the version counter, or moved storage shuffles again)."""
    if w.is_inference():  # no version counter to tell a changed tensor: shuffled at every call
        return _shuffle(w)
    entry = _SHUFFLED.get(id(w))
    if entry is not None and entry[0]() is w and entry[1] == w._version and entry[2] == w.data_ptr():
        return entry[3]
    out = _shuffle(w)
    if len(_SHUFFLED) >= _SHUFFLED_MAX:
        _SHUFFLED.clear()
    key = id(w)

    def forget(ref: weakref.ref, key: int = key) -> None:
        if _SHUFFLED.get(key, (None,))[0] is ref:
            del _SHUFFLED[key]

    _SHUFFLED[key] = (weakref.ref(w, forget), w._version, w.data_ptr(), out)
    return out


def fused_moe_aiter(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """The routed experts through AITER's `fused_moe` (see the module docstring).

    Args:
        x, w1, w2, topk_weights, topk_ids: fused_moe's validated arguments.
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [M, H] in x's dtype.
    """
    if kernel is None:
        kernel = aiter_native.function(KERNEL, FUNCTION)
    # AITER's defaults are the unquantized SiLU-gated MoE: activation=Silu, quant_type=No
    return kernel(x, shuffled(w1), shuffled(w2), topk_weights, topk_ids)


def covered(args: Mapping[str, Any]) -> Check:
    """AITER's MoE contract (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "x")
    if not ok:
        return False, why
    x, w1, w2 = args["x"], args["w1"], args["w2"]
    if x.dtype not in DTYPES:
        return False, f"x is {x.dtype}; AITER's fused_moe takes {aiter_native.dtype_names(*DTYPES)}"
    rows, cols = (w1.shape[1], w2.shape[1]), (w1.shape[2], w2.shape[2])
    if any(n % ROWS_MULTIPLE for n in rows) or any(n % COLUMNS_MULTIPLE for n in cols):
        return False, (
            f"w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}: the {SHUFFLE_LAYOUT} weight shuffle takes rows "
            f"(2I, H) in multiples of {ROWS_MULTIPLE} and columns (H, I) in multiples of {COLUMNS_MULTIPLE}"
        )
    return True, f"AITER fused_moe (CK/ASM), {SHUFFLE_LAYOUT}-shuffled weights, on {aiter.effective_arch(x.device)}"


register(
    Backend(
        OP,
        "aiter",
        fused_moe_aiter,
        library=LIBRARY_AITER,
        available=aiter_native.available(KERNEL, FUNCTION, "AITER's CK/ASM fused_moe"),
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        reproducible=False,
        description="AITER fused_moe (CK 2-stage / ASM) as vLLM and SGLang call it, shuffled weights; stage 2 may add atomically",
    )
)
