"""gdn_lab.aiter.wheel: the trimmed amd-aiter wheel keeps the `aiter` package byte for byte, drops the rest, and says so."""

from __future__ import annotations

import base64
import hashlib
import zipfile

import pytest

from gdn_lab.aiter.wheel import main, trim_wheel

INFO = "amd_aiter-0.1.7.post2.dev18.dist-info"
FILES = {
    "aiter/__init__.py": b"import torch\n",
    "aiter/ops/triton/pa_decode.py": b"X = 1\n",
    "aiter_meta/hsa/gfx942/big.co": b"\0" * 5000,
    f"{INFO}/METADATA": b"Metadata-Version: 2.2\nName: amd-aiter\nVersion: 0.1.7.post2.dev18\nRequires-Dist: pybind11\n",
    f"{INFO}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    f"{INFO}/top_level.txt": b"aiter\naiter_meta\n",
    f"{INFO}/RECORD": b"stale\n",
}


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in FILES.items():
            z.writestr(name, data)
    return path


def test_trim_keeps_the_package_and_rewrites_the_record(wheel, tmp_path):
    out = trim_wheel(wheel, tmp_path / "out")
    assert out.name == "amd_aiter-0.1.7.post2.dev18+trimmed-py3-none-any.whl"
    assert out.stat().st_mode & 0o777 == 0o644
    info = "amd_aiter-0.1.7.post2.dev18+trimmed.dist-info"
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert not any(n.startswith("aiter_meta/") for n in names)
        for n in ("aiter/__init__.py", "aiter/ops/triton/pa_decode.py"):
            assert z.read(n) == FILES[n]
        assert b"Version: 0.1.7.post2.dev18+trimmed\n" in z.read(f"{info}/METADATA")
        assert z.read(f"{info}/top_level.txt") == b"aiter\n"
        rows = [line.split(",") for line in z.read(f"{info}/RECORD").decode().splitlines()]
        assert {r[0] for r in rows} == names
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = z.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data)


def test_cli_and_bad_input(wheel, tmp_path, capsys):
    assert main([str(wheel), str(tmp_path / "cli")]) == 0
    assert "+trimmed" in capsys.readouterr().out
    with pytest.raises(ValueError, match="keep"):
        trim_wheel(wheel, tmp_path / "none", keep=("nothing/",))
    not_a_wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(not_a_wheel, "w") as z:
        z.writestr("a.py", b"")
    with pytest.raises(ValueError, match="dist-info"):
        trim_wheel(not_a_wheel, tmp_path / "bad")


def test_runs_as_a_module(wheel, tmp_path):
    """`python -m gdn_lab.aiter.wheel` works, and the package init does not import it first (runpy warns then)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "gdn_lab.aiter.wheel", str(wheel), str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "+trimmed" in done.stdout and "python -m gdn_lab.aiter.wheel" not in done.stderr
