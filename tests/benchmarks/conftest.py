"""How the benchmark tests run a script: the `run_smoke` fixture, `run_smoke("bench_x.py", *args)`.

Every script's `--smoke` mode is Triton's interpreter on the CPU. Triton fixes a kernel's mode
when the kernel is decorated, and a test session on a GPU decorated its kernels for the GPU, so
the script runs in its own process, told the interpreter is on and shown no GPU, with this
session's import path in front of the checkout (a machine whose packages come from PYTHONPATH
keeps them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run benchmarks/`script` with `args` on the CPU interpreter; fail the test with its stderr."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


@pytest.fixture
def run_smoke():
    """`run_smoke(script, *args)`: the CompletedProcess (its stdout as text) of a script that exited 0."""
    return _run
