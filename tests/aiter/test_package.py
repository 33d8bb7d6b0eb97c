"""gdn_lab.aiter as a package: its public names, and it never imports, hides or stands in for AITER.

The real library is the top-level `aiter`; this package is `gdn_lab.aiter`. Importing the lab must
not import AITER (its init needs ROCm) nor triton, and must leave `import aiter` resolving to the
installed AITER.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_lab import aiter

FOLDER = Path(aiter.__file__).resolve().parent


def test_public_names():
    for name in aiter.__all__:
        assert hasattr(aiter, name), name
    for name in ("load", "unload", "loaded", "kernel_available", "emulate", "probe", "shims", "current_route"):
        assert callable(getattr(aiter, name)), name
    # `gdn_lab.aiter.probe` and `.shims` are the functions; their modules are reached by from-imports.
    from gdn_lab.aiter.probe import Probe
    from gdn_lab.aiter.shims import shims

    assert isinstance(aiter.probe(), Probe) and aiter.shims is shims
    assert sys.modules["gdn_lab.aiter.probe"].probe is aiter.probe


def test_the_package_reaches_aiter_only_by_its_absolute_name():
    """No `import aiter` / `from aiter import` statements: the loader uses importlib.import_module("aiter")."""
    offenders = []
    for path in sorted(FOLDER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n == "aiter" or n.startswith("aiter.")]
    assert not offenders, offenders


def test_importing_the_lab_neither_imports_nor_shadows_aiter():
    code = """
import importlib.util, json, sys
import gdn_lab.aiter, gdn_lab.ops, gdn_lab.environment
from gdn_lab import aiter, environment
aiter.probe(); environment.fingerprint("cpu")
with aiter.emulate("gfx942"):
    aiter.effective_arch("cpu")
spec = importlib.util.find_spec("aiter")
print(json.dumps({
    "imported": sorted(m for m in sys.modules if m == "aiter" or m.startswith("aiter.") or m == "triton"),
    "origin": spec.origin if spec else None,
}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=FOLDER.parents[1]
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["imported"] == []
    if seen["origin"] is not None:  # AITER is installed: `import aiter` still finds AITER, not the lab
        assert not Path(seen["origin"]).resolve().is_relative_to(FOLDER)


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_a_loaded_aiter_is_the_installed_one(fresh_loader):
    aiter.load("pa_decode")
    real = sys.modules["aiter"]
    assert real is not aiter and Path(aiter.probe().location).resolve() != FOLDER
