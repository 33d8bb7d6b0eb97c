"""gdn_decode through AITER's FlyDSL decode, `flydsl_gdr_decode`, as SGLang's adapter calls it (ROCm only).

`aiter-flydsl` (library flydsl, rule `gdn_lab.rules.flydsl_gdr_decode`: the tuned WARP_THREADS_K by
batch size): `aiter.ops.flydsl.linear_attention_kernels.flydsl_gdr_decode`, imported from its module
directly (aiter's `aiter/ops/flydsl/__init__.py` keeps the export commented out), called as SGLang's
`official_flydsl_decode` adapter does (fork apinge/sglang @1de3bf01, `gdn_aiter.py`;
aiter_contracts.md 3.3):

    flydsl_gdr_decode(q[:, None], k[:, None], v[:, None], a[:, None], b[:, None], dt_bias, A_log,
        slots, state, out, use_qk_l2norm=use_qk_l2norm, need_shuffle_state=False)

q/k [B, 1, HK, K] and v [B, 1, HV, V] contiguous (SGLang transposes its [1, B, H, D] to this),
a/b [B, 1, HV], out preallocated [B, 1, HV, V] in q's dtype, the VK state pool [slots, HV, V, K]
as it is (`need_shuffle_state=False`), updated in place at `slots`. FlyDSL scales q by 1/sqrt(K)
itself (there is no scale argument) and skips rows with a negative index (their output is not
written): the adapter zeroes those rows, the lab's padding contract.

dt_bias: FlyDSL takes it in q's dtype (key, value, a, b, dt_bias and out share the query dtype), as
a bf16 checkpoint stores it; the lab holds gate parameters in float32, so the adapter rounds
dt_bias to q's dtype (the torch reference keeps float32: closeness to it includes that rounding;
invariance does not change, the same rounding applies alone and batched). A_log is passed in
float32 (FlyDSL takes f32 or bf16).

Contract (`covered`): ROCm tensors on the GPU; q, k, v, a, b in one dtype, bf16 or fp16; K = V =
128 (the size AITER tunes and SGLang calls); HV % HK == 0; a contiguous, 16-byte aligned fp32 or
bf16 VK state; the query scale K ** -0.5 (the kernel's own). Not picked by `auto`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops import aiter_native
from gdn_lab.ops.gdn_decode import OP
from gdn_lab.routing import LIBRARY_FLYDSL, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import flydsl_gdr_decode

KERNEL, FUNCTION = "flydsl_gdr_decode", "flydsl_gdr_decode"
HEAD_DIM = 128
DTYPES = (torch.bfloat16, torch.float16)
STATE_DTYPES = (torch.float32, torch.bfloat16)

_aiter_module = aiter_native.available(KERNEL, FUNCTION, "AITER's FlyDSL flydsl_gdr_decode")


def available() -> Check:
    """ROCm, the flydsl package (PyPI), and aiter's FlyDSL kernel module (imported on the first probe)."""
    ok, why = _aiter_module()
    if ok or not aiter.on_rocm():
        return ok, why
    if importlib.util.find_spec("flydsl") is None:
        return False, f"flydsl is not installed (pip install flydsl; aiter pins 0.3.1): {why}"
    return ok, why


def gdn_decode_aiter_flydsl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
    *,
    kernel: Callable[..., Any] | None = None,
) -> torch.Tensor:
    """gdn_decode through `flydsl_gdr_decode`, as SGLang's adapter calls it (see the module docstring).

    Args:
        q ... use_qk_l2norm: gdn_decode's validated arguments (`scale` must be K ** -0.5).
        kernel: the function to call in AITER's place (a test double); None loads AITER's own.

    Returns:
        [B, HV, V] in q's dtype (zeros for negative slots); `state` updated in place at `slots`.
    """
    fn = kernel or aiter_native.function(KERNEL, FUNCTION)
    query, key, value = (x.unsqueeze(1).contiguous() for x in (q, k, v))  # [B, 1, H, D]
    out = torch.empty_like(value)
    fn(
        query,
        key,
        value,
        a.unsqueeze(1),
        b.unsqueeze(1),
        dt_bias.to(q.dtype),
        A_log.float(),
        slots,
        state,
        out,
        use_qk_l2norm=use_qk_l2norm,
        need_shuffle_state=False,
    )
    out = out[:, 0]
    out[slots < 0] = 0  # FlyDSL does not write skipped rows
    return out


def covered(args: Mapping[str, Any]) -> Check:
    """flydsl_gdr_decode's contract (see the module docstring)."""
    ok, why = aiter_native.on_device(args, "q")
    if not ok:
        return False, why
    q, v, state = args["q"], args["v"], args["state"]
    if q.dtype not in DTYPES:
        return False, f"q is {aiter_native.dtype_names(q.dtype)}; flydsl_gdr_decode takes bf16 or fp16"
    wrong = [n for n in ("k", "v", "a", "b") if args[n].dtype != q.dtype]
    if wrong:
        return False, f"{', '.join(wrong)} must share q's dtype ({aiter_native.dtype_names(q.dtype)})"
    if q.shape[2] != HEAD_DIM or v.shape[2] != HEAD_DIM:
        return False, f"K={q.shape[2]} V={v.shape[2]}: AITER's FlyDSL decode is tuned and called with K = V = 128"
    if state.dtype not in STATE_DTYPES or not state.is_contiguous() or state.data_ptr() % 16:
        return False, "state must be a contiguous, 16-byte aligned fp32 or bf16 VK pool"
    if abs(args["scale"] - q.shape[2] ** -0.5) > 1e-12:
        return (
            False,
            f"scale {args['scale']}: FlyDSL applies 1/sqrt(K) = {q.shape[2] ** -0.5} itself (no scale argument)",
        )
    return True, "flydsl_gdr_decode (VK state, need_shuffle_state=False), config from its tuned table"


register(
    Backend(
        OP,
        "aiter-flydsl",
        gdn_decode_aiter_flydsl,
        library=LIBRARY_FLYDSL,
        available=available,
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=flydsl_gdr_decode.RULE,
        description="AITER FlyDSL flydsl_gdr_decode as SGLang's adapter calls it (WARP_THREADS_K from its tuned table by batch)",
    )
)
