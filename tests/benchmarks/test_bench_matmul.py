"""benchmarks/bench_matmul.py --smoke: the whole script on tiny shapes, on the test device."""

import csv
import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke(tmp_path, run_smoke, device):
    run_smoke("bench_matmul.py", "--smoke", "--out", str(tmp_path))
    with (tmp_path / "bench_matmul.csv").open() as f:
        rows = list(csv.DictReader(f))
    timing = [r for r in rows if r["kind"] == "timing"]
    assert {(r["impl"], r["M"]) for r in timing} == {("triton", "1"), ("torch", "1"), ("triton", "33"), ("torch", "33")}
    assert all(r["status"] == "ok" and float(r["us"]) > 0 and r["env_torch"] for r in timing)
    assert all(r["ratio_vs_torch"] for r in timing if r["impl"] == "triton")
    inv = {r["impl"]: r["bitwise_equal"] for r in rows if r["kind"] == "invariance"}
    assert inv["triton"] == "True"
    if device.type == "cpu":  # float32 on the CPU: a 1-row call takes another path (see matmul_native)
        assert inv["torch"] == "False"
    verdict = {r["impl"]: r["verdict"] for r in rows if r["kind"] == "invariance"}
    caught = inv["torch"] == "False"
    assert verdict == {
        "torch": "caught" if caught else "NOT caught",
        "triton": "invariant" if caught else "insensitive",
    }
