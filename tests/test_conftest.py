"""tests/conftest.py: a sticky GPU error ends the session at the test where it surfaced, naming it;
an ordinary failure does not."""

import shutil
import subprocess
import sys
from pathlib import Path

CASES = """
def test_faults():
    raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

def test_after_the_fault():
    pass
"""
ORDINARY = """
def test_fails():
    raise RuntimeError("an ordinary failure")

def test_after_the_failure():
    pass
"""


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_cases.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", "cpu", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def test_a_sticky_gpu_error_stops_the_session_and_names_the_test(tmp_path):
    r = run(tmp_path, CASES)
    assert r.returncode == 2, r.stdout  # pytest: interrupted
    assert (
        "the GPU context is lost (an illegal memory access was encountered) in test_cases.py::test_faults" in r.stdout
    )
    assert "1 failed" in r.stdout and "passed" not in r.stdout, r.stdout


def test_an_ordinary_failure_lets_the_session_go_on(tmp_path):
    r = run(tmp_path, ORDINARY)
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert "GPU context" not in r.stdout
