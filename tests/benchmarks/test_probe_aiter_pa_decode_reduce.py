"""benchmarks/probe_aiter_pa_decode_reduce.py --smoke: the probe runs on the test device. Under the CPU
interpreter AITER's reduce adds its (padded) partitions in order, so no width changes the bits; a
GPU's tree reduction may (what the probe measures), so there only its columns are checked."""

import csv

import pytest

from gdn_lab import aiter


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_smoke(tmp_path, run_smoke, device):
    run_smoke("probe_aiter_pa_decode_reduce.py", "--smoke", "--out", str(tmp_path))
    with (tmp_path / "probe_aiter_pa_decode_reduce.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["reduce_width"] for r in rows} >= {"2", "4"} and any(r["same_width"] == "True" for r in rows)
    assert rows[0]["env_torch"] and {r["bitwise_equal"] for r in rows} <= {"True", "False"}
    if device.type == "cpu":
        assert all(r["bitwise_equal"] == "True" for r in rows)
