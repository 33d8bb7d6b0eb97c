"""The wheel runs: built from the repository's files alone, installed into a fresh venv, it finds its
notebooks, presets and rule tables as package data and runs notebook 00 through `gdn-lab run` from
a directory that is not the checkout.

Offline and quick: the wheel is built with this environment's setuptools (no build isolation) and
installed without dependencies; the fresh venv sees this environment's packages (torch, papermill,
...) through a .pth file, not gdn_lab itself (an editable install's finder is not activated by a
plain path entry).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from gdn_lab import package_data

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _copy_sources(dest: Path) -> None:
    """What the build needs: the package, setup.py, the project files and the data it carries."""
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "gdn_lab", dest / "gdn_lab", ignore=shutil.ignore_patterns("__pycache__", "_data", "*.egg-info")
    )
    for folder, pattern in package_data.LAYOUT.values():
        (dest / folder).mkdir(parents=True, exist_ok=True)
        for f in (ROOT / folder).glob(pattern):
            shutil.copy2(f, dest / folder / f.name)


def _outside_env(home: Path, venv: Path) -> dict[str, str]:
    """A bare environment for the installed wheel: its venv's bin first, and of this session's
    PYTHONPATH and JUPYTER_PATH (a machine whose packages come from them) all but the checkout."""
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home)}
    for name in ("PYTHONPATH", "JUPYTER_PATH"):
        keep = [p for p in os.environ.get(name, "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
        if keep:
            env[name] = os.pathsep.join(keep)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src, out = tmp / "src", tmp / "dist"
    src.mkdir()
    _copy_sources(src)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (whl,) = out.glob("gdn_lab-*.whl")
    return whl


def test_the_wheel_carries_the_notebooks_presets_and_rule_tables(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for kind, (folder, pattern) in package_data.LAYOUT.items():
        want = {f"gdn_lab/_data/{kind}/{f.name}" for f in (ROOT / folder).glob(pattern)}
        assert want and want <= names, kind


def test_installed_wheel_runs_notebook_00_from_any_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "outer-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch, papermill, ...
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _outside_env(tmp_path, venv)
    where = subprocess.run(
        [str(python), "-c", "import gdn_lab.package_data as p; print(p.PACKAGE); print(p.path('presets'))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(site) and where[1].endswith("gdn_lab/_data/presets"), where
    out = tmp_path / "run"
    done = subprocess.run(
        [str(venv / "bin" / "gdn-lab"), "run", "--preset", "cpu-smoke", "--only", "00", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=elsewhere,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{out}/index.html"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and [nb["status"] for nb in summary["notebooks"]] == ["ok"]
    executed = json.loads((out / "00_environment_and_routing.ipynb").read_text())
    assert Path(executed["metadata"]["papermill"]["input_path"]).is_relative_to(site), "the wheel's own notebook ran"
    assert "WARNING" not in done.stderr and "Traceback" not in done.stderr, done.stderr
