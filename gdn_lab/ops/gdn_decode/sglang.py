"""gdn_decode as SGLang's AiterGDNKernel runs it on AMD: HIP, FlyDSL or Triton, chosen per launch (ROCm only).

`sglang-aiter` (library sglang-aiter, rule `gdn_lab.rules.sglang_gdn`'s decode rule, evaluated with
this machine's availability of the HIP and FlyDSL decodes). `AiterGDNKernel.decode` (fork
apinge/sglang @1de3bf01, `gdn_aiter.py`; aiter_contracts.md 3.10) takes, for the launch's active
batch size B:

1. HIP (`aiter-hip`) iff the HIP decode imports and its extension builds, the arch is gfx942,
   the state is contiguous, (HK, HV) = (2, 8) with B >= 24, and SGLang's runtime contract holds
   (q, k, v, a, b, dt_bias bf16, K = V = 128, fp32 state ending in (HV, 128, 128));
2. else FlyDSL (`aiter-flydsl`) iff it imports, HV >= HK, HV % HK == 0 and the same runtime
   contract holds (its WARP_THREADS_K then follows B by the tuned table);
3. else its Triton fallback.

The route is computed by the rule (`sglang_gdn.SglangGdnDecodeRule`), so the backend and its
rule cannot disagree; each kernel is then called exactly as its own backend calls it (as SGLang
calls it: scale K ** -0.5 and `use_qk_l2norm_in_kernel=True` always). Because SGLang checks
dt_bias is bf16, the lab's float32 dt_bias routes to Triton, as it would in SGLang; pass a bf16
dt_bias to reach HIP and FlyDSL.

SGLang's Triton fallback is its own `TritonGDNKernel` (fla's fused sigmoid-gating recurrent
kernel); SGLang is not a dependency of the lab, so the Triton branch runs AITER's Triton decode
(`aiter-triton`), which has the same structure (one program per V tile, sequence and head, full-K
sums, batch invariant) but not necessarily the same tile config: the Triton branch's bits are
AITER's, not SGLang's.

Contract (`covered`): ROCm; the launch's batch is the call's B (SGLang trims padded rows by
`active_batch_size`; a negative slot is covered only where the chosen kernel covers it); scale
K ** -0.5 and L2-normalized q/k; then the chosen kernel's own contract. Not picked by `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import torch

from gdn_lab import aiter
from gdn_lab.ops.aiter_paged import rule_env
from gdn_lab.ops.gdn_decode import OP, aiter_triton, flydsl
from gdn_lab.ops.gdn_decode import aiter as hip
from gdn_lab.routing import LIBRARY_SGLANG_AITER, PRIORITY_AMD, Backend, Check, register
from gdn_lab.rules import sglang_gdn
from gdn_lab.rules.base import Predicted, RuleEnv

KERNELS = ("hip", "flydsl", "triton")
_ADAPTERS: dict[str, Callable[..., torch.Tensor]] = {
    "hip": hip.gdn_decode_aiter_hip,
    "flydsl": flydsl.gdn_decode_aiter_flydsl,
    "triton": aiter_triton.gdn_decode_aiter_triton,
}
_COVERED: dict[str, Callable[[Mapping[str, Any]], Check]] = {
    "hip": hip.covered,
    "flydsl": flydsl.covered,
    "triton": aiter_triton.covered,
}


@cache
def _flydsl_imports() -> bool:
    return flydsl.available()[0]


def kernel_availability() -> dict[str, bool]:
    """Which of SGLang's decode kernels load here: HIP (import + extension build), FlyDSL (import).

    Off ROCm both are False without importing anything.
    """
    if not aiter.on_rocm():
        return {"hip": False, "flydsl": False}
    return {"hip": hip.hip_ready()[0], "flydsl": _flydsl_imports()}


@dataclass(frozen=True)
class SglangAiterDecodeRule:
    """SGLang's decode rule (`sglang_gdn.DECODE_RULE`) with this machine's HIP / FlyDSL availability.

    SGLang's `select_aiter_gdn_decode_backend` takes `hip_available` and `fly_available`; the rule
    module's default assumes both. This rule asks the machine (`kernel_availability`) when it
    predicts, so a HIP decode that does not import here is predicted as SGLang would route.
    """

    name: str = sglang_gdn.DECODE_RULE.name
    source: str = sglang_gdn.DECODE_RULE.source

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        have = kernel_availability()
        rule = replace(sglang_gdn.DECODE_RULE, hip_available=have["hip"], fly_available=have["flydsl"])
        return rule.predict(args, request, env)

    def expect(self, alone_key: str, batched_key: str) -> str:
        return sglang_gdn.DECODE_RULE.expect(alone_key, batched_key)


RULE = SglangAiterDecodeRule()


def route(args: Mapping[str, Any], available: Mapping[str, bool]) -> tuple[str, Predicted]:
    """(kernel, the rule's prediction) SGLang takes for the call, given which kernels load."""
    rule = replace(sglang_gdn.DECODE_RULE, hip_available=available.get("hip", False),
                   fly_available=available.get("flydsl", False))  # fmt: skip
    predicted = rule.predict(args, 0, rule_env(args["q"].device))
    return predicted.variant.split(":")[0], predicted


def _sglang_call(args: Mapping[str, Any]) -> Check:
    k = args["q"].shape[2]
    if abs(args["scale"] - k**-0.5) > 1e-12:
        return False, f"scale {args['scale']}: SGLang's AiterGDNKernel always passes K ** -0.5 = {k**-0.5}"
    if not args["use_qk_l2norm"]:
        return False, "use_qk_l2norm=False: SGLang's AiterGDNKernel always passes use_qk_l2norm_in_kernel=True"
    return True, ""


def gdn_decode_sglang_aiter(
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
    kernels: Mapping[str, Callable[..., Any]] | None = None,
) -> torch.Tensor:
    """gdn_decode routed as SGLang's AiterGDNKernel routes it (see the module docstring).

    Args:
        q ... use_qk_l2norm: gdn_decode's validated arguments.
        kernels: {"hip" | "flydsl" | "triton": the function to call in AITER's place} (test
            doubles); a kernel missing from it does not load. None: this machine's kernels.

    Returns:
        [B, HV, V] in q's dtype; `state` updated in place at `slots`.
    """
    args = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, slots=slots, scale=scale,
                use_qk_l2norm=use_qk_l2norm)  # fmt: skip
    have = kernel_availability() if kernels is None else {name: name in kernels for name in KERNELS}
    chosen, _ = route(args, have)
    kernel = None if kernels is None else kernels[chosen]
    return _ADAPTERS[chosen](**args, kernel=kernel)


def available() -> Check:
    """SGLang's AiterGDNKernel exists on ROCm builds with aiter only."""
    if not aiter.on_rocm():
        return False, "SGLang's AiterGDNKernel runs on ROCm only; this torch has no ROCm (torch.version.hip is None)"
    p = aiter.probe()
    return (
        (True, f"aiter {p.version}: SGLang's HIP / FlyDSL / Triton GDN decode routing")
        if p.installed
        else (
            False,
            p.reason,
        )
    )


def covered(args: Mapping[str, Any], availability: Mapping[str, bool] | None = None) -> Check:
    """SGLang's call, then the chosen kernel's own contract.

    Args:
        args: gdn_decode's validated arguments.
        availability: which kernels load (None: this machine's, `kernel_availability`).
    """
    ok, why = _sglang_call(args)
    if not ok:
        return False, why
    chosen, predicted = route(args, kernel_availability() if availability is None else availability)
    ok, why = _COVERED[chosen](args)
    if not ok:
        return False, f"SGLang routes to {chosen} ({predicted.reason}), which does not cover it: {why}"
    return True, f"{predicted.variant}: {predicted.reason}"


register(
    Backend(
        OP,
        "sglang-aiter",
        gdn_decode_sglang_aiter,
        library=LIBRARY_SGLANG_AITER,
        available=available,
        covered=covered,
        priority=PRIORITY_AMD,
        auto=False,
        rule=RULE,
        description="SGLang's AiterGDNKernel decode routing: HIP for (2,8) at batch >= 24 on gfx942, else FlyDSL, else Triton",
    )
)
