"""benchmarks/bench_decode_attention.py --smoke: the whole script on tiny shapes, on the test device."""

import csv
import importlib.util
from pathlib import Path

import pytest

SCRIPT = "bench_decode_attention.py"


def case(r: dict) -> tuple:
    return r["Hq"], r["Hkv"], r["D"], r["kv_dtype"], r["page_size"]


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke(tmp_path, run_smoke):
    run_smoke(SCRIPT, "--smoke", "--out", str(tmp_path))
    rows = _rows(tmp_path / "bench_decode_attention.csv")
    assert all(r["status"] == "ok" and r["env_torch"] for r in rows)
    timing = [r for r in rows if r["kind"] == "timing"]
    assert {(r["impl"], r["kv_dtype"]) for r in timing} == {
        ("sdpa", "bf16"), ("triton", "bf16"), ("triton", "fp8"), ("control", "bf16"), ("control", "fp8"),
    }  # fmt: skip
    assert all(float(r["us"]) > 0 and float(r["bytes"]) > 0 for r in timing)
    ours = [r for r in timing if r["impl"] != "sdpa"]
    assert all(r["ratio_vs_sdpa"] and r["max_abs_vs_sdpa"] for r in ours)
    assert all(float(r["max_abs_vs_sdpa"]) < 2e-2 for r in ours if r["kv_dtype"] == "bf16")
    assert all(r["ratio_vs_control"] for r in ours if r["impl"] == "triton")
    assert all(r["target"] and r["target_met"] in ("True", "False") for r in ours if r["impl"] == "triton")
    inv = [r for r in rows if r["kind"] == "invariance"]
    assert {r["impl"] for r in inv} == {"triton", "control"}
    assert all(r["bitwise_equal"] == "True" for r in inv if r["impl"] == "triton")
    # each case (shape, cache, page size) judged by its own control; on the CPU these bf16 cases
    # are insensitive (the interpreter's fp32 dots leave the control's split points no trace in
    # bf16 outputs), and the verdict must say so
    caught = {case(r) for r in inv if r["impl"] == "control" and r["bitwise_equal"] == "False"}
    for r in inv:
        if r["impl"] == "control":
            assert r["verdict"] == ("caught" if case(r) in caught else "NOT caught")
        else:
            assert r["verdict"] == ("invariant" if case(r) in caught else "insensitive")
    plans = [r for r in rows if r["kind"] == "plans"]
    assert len({r["plan"] for r in plans}) >= 3, "fine and coarse plans, short and long spans"
    assert plans and all(r["bitwise_equal"] == "True" for r in plans)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke_sweep_summary(tmp_path, run_smoke):
    argv = ["--smoke", "--out", str(tmp_path), "--kv-dtypes", "bf16", "--page-sizes", "16", "--sweep"]
    out = run_smoke(SCRIPT, *argv).stdout
    rows = _rows(tmp_path / "bench_decode_attention.csv")
    sweep = [r for r in rows if r["kind"] == "sweep"]
    assert {r["note"] for r in sweep} >= {"default config", "forced plan"}
    assert "sweep D=64 bf16 page 16" in out and "vs sdpa / vs control" in out
    assert {(r["B"], r["ctx"]) for r in sweep} == {("3", "320")}  # the smoke sweep's own case
    # every plan the rule can pick: fine spans dividing a node's blocks, coarse ones the request's nodes
    # (under the interpreter 4 blocks a node and 2 nodes in 320 tokens; 16 and 1 on a GPU)
    forced = [r for r in sweep if r["note"] == "forced plan"]
    cfg = dict(kv.split("=") for kv in forced[0]["config"].split())
    per_node = int(cfg["node_blocks"])
    nodes = -(-320 // (int(cfg["block_n"]) * per_node))
    fine = {f"unit=1 span={s}" for s in range(1, per_node + 1) if per_node % s == 0}
    coarse = {f"unit={per_node} span={s * per_node}" for s in range(1, nodes + 1) if nodes % s == 0}
    assert {r["plan"] for r in forced} == fine | coarse and len(fine | coarse) >= 4


def test_the_sweep_runs_at_the_batches_and_contexts_asked_for(load_script):
    bench = load_script(SCRIPT)
    args = bench.parse_args(["--out", "x", "--sweep", "--batches", "16,32", "--contexts", "1024"])
    assert args.sweep_cases == [(16, 1024), (32, 1024)]
    assert bench.parse_args(["--out", "x", "--sweep"]).sweep_cases[0] == (1, 4096)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cases_over_the_memory_limit_are_skipped_rows(tmp_path, run_smoke):
    argv = ["--smoke", "--out", str(tmp_path), "--max-gb", "0", "--kv-dtypes", "bf16", "--page-sizes", "16"]
    run_smoke(SCRIPT, *argv)
    timing = [r for r in _rows(tmp_path / "bench_decode_attention.csv") if r["kind"] == "timing"]
    assert {r["impl"] for r in timing} == {"sdpa", "triton", "control"}
    assert all(r["status"] == "skipped" and "--max-gb" in r["note"] and not r["us"] for r in timing)
