"""benchmarks/bench_trace.py --smoke: the whole script on tiny models (CPU), and the CSV it writes."""

import csv
import gzip
import importlib.util
import json
from pathlib import Path

import pytest
import torch


@pytest.fixture
def bench(load_script):
    return load_script("bench_trace.py")


def test_smoke(bench, tmp_path):
    assert bench.main(["--smoke", "--out", str(tmp_path), "--reps", "2"]) == 0
    with (tmp_path / "bench_trace.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    columns = reader.fieldnames
    assert columns[: len(bench.COLUMNS)] == bench.COLUMNS
    assert {"env_torch", "env_device", "env_triton"} <= set(columns)
    shapes = {(r["batch"], r["tokens_per_request"]) for r in rows}
    assert shapes == {("1", "8"), ("4", "2")}
    hf_missing = importlib.util.find_spec("transformers") is None
    for r in rows:
        assert r["model"] in ("lab-qwen3-next-tp4", "hf-qwen3") and r["env_torch"]
        if r["status"] == "skipped":
            assert r["reason"] and (r["mode"] == "debugmode" or (r["model"] == "hf-qwen3" and hf_missing))
            continue
        assert r["status"] == "ok", r["reason"]
        assert float(r["ms"]) > 0 and int(r["reps"]) == 2 and r["grad_mode"] == "no_grad"
        if r["mode"] != "plain":
            assert float(r["ratio_vs_plain"]) > 0
        if r["mode"] in ("modules", "ops"):
            assert r["hash_impl"] == "torch" and int(r["n_entries"]) > 0 and int(r["n_tensors"]) > 0
            assert float(r["target_ratio"]) in (1.5, 3.0) and r["meets_target"] == ""  # judged on CUDA only
            with_read = (float(r["ms"]) + float(r["finalize_ms"])) / float(r["ms"]) * float(r["ratio_vs_plain"])
            assert float(r["ratio_with_read"]) == pytest.approx(with_read)
        if r["mode"].endswith("-host"):  # the recorder's host code alone: as many entries, no tensor read
            assert r["hash_impl"] == "skipped" and r["target_ratio"] == ""
            twin = next(
                t for t in rows if (t["model"], t["batch"], t["mode"]) == (r["model"], r["batch"], r["mode"][:-5])
            )
            assert r["n_entries"] == twin["n_entries"] and r["n_tensors"] == twin["n_tensors"]
    modes = {(r["model"], r["mode"]) for r in rows}
    assert ("lab-qwen3-next-tp4", "ops") in modes and ("hf-qwen3", "modules-host") in modes and len(modes) == 12


def _rows(mod, out: Path, *extra: str) -> dict:
    argv = ["--smoke", "--out", str(out), "--modes", "plain,modules,ops", "--shapes", "4x2", "--reps", "1", *extra]
    assert mod.main(argv) == 0
    with (out / "bench_trace.csv").open() as f:
        return {(r["model"], r["mode"]): r for r in csv.DictReader(f)}


def test_inference_mode_records_the_same_calls_reading_activations_at_every_call(bench, tmp_path):
    no_grad = _rows(bench, tmp_path / "no_grad")
    inference = _rows(bench, tmp_path / "inference", "--inference-mode")
    assert no_grad.keys() == inference.keys()
    for key, r in inference.items():
        assert r["grad_mode"] == "inference_mode" and r["status"] in ("ok", "skipped"), r["reason"]
        if r["status"] == "ok" and key[1] != "plain":
            twin = no_grad[key]
            assert (r["n_entries"], r["n_tensors"]) == (twin["n_entries"], twin["n_tensors"])
            # <=: tensors made outside inference mode (the weights) are still read once
            assert int(twin["n_read"]) < int(r["n_read"]) <= int(r["n_tensors"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the full run is the GPU's")
def test_without_a_gpu_the_full_run_asks_for_smoke(bench, tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "--smoke" in capsys.readouterr().err


def test_a_timeline_of_one_mode_is_written_beside_the_csv(bench, tmp_path, capsys):
    argv = ["--smoke", "--out", str(tmp_path), "--models", "lab", "--shapes", "4x2", "--modes", "plain,ops"]
    assert bench.main([*argv, "--reps", "1", "--timeline", "ops"]) == 0
    printed = capsys.readouterr().out
    assert "[timeline] lab-qwen3-next-tp4 4x2 ops: 3 forwards in" in printed
    path = tmp_path / "timeline_lab-qwen3-next-tp4_4x2_ops.json.gz"
    with gzip.open(path) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert any(str(n).startswith("aten::") for n in names)  # the forwards' own torch ops are in it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left


@pytest.mark.parametrize("option", ["--profile", "--timeline"])
def test_a_profile_or_timeline_of_a_mode_that_does_not_run_is_refused(bench, tmp_path, capsys, option):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--smoke", "--out", str(tmp_path), "--modes", "plain,modules", option, "ops"])
    assert exc.value.code == 2
    assert f"{option}: 'ops' is not among the modes run; accepted: plain, modules" in capsys.readouterr().err
    assert not (tmp_path / "bench_trace.csv").exists()
