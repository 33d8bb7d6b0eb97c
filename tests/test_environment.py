"""gdn_lab.environment: the fingerprint composed from device facts, AITER's route and gdn_lab's git provenance.

The provenance tests run gdn_lab from copies of the package in subprocesses, the way a run uses
it from PYTHONPATH: from a git checkout (commit and dirty flag), from a copy without .git, and
from a folder that sits inside some other checkout (not that checkout's code).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gdn_lab
from gdn_lab import aiter, environment

PACKAGE = Path(gdn_lab.__file__).resolve().parent
HAVE_GIT = shutil.which("git") is not None
needs_git = pytest.mark.skipif(not HAVE_GIT, reason="git is not installed")
PROVENANCE = ("gdn_lab", "gdn_lab_commit", "gdn_lab_dirty", "gdn_lab_path")
AITER_KEYS = ("aiter_route", "aiter_route_note", "aiter_arch", "aiter_num_cus", "aiter_emulation")


@pytest.fixture(autouse=True)
def _provenance_from_git(monkeypatch):
    # A caller's GDN_LAB_COMMIT override (a device run's) would mask the git provenance under test.
    monkeypatch.delenv("GDN_LAB_COMMIT", raising=False)
    monkeypatch.delenv("GDN_LAB_DIRTY", raising=False)


def test_fingerprint_names_every_version_the_device_gdn_lab_and_aiter():
    fp = environment.fingerprint("cpu")
    for key in ("python", "torch", "triton", "fla", "aiter", "flydsl", "device", "arch", "platform", "num_sms"):
        assert key in fp
    for key in (*PROVENANCE, *AITER_KEYS, "triton_mode", "triton_interpret"):
        assert key in fp
    assert fp["torch"] == torch.__version__ and fp["arch"] == "cpu"
    assert fp["gdn_lab"] == gdn_lab.__version__ and fp["gdn_lab_path"] == str(PACKAGE)
    json.dumps(fp)  # flat and serialisable


def test_aiter_fields_say_whether_the_emulation_is_the_default():
    fp = environment.fingerprint("cpu")
    if not aiter.probe().installed:
        assert fp["aiter_arch"] is fp["aiter_num_cus"] is fp["aiter_emulation"] is None
        assert environment.notes(fp)["aiter_arch"] == "aiter is not installed"
        return
    if torch.version.hip:
        assert fp["aiter_emulation"] == "native"
        return
    assert (fp["aiter_arch"], fp["aiter_num_cus"], fp["aiter_emulation"]) == ("gfx950", 256, "default")
    assert "default emulation off ROCm" in environment.notes(fp)["aiter_arch"]
    assert "MI350X" in environment.notes(fp)["aiter_num_cus"]
    with aiter.emulate("gfx942"):
        inside = environment.fingerprint("cpu")
    assert (inside["aiter_arch"], inside["aiter_num_cus"], inside["aiter_emulation"]) == ("gfx942", 80, "emulate()")
    assert "aiter.emulate()" in environment.notes(inside)["aiter_arch"]


def test_without_aiter_its_fields_are_none(monkeypatch):
    missing = aiter.Probe(False, None, None, None, "aiter is not installed")
    monkeypatch.setattr(aiter, "probe", lambda: missing)
    monkeypatch.setattr(aiter, "current_route", lambda: (None, ""))
    fields = environment.aiter_fields("cpu")
    assert fields == dict.fromkeys(AITER_KEYS) | {"aiter_route_note": ""}


@needs_git
def test_provenance_of_this_checkout():
    root = PACKAGE.parent
    if environment._checkout_root(PACKAGE) is None:
        pytest.skip("gdn_lab is not imported from the top of a git checkout here")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True).stdout
    p = environment.provenance()
    assert p["gdn_lab_commit"] == head.strip() and p["gdn_lab_dirty"] == bool(status.strip())


def test_provenance_never_raises_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert environment._git(PACKAGE.parent, "rev-parse", "HEAD") is None
    p = environment.provenance()
    assert p["gdn_lab_commit"] is None and p["gdn_lab_dirty"] is None and p["gdn_lab"] == gdn_lab.__version__


@needs_git
def test_git_variables_of_a_hook_do_not_redirect_it(monkeypatch, tmp_path):
    if environment._checkout_root(PACKAGE) is None:
        pytest.skip("gdn_lab is not imported from the top of a git checkout here")
    expected = environment.provenance()["gdn_lab_commit"]
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    assert environment.provenance()["gdn_lab_commit"] == expected


def _copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "gdn_lab", ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "gdn_lab"


def _provenance_from(pythonpath: Path) -> dict:
    """environment.provenance() of the gdn_lab found first on PYTHONPATH, in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["PYTHONPATH"] = str(pythonpath)
    code = "import json\nfrom gdn_lab import environment\nprint(json.dumps(environment.provenance()))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=pythonpath, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@needs_git
def test_provenance_from_pythonpath_in_a_git_checkout(tmp_path):
    repo = tmp_path / "repo"
    copy = _copy_package(repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "copy")
    head = _git(repo, "rev-parse", "HEAD")
    p = _provenance_from(repo)
    assert p == {
        "gdn_lab": gdn_lab.__version__,
        "gdn_lab_commit": head,
        "gdn_lab_dirty": False,
        "gdn_lab_path": str(copy.resolve()),
    }
    (copy / "device.py").write_text((copy / "device.py").read_text() + "\n# edited\n")
    assert _provenance_from(repo)["gdn_lab_dirty"] is True


def test_provenance_from_a_copy_without_git(tmp_path):
    copy = _copy_package(tmp_path / "plain")
    p = _provenance_from(tmp_path / "plain")
    assert p["gdn_lab_path"] == str(copy.resolve()) and p["gdn_lab"] == gdn_lab.__version__
    assert p["gdn_lab_commit"] is None and p["gdn_lab_dirty"] is None


@needs_git
def test_a_copy_inside_another_checkout_is_not_that_checkouts_code(tmp_path):
    """As a package installed into a venv that lives inside a checkout: the enclosing repo's HEAD is not ours."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "unrelated")
    _copy_package(repo / "site-packages")
    p = _provenance_from(repo / "site-packages")
    assert p["gdn_lab_commit"] is None and p["gdn_lab_dirty"] is None


class _FakeDist:
    def __init__(self, init_file: Path, direct_url: dict | None):
        self.init_file, self.direct_url = init_file, direct_url

    def locate_file(self, path):
        return self.init_file

    def read_text(self, name):
        return json.dumps(self.direct_url) if name == "direct_url.json" and self.direct_url else None


def test_a_vcs_install_reports_the_commit_pip_recorded(monkeypatch):
    import importlib.metadata

    url = {"url": "https://example.com/gdn_lab.git", "vcs_info": {"vcs": "git", "commit_id": "abc123"}}
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _FakeDist(PACKAGE / "__init__.py", url))
    assert environment._installed_commit(PACKAGE) == "abc123"
    # metadata of another copy (an install shadowed by PYTHONPATH) says nothing about this one
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _FakeDist(Path("/elsewhere/__init__.py"), url))
    assert environment._installed_commit(PACKAGE) is None
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _FakeDist(PACKAGE / "__init__.py", None))
    assert environment._installed_commit(PACKAGE) is None


def test_a_copy_states_its_commit(monkeypatch):
    monkeypatch.setenv("GDN_LAB_COMMIT", "0123abcd")
    monkeypatch.setenv("GDN_LAB_DIRTY", "0")
    p = environment.provenance()
    assert p["gdn_lab_commit"] == "0123abcd" and p["gdn_lab_dirty"] is False
