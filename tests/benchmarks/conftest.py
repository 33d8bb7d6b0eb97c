"""How the benchmark tests run a script: the `run_smoke` fixture, `run_smoke("bench_x.py", *args)`,
and import one: `load_script("bench_x.py")`.

A script's `--smoke` mode runs tiny shapes on the session's device (tests/conftest.py): on the CPU
under Triton's interpreter, on a GPU compiled (`--device cuda`; the H200 machine's Triton 3.6
interpreter fails on loop bounds read from memory, `int()` of a one-element array). Triton fixes a
kernel's mode when the kernel is decorated, so the script runs in its own process, with this
session's TRITON_INTERPRET, and its import path in front of the checkout (a machine whose packages
come from PYTHONPATH keeps them).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_smoke(device):
    """`run_smoke(script, *args, returncode=0)`: the CompletedProcess (its stdout and stderr as text)
    of a script that exited with `returncode`, with `--device` the session's device; any other exit
    shows its stderr."""
    from gdn_lab.report.runner import prepended

    env = dict(os.environ, PYTHONPATH=prepended("PYTHONPATH", ROOT))

    def run(script: str, *args: str, timeout: int = 600, returncode: int = 0) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args, "--device", device.type]
        done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
        if done.returncode != returncode:
            pytest.fail(f"{script} {' '.join(args)} exited {done.returncode}, not {returncode}:\n{done.stderr[-4000:]}")
        return done

    return run


@pytest.fixture(scope="session")
def load_script():
    """`load_script(script)`: a benchmark script imported in this process (its argument parsing and
    helpers), registered in sys.modules under its name, where its dataclasses look it up."""

    def load(script: str):
        name = Path(script).stem
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / script)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
