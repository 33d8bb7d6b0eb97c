"""benchmarks/probe_trace_rows.py --smoke: a recorded forward's reads replayed through this tree's row
stage and another version's."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict[str, str]]:
    with (path / "probe_trace_rows.csv").open() as f:
        return list(csv.DictReader(f))


@needs_hf
def test_smoke_against_a_copy_of_this_row_stage(run_smoke, tmp_path):
    copy = tmp_path / "triton_hash.py"
    copy.write_text((ROOT / "gdn_lab" / "trace" / "triton_hash.py").read_text())
    done = run_smoke(
        "probe_trace_rows.py", "--smoke", "--out", str(tmp_path), "--shapes", "1x8,3x2", "--against", str(copy)
    )
    assert "[probe_trace_rows] wrote" in done.stdout
    rows = _rows(tmp_path)
    assert rows and all(r["same_bits"] == "True" and float(r["ms"]) > 0 and r["env_torch"] for r in rows)
    assert {r["against"] for r in rows} == {str(copy)}
    runs = {}
    for r in rows:
        runs.setdefault((r["batch"], r["level"], r["reads"]), {})[r["row_stage"]] = int(r["n_reads"])
    assert all(set(stages) == {"tree", "against"} and len(set(stages.values())) == 1 for stages in runs.values())
    for batch in ("1", "3"):
        classes = [
            n["tree"] for (b, level, reads), n in runs.items() if b == batch and level == "modules" and reads != "all"
        ]
        assert len(classes) > 1 and sum(classes) == runs[(batch, "modules", "all")]["tree"]
        assert runs[(batch, "ops", "all")]["tree"] > runs[(batch, "modules", "all")]["tree"]  # ops reads more tensors


@needs_hf
def test_a_row_stage_that_changes_bits_is_caught(run_smoke, tmp_path):
    # A known-different row stage: every row value plus one. The probe must say so, and exit 1.
    copy = tmp_path / "triton_hash.py"
    source = (ROOT / "gdn_lab" / "trace" / "triton_hash.py").read_text()
    marker = "def row_values_many("
    assert marker in source
    copy.write_text(
        source.replace(marker, "def _row_values_many_as_is(")
        + "\n\ndef row_values_many(items):\n    _row_values_many_as_is(items)\n"
        + "    for words, r, f, out, offset in items:\n        out[offset : offset + r] += 1\n"
    )
    run_smoke(
        "probe_trace_rows.py", "--smoke", "--out", str(tmp_path), "--shapes", "1x8", "--reps", "1",
        "--against", str(copy), returncode=1,
    )  # fmt: skip
    rows = _rows(tmp_path)
    assert rows and all(r["same_bits"] == "False" for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shapes", "1x0"], "--shapes '1x0'"),
        (["--reps", "0"], "--reps 0"),
        (["--against", "/no/such.py"], "--against"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, args, message):
    script = ROOT / "benchmarks" / "probe_trace_rows.py"
    done = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(tmp_path), *args], capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr
