"""benchmarks/probe_trace_rows.py --smoke: a recorded forward's reads replayed under both tile rules."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")


@needs_hf
def test_smoke(run_smoke, tmp_path):
    done = run_smoke("probe_trace_rows.py", "--smoke", "--out", str(tmp_path), "--shapes", "1x8,3x2")
    assert "[probe_trace_rows] wrote" in done.stdout
    with (tmp_path / "probe_trace_rows.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["same_bits"] == "True" and float(r["ms"]) > 0 and r["env_torch"] for r in rows)
    runs = {}
    for r in rows:
        runs.setdefault((r["batch"], r["level"], r["reads"]), {})[r["rule"]] = int(r["n_reads"])
    assert all(set(rules) == {"fit", "fixed"} and len(set(rules.values())) == 1 for rules in runs.values())
    for batch in ("1", "3"):
        classes = [
            n["fit"] for (b, level, reads), n in runs.items() if b == batch and level == "modules" and reads != "all"
        ]
        assert len(classes) > 1 and sum(classes) == runs[(batch, "modules", "all")]["fit"]
        assert runs[(batch, "ops", "all")]["fit"] > runs[(batch, "modules", "all")]["fit"]  # ops reads more tensors


@pytest.mark.parametrize(("args", "message"), [(["--shapes", "1x0"], "--shapes '1x0'"), (["--reps", "0"], "--reps 0")])
def test_bad_arguments_are_refused(tmp_path, args, message):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "probe_trace_rows.py"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path), *args], capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr
