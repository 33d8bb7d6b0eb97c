"""benchmarks/probe_gdn_prefill_kernels.py --smoke: every launch of the backend, a state tile and output tiles (one of them two value heads a program, with the default's bits), the prepare's other inverse, segment lengths (one chunk each, and serial) and a launch option of the parallel launches are timed."""

import csv


def test_smoke(tmp_path, run_smoke):
    run_smoke("probe_gdn_prefill_kernels.py", "--smoke", "--out", str(tmp_path))
    with (tmp_path / "probe_gdn_prefill_kernels.csv").open() as f:
        rows = list(csv.DictReader(f))
    launches = {r["launch"] for r in rows}
    assert launches == {"plan+scratch", "prepare", "state", "output", "backend"}
    assert all(r["status"] == "ok" and float(r["us"]) > 0 for r in rows) and rows[0]["env_torch"]
    assert {(r["HK"], r["HV"], r["tokens"]) for r in rows} == {("1", "2", "128")}
    assert any(r["block_v"] for r in rows if r["launch"] == "state")
    grouped = [r for r in rows if r["launch"] == "output" and r["group_heads"] == "2"]
    assert grouped and all(r["same_bits"] == "True" for r in rows if r["launch"] == "output" and r["block_v"])
    assert {r["inverse"] for r in rows if r["launch"] == "prepare"} >= {"doubling"}
    assert {r["launch"] for r in rows if r["num_warps"] and not r["block_v"] and not r["segment_chunks"]} == {
        "prepare",
        "output",
    }
    assert {r["segment_chunks"] for r in rows if r["launch"] == "state"} >= {"1", "serial"}
