"""benchmarks/bench_fused_moe.py --smoke: the whole script on a tiny shape, on the test device."""

import csv
import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke(tmp_path, run_smoke, device):
    done = run_smoke("bench_fused_moe.py", "--smoke", "--out", str(tmp_path))
    with (tmp_path / "bench_fused_moe.csv").open() as f:
        rows = list(csv.DictReader(f))
    ours = [r for r in rows if r["kind"] == "timing" and r["impl"] == "triton"]
    assert [r["M"] for r in ours] == ["1", "9"]
    assert all(r["status"] == "ok" and float(r["us"]) > 0 and r["config"] and r["env_torch"] for r in ours), [
        (r["status"], r["note"]) for r in ours
    ]
    aiter = [r for r in rows if r["kind"] == "timing" and r["impl"] == "aiter-triton-moe"]
    assert len(aiter) == 2
    if device.type == "cpu":  # float32 in the interpreter: AITER's MoE takes fp16/bf16 only, and the row says so
        assert all(r["status"] == "error" and "float32" in r["note"] for r in aiter)
    inv = {(r["impl"], r["M"]): r for r in rows if r["kind"] == "invariance" and r["status"] == "ok"}
    # 9 tokens > 8 experts: the control sums atomically, ours does not
    assert inv[("triton", "9")]["bitwise_equal"] == "True" and inv[("triton", "9")]["expected"] == "equal"
    control = inv[("triton-atomic-by-batch", "9")]
    assert control["bitwise_equal"] == "False" and control["expected"] == "differs"
    assert (inv[("triton", "9")]["verdict"], control["verdict"]) == ("invariant", "caught")
    assert "invariance tiny triton: invariant 1 (of 1 case)" in done.stdout
    assert "against the rule at M=[]" in done.stdout
