"""Input validation shared by every op: clear errors, raised before any kernel runs.

Shapes are written as in the docstrings, `"B Hq D"`; a name binds on first sight and every later
tensor must agree with it, so a message can say where the expectation came from:
`kv_indptr: expected shape [B+1] = [3] (B=2 from q), got (4,)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


class Dims:
    """Named dimensions bound while checking the tensors of one call."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.origin: dict[str, str] = {}

    def __getitem__(self, key: str) -> int:
        return self.values[key]

    def bind(self, label: str, value: int, source: str) -> None:
        if label not in self.values:
            self.values[label] = value
            self.origin[label] = source

    def where(self, label: str) -> str:
        return f"{label}={self.values[label]} from {self.origin[label]}"


def check_tensor(
    name: str,
    t: object,
    shape: str,
    dims: Dims,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
) -> None:
    """Check one tensor's rank, shape, dtype and device.

    Args:
        name: the parameter name, used in the message.
        t: the value passed.
        shape: space-separated dims: a name (`B`), a name plus one (`B+1`) or an integer.
        dims: the call's bindings; unbound names bind to this tensor's size.
        dtypes: accepted dtypes, or None for any.
        device: the device every tensor of the call must be on.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(
            f"{name}: expected a torch.Tensor of shape [{', '.join(shape.split())}], got {type(t).__name__}"
        )
    labels = shape.split()
    pretty = "[" + ", ".join(labels) + "]"
    size = t.shape  # read once: under a TorchFunctionMode every metadata read is a Python call
    if len(size) != len(labels):
        raise ValueError(f"{name}: expected {len(labels)} dims {pretty}, got shape {tuple(size)}")
    for axis, label in enumerate(labels):
        n = size[axis]
        if label.isdigit():
            if n != int(label):
                raise ValueError(f"{name}: expected shape {pretty}, got {tuple(size)} (dim {axis} must be {label})")
            continue
        base, plus = (label[:-2], 1) if label.endswith("+1") else (label, 0)
        if base in dims.values:
            want = dims[base] + plus
            if n != want:
                source = f"from {dims.origin[base]}" if plus == 0 else dims.where(base)
                raise ValueError(f"{name}: expected shape {pretty} with {label}={want} ({source}), got {tuple(size)}")
        else:
            if n - plus < 0:
                raise ValueError(f"{name}: dim {axis} ({label}) must be at least {plus}, got {n}")
            dims.bind(base, n - plus, name)
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {dtype_name(t.dtype)} is not accepted; expected one of {_names(dtypes)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, but the call's tensors are on {device} (all must share a device)")


def dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """A read-only index, length or per-head parameter tensor as every backend's kernel reads it:
    contiguous, a copy only where it is not (a column of a table, `lens[:, 1]`). Kernels index
    these with a stride of 1, so a strided one would be read wrongly, without an error. (Asked
    first: under a recorder's function mode is_contiguous is a metadata read, contiguous a call.)"""
    return t if t is None or t.is_contiguous() else t.contiguous()


def signature(values: Sequence[object]) -> tuple | None:
    """What shape/dtype validation reads from a call, as a hashable key.

    A tensor contributes its type, shape, dtype and device; any other value its type and itself.
    Checks that read only these (not tensor values) give the same answer for the same key, so an
    op may skip them for a signature it has already accepted. None when a value is unhashable.
    """
    key = tuple((type(x), x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else (type(x), x) for x in values)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def check_optional(name: str, t: object, shape: str, dims: Dims, dtypes=None, device=None) -> None:
    if t is not None:
        check_tensor(name, t, shape, dims, dtypes, device)


def check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


def check_divides(small_name: str, small: int, big_name: str, big: int) -> None:
    if big <= 0:  # 0 divides by anything: zero query heads would run and return nothing
        raise ValueError(f"{big_name}: expected at least 1 (a multiple of {small_name} (={small})), got {big}")
    if small <= 0 or big % small != 0:
        raise ValueError(f"{big_name} (={big}) must be divisible by {small_name} (={small})")


def check_choice(name: str, value: object, accepted: Sequence[object]) -> None:
    if value not in accepted:
        raise ValueError(f"{name}: {value!r} is not accepted; expected one of {', '.join(map(repr, accepted))}")


def check_positive_float(name: str, value: object, none: str | None = None) -> None:
    """value is a finite number > 0 (inf and nan are not: an inf scale or eps makes NaNs), or None
    where `none` says what None stands for."""
    if value is None and none is not None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        accepted = "a positive finite float" + (f" or None ({none})" if none is not None else "")
        raise ValueError(f"{name}: expected {accepted}, got {value!r}")


def check_bool(name: str, value: object) -> None:
    if value is not True and value is not False:
        raise ValueError(f"{name}: expected a bool (True or False), got {value!r}")


def host_ints(t: torch.Tensor) -> list[int]:
    """A small int tensor's values on the host (one synchronisation)."""
    return [int(x) for x in t.tolist()]


def check_prefix_sums(name: str, indptr: list[int], total: int | None = None, total_name: str = "") -> None:
    """indptr must start at 0, never decrease, and end at `total` when given."""
    if indptr[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {indptr[0]}")
    for i in range(len(indptr) - 1):
        if indptr[i + 1] < indptr[i]:
            raise ValueError(
                f"{name}: must be non-decreasing, but {name}[{i + 1}]={indptr[i + 1]} < {name}[{i}]={indptr[i]}"
            )
    if total is not None and indptr[-1] != total:
        raise ValueError(f"{name}: last entry {indptr[-1]} must equal {total_name} (={total})")


def check_lengths_positive(name: str, lengths: list[int]) -> None:
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"{name}: every length must be > 0, but entry {i} is {n}")


def check_index_range(name: str, values: torch.Tensor, size: int, size_name: str, allow_negative: bool = False) -> None:
    """Every index must point inside [0, size) (negative entries allowed as padding when asked)."""
    if values.numel() == 0:
        return
    lo, hi = (int(x) for x in torch.stack([values.min(), values.max()]).tolist())
    if hi >= size or (lo < 0 and not allow_negative):
        accepted = f"[0, {size})" + (" or negative for padding" if allow_negative else "")
        bad = hi if hi >= size else lo
        raise ValueError(f"{name}: entry {bad} points outside {size_name} (={size}); accepted: {accepted}")


def check_distinct(name: str, values: torch.Tensor) -> None:
    """Non-negative entries must be distinct (two rows updating one state slot would race)."""
    live = values[values >= 0]
    if live.numel() != torch.unique(live).numel():
        raise ValueError(f"{name}: non-negative entries must be distinct (each state slot is updated by one row)")
