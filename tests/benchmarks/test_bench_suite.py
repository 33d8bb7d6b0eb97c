"""benchmarks/bench_suite.py --smoke: a notebook run cold and warm in fresh processes, timed, tables compared."""

import csv


def test_smoke(tmp_path, run_smoke):
    run_smoke("bench_suite.py", "--smoke", "--only", "00", "--jobs", "1", "--out", str(tmp_path))
    with (tmp_path / "bench_suite.csv").open() as f:
        rows = list(csv.DictReader(f))
    suites = [r for r in rows if r["kind"] == "suite"]
    assert [(r["jobs"], r["cold"]) for r in suites] == [("1", "True"), ("1", "False")]
    assert all(r["exit_code"] == "0" and r["notebooks_ok"] == "1" and float(r["seconds"]) > 0 for r in suites)
    assert [r["same_tables"] for r in suites] == ["", "True"]  # the first run is the reference
    notebooks = [r for r in rows if r["kind"] == "notebook"]
    assert [r["notebook"] for r in notebooks] == ["00_environment_and_routing"] * 2
    assert all(r["status"] == "ok" and float(r["seconds"]) > 0 for r in notebooks)
    assert all(r["env_torch"] for r in rows)
    assert (tmp_path / "runs" / "cpu-smoke-jobs1-warm" / "index.html").exists()
