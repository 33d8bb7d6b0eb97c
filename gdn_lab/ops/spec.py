"""Everything the lab knows about one op, registered from the op's own folder.

An op folder (`gdn_lab/ops/<op>/`) registers one `OpSpec` and its backends when it is imported;
`gdn_lab.ops` imports every op folder it finds. Workloads, experiments, the CLI and the docs test
read the specs, so a new op is a new folder:

- `validate` / `function` / `example`: the public call, its checks, a small validated call;
- `shape` and `build`: the workload builder (a target among batchmates, each request's content
  from its own seed; see `gdn_lab.ops.batch`);
- `outputs`, `states` and `view`: the names of what a call returns and updates in place, and
  which rows and state slot of them belong to one request;
- `values` and `tolerances`: how a tensor reads as numbers, and the named closeness to the
  reference (`Tolerance`).

Example:
    >>> import gdn_lab.ops
    >>> s = get("gdn_decode")
    >>> s.outputs, s.states, s.reference
    (('out',), ('state',), 'torch')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn_lab.checks import FP8_DTYPES, dtype_name

METRICS = ("allclose", "rms_ratio", "rel_mae", "bitwise")


@dataclass(frozen=True)
class Tolerance:
    """A named closeness test of a result against a reference.

    Attributes:
        metric: "allclose" (|x - ref| <= atol + rtol * |ref| everywhere), "rms_ratio"
            (RMS(x - ref) / RMS(ref) <= limit, flash-linear-attention's ratio), "rel_mae"
            (mean |x - ref| / mean |ref| <= limit) or "bitwise" (the same bits).
        limit: the bound of rms_ratio and rel_mae.
        atol, rtol: the bounds of allclose.
    """

    metric: str
    limit: float = 0.0
    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric: {self.metric!r} is not accepted; expected one of {', '.join(METRICS)}")

    @property
    def name(self) -> str:
        """How the tolerance reads in a table."""
        if self.metric == "allclose":
            return f"|out-ref| <= {self.atol:.3g} + {self.rtol:.3g}*|ref|"
        if self.metric == "bitwise":
            return "bitwise"
        return f"{'rms(out-ref)/rms(ref)' if self.metric == 'rms_ratio' else 'rel_mae'} <= {self.limit:g}"

    def measure(self, x: torch.Tensor, ref: torch.Tensor) -> float:
        """The metric's value: the ratio (rms_ratio, rel_mae), the largest |x - ref| (allclose), or
        the number of differing elements (bitwise)."""
        if self.metric == "bitwise":
            return float((x.view(torch.uint8) != ref.view(torch.uint8)).sum()) if x.numel() else 0.0
        x64, r64 = x.double(), ref.double()
        diff = (x64 - r64).abs()
        if self.metric == "allclose":
            return float(diff.max()) if diff.numel() else 0.0
        if self.metric == "rms_ratio":
            num, den = float(diff.pow(2).mean().sqrt()), float(r64.pow(2).mean().sqrt())
        else:
            num, den = float(diff.mean()), float(r64.abs().mean())
        return num / den if den > 0 else num

    def holds(self, x: torch.Tensor, ref: torch.Tensor) -> bool:
        """Whether x is within the tolerance of ref."""
        if self.metric == "bitwise":
            return x.shape == ref.shape and self.measure(x, ref) == 0
        if self.metric == "allclose":
            diff = (x.double() - ref.double()).abs()
            return bool((diff <= self.atol + self.rtol * ref.double().abs()).all())
        return self.measure(x, ref) <= self.limit


def dtype_key(dtype: torch.dtype) -> str:
    """The key a tolerance table uses for a dtype: its name, or "fp8" for every fp8 format."""
    return "fp8" if dtype in FP8_DTYPES else dtype_name(dtype)


@dataclass(frozen=True)
class View:
    """Where one request lives in a call: its rows of every output (dim 0) and its state slot."""

    rows: slice
    slot: int | None = None


@dataclass(frozen=True)
class OpSpec:
    """One op (see the module docstring).

    Attributes:
        name: the op's name ("decode_attention").
        function: the public function (validates, routes, runs).
        validate: the public signature without `backend`; returns the dict every backend's `run` takes.
        example: (device, dtype) -> the validated arguments of a small call.
        shape: the dataclass that sizes the op's workloads (`gdn_lab.ops.batch.AttentionShape`, ...).
        build: (batch, shape, BuildOptions) -> validated arguments for a `gdn_lab.ops.batch.Batch`.
        outputs: the names of what `run` returns, in order (one name: a tensor; more: a tuple).
        states: the argument names of the state pools the op updates in place.
        view: (batch, validated args, request index) -> View.
        values: {tensor name: (tensors of one result) -> the tensor read as numbers}, for tensors
            whose bits are codes (fp8 with scales); others read as they are.
        tolerances: {(reference, tensor, dtype key): Tolerance}; see `tolerance`.
        reference: the backend that is the ground truth.
        exact: (validated args) -> the first output in float64, computed independently of every
            backend (the oracle errors are measured against), or None.
        kv_cache: the op reads a KV cache (a KV dtype applies to it).
        fixed_length: every request has this many tokens (gdn_decode: one step), or None.
        description: one line.
    """

    name: str
    function: Callable[..., Any]
    validate: Callable[..., dict[str, Any]]
    example: Callable[..., dict[str, Any]]
    shape: type
    build: Callable[..., dict[str, Any]]
    outputs: tuple[str, ...]
    view: Callable[[Any, Mapping[str, Any], int], View]
    states: tuple[str, ...] = ()
    values: Mapping[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] = field(default_factory=dict)
    tolerances: Mapping[tuple[str, str, str], Tolerance] = field(default_factory=dict)
    reference: str = "torch"
    exact: Callable[[Mapping[str, Any]], torch.Tensor] | None = None
    kv_cache: bool = False
    fixed_length: int | None = None
    description: str = ""

    def tensors(self, result: Any, args: Mapping[str, Any], view: View | None = None) -> dict[str, torch.Tensor]:
        """A result's tensors by name: the outputs, then the state pools after the run.

        Args:
            result: what `run` returned.
            args: the arguments it ran on (its states updated in place).
            view: one request's rows and slot (`view(batch, args, i)`); None: whole tensors.
        """
        results = result if isinstance(result, tuple) else (result,)
        out = {}
        for name, value in zip(self.outputs, results):
            if value is not None:
                out[name] = value if view is None else value[view.rows]
        for name in self.states:
            out[name] = args[name] if view is None else args[name][view.slot]
        return out

    def as_values(self, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """Tensor `name` of `tensors` read as numbers (codes dequantized, see `values`)."""
        read = self.values.get(name)
        return read(tensors) if read is not None else tensors[name]

    def tolerance(self, tensor: str, dtype: torch.dtype, reference: str | None = None) -> Tolerance:
        """The named closeness of `tensor` to `reference` (default: the spec's) for `dtype`.

        Raises:
            ValueError: the spec has no tolerance for the key (the message lists those it has).
        """
        key = (reference or self.reference, tensor, dtype_key(dtype))
        if key not in self.tolerances:
            have = ", ".join("/".join(k) for k in self.tolerances) or "none"
            raise ValueError(f"tolerance: {self.name} has none for {'/'.join(key)}; it has: {have}")
        return self.tolerances[key]


_SPECS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add an op (a later registration of the same name replaces it)."""
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> OpSpec:
    """The spec of op `name`.

    Raises:
        ValueError: an unknown op (the message lists the registered ones).
    """
    if name not in _SPECS:
        raise ValueError(f"op: {name!r} is not known; accepted: {', '.join(_SPECS) or 'none registered'}")
    return _SPECS[name]


def names() -> list[str]:
    """Every registered op, in registration order."""
    return list(_SPECS)


def unregister(name: str) -> None:
    """Remove an op (for tests that register a toy op)."""
    _SPECS.pop(name, None)
