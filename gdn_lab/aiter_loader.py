"""AITER's Triton kernels on any machine: probe, load, and the shims that scope them.

The PyPI wheel `amd-aiter` ships AITER's Triton kernels (`aiter/ops/triton/`) as plain Python.
`import aiter` needs ROCm (its package init builds the C++ ops), but the Triton submodules do not,
so the lab reaches them by one of three routes, chosen by `probe()` and recorded in every
fingerprint (`aiter_route`):

- "official": on ROCm, `import aiter` as AITER documents it (a current aiter built from source);
- "AITER_TRITON_ONLY": off ROCm, when the installed aiter's init honours `AITER_TRITON_ONLY=1`
  (it then skips the C++ ops), `import aiter` with that variable set while aiter modules import;
- "init-bypass": off ROCm otherwise (amd-aiter 0.1.7 has no AITER_TRITON_ONLY): an empty package
  module named `aiter`, whose `__path__` is the installed folder, stands in for the init while the
  submodules import. `unload()` removes it and every module the loads added.

Off ROCm, AITER's code asks two questions a non-AMD machine answers wrongly and passes launch
options only AMD's backend knows; `shims()` handles all three for AITER alone, for the duration of
a `with` block, restoring everything on every exit path (the blocks nest):

- the arch: `aiter.ops.triton.utils._triton.arch_info.get_arch()` reads Triton's active target,
  which is an int (90) on an H200 and does not exist under the CPU interpreter; AITER compares it
  with gfx names at import. The shim makes it answer the *emulated* arch (gfx950 or gfx942, a
  parameter recorded in every result row). Under the interpreter Triton has no active driver at
  all, so a stub driver whose target is `GPUTarget("hip", arch, 64)` is active inside the block.
- the CU count: `aiter.ops.triton.utils.device_info.get_num_sms()` asks torch.cuda (no answer on
  the CPU); AITER's unified_attention sizes its split from it. The shim answers `num_cus`: by
  default the GPU's own count (132 on an H200) and, on the CPU, the emulated device's (256 for an
  MI350X, 80 for an MI308X).
- AMD-only launch options: AITER launches kernels with `waves_per_eu`, `matrix_instr_nonkdim`,
  `kpack`, which the CUDA backend rejects; the shim drops them from the launches of AITER's own
  kernel objects (an instance attribute on each, removed on exit), never from other Triton code.

Nothing here imports aiter or triton at module load.

Example:
    >>> probe().route in (None, "official", "AITER_TRITON_ONLY", "init-bypass")
    True
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from gdn_lab import checks

ROUTE_OFFICIAL = "official"
ROUTE_TRITON_ONLY = "AITER_TRITON_ONLY"
ROUTE_BYPASS = "init-bypass"
ROUTES = (ROUTE_OFFICIAL, ROUTE_TRITON_ONLY, ROUTE_BYPASS)

# The wheel the backends, rules and shims were written against (PyPI, 2025-11).
WRITTEN_AGAINST = "0.1.7.post2.dev18"
INSTALL_HINT = "pip install 'gdn_lab[aiter-triton]' (or: pip install --no-deps amd-aiter==0.1.7.post2.dev18)"

# Launch options only Triton's HIP backend knows; the CUDA backend raises on them.
AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

# The kernel modules the lab calls, by short name: where amd-aiter 0.1.7 has them, then where
# later aiter versions moved them (aiter/ops/triton/attention/).
KERNEL_MODULES = {
    "pa_decode": ("aiter.ops.triton.pa_decode", "aiter.ops.triton.attention.pa_decode"),
    "unified_attention": ("aiter.ops.triton.unified_attention", "aiter.ops.triton.attention.unified_attention"),
    "mha": ("aiter.ops.triton.mha", "aiter.ops.triton.attention.mha"),
}

_ARCH_INFO = "aiter.ops.triton.utils._triton.arch_info"
_DEVICE_INFO = "aiter.ops.triton.utils.device_info"
_BYPASS_MARK = "__gdn_lab_init_bypass__"


@dataclass(frozen=True)
class EmulatedDevice:
    """An AMD device whose AITER dispatch the lab reproduces off ROCm.

    Attributes:
        arch: the gfx name AITER is told.
        name: the device whose CU count is used.
        num_cus: its compute units (public specs).
    """

    arch: str
    name: str
    num_cus: int


# gfx942 is emulated as the MI308X (80 CUs), the lab's gfx942 target; AITER's own config files
# for gfx942 are named MI300X (304 CUs) and are the ones it reads either way.
EMULATED_DEVICES = {
    "gfx950": EmulatedDevice("gfx950", "MI350X", 256),
    "gfx942": EmulatedDevice("gfx942", "MI308X", 80),
}
DEFAULT_ARCH = "gfx950"


# --- the cheap probe ------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """What `load()` would do here, found without importing aiter.

    Attributes:
        installed: an `aiter` package is importable.
        version: its distribution version (amd-aiter or aiter), if installed.
        location: the package folder.
        route: the route `load()` takes here, or None when aiter is missing.
        reason: one line for tables and `gdn-lab env`.
    """

    installed: bool
    version: str | None
    location: str | None
    route: str | None
    reason: str


def _distribution_version() -> str | None:
    for dist in ("amd-aiter", "aiter"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _package_location() -> tuple[str | None, str | None]:
    """(package folder, __init__.py path) of the installed aiter, without executing its init."""
    mod = sys.modules.get("aiter")
    if mod is not None and getattr(mod, "__path__", None):
        return list(mod.__path__)[0], getattr(mod, "__file__", None)
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    return list(spec.submodule_search_locations)[0], spec.origin


def supports_triton_only(init_file: str | None) -> bool:
    """Whether an aiter package init honours AITER_TRITON_ONLY (it names the variable)."""
    if not init_file or not os.path.isfile(init_file):
        return False
    with open(init_file, encoding="utf-8", errors="replace") as f:
        return "AITER_TRITON_ONLY" in f.read()


def on_rocm() -> bool:
    return bool(torch.version.hip)


def probe() -> Probe:
    """Find aiter and the route `load()` would take. Cheap, never raises, imports nothing."""
    try:
        location, init_file = _package_location()
        version = _distribution_version()
        if location is None:
            return Probe(False, version, None, None, f"aiter is not installed ({INSTALL_HINT})")
        if on_rocm():
            route = ROUTE_OFFICIAL
            why = "ROCm: import aiter as documented"
        elif supports_triton_only(init_file):
            route = ROUTE_TRITON_ONLY
            why = "off ROCm; its init honours AITER_TRITON_ONLY=1"
        else:
            route = ROUTE_BYPASS
            why = "off ROCm; its init has no AITER_TRITON_ONLY, so the Triton submodules load without it"
        return Probe(True, version, location, route, f"aiter {version} at {location} via {route} ({why})")
    except Exception as exc:  # a probe reports, it does not raise
        return Probe(False, None, None, None, f"aiter probe failed: {type(exc).__name__}: {exc}")


# --- emulation settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Emulation:
    """Which AMD device AITER's dispatch is told about off ROCm.

    Attributes:
        arch: "gfx950" or "gfx942".
        num_cus: the CU count AITER's split heuristics see; None: the GPU's own count, or the
            emulated device's on the CPU.
    """

    arch: str = DEFAULT_ARCH
    num_cus: int | None = None

    def __post_init__(self) -> None:
        checks.check_choice("arch", self.arch, tuple(EMULATED_DEVICES))
        if self.num_cus is not None:
            checks.check_positive("num_cus", self.num_cus)


_EMULATION: list[Emulation] = [Emulation()]


@contextlib.contextmanager
def emulate(arch: str = DEFAULT_ARCH, num_cus: int | None = None) -> Iterator[Emulation]:
    """Within the block, AITER backends run as on `arch` with `num_cus` CUs (off ROCm).

    Args:
        arch: the emulated arch, "gfx950" (MI350X) or "gfx942" (MI308X).
        num_cus: the CU count AITER's heuristics see; None for the default (see `Emulation`).

    Example:
        >>> with emulate("gfx942"):
        ...     current_emulation().arch
        'gfx942'
    """
    setting = Emulation(arch, num_cus)
    _EMULATION.append(setting)
    try:
        yield setting
    finally:
        _EMULATION.pop()


def current_emulation() -> Emulation:
    return _EMULATION[-1]


def effective_arch(device: torch.device | str | None = None) -> str:
    """The arch AITER dispatches for: the device's own on ROCm, else the emulated one."""
    if on_rocm():
        from gdn_lab.device import detect

        return detect(device).arch
    return current_emulation().arch


def effective_num_cus(device: torch.device | str | None = None) -> int:
    """The CU/SM count AITER's heuristics see: the override, else the GPU's own, else the emulated device's."""
    setting = current_emulation()
    if setting.num_cus is not None:
        return setting.num_cus
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        from gdn_lab.device import detect

        return detect(dev).num_sms
    return EMULATED_DEVICES[effective_arch(device)].num_cus


def row_arch(backend: str, device: torch.device | str | None = None) -> str | None:
    """The arch a result row of `backend` should record: the emulated one for AITER's Triton
    backends off ROCm (what AITER dispatched for), else None (the device's own)."""
    if backend.startswith("aiter-triton") and not on_rocm():
        return current_emulation().arch
    return None


def fingerprint_fields(device: torch.device | str | None = None) -> dict[str, object]:
    """The aiter keys of the environment fingerprint (the version is `package_versions()["aiter"]`):
    the route, why it differs from the probe's if it does, the arch AITER dispatches for and the CU
    count it sees (None when aiter is not installed)."""
    p = probe()
    loaded = _STATE.loaded
    try:
        arch, cus = effective_arch(device), effective_num_cus(device)
    except Exception:  # the fingerprint must never fail
        arch, cus = None, None
    return {
        "aiter_route": loaded.route if loaded else p.route,
        "aiter_route_note": loaded.note if loaded else "",
        "aiter_arch": arch if p.installed else None,
        "aiter_num_cus": cus if p.installed else None,
    }


# --- loading --------------------------------------------------------------------------------


class AiterUnavailable(RuntimeError):
    """aiter is missing, or a kernel module cannot be imported here; the message says why."""


@dataclass
class Loaded:
    """The aiter modules the lab imported, and how.

    Attributes:
        route: the route taken.
        version: aiter's version.
        arch: the arch AITER was told at import (module constants depend on it).
        interpret: whether Triton's interpreter was on (kernels are decorated at import).
        added: names this loader put into sys.modules, removed by `unload()`.
        modules: kernel short name -> module.
        note: why the route differs from the probe's, if it does.
    """

    route: str
    version: str | None
    arch: str
    interpret: bool
    added: list[str] = field(default_factory=list)
    modules: dict[str, ModuleType] = field(default_factory=dict)
    note: str = ""


@dataclass
class _LoaderState:
    loaded: Loaded | None = None
    failures: dict[tuple[str, str, bool], str] = field(default_factory=dict)


_STATE = _LoaderState()


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _install_bypass_package(location: str, init_file: str | None) -> None:
    """Put an empty package named `aiter` whose submodules resolve in the installed folder."""
    spec = importlib.machinery.ModuleSpec("aiter", None, origin=init_file, is_package=True)
    spec.submodule_search_locations = [location]
    module = importlib.util.module_from_spec(spec)
    module.__file__ = init_file
    setattr(module, _BYPASS_MARK, True)
    sys.modules["aiter"] = module


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _new_modules(before: set[str]) -> list[str]:
    return [name for name in sys.modules if name not in before and (name == "aiter" or name.startswith("aiter."))]


def _forget(names: list[str]) -> None:
    for name in names:
        sys.modules.pop(name, None)


def _start(p: Probe, arch: str) -> Loaded:
    """Import the `aiter` package itself by the probe's route (the bypass installs a stand-in)."""
    loaded = Loaded(p.route or ROUTE_BYPASS, p.version, arch, _interpreting())
    before = set(sys.modules)
    if "aiter" in sys.modules:
        # Someone imported aiter before the lab: use it as it is.
        if not getattr(sys.modules["aiter"], _BYPASS_MARK, False):
            loaded.route = ROUTE_OFFICIAL
            loaded.note = "aiter was already imported by the process"
        return loaded
    location, init_file = _package_location()
    assert location is not None
    if p.route == ROUTE_OFFICIAL:
        importlib.import_module("aiter")
    elif p.route == ROUTE_TRITON_ONLY:
        try:
            with _env("AITER_TRITON_ONLY", "1"), shims(arch, need_package=False):
                importlib.import_module("aiter")
        except Exception as exc:
            _forget(_new_modules(before))
            loaded.route = ROUTE_BYPASS
            loaded.note = f"AITER_TRITON_ONLY import failed ({type(exc).__name__}: {exc}); used the init bypass"
            _install_bypass_package(location, init_file)
    else:
        _install_bypass_package(location, init_file)
    loaded.added.extend(_new_modules(before))
    return loaded


def load(kernel: str, arch: str | None = None) -> ModuleType:
    """Import one of AITER's Triton kernel modules, by the probe's route, inside the shims.

    A module is imported once per (arch, interpreter mode): AITER fixes arch-dependent constants
    (fp8 dtypes, config files) at import, so asking for another arch, or switching
    TRITON_INTERPRET, unloads everything and imports again.

    Args:
        kernel: a key of KERNEL_MODULES ("pa_decode", "unified_attention", "mha").
        arch: the emulated arch (default: the current emulation); ignored on ROCm.

    Returns:
        The kernel module.

    Raises:
        ValueError: an unknown kernel or arch.
        AiterUnavailable: aiter is missing or the module does not import here (the message says why).
    """
    checks.check_choice("kernel", kernel, tuple(KERNEL_MODULES))
    arch = effective_arch() if arch is None else arch
    if not on_rocm():
        checks.check_choice("arch", arch, tuple(EMULATED_DEVICES))
    key = (kernel, arch, _interpreting())
    if key in _STATE.failures:
        raise AiterUnavailable(_STATE.failures[key])
    loaded = _STATE.loaded
    if loaded is not None and (loaded.arch != arch or loaded.interpret != _interpreting()):
        unload()
        loaded = None
    if loaded is not None and kernel in loaded.modules:
        return loaded.modules[kernel]
    p = probe()
    if not p.installed:
        raise AiterUnavailable(p.reason)
    if loaded is None:
        try:
            loaded = _start(p, arch)
        except Exception as exc:
            reason = f"aiter {p.version} via {p.route}: import aiter failed: {type(exc).__name__}: {exc}"
            _STATE.failures[key] = reason
            raise AiterUnavailable(reason) from exc
        _STATE.loaded = loaded
    before = set(sys.modules)
    try:
        # No CU answer while importing: a module that imports get_num_sms by name would keep it.
        triton_only = _env("AITER_TRITON_ONLY", "1") if loaded.route == ROUTE_TRITON_ONLY else contextlib.nullcontext()
        with triton_only, shims(arch):
            module = _import_first(KERNEL_MODULES[kernel])
    except Exception as exc:
        _forget(_new_modules(before))
        reason = (
            f"aiter {p.version} via {loaded.route}: {' / '.join(KERNEL_MODULES[kernel])} does not import here "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        )
        _STATE.failures[key] = reason
        raise AiterUnavailable(reason) from exc
    loaded.added.extend(_new_modules(before))
    loaded.modules[kernel] = module
    return module


def _import_first(names: tuple[str, ...]) -> ModuleType:
    """Import the first of `names` that exists (a missing one is skipped, any other error raised)."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
    return importlib.import_module(names[-1])


def loaded() -> Loaded | None:
    """What is loaded now (None before the first load and after `unload()`)."""
    return _STATE.loaded


def unload() -> None:
    """Remove every module the loads added to sys.modules and forget remembered failures."""
    if _STATE.loaded is not None:
        _forget(_STATE.loaded.added)
    _STATE.loaded = None
    _STATE.failures.clear()


def kernel_available(kernel: str, device: torch.device | str | None = None) -> tuple[bool, str]:
    """(ok, reason) for running one AITER kernel module here; imports it once (remembered)."""
    from gdn_lab.ops.triton_support import triton_available

    p = probe()
    if not p.installed:
        return False, p.reason
    ok, why = triton_available()
    if not ok:
        return False, why
    try:
        load(kernel, effective_arch(device))
    except AiterUnavailable as exc:
        return False, str(exc)
    except ValueError as exc:
        return False, str(exc)
    route = _STATE.loaded.route if _STATE.loaded else p.route
    other = (
        ""
        if (p.version or "").split("+")[0] == WRITTEN_AGAINST
        else f"; the lab's rules were read from {WRITTEN_AGAINST}"
    )
    return True, f"aiter {p.version} ({route}){other}, {why}"


# --- shims ----------------------------------------------------------------------------------


def _stub_driver(arch: str) -> Any:
    """A Triton driver stand-in whose only answer is the emulated AMD target (interpreter only)."""
    from triton.backends.compiler import GPUTarget

    class _EmulatedTarget:
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("hip", arch, 64)

        def is_active(self) -> bool:
            return False

    return _EmulatedTarget()


def _aiter_modules() -> list[ModuleType]:
    """The loaded aiter submodules."""
    return [m for n, m in list(sys.modules.items()) if n.startswith("aiter.") and isinstance(m, ModuleType)]


def _launch_targets() -> list[Any]:
    """AITER's kernel objects in the loaded aiter modules (the innermost JIT/interpreted functions,
    which receive the launch options; autotuner and heuristics wrappers pass them down)."""
    from triton.runtime.jit import KernelInterface

    found: dict[int, Any] = {}
    for module in _aiter_modules():
        for obj in list(vars(module).values()):
            inner = obj
            while isinstance(getattr(inner, "fn", None), KernelInterface):
                inner = inner.fn
            python_fn = getattr(inner, "fn", None)
            if isinstance(inner, KernelInterface) and (getattr(python_fn, "__module__", None) or "").startswith(
                "aiter."
            ):
                found[id(inner)] = inner
    return list(found.values())


def _dropping_amd_options(run: Any) -> Any:
    def launch(*args: Any, **kwargs: Any) -> Any:
        for key in AMD_ONLY_LAUNCH_OPTIONS:
            kwargs.pop(key, None)
        return run(*args, **kwargs)

    return launch


def _genuine(fn: Any) -> Any:
    """AITER's own function behind a shim's answer (itself if it is not an answer)."""
    return getattr(fn, "__gdn_lab_genuine__", fn)


def _answering(genuine: Any, value: int) -> Any:
    """A stand-in for AITER's `get_num_sms` that answers `value` (and remembers what it replaces,
    so nested blocks and modules that imported the function by name are found again)."""

    def get_num_sms() -> int:
        return value

    get_num_sms.__gdn_lab_genuine__ = genuine  # type: ignore[attr-defined]
    return get_num_sms


@contextlib.contextmanager
def _patched(obj: Any, attr: str, value: Any, instance: bool = False) -> Iterator[None]:
    """Set obj.attr for the block; restore the old value (or remove an instance attribute) after."""
    had = attr in vars(obj) if instance else hasattr(obj, attr)
    old = vars(obj).get(attr) if instance else getattr(obj, attr, None)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, attr, old)
        else:
            delattr(obj, attr)


@contextlib.contextmanager
def _active_driver(driver_obj: Any) -> Iterator[None]:
    from triton.runtime import driver

    previous = getattr(driver, "_active", None)
    driver.set_active(driver_obj)
    try:
        yield
    finally:
        driver.set_active(previous)


@contextlib.contextmanager
def shims(arch: str, num_cus: int | None = None, *, need_package: bool = True) -> Iterator[None]:
    """Answer AITER's arch and CU-count questions and drop AMD-only launch options, for the block.

    A no-op on ROCm (AITER asks the real device there). Off ROCm it patches, for the block only:
    `arch_info.get_arch` (-> `arch`), `device_info.get_num_sms` and its imported copies in loaded
    aiter modules (-> `num_cus`), Triton's active driver under the interpreter (-> a stub whose
    target is `hip`/`arch`), and the `run` of each loaded AITER kernel object (drops
    AMD_ONLY_LAUNCH_OPTIONS). Everything is restored on exit, exceptions included; blocks nest.

    Args:
        arch: the gfx arch AITER is told.
        num_cus: the CU count AITER's heuristics see (None: leave get_num_sms alone, as while
            importing, where a module importing it by name would keep the answer).
        need_package: import arch_info through the loaded `aiter` package (False while the
            package itself is being imported).
    """
    if on_rocm():
        yield
        return
    with contextlib.ExitStack() as stack:
        if _interpreting():
            stack.enter_context(_active_driver(_stub_driver(arch)))
        if need_package or "aiter" in sys.modules:
            arch_info = importlib.import_module(_ARCH_INFO)
            device_info = importlib.import_module(_DEVICE_INFO)
            stack.enter_context(_patched(arch_info, "get_arch", lambda: arch))
            genuine = _genuine(vars(device_info).get("get_num_sms"))
            if num_cus is not None and genuine is not None:
                answer = _answering(genuine, num_cus)
                for module in _aiter_modules():
                    if _genuine(vars(module).get("get_num_sms")) is genuine:
                        stack.enter_context(_patched(module, "get_num_sms", answer))
            for kernel in _launch_targets():
                stack.enter_context(_patched(kernel, "run", _dropping_amd_options(kernel.run), instance=True))
        yield
