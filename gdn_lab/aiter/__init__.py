"""AITER's Triton kernels on any machine: probe and route, arch/CU emulation, loader, shims, wheel.

One job per module:

- `probe`: find the installed aiter and the route `load()` takes here (cheap, never raises,
  imports nothing): `probe()`, `Probe`, ROUTES, INSTALL_HINT, WRITTEN_AGAINST, `on_rocm()`.
- `emulation`: which AMD device AITER is told about off ROCm: `emulate()`, `current_emulation()`,
  `emulating()`, `effective_arch()`, `effective_num_cus()`, `Emulation`, EMULATED_DEVICES.
- `loader`: import AITER's kernel modules by that route, reversibly: `load()`, `unload()`,
  `loaded()`, `current_route()`, `kernel_available()`, `AiterUnavailable`, `Loaded`; KERNEL_MODULES
  names every module the lab calls, ROCM_ONLY those that load on ROCm only.
- `shims`: the scoped arch/CU/launch-option shims: `shims()`.
- `wheel`: trim the amd-aiter wheel to its Python package (`python -m gdn_lab.aiter.wheel`); not
  imported here.

Callers write `from gdn_lab import aiter`, then `aiter.load("pa_decode")`, `aiter.emulate("gfx942")`,
`aiter.probe()`. The names `gdn_lab.aiter.probe` and `gdn_lab.aiter.shims` are those functions; the
modules of the same name are reached by a from-import (`from gdn_lab.aiter.probe import Probe`).

This package is `gdn_lab.aiter`; AITER itself is the top-level `aiter`, imported only by `load()`,
always by its absolute name. Importing this package imports neither aiter nor triton.

Example:
    >>> from gdn_lab import aiter
    >>> with aiter.emulate("gfx942"):
    ...     aiter.current_emulation().arch
    'gfx942'
"""

from gdn_lab.aiter.emulation import (
    DEFAULT_ARCH,
    EMULATED_DEVICES,
    EmulatedDevice,
    Emulation,
    current_emulation,
    effective_arch,
    effective_num_cus,
    emulate,
    emulating,
)
from gdn_lab.aiter.loader import (
    KERNEL_MODULES,
    ROCM_ONLY,
    AiterUnavailable,
    Loaded,
    current_route,
    kernel_available,
    load,
    loaded,
    unload,
)
from gdn_lab.aiter.probe import (
    INSTALL_HINT,
    ROUTE_BYPASS,
    ROUTE_OFFICIAL,
    ROUTE_TRITON_ONLY,
    ROUTES,
    WRITTEN_AGAINST,
    Probe,
    on_rocm,
    probe,
    supports_triton_only,
)
from gdn_lab.aiter.shims import AMD_ONLY_LAUNCH_OPTIONS, shims

__all__ = [
    "AMD_ONLY_LAUNCH_OPTIONS",
    "DEFAULT_ARCH",
    "EMULATED_DEVICES",
    "INSTALL_HINT",
    "KERNEL_MODULES",
    "ROUTES",
    "ROUTE_BYPASS",
    "ROUTE_OFFICIAL",
    "ROCM_ONLY",
    "ROUTE_TRITON_ONLY",
    "WRITTEN_AGAINST",
    "AiterUnavailable",
    "EmulatedDevice",
    "Emulation",
    "Loaded",
    "Probe",
    "current_emulation",
    "current_route",
    "effective_arch",
    "effective_num_cus",
    "emulate",
    "emulating",
    "kernel_available",
    "load",
    "loaded",
    "on_rocm",
    "probe",
    "shims",
    "supports_triton_only",
    "unload",
]
