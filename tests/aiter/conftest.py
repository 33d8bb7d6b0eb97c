"""What the gdn_lab.aiter tests share: a clean loader, a hidden aiter, and small fake aiter packages.

The fakes (in tmp_path) exercise routes the installed amd-aiter wheel predates (AITER_TRITON_ONLY)
and layouts of later aiter versions.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from gdn_lab import aiter


def _aiter_module_names() -> set[str]:
    return {n for n in sys.modules if n == "aiter" or n.startswith("aiter.")}


@pytest.fixture
def aiter_modules():
    """A function: the names of the real aiter's modules now in sys.modules."""
    return _aiter_module_names


@pytest.fixture
def fresh_loader():
    """Start and end with nothing loaded, whatever the test did."""
    aiter.unload()
    yield
    aiter.unload()


class _HideAiter:
    """A meta-path finder that makes `aiter` unimportable, as on a machine without the wheel."""

    def find_spec(self, name, path=None, target=None):
        if name == "aiter" or name.startswith("aiter."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None


@pytest.fixture
def hide_aiter(monkeypatch):
    """aiter neither importable nor loaded for the test: an earlier test in the same process may
    have imported it, and a loaded aiter is an installed one (`aiter.probe` reads sys.modules first)."""
    for name in _aiter_module_names():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_HideAiter(), *sys.meta_path])


@pytest.fixture
def fake_aiter(tmp_path, monkeypatch):
    """Write a minimal aiter package (the submodules the loader and shims import, and a pa_decode
    that records what it saw at import) into tmp_path, first on sys.path; returns its root."""

    def make(init_body: str):
        files = {
            "aiter/__init__.py": init_body,
            "aiter/ops/__init__.py": "",
            "aiter/ops/triton/__init__.py": "",
            "aiter/ops/triton/utils/__init__.py": "",
            "aiter/ops/triton/utils/_triton/__init__.py": "",
            "aiter/ops/triton/utils/_triton/arch_info.py": "def get_arch():\n    raise RuntimeError('no driver')\n",
            "aiter/ops/triton/utils/device_info.py": "def get_num_sms():\n    raise RuntimeError('no cuda')\n",
            "aiter/ops/triton/pa_decode.py": textwrap.dedent(
                """
                import os
                from aiter.ops.triton.utils._triton import arch_info
                TRITON_ONLY_AT_IMPORT = os.environ.get("AITER_TRITON_ONLY")
                ARCH_AT_IMPORT = arch_info.get_arch()
                """
            ),
        }
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()
        return tmp_path

    return make
