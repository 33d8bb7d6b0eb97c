"""benchmarks/probe_decode_bits.py --smoke: save, compare unchanged, a changed output found, another probe refused."""

import csv
import importlib.util

import pytest
import torch


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_smoke(tmp_path, run_smoke):
    saved = tmp_path / "before.pt"
    run_smoke("probe_decode_bits.py", "save", str(saved), "--smoke")
    done = run_smoke("probe_decode_bits.py", "compare", str(saved), "--out", str(tmp_path / "same"), "--smoke")
    rows = list(csv.DictReader((tmp_path / "same" / "probe_decode_bits.csv").open()))
    assert len(rows) == 10 and all(r["equal_requests"] == r["requests"] and not r["changed_lengths"] for r in rows)
    assert {r["plan"] for r in rows} == {"auto", "fine 1 block", "fine 1 node", "coarse 1 node", "coarse 4 nodes"}
    assert all(r["env_torch"] and r["saved_commit"] == r["env_gdn_lab_commit"] for r in rows)
    assert "kept every bit" in done.stdout

    # One element of one request moved by one ulp in the saved file: found, and only there.
    data = torch.load(saved, weights_only=False)
    key = next(k for k in data["cases"] if k[-1] == "fine 1 node")
    out, lens = data["cases"][key]
    out.view(torch.int16)[3, 1, 2] += 1  # bf16: the next representable value
    torch.save(data, saved)
    run_smoke("probe_decode_bits.py", "compare", str(saved), "--out", str(tmp_path / "moved"), "--smoke", returncode=1)
    rows = list(csv.DictReader((tmp_path / "moved" / "probe_decode_bits.csv").open()))
    changed = [r for r in rows if r["changed_lengths"]]
    assert len(changed) == 1 and changed[0]["plan"] == "fine 1 node" and changed[0]["page_size"] == str(key[4])
    assert changed[0]["changed_lengths"] == str(lens[3]) and int(changed[0]["equal_requests"]) == len(lens) - 1

    # A file of another configuration is refused before anything runs.
    data["smoke"] = False
    torch.save(data, saved)
    done = run_smoke(
        "probe_decode_bits.py", "compare", str(saved), "--out", str(tmp_path / "x"), "--smoke", returncode=2
    )
    assert "another probe" in done.stderr and not (tmp_path / "x").exists()
