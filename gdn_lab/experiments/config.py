"""The one Config style every experiment uses: a frozen dataclass of plain, typed values.

A config holds what a notebook's parameters cell, a preset or the CLI give (names, numbers, lists,
dicts), so one schema serves all three, and it is checked when it is built, before any kernel runs:

- every field against its type hint (`int`, `float`, `bool`, `str`, `X | None`, `tuple[int, ...]`,
  `dict[str, int]`, nested dicts); lists become tuples;
- then each field's own check (`field(metadata=check(...))`: positive numbers, known names);
- then the experiment's `validate()` for what relates fields (an op's backends, a shape's fields).

Errors are ValueErrors that name the field, the value given and what is accepted.

Example:
    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True)
    ... class Demo(ExperimentConfig):
    ...     sizes: tuple[int, ...] = field(default=(1, 2), metadata=check(positive_ints))
    >>> Demo(sizes=[4, 8]).sizes
    (4, 8)
    >>> Demo(sizes=[0])
    Traceback (most recent call last):
    ...
    ValueError: sizes: expected positive integers, got (0,)
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import torch

from gdn_lab import checks, routing
from gdn_lab.device import detect
from gdn_lab.ops import spec as op_spec
from gdn_lab.workloads import resolve_device, resolve_dtype, resolve_kv_dtype

DTYPES = ("bfloat16", "float16", "float32", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda")


def check(fn: Callable[[str, Any], None] | None = None, help: str = "") -> dict[str, Any]:
    """A field's metadata: its own check `fn(name, value)` (raises ValueError), and a help line."""
    return {"check": fn, "help": help}


def positive_ints(name: str, value: Sequence[int]) -> None:
    if not value or any(v <= 0 for v in value):
        raise ValueError(f"{name}: expected positive integers, got {value!r}")


def positive(name: str, value: float | None) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")


def one_of(accepted: Sequence[Any]) -> Callable[[str, Any], None]:
    def choose(name: str, value: Any) -> None:
        checks.check_choice(name, value, tuple(accepted))

    return choose


def known_op(name: str, value: str) -> None:
    checks.check_choice(name, value, tuple(op_spec.names()))


def known_ops(name: str, value: Sequence[str]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one op; accepted: {', '.join(op_spec.names())}")
    for v in value:
        checks.check_choice(name, v, tuple(op_spec.names()))


def plain(value: Any) -> Any:
    """A config value as plain data (lists, dicts, str, numbers, None): what YAML, JSON and a
    notebook's parameters cell hold. Tuples become lists; torch devices and dtypes their names."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, torch.dtype):
        return checks.dtype_name(value)
    return value


def known_arch(name: str, value: str) -> None:
    """An arch whose fp8 format the lab knows: gfx942, gfx950, sm_XX, cpu."""
    from gdn_lab.device import fp8_dtypes_for

    try:
        fp8_dtypes_for(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}".replace(f"arch {value!r}", repr(value), 1)) from None


def known_kv_dtype(name: str, value: str) -> None:
    """A KV-cache dtype name: "fp8" (the arch's format), "auto" (the compute dtype) or a compute dtype."""
    resolve_kv_dtype(value, torch.float32, "cpu")


def _human(hint: Any) -> str:
    """A type hint as a message says it: "a mapping, a list of mappings or null"."""
    origin, targs = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_human(a) for a in targs if a is not type(None)] + (["null"] if type(None) in targs else [])
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    if origin is tuple:
        inner = _human(targs[0]).removeprefix("an ").removeprefix("a ")
        return f"a list of {inner}s" if not inner.endswith("s") else f"a list of {inner}"
    if origin in (dict, Mapping, typing.Mapping) or hint in (dict, Mapping):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, _type_name(hint))


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """`value` as type `hint`, or a ValueError naming the field (lists become tuples)."""
    origin, targs = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in targs:
            return None
        errors = []
        for option in (a for a in targs if a is not type(None)):
            try:
                return _coerce(name, value, option)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if len(errors) == 1 else f"{name}: expected {_human(hint)}, got {value!r}")
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ValueError(f"{name}: expected a list of {_type_name(targs[0])}, got {value!r}")
        return tuple(_coerce(f"{name}[{i}]", v, targs[0]) for i, v in enumerate(value))
    if origin in (dict, Mapping, typing.Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name}: expected a mapping, got {value!r}")
        key_t, val_t = targs if targs else (Any, Any)
        return {_coerce(name, k, key_t): _coerce(f"{name}.{k}", v, val_t) for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, torch.device):  # a torch object stands for its name
            return str(value)
        if isinstance(value, torch.dtype):
            return checks.dtype_name(value)
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r}")
        return value
    return value


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """What every experiment takes.

    Attributes:
        seed: seeds every workload: the same seed gives the same table.
        device: "auto" (the GPU if torch sees one, else the CPU), "cpu" or "cuda".
        dtype: the compute dtype: bfloat16, float16 or float32 (bf16, fp16, fp32).
    """

    seed: int = field(default=0, metadata=check(help="seeds every workload"))
    device: str = field(default="auto", metadata=check(one_of(DEVICES), "auto, cpu or cuda"))
    dtype: str = field(default="bfloat16", metadata=check(one_of(DTYPES), "the compute dtype"))

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = _coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
            own = f.metadata.get("check")
            if own is not None and value is not None:
                own(f.name, value)
        self.validate()

    def validate(self) -> None:
        """Checks that relate fields (an experiment overrides it); raises ValueError."""
        self.torch_device  # noqa: B018  ("cuda" on a machine without a GPU is an error here, not later)

    @cached_property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    @cached_property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype)

    @cached_property
    def device_arch(self) -> str:
        return detect(self.torch_device).arch

    def kv_torch_dtype(self, kv_dtype: str | None, arch: str | None = None) -> torch.dtype | None:
        """A KV dtype name ("fp8": the arch's format) as a torch dtype; None keeps the compute dtype."""
        return None if kv_dtype is None else resolve_kv_dtype(kv_dtype, self.torch_dtype, arch or self.device_arch)

    def unused(self) -> dict[str, str]:
        """{field: why}: fields whose value nothing in this experiment reads (a config that fans out
        to several ops overrides some per op). The suite runner refuses a `-p` value for one of
        them, which would otherwise be accepted silently. Default: none."""
        return {}

    def plain(self) -> dict[str, Any]:
        """Every field as plain data ({name: value}); `type(self)(**cfg.plain())` builds it again."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def parameters(cls) -> dict[str, dict[str, Any]]:
        """{field: {type, default, help}} for documentation and the suite runner (no default: MISSING)."""
        hints = typing.get_type_hints(cls)
        return {
            f.name: {"type": _type_name(hints[f.name]), "default": f.default, "help": f.metadata.get("help", "")}
            for f in fields(cls)
        }


def check_backends(name: str, op: str, backends: Sequence[str] | None, strict: bool = True) -> None:
    """Every named backend is one of op's (strict), or of some op (not strict: a list shared by ops)."""
    if backends is None:
        return
    registered = routing.backend_names(op)
    everywhere = {b for o in op_spec.names() for b in routing.backend_names(o)}
    for b in backends:
        if b not in (registered if strict else everywhere):
            raise ValueError(
                f"{name}: {b!r} is not a backend of {op if strict else 'any op'}; "
                f"accepted: {', '.join(registered if strict else sorted(everywhere))}"
            )


def make_shape(cls: Any, given: Mapping[str, int] | None) -> Any:
    """A shape dataclass (`AttentionShape`, `GDNShape`, ...) from {field: value}, errors named `<param>.<field>`."""
    given = given or {}
    accepted = ", ".join(f.name for f in fields(cls))
    unknown = sorted(set(given) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{cls.param}: {', '.join(map(str, unknown))} not accepted; accepted fields: {accepted}")
    try:
        return cls(**given)
    except (TypeError, ValueError) as exc:  # a field's own check names the field: say whose field it is
        raise ValueError(f"{cls.param}.{exc}" if ":" in str(exc).split(" ")[0] else f"{cls.param}: {exc}") from None


def shape_of(op: str, shapes: Mapping[str, Mapping[str, int]]) -> Any:
    """The op's shape dataclass built from the config's {param: fields} (its `param`, e.g. "attention")."""
    cls = op_spec.get(op).shape
    return make_shape(cls, shapes.get(cls.param))
