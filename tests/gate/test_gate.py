"""The regression gate: a fingerprint rerun holds; planted changes, variance, a blind control, a
tampered file and bad files are each caught, with the exit codes `gdn-lab check` documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from gdn_lab import cli, routing
from gdn_lab.gate import golden
from gdn_lab.gate.check import check_documents, environment_differences
from gdn_lab.gate.fingerprint import GateConfig, blas_core, environment, fingerprint
from gdn_lab.ops.gdn_decode.reference import gdn_decode_torch

# FlyDSL's tuned table (the k-split control) splits K in 32 for one request and 16 for 2..32 at 4/8
GDN = {"num_k_heads": 4, "num_v_heads": 8, "head_dim": 32}
CASES = [{"op": "gdn_decode", "backends": ["torch", "test-gate"], "batch_sizes": [2, 5], "gdn": GDN}]


def _variant(**args):
    out = gdn_decode_torch(**args)
    return out + 1e-3 * (args["q"].shape[0] - 1)  # follows the batch size


def _one_ulp(**args):
    """One ulp more in the first element of every request's output: invariant still, other numerics."""
    out = gdn_decode_torch(**args)
    out[:, 0, 0] = torch.nextafter(out[:, 0, 0], torch.full_like(out[:, 0, 0], float("inf")))
    return out


def _register(run, variant_control: bool = False, name: str = "test-gate"):
    return routing.register(
        routing.Backend("gdn_decode", name, run, routing.LIBRARY_TORCH, auto=False, variant_control=variant_control)
    )


@pytest.fixture
def gate(device):
    _register(gdn_decode_torch)
    cfg = GateConfig(device=device.type, dtype="float32", cases=CASES)
    try:
        yield cfg, fingerprint(cfg, progress=False)
    finally:
        routing._REGISTRY["gdn_decode"].pop("test-gate", None)
        routing._REGISTRY["gdn_decode"].pop("test-blind", None)


def test_a_rerun_holds_and_records_what_the_issue_asks(gate):
    cfg, doc = gate
    result = check_documents(doc, fingerprint(cfg, progress=False))
    assert result.ok and result.hashes_compared and result.notes.empty
    case = next(c for c in doc["cases"] if c["backend"] == "torch" and c["tensor"] == "state")
    assert case["alone_hash"] == case["batched_hash"] and len(case["alone_hash"]) == 16
    assert case["lengths"] and case["position"] is not None and case["reproducible"] is True
    assert doc["schema"] == golden.SCHEMA and doc["environment"]["torch"] == torch.__version__
    assert all(c["control_caught"] for c in doc["cases"]), "the gate's control must be caught to begin with"


def test_one_ulp_in_one_element_is_a_numerics_change(gate):
    cfg, doc = gate
    _register(_one_ulp)
    result = check_documents(doc, fingerprint(cfg, progress=False))
    found = result.findings[result.findings.backend == "test-gate"]
    assert set(found.finding) == {"numerics changed"} and set(found.tensor) == {"out"}


def test_a_backend_that_became_batch_variant_fails(gate):
    cfg, doc = gate
    _register(_variant)
    found = check_documents(doc, fingerprint(cfg, progress=False)).findings
    assert "no longer invariant" in set(found[found.backend == "test-gate"].finding)


def test_a_control_that_is_no_longer_caught_fails(gate):
    cfg, doc = gate
    blind = routing.get("gdn_decode", "triton-ksplit-by-batch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(routing._REGISTRY["gdn_decode"], blind.name, routing.Backend(
            "gdn_decode", blind.name, gdn_decode_torch, routing.LIBRARY_TORCH, auto=False, variant_control=True
        ))  # fmt: skip
        result = check_documents(doc, fingerprint(cfg, progress=False))
    assert "control no longer caught" in set(result.findings.finding)


def test_another_environment_compares_verdicts_only(gate):
    cfg, doc = gate
    now = fingerprint(cfg, progress=False)
    now["environment"] = {**now["environment"], "torch": "0.0-elsewhere"}
    _, tampered = now, json.loads(json.dumps(doc))
    tampered["cases"][0]["alone_hash"] = "0" * 16
    result = check_documents(tampered, now)
    assert result.ok and not result.hashes_compared and "torch: " in " ".join(result.environment.values())


def test_numpys_blas_kernel_counts_for_the_triton_kernels_only():
    """Under the interpreter a tl.dot is numpy's matmul: another BLAS kernel compares the Triton
    libraries' verdicts only, and torch's CPU kernels (not numpy's) keep their hashes compared."""
    a = {"platform": "cpu", "torch": "2", "triton": "3", "blas_core": "SkylakeX"}
    b = {**a, "blas_core": "Haswell"}
    assert environment_differences(a, b, "torch") == []
    for library in ("gdn_lab-triton", "aiter-triton", "fla"):
        assert environment_differences(a, b, library) == ["blas_core: SkylakeX -> Haswell"]


def test_the_fingerprint_names_the_blas_kernel_under_the_interpreter(device):
    """The kernel OpenBLAS picked, as OPENBLAS_CORETYPE forces it in a fresh process; None off the
    interpreter (numpy computes no kernel's sums there)."""
    env = environment(device)
    if not env["triton_interpret"]:
        assert env["blas_core"] is None
        return
    if env["blas_core"] is None or env["cpu_capability"] not in ("AVX2", "AVX512"):
        pytest.skip("no OpenBLAS that names its kernel, or no AVX2 for Haswell's")
    code = "from gdn_lab.gate.fingerprint import blas_core; print(blas_core())"
    forced = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    out = subprocess.run([sys.executable, "-c", code], env=forced, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Haswell" and env["blas_core"] == blas_core()


def _preset(tmp_path, cases, device):
    path = tmp_path / "gate.yaml"
    path.write_text(
        yaml.safe_dump(
            {"description": "test gate", "gate": {"device": device.type, "dtype": "float32", "cases": cases}}
        )
    )
    return str(path)


def test_the_cli_writes_checks_and_updates(gate, tmp_path, capsys, device):
    out = tmp_path / "golden.json"
    assert cli.main(["fingerprint", "--preset", _preset(tmp_path, CASES, device), "--out", str(out), "--quiet"]) == 0
    assert cli.main(["check", "--golden", str(out), "--quiet"]) == 0
    assert "ok: every case" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    doc["cases"][0]["alone_hash"] = "f" * 16  # a tampered golden file
    out.write_text(json.dumps(doc))
    assert cli.main(["check", "--golden", str(out), "--quiet"]) == 1
    assert "numerics changed" in capsys.readouterr().out
    assert cli.main(["check", "--golden", str(out), "--quiet", "--update"]) == 0
    assert "updated" in capsys.readouterr().out and cli.main(["check", "--golden", str(out), "--quiet"]) == 0


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        (json.dumps({"kind": "something else"}), "not a gdn_lab fingerprint"),
        (json.dumps({"kind": golden.KIND, "schema": golden.SCHEMA + 1}), "newer gdn_lab"),
        (json.dumps({"kind": golden.KIND, "schema": 1}), "lacks"),
    ],
)
def test_bad_golden_files_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "golden.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["check", "--golden", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_bad_gate_presets_exit_2(tmp_path, capsys, device):
    bad = _preset(tmp_path, [{"op": "gdn_decode", "targets": [0]}], device)
    assert cli.main(["fingerprint", "--preset", bad, "--out", str(tmp_path / "x.json")]) == 2
    assert "targets: expected positive integers" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_compare_a_fingerprint_with_itself_and_a_changed_one(gate, tmp_path, capsys):
    _, doc = gate
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    golden.write(a, doc)
    assert cli.main(["compare", str(a), str(a), "--out", str(tmp_path / "same.html")]) == 0
    assert "no differences" in capsys.readouterr().out and "no differences" in (tmp_path / "same.html").read_text()
    changed = json.loads(json.dumps(doc))
    changed["cases"][0]["bitwise_equal"] = not changed["cases"][0]["bitwise_equal"]
    changed["cases"].pop()
    golden.write(b, changed)
    assert cli.main(["compare", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    assert "verdicts changed: 1" in text and "cases on one side only: 1" in text
