"""Find the installed aiter and the route `gdn_lab.aiter.load` would take here: cheap, never raises.

The PyPI wheel `amd-aiter` ships AITER's Triton kernels (`aiter/ops/triton/`) as plain Python.
`import aiter` needs ROCm (its package init builds the C++ ops), but the Triton submodules do not,
so the lab reaches them by one of three routes, recorded in every fingerprint (`aiter_route`):

- "official": on ROCm, `import aiter` as AITER documents it (a current aiter built from source);
- "AITER_TRITON_ONLY": off ROCm, when the installed aiter's init honours `AITER_TRITON_ONLY=1`
  (it then skips the C++ ops), `import aiter` with that variable set while aiter modules import;
- "init-bypass": off ROCm otherwise (amd-aiter 0.1.7 has no AITER_TRITON_ONLY): an empty package
  module named `aiter`, whose `__path__` is the installed folder, stands in for the init while the
  submodules import (`gdn_lab.aiter.loader`).

The probe reads the file system only: it imports neither aiter nor triton. It also refuses a
top-level `aiter` that is the lab's own `gdn_lab/aiter/` folder, which is what Python finds when
the `gdn_lab/` folder itself is on sys.path (a script run from inside it).

Example:
    >>> probe().route in (None, "official", "AITER_TRITON_ONLY", "init-bypass")
    True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass

import torch

ROUTE_OFFICIAL = "official"
ROUTE_TRITON_ONLY = "AITER_TRITON_ONLY"
ROUTE_BYPASS = "init-bypass"
ROUTES = (ROUTE_OFFICIAL, ROUTE_TRITON_ONLY, ROUTE_BYPASS)

# The wheel the backends, rules and shims were written against (PyPI, 2025-11).
WRITTEN_AGAINST = "0.1.7.post2.dev18"
INSTALL_HINT = "pip install 'gdn_lab[aiter-triton]' (or: pip install --no-deps amd-aiter==0.1.7.post2.dev18)"

# This package's own folder: a top-level `aiter` found here is the lab shadowing AITER, not AITER.
_OWN_FOLDER = os.path.dirname(os.path.abspath(__file__))


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


def on_rocm() -> bool:
    """torch was built for ROCm (AITER then runs natively and asks the device itself)."""
    return bool(torch.version.hip)


def distribution_version() -> str | None:
    """The installed aiter's distribution version (amd-aiter, else aiter), read from its metadata."""
    for dist in ("amd-aiter", "aiter"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_location() -> tuple[str | None, str | None]:
    """(package folder, __init__.py path) of the top-level `aiter`, without executing its init."""
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


def is_own_folder(location: str | None) -> bool:
    """Whether `location` is this package's folder (gdn_lab/aiter), i.e. not AITER."""
    return location is not None and os.path.realpath(location) == os.path.realpath(_OWN_FOLDER)


def supports_triton_only(init_file: str | None) -> bool:
    """Whether an aiter package init honours AITER_TRITON_ONLY (it names the variable)."""
    if not init_file or not os.path.isfile(init_file):
        return False
    with open(init_file, encoding="utf-8", errors="replace") as f:
        return "AITER_TRITON_ONLY" in f.read()


def probe() -> Probe:
    """Find aiter and the route `load()` would take. Cheap, never raises, imports nothing."""
    try:
        location, init_file = package_location()
        version = distribution_version()
        if location is None:
            return Probe(False, version, None, None, f"aiter is not installed ({INSTALL_HINT})")
        if is_own_folder(location):
            return Probe(
                False,
                version,
                None,
                None,
                f"the top-level `aiter` is gdn_lab's own {location} (the gdn_lab/ folder is on sys.path): "
                f"run from the repository root, or install aiter ({INSTALL_HINT})",
            )
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
