"""What every experiment shares: picking backends, running one without falling back, error metrics.

A requested backend is routed by name (`gdn_lab.routing.decide`), never replaced: a call it cannot
run comes back as `Ran(covered=False, reason=...)`, and a call that raises comes back with its
error, so an experiment can write a row for it and go on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gdn_lab import routing
from gdn_lab.workloads import TargetView, fresh_copy, state_keys

# Names of the tensors an op's result is compared on (GDN states are read after the run).
OUTPUT_NAMES = {
    "decode_attention": ("out",),
    "prefill_attention": ("out",),
    "gdn_decode": ("out",),
    "gdn_prefill": ("out",),
    "gdn_layer_prefill": ("out", "fp8", "fp8_scales"),
}
STATE_NAMES = {"state": "state", "delta_state": "state", "conv_state": "conv_state"}


def select_backends(
    op: str, requested: str | Sequence[str] | None = None, include_controls: bool = True, strict: bool = True
):
    """The backends an experiment runs for `op`, in the registry's order.

    Args:
        op: the op.
        requested: None or "all" for every registered backend; else names.
        include_controls: add the op's batch-variant controls (`routing.controls(op)`) if not named.
        strict: a requested name that is not a backend of `op` raises; when False it is skipped
            (a list of names shared by several ops).

    Returns:
        A list of routing.Backend.

    Raises:
        ValueError: (strict) a requested name is not a backend of `op`; the message lists the registered ones.
    """
    if requested is None or requested == "all":
        chosen = [b for b in routing.backends(op) if not b.variant_control]
    else:
        names = [requested] if isinstance(requested, str) else list(requested)
        registered = set(routing.backend_names(op))
        chosen = [routing.get(op, n) for n in names if strict or n in registered]
    if include_controls:
        chosen += [c for c in routing.controls(op) if c.name not in {b.name for b in chosen}]
    return chosen


@dataclass
class Ran:
    """One backend's run of one call.

    Attributes:
        backend: the requested name.
        covered: whether the backend could take the call.
        reason: routing's reason (why it ran, or why not), or the error.
        result: what the op returned, or None.
        args: the arguments it ran on (with its private state copies, now updated).
        error: "ExcType: message" when the run raised.
    """

    backend: str
    covered: bool
    reason: str
    result: Any = None
    args: dict[str, Any] | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        if not self.covered:
            return "not covered"
        return "error" if self.error else "compared"


def run_backend(op: str, name: str, args: Mapping[str, Any]) -> Ran:
    """Run backend `name` on private copies of the states in `args`; never another backend."""
    decision = routing.decide(op, args, name)
    if decision.backend is None:
        return Ran(name, False, decision.reason)
    mine = fresh_copy(op, dict(args))
    try:
        result = decision.backend.run(**mine)
        if isinstance(result, torch.Tensor) and result.device.type == "cuda":
            torch.cuda.synchronize(result.device)
    except Exception as exc:  # a backend that claims a case and then fails is reported, not fatal
        return Ran(name, True, decision.reason, error=f"{type(exc).__name__}: {exc}")
    return Ran(name, True, decision.reason, result, mine)


def target_tensors(op: str, ran: Ran, view: TargetView) -> dict[str, torch.Tensor]:
    """The target's slice of every compared tensor: output rows, then its state slots after the run."""
    assert ran.args is not None
    results = ran.result if isinstance(ran.result, tuple) else (ran.result,)
    out = {}
    for name, value in zip(OUTPUT_NAMES[op], results):
        if value is not None:
            out[name] = value[view.rows]
    for key in state_keys(op):
        out[STATE_NAMES[key]] = ran.args[key][view.slot]
    return out


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 (NaN if either holds NaN where the other does not)."""
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def rel_mae(a: torch.Tensor, b: torch.Tensor) -> float:
    """mean |a - b| / mean |b|: the relative mean absolute error of `a` against the reference `b`."""
    b64 = b.double()
    denom = float(b64.abs().mean())
    return float((a.double() - b64).abs().mean()) / denom if denom > 0 else max_abs(a, b)


def rms_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    """RMS(a - b) / RMS(b), flash-linear-attention's closeness metric."""
    b64 = b.double()
    denom = float(b64.pow(2).mean().sqrt())
    diff = float((a.double() - b64).pow(2).mean().sqrt())
    return diff / denom if denom > 0 else diff


def is_amd_library(backend: str) -> bool:
    """AITER / FlyDSL backends: their results off ROCm are 'not yet run on AMD hardware'."""
    return backend.startswith("aiter")


def hardware_note(backend: str, platforms: Iterable[str]) -> str:
    """' (not yet run on AMD hardware)' for an AMD-library backend unless every run was on ROCm."""
    return " (not yet run on AMD hardware)" if is_amd_library(backend) and set(platforms) != {"rocm"} else ""


def labeled(backend: str, platforms: Iterable[str]) -> str:
    """The backend's name as conclusions print it (AMD-library results off ROCm marked)."""
    return f"{backend}{hardware_note(backend, platforms)}"


def fmt_list(items: Iterable[object]) -> str:
    items = list(items)
    return ", ".join(str(i) for i in items) if items else "none"
