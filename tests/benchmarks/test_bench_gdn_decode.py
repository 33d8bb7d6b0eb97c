"""benchmarks/bench_gdn_decode.py --smoke: the whole script on tiny shapes, on the test device.

The control's variance at B=13 is asserted where it was measured at these shapes: the CPU interpreter.
"""

import csv
import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke(tmp_path, run_smoke, device):
    run_smoke("bench_gdn_decode.py", "--smoke", "--out", str(tmp_path))
    with (tmp_path / "bench_gdn_decode.csv").open() as f:
        rows = list(csv.DictReader(f))
    kinds = {r["kind"] for r in rows}
    assert {"overhead", "host", "timing", "invariance", "ksplit_variance", "tile_variance"} <= kinds
    host = [r for r in rows if r["kind"] == "host"]
    assert {"bare kernel[grid]", "public triton", "public auto", "public triton - bare"} <= {r["impl"] for r in host}
    assert all(r["target_met"] in ("True", "False") for r in host if r["impl"] == "public triton - bare")
    assert all(r["env_torch"] and r["env_triton_interpret"] == str(device.type == "cpu") for r in rows)
    timing = [r for r in rows if r["kind"] == "timing"]
    assert {"triton-public", "triton-wrapper"} <= {r["impl"] for r in timing}
    assert all(float(r["us"]) > 0 for r in timing)
    ours = [r for r in timing if r["impl"].startswith("triton")]
    assert all(float(r["max_abs_vs_ref"]) < 2e-2 and float(r["state_max_abs_vs_ref"]) < 1e-4 for r in ours)
    inv = {r["impl"]: r["bitwise_equal"] for r in rows if r["kind"] == "invariance"}
    assert inv["triton"] == "True" and all(v == "True" for k, v in inv.items() if "k_split=" in k)
    verdict = {r["impl"]: r["verdict"] for r in rows if r["kind"] == "invariance"}
    caught = inv["triton-ksplit-by-batch"] == "False"
    assert verdict["triton-ksplit-by-batch"] == ("caught" if caught else "NOT caught")
    assert verdict["triton"] == ("invariant" if caught else "insensitive")
    if device.type == "cpu":
        assert caught, "the control must be caught at B=13"
    if importlib.util.find_spec("fla") is not None:
        assert inv["fla"] == "True" and {"fla-gate", "fla-pre"} <= {r["impl"] for r in timing}
