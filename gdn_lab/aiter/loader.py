"""Import AITER's kernel modules by the probe's route, once per (arch, interpreter mode), reversibly.

The portable Triton modules load anywhere Triton runs; the AMD-only ones (ROCM_ONLY: HIP, CK,
FlyDSL and Gluon kernels) only on ROCm, where the route is AITER's official `import aiter`.

`load(kernel, arch)` imports one of KERNEL_MODULES inside the shims (`gdn_lab.aiter.shims`), by
the route `gdn_lab.aiter.probe` found: the official `import aiter` on ROCm, `AITER_TRITON_ONLY=1`,
or the init bypass (an empty package module named `aiter`, whose `__path__` is the installed
folder, stands in for the init while the submodules import). AITER fixes arch-dependent constants
at import, so another arch or another TRITON_INTERPRET setting unloads everything and imports
again. `unload()` removes every module the loads added to sys.modules. A kernel that does not
import is an `AiterUnavailable` with the reason, remembered until `unload()`.

The real library is always imported by its absolute name (`importlib.import_module("aiter")`), the
top-level package; this package is `gdn_lab.aiter` and never stands in for it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType

import torch

from gdn_lab import checks
from gdn_lab.aiter.emulation import EMULATED_DEVICES, effective_arch
from gdn_lab.aiter.probe import (
    ROUTE_BYPASS,
    ROUTE_OFFICIAL,
    ROUTE_TRITON_ONLY,
    WRITTEN_AGAINST,
    Probe,
    on_rocm,
    package_location,
    probe,
)
from gdn_lab.aiter.shims import shims
from gdn_lab.device import interpreting, triton_mode
from gdn_lab.interpreter import skip_repeated_work

# The kernel modules the lab calls, by short name: where amd-aiter 0.1.7 has them, then where
# later aiter versions moved them (aiter/ops/triton/attention/, aiter/ops/triton/gemm/basic/).
KERNEL_MODULES = {
    # AITER's portable Triton kernels: any GPU, and the CPU interpreter, through the shims
    "pa_decode": ("aiter.ops.triton.pa_decode", "aiter.ops.triton.attention.pa_decode"),
    "unified_attention": ("aiter.ops.triton.unified_attention", "aiter.ops.triton.attention.unified_attention"),
    "mha": ("aiter.ops.triton.mha", "aiter.ops.triton.attention.mha"),
    "gemm_a16w16": ("aiter.ops.triton.gemm_a16w16", "aiter.ops.triton.gemm.basic.gemm_a16w16"),
    "moe_op": ("aiter.ops.triton.moe_op", "aiter.ops.triton.moe.moe_op"),
    "moe_config_utils": ("aiter.ops.triton.utils.moe_config_utils",),
    "shuffle": ("aiter.ops.shuffle",),  # shuffle_weight: torch ops, the CK MoE's weight layout
    # newer than amd-aiter 0.1.7 (aiter built from source)
    "gdn_decode_triton": ("aiter.ops.triton._triton_kernels.gated_delta_rule.decode.fused_sigmoid_gating_recurrent",),
    # AITER's ROCm-only kernels (HIP, CK, FlyDSL, Gluon): imported on ROCm only, by the official route
    "paged_attention_ragged": ("aiter.ops.attention",),
    "mha_batch_prefill": ("aiter.ops.mha",),
    "flydsl_gdr_decode": ("aiter.ops.flydsl.linear_attention_kernels",),
    "hip_gdn_decode": ("aiter.ops.hip.gated_delta_net.hip_gdn_decode",),
    "gdn_prefill_vk": ("aiter.ops.triton.gated_delta_net.gated_delta_rule",),
    "fused_gdn_prefill": ("aiter.ops.triton.gated_delta_net.fused_gdn_prefill_qkvz",),
    "ck_moe": ("aiter.fused_moe",),
}
# The kernels that run on AMD GPUs only: off ROCm `load` refuses them without importing anything.
ROCM_ONLY = frozenset(
    {"paged_attention_ragged", "mha_batch_prefill", "flydsl_gdr_decode", "hip_gdn_decode", "gdn_prefill_vk",
     "fused_gdn_prefill", "ck_moe"}
)  # fmt: skip

_BYPASS_MARK = "__gdn_lab_init_bypass__"


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
    loaded = Loaded(p.route or ROUTE_BYPASS, p.version, arch, interpreting())
    before = set(sys.modules)
    if "aiter" in sys.modules:
        # Someone imported aiter before the lab: use it as it is.
        if not getattr(sys.modules["aiter"], _BYPASS_MARK, False):
            loaded.route = ROUTE_OFFICIAL
            loaded.note = "aiter was already imported by the process"
        return loaded
    location, init_file = package_location()
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
        kernel: a key of KERNEL_MODULES ("pa_decode", "unified_attention", "mha", "gemm_a16w16", ...;
            those in ROCM_ONLY only on ROCm).
        arch: the emulated arch (default: the current emulation); ignored on ROCm.

    Returns:
        The kernel module.

    Raises:
        ValueError: an unknown kernel or arch.
        AiterUnavailable: aiter is missing, the kernel is AMD-only and this is not ROCm, or the
            module does not import here (the message says why).
    """
    checks.check_choice("kernel", kernel, tuple(KERNEL_MODULES))
    if kernel in ROCM_ONLY and not on_rocm():
        raise AiterUnavailable(
            f"{kernel} is AMD-only (HIP/CK/FlyDSL/Gluon): it runs on ROCm, and this torch has no ROCm "
            "(torch.version.hip is None)"
        )
    arch = effective_arch() if arch is None else arch
    if not on_rocm():
        checks.check_choice("arch", arch, tuple(EMULATED_DEVICES))
    interpret = interpreting()
    skip_repeated_work()  # under the interpreter: AITER's kernels call device functions as ours do
    key = (kernel, arch, interpret)
    if key in _STATE.failures:
        raise AiterUnavailable(_STATE.failures[key])
    loaded = _STATE.loaded
    if loaded is not None and (loaded.arch != arch or loaded.interpret != interpret):
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


def current_route() -> tuple[str | None, str]:
    """(route, note): the route the loads took, or the one `load()` would take (None: no aiter);
    the note says why the route taken differs from the probe's ("" when it does not)."""
    if _STATE.loaded is not None:
        return _STATE.loaded.route, _STATE.loaded.note
    return probe().route, ""


def unload() -> None:
    """Remove every module the loads added to sys.modules and forget remembered failures."""
    if _STATE.loaded is not None:
        _forget(_STATE.loaded.added)
    _STATE.loaded = None
    _STATE.failures.clear()


def kernel_available(kernel: str, device: torch.device | str | None = None) -> tuple[bool, str]:
    """(ok, reason) for running one AITER kernel module here; imports it once (remembered).

    Args:
        kernel: a key of KERNEL_MODULES.
        device: where it would run (default: the current accelerator, else the CPU): Triton must
            run there (`gdn_lab.device.triton_mode`).
    """
    p = probe()
    if not p.installed:
        return False, p.reason
    if kernel in ROCM_ONLY and not on_rocm():
        try:
            load(kernel)
        except AiterUnavailable as exc:
            return False, str(exc)
    mode, why = triton_mode(device)
    if mode is None:
        return False, why
    try:
        load(kernel, effective_arch(device))
    except (AiterUnavailable, ValueError) as exc:
        return False, str(exc)
    route = _STATE.loaded.route if _STATE.loaded else p.route
    other = (
        ""
        if (p.version or "").split("+")[0] == WRITTEN_AGAINST
        else f"; the lab's rules were read from {WRITTEN_AGAINST}"
    )
    return True, f"aiter {p.version} ({route}){other}, {why}"
