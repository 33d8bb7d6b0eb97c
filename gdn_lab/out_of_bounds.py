"""Find a Triton kernel's out-of-bounds loads and stores on the CPU, under Triton's interpreter.

On a GPU an address outside every allocation is an illegal memory access: it ends the process's
CUDA context, and with it every later launch. Under the interpreter such an address reads or
writes whatever the host has there, silently. `out_of_bounds()` checks, for every launch inside
it, that each address a load or store keeps after its mask lies inside one of the launch's tensor
arguments, from the view's first element to its last (strides followed, so a view's neighbours
in the same storage count as outside). A kernel whose accesses all pass cannot fault that way on
any device with the same arguments; one that faults on a GPU while every access here passes
points at the compiled code, not at the kernel's addresses.

Triton 3.9's interpreter: the wrapped hooks are `GridExecutor.__call__` and
`InterpreterBuilder.create_masked_load` / `create_masked_store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Access:
    """Out-of-bounds accesses of one kind in one launch: `count` addresses, the first of them
    `address` (a host address: its offset from `nearest`'s start says how far out it fell)."""

    kernel: str
    kind: str  # "load" or "store"
    count: int
    address: int
    nearest: str  # the closest tensor argument, as name[shape] dtype


def _extent(t: Any) -> tuple[int, int]:
    """[first byte, past the last byte] of a tensor view."""
    lo = t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return lo, lo + (last + 1) * t.element_size()


@contextlib.contextmanager
def out_of_bounds() -> Iterator[list[Access]]:
    """Record the out-of-bounds accesses of every launch in the block (in launch order) into the
    list it yields; the hooks are restored on leaving, also on an exception.

    Raises:
        RuntimeError: if Triton's interpreter is not on (TRITON_INTERPRET=1 before the kernels are
            decorated), or lacks the hooks.
    """
    from gdn_lab.device import interpreting

    if not interpreting():
        raise RuntimeError("out_of_bounds: needs Triton's interpreter (TRITON_INTERPRET=1)")
    import numpy as np
    import torch
    from triton.runtime import interpreter

    executor, builder = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "InterpreterBuilder", None)
    if executor is None or builder is None or not hasattr(builder, "create_masked_load"):
        raise RuntimeError("out_of_bounds: this Triton's interpreter lacks the hooks it wraps")
    found: list[Access] = []
    launch: dict[str, Any] = {"kernel": "", "tensors": []}
    call, load, store = executor.__call__, builder.create_masked_load, builder.create_masked_store

    def check(ptrs: Any, mask: Any, kind: str) -> None:
        addresses = ptrs.data[mask.data.astype(bool)]
        if addresses.size == 0:
            return
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        inside = np.zeros(addresses.shape, dtype=bool)
        for _, (lo, hi) in launch["tensors"]:
            inside |= (addresses >= lo) & (addresses + size <= hi)
        if inside.all():
            return
        first = int(addresses[~inside][0])
        distance = [(min(abs(first - lo), abs(first - hi)), name) for name, (lo, hi) in launch["tensors"]]
        found.append(Access(launch["kernel"], kind, int((~inside).sum()), first, min(distance, default=(0, ""))[1]))

    def launched(self: Any, *args: Any, **kwargs: Any) -> Any:
        named = [*zip(self.arg_names, args, strict=False), *kwargs.items()]
        launch["kernel"] = getattr(self.fn, "__name__", repr(self.fn))
        launch["tensors"] = [
            (f"{name}{list(t.shape)} {str(t.dtype).removeprefix('torch.')}", _extent(t))
            for name, t in named
            if isinstance(t, torch.Tensor) and t.numel()
        ]
        return call(self, *args, **kwargs)

    def loaded(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *rest)

    def stored(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *rest)

    executor.__call__, builder.create_masked_load, builder.create_masked_store = launched, loaded, stored
    try:
        yield found
    finally:
        executor.__call__, builder.create_masked_load, builder.create_masked_store = call, load, store
