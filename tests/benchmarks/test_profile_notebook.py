"""benchmarks/profile_notebook.py: a notebook's code cells under cProfile, its Triton compiles timed."""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_profiles_a_notebook_with_the_presets_values(tmp_path, run_smoke, device):
    name = "00_environment_and_routing"
    run_smoke("profile_notebook.py", name, "--preset", "cpu-smoke", "--top", "15", "--out", str(tmp_path))
    rows = _rows(tmp_path / f"profile_{name}.csv")
    assert [r["kind"] for r in rows] == ["run"] + ["function"] * 15
    assert float(rows[0]["seconds"]) > 0 and rows[0]["env_torch"]
    cum = [float(r["cumtime_s"]) for r in rows[1:]]
    assert cum == sorted(cum, reverse=True) and all(r["function"] for r in rows[1:])
    # the notebook ran with the preset's values, into the given directory, on the session's device
    assert (tmp_path / "results" / name / "routing.csv").is_file()
    assert (rows[0]["env_platform"] == "cpu") == (device.type == "cpu")
    compiles = _rows(tmp_path / f"compiles_{name}.csv")
    assert all(r["kernel"] and float(r["seconds"]) >= 0 for r in compiles)
    if device.type == "cpu":
        assert compiles == []  # Triton's interpreter compiles nothing
    assert (tmp_path / f"{name}.prof").stat().st_size > 0


def test_an_unknown_notebook_is_rejected_before_anything_runs(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_notebook.py"), "99_nope", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "notebook: '99_nope' is not in" in done.stderr and "accepted: a notebook's stem" in done.stderr
    assert not any(tmp_path.iterdir())
