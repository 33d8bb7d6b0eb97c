"""benchmarks/probe_ncu.py --smoke: each probe's calls run on the test device and give finite outputs."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("what", ["decode", "prefill", "layer"])
def test_smoke(run_smoke, what):
    done = run_smoke("probe_ncu.py", what, "--smoke")
    assert f"[probe_ncu] {what}:" in done.stdout


def test_bad_arguments_are_refused():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "probe_ncu.py"
    cmd = [sys.executable, str(script), "decode", "--tokens", "100", "--page-size", "16"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2 and "--tokens 100 must be a multiple of --page-size 16" in done.stderr
