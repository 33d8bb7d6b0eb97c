"""One op, many backends: a registry per op, `route()` and `explain()`.

A backend is a named object with three callables and metadata that says what it is (`library`,
`emulated_arch`, `variant_control`, `rule`), so tables take their arch and their "not yet run on
AMD hardware" mark from the backend, never from its name:

- `available()` -> (ok, reason): platform and import probe; cheap and never raises.
- `covered(args)` -> (ok, reason): the backend's shape/dtype/arch contract for one call.
- `run(**args)`: the computation.

`route(op, args, backend="auto")` returns a `Decision`: the backend that runs and, for every other
backend, why it did not. `auto` walks the backends in ascending `priority` (the documented order:
the AMD libraries on ROCm, our Triton kernels, fla, the torch reference) and skips those marked
`auto=False` (the batch-variant controls and the alternative references, which run only when named).
A named backend is never replaced: if it cannot cover the call, `route` raises `NotCovered`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, Protocol

Check = tuple[bool, str]


@dataclass(frozen=True)
class Library:
    """Where a backend's kernels come from.

    Attributes:
        name: "torch", "gdn_lab-triton", "fla", "aiter-triton", "aiter", "flydsl", "sglang-aiter".
        amd: AMD's own kernels: results obtained off ROCm are "not yet run on AMD hardware".
    """

    name: str
    amd: bool = False


LIBRARY_TORCH = Library("torch")
LIBRARY_TRITON = Library("gdn_lab-triton")  # our own Triton kernels
LIBRARY_FLA = Library("fla")
LIBRARY_AITER_TRITON = Library("aiter-triton", amd=True)  # AITER's portable Triton kernels
LIBRARY_AITER = Library("aiter", amd=True)  # AITER's HIP / CK / ASM kernels
LIBRARY_FLYDSL = Library("flydsl", amd=True)
LIBRARY_SGLANG_AITER = Library("sglang-aiter", amd=True)  # SGLang's routing among AITER's kernels
HARDWARE_NOTE = " (not yet run on AMD hardware)"

# Auto-order tiers (lower runs first). A backend picks one; ties keep registration order.
PRIORITY_AMD = 10
PRIORITY_TRITON = 20
PRIORITY_FLA = 30
PRIORITY_REFERENCE = 90


def always_available() -> Check:
    return True, "pure PyTorch"


def covers_everything(args: Mapping[str, Any]) -> Check:
    return True, "any input the op accepts"


@dataclass(frozen=True)
class Backend:
    """A named implementation of one op.

    Attributes:
        op: the op it implements ("decode_attention", ...).
        name: the backend name used by `backend=` ("torch", "triton", ...).
        run: called with the validated arguments as keywords; returns what the op returns.
        library: where its kernels come from (a `Library`).
        available: () -> (ok, reason); cheap, never raises.
        covered: (args) -> (ok, reason) for the validated arguments of one call.
        priority: position in the auto order (lower first).
        auto: whether `backend="auto"` may pick it.
        variant_control: a deliberately batch-variant implementation, the control every invariance
            run carries to prove it can see batch variance (never picked by auto).
        emulated_arch: () -> the arch the library dispatches for when it runs emulated (AITER's
            Triton kernels off ROCm are told gfx950 or gfx942), or None when it runs natively;
            None for backends that never emulate.
        rule: the dispatch rule its kernel follows (`gdn_lab.rules.base.DispatchRule`), or None.
        reproducible: a second process given the same inputs on the same machine computes the same
            bits; False for autotuned kernels, whose config can differ from process to process
            (a regression gate records their hashes but never compares them).
        description: one line for `explain()` and `gdn-lab env`.
    """

    op: str
    name: str
    run: Callable[..., Any]
    library: Library
    available: Callable[[], Check] = always_available
    covered: Callable[[Mapping[str, Any]], Check] = covers_everything
    priority: int = PRIORITY_REFERENCE
    auto: bool = True
    variant_control: bool = False
    emulated_arch: Callable[[], str | None] | None = None
    rule: Any = None
    reproducible: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        if self.variant_control and self.auto:
            raise ValueError(f"{self.op}/{self.name}: a variant control must have auto=False")

    @cached_property
    def runner(self) -> Callable[..., Any]:
        """`run` itself, or the function a `lazy` run stands for once imported: the hot path calls
        it without the lazy wrapper's second spreading of the keywords."""
        return self.run.resolve() if isinstance(self.run, Lazy) else self.run

    def row_arch(self, device_arch: str) -> str:
        """The arch a result row of this backend stands for: the emulated one, else the device's."""
        emulated = self.emulated_arch() if self.emulated_arch is not None else None
        return emulated or device_arch

    def hardware_note(self, platforms: Iterable[str]) -> str:
        """HARDWARE_NOTE for AMD's kernels unless every run was on ROCm, else ""."""
        return HARDWARE_NOTE if self.library.amd and set(platforms) != {"rocm"} else ""

    def check(self, args: Mapping[str, Any] | None) -> tuple[Check, Check | None]:
        """(availability, coverage); coverage is None when unavailable or when no call is given."""
        try:
            avail = self.available()
        except Exception as exc:  # a probe that raises is a bug in the probe, reported, not fatal
            avail = (False, f"availability probe failed: {type(exc).__name__}: {exc}")
        if not avail[0] or args is None:
            return avail, None
        try:
            cov = self.covered(args)
        except Exception as exc:
            cov = (False, f"coverage check failed: {type(exc).__name__}: {exc}")
        return avail, cov


class Lazy:
    """A callable that imports `module` on first use: kernel modules (Triton, AITER) stay unimported
    until a call runs, so importing gdn_lab has no side effects and TRITON_INTERPRET can be set late."""

    __slots__ = ("module", "attr", "_resolved")

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr, self._resolved = module, attr, None

    def resolve(self) -> Callable[..., Any]:
        """The function, imported on the first call."""
        if self._resolved is None:
            import importlib

            self._resolved = getattr(importlib.import_module(self.module), self.attr)
        return self._resolved

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy({self.module}.{self.attr})"


def lazy(module: str, attr: str) -> Lazy:
    """`module.attr`, imported on its first call (`Lazy`)."""
    return Lazy(module, attr)


def controls(op: str) -> list[Backend]:
    """The op's batch-variant control backends."""
    return [b for b in backends(op) if b.variant_control]


class NotCovered(RuntimeError):
    """A named backend cannot run this call (unavailable here, or outside its contract)."""

    def __init__(self, op: str, backend: str, reason: str) -> None:
        super().__init__(f"{op}: backend {backend!r} cannot run this call: {reason}")
        self.op, self.backend, self.reason = op, backend, reason


class _Derived(NamedTuple):
    """What routing reads from one op's registry, recomputed whenever its backends change."""

    ids: tuple[int, ...]  # the ids of its backends (the key: the lists hold them, so no id is reused)
    order: list[Backend]  # every backend in auto order, the explicit-only ones last
    auto: list[Backend]  # the backends `auto` walks (order's head)
    named: dict[str, str]  # rejection reasons of the backends that never run unnamed


_REGISTRY: dict[str, dict[str, Backend]] = {}
# Per op, the registry's derived lists (however the registry was changed: `_derived` checks the ids).
_ORDER: dict[str, _Derived] = {}


def register(backend: Backend) -> Backend:
    """Add a backend to its op's registry (a later registration of the same name replaces it).

    Op folders register their backends when `gdn_lab.ops` imports them; this module imports no op.
    """
    _REGISTRY.setdefault(backend.op, {})[backend.name] = backend
    return backend


def unregister(op: str) -> None:
    """Remove every backend of `op` (for tests that register a toy op)."""
    _REGISTRY.pop(op, None)


def ops() -> list[str]:
    """Every op with a registry."""
    return list(_REGISTRY)


def backends(op: str) -> list[Backend]:
    """The op's backends in auto order (explicit-only backends last)."""
    return list(_derived(op).order)


def _derived(op: str) -> _Derived:
    """The op's derived lists (cached; do not mutate them: copy first)."""
    reg = _REGISTRY.get(op)
    if reg is None:
        raise ValueError(f"op: {op!r} is not known; accepted: {', '.join(_REGISTRY)}")
    ids = tuple(map(id, reg.values()))
    hit = _ORDER.get(op)
    if hit is not None and hit.ids == ids:
        return hit
    order = sorted(reg.values(), key=lambda b: (not b.auto, b.priority))
    auto = [b for b in order if b.auto]
    named = {b.name: "runs only when named (not in the auto order)" for b in order if not b.auto}
    _ORDER[op] = derived = _Derived(ids, order, auto, named)
    return derived


def backend_names(op: str) -> list[str]:
    return [b.name for b in backends(op)]


def get(op: str, name: str) -> Backend:
    found = _REGISTRY.get(op, {}).get(name)
    if found is not None:  # the hot path of every named call: no sorting
        return found
    names = backend_names(op)
    if name not in names:
        raise ValueError(f"backend: {name!r} is not a backend of {op}; accepted: auto, {', '.join(names)}")
    return _REGISTRY[op][name]


@dataclass(slots=True)  # one per routed call
class Decision:
    """The outcome of routing one call.

    Attributes:
        op: the op.
        requested: the `backend=` argument ("auto" or a name).
        backend: the backend that runs, or None when nothing covers the call.
        reason: why it was chosen, or why the requested one cannot run.
        rejected: every backend considered and not chosen, with its reason.
    """

    op: str
    requested: str
    backend: Backend | None
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.backend.name if self.backend else None

    @property
    def covered(self) -> bool:
        return self.backend is not None


def decide(op: str, args: Mapping[str, Any], backend: str = "auto") -> Decision:
    """Route without raising: a Decision whose backend is None says why nothing can run."""
    if backend != "auto":
        b = get(op, backend)
        avail, cov = b.check(args)
        if not avail[0]:
            return Decision(op, backend, None, f"not available: {avail[1]}")
        assert cov is not None
        if not cov[0]:
            return Decision(op, backend, None, f"not covered: {cov[1]}")
        return Decision(op, backend, b, cov[1])
    derived = _derived(op)  # once per call: it walks the registry to see whether it changed
    rejected = dict(derived.named)
    for b in derived.auto:
        avail, cov = b.check(args)
        if not avail[0]:
            rejected[b.name] = f"not available: {avail[1]}"
        elif cov is not None and not cov[0]:
            rejected[b.name] = f"not covered: {cov[1]}"
        else:
            reason = f"first covered backend in the auto order ({cov[1] if cov else avail[1]})"
            return Decision(op, "auto", b, reason, rejected)
    return Decision(op, "auto", None, "no backend covers this call", rejected)


def route(op: str, args: Mapping[str, Any], backend: str = "auto") -> Decision:
    """Pick the backend for one validated call.

    Args:
        op: the op name.
        args: the call's validated arguments (what `run` receives).
        backend: "auto" or a backend name.

    Returns:
        A Decision whose `backend` is set.

    Raises:
        ValueError: `backend` is not a backend of `op`.
        NotCovered: the named backend (or, for auto, every backend) cannot run the call.
    """
    d = decide(op, args, backend)
    if d.backend is None:
        detail = d.reason if backend != "auto" else "; ".join(f"{k}: {v}" for k, v in d.rejected.items())
        raise NotCovered(op, backend, detail)
    return d


class DispatchObserver(Protocol):
    """Sees every call `dispatch` runs: `before` with its inputs, `after` with its result. An
    observer may also have `running(op) -> context manager`: the backend then runs inside that
    context, exited however the run ends (the trace recorder steps its function mode aside there)."""

    def before(self, op: str, decision: Decision, args: Mapping[str, Any]) -> None: ...

    def after(self, op: str, decision: Decision, args: Mapping[str, Any], result: Any) -> None: ...


_OBSERVERS: list[DispatchObserver] = []


@contextlib.contextmanager
def observe(observer: DispatchObserver) -> Iterator[DispatchObserver]:
    """Within the block, `observer` sees every dispatched op call (blocks nest; removed on every exit)."""
    _OBSERVERS.append(observer)
    try:
        yield observer
    finally:
        _OBSERVERS.remove(observer)


def dispatch(op: str, args: Mapping[str, Any], backend: str = "auto") -> tuple[Any, Decision]:
    """Route and run: (output, decision). Observers (`observe`) see the inputs before the run,
    since in-place ops overwrite them, the run inside their `running` contexts, and the result after."""
    d = route(op, args, backend)
    assert d.backend is not None
    if not _OBSERVERS:
        return d.backend.runner(**args), d
    watching = list(_OBSERVERS)
    for o in watching:
        o.before(op, d, args)
    with contextlib.ExitStack() as stack:
        for o in watching:
            running = getattr(o, "running", None)
            if running is not None:
                stack.enter_context(running(op))
        result = d.backend.runner(**args)
    for o in watching:
        o.after(op, d, args, result)
    return result, d


def explain(op: str, args: Mapping[str, Any] | None = None, backend: str = "auto") -> list[dict[str, Any]]:
    """One row per backend: available, covered, the reason, and whether it would run.

    Args:
        op: the op name.
        args: validated arguments of a call, or None to report availability only.
        backend: the request to explain ("auto" or a name).
    """
    chosen = decide(op, args, backend).name if args is not None else None
    rows = []
    for b in backends(op):
        avail, cov = b.check(args)
        reason = avail[1] if not avail[0] or cov is None else cov[1]
        rows.append(
            {
                "op": op,
                "backend": b.name,
                "available": avail[0],
                "covered": None if cov is None else cov[0],
                "auto": b.auto,
                "variant_control": b.variant_control,
                "library": b.library.name,
                "amd_library": b.library.amd,
                "rule": getattr(b.rule, "name", None),
                "chosen": b.name == chosen,
                "reason": reason,
                "description": b.description,
            }
        )
    return rows
