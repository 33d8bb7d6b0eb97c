"""gdn_lab.aiter.probe: cheap, never raises, names the route, and a missing aiter is a reason."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from gdn_lab import aiter
from gdn_lab.aiter.probe import Probe, supports_triton_only

GDN_LAB_FOLDER = Path(aiter.__file__).resolve().parents[1]


def test_probe_is_cheap_and_names_a_route(aiter_modules):
    before = aiter_modules()
    p = aiter.probe()
    assert isinstance(p, Probe)
    assert aiter_modules() == before  # the probe imports nothing
    if p.installed:
        expected = aiter.ROUTE_OFFICIAL if torch.version.hip else p.route
        assert p.route == expected and p.route in aiter.ROUTES
        assert p.version and p.location and p.route in p.reason
    else:
        assert p.route is None and "not installed" in p.reason


def test_missing_aiter_is_a_reason(hide_aiter):
    p = aiter.probe()
    assert not p.installed and p.route is None
    assert "not installed" in p.reason and "aiter-triton" in p.reason and aiter.INSTALL_HINT in p.reason


def test_the_labs_own_folder_is_never_taken_for_aiter(monkeypatch):
    """With gdn_lab/ itself on sys.path (a script run from inside it), `aiter` would be gdn_lab/aiter."""
    monkeypatch.setattr(sys, "path", [str(GDN_LAB_FOLDER), *sys.path])
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    p = aiter.probe()
    assert not p.installed and p.route is None and "gdn_lab's own" in p.reason


def test_a_probe_that_fails_reports_instead_of_raising(monkeypatch):
    import gdn_lab.aiter.probe  # noqa: F401  (the module: `gdn_lab.aiter.probe` is the function)

    module = sys.modules["gdn_lab.aiter.probe"]

    def boom():
        raise OSError("disk on fire")

    monkeypatch.setattr(module, "package_location", boom)
    p = aiter.probe()
    assert not p.installed and "probe failed: OSError: disk on fire" in p.reason


def test_triton_only_support_is_read_from_the_init(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("import os\nif os.environ.get('AITER_TRITON_ONLY'): pass\n")
    assert supports_triton_only(str(init))
    init.write_text("import torch\n")
    assert not supports_triton_only(str(init))
    assert not supports_triton_only(None) and not supports_triton_only(str(tmp_path / "missing.py"))
