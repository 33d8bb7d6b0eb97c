"""benchmarks/probe_aiter_pa_decode_reduce.py --smoke: the probe runs under the CPU interpreter, where
AITER's reduce adds its (padded) partitions in order, so no width changes the bits."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_lab import aiter

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_smoke(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "probe_aiter_pa_decode_reduce.py"),
        "--smoke",
        "--out",
        str(tmp_path),
    ]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=300, capture_output=True)
    with (tmp_path / "probe_aiter_pa_decode_reduce.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["reduce_width"] for r in rows} >= {"2", "4"} and any(r["same_width"] == "True" for r in rows)
    assert all(r["bitwise_equal"] == "True" for r in rows) and rows[0]["env_torch"]
