import json
import os
import subprocess
import sys

import pytest

from gdn_lab.cli import main


@pytest.fixture(autouse=True)
def _restore_triton_interpret(monkeypatch):
    """`env` sets TRITON_INTERPRET=1 on the CPU when it is unset: undo it after each test, so the
    process keeps one interpreter mode (a GPU machine's tests run without it)."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)


def test_help_explains_itself():
    out = subprocess.run([sys.executable, "-m", "gdn_lab.cli", "--help"], capture_output=True, text=True, check=True)
    text = " ".join(out.stdout.split())
    assert "same bits whatever it is batched with" in text and "env" in text


def test_env_json_has_the_fingerprint_and_every_op(capsys):
    assert main(["env", "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fingerprint"]["arch"] == "cpu"
    ops = {r["op"] for r in data["backends"]}
    assert {"decode_attention", "prefill_attention", "gdn_decode", "gdn_prefill", "gdn_layer_prefill"} <= ops
    assert all(r["reason"] for r in data["backends"])


def test_env_table(capsys):
    assert main(["env", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "decode_attention" in out
    assert "* torch" in out or "* triton" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: gdn-lab" in capsys.readouterr().out


def _env_json(**environ: str | None) -> dict:
    """`gdn-lab env --device cpu --json` in a fresh process, with these variables set (None: unset)."""
    env = dict(os.environ)
    for k, v in environ.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    done = subprocess.run(
        [sys.executable, "-m", "gdn_lab.cli", "env", "--device", "cpu", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout)


def test_env_on_the_cpu_reports_triton_as_run_and_invariance_run_it():
    """Without TRITON_INTERPRET, env applies the default `run` and `invariance` apply on the CPU
    (TRITON_INTERPRET=1), says so, and reports the same backends as a process that has it set."""
    unset = _env_json(TRITON_INTERPRET=None)
    fp = unset["fingerprint"]
    assert fp["triton_interpret"] is True
    assert "set by gdn-lab on the CPU" in unset["notes"]["triton_interpret"]
    if fp["triton"] is not None:
        assert fp["triton_mode"] == "interpreter"
        triton_rows = [r for r in unset["backends"] if r["library"] == "gdn_lab-triton"]
        assert triton_rows and all(r["available"] for r in triton_rows)
    as_run = _env_json(TRITON_INTERPRET="1")  # what `gdn-lab run`'s kernels and `invariance` get
    assert as_run["notes"]["triton_interpret"] == "TRITON_INTERPRET=1 from the environment"

    def states(data):
        return [(r["op"], r["backend"], r["available"], r["covered"], r["chosen"]) for r in data["backends"]]

    assert states(unset) == states(as_run)


def test_env_keeps_an_explicit_setting_and_says_where_it_came_from(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert main(["env", "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fingerprint"]["triton_interpret"] is False and data["fingerprint"]["triton_mode"] is None
    assert "TRITON_INTERPRET=0 from the environment" in data["notes"]["triton_interpret"]
    rows = {(r["op"], r["backend"]): r for r in data["backends"]}
    triton = rows[("decode_attention", "triton")]
    # no interpreter: Triton cannot run a CPU call (unavailable on a CPU machine; on a GPU machine
    # available, but the call on the CPU is not covered)
    assert not (triton["available"] and triton["covered"]), triton


def test_env_labels_aiters_arch_as_the_default_emulation(capsys):
    from gdn_lab import aiter

    assert main(["env", "--device", "cpu"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  aiter_")}
    if not aiter.probe().installed:
        assert "None" in lines["aiter_arch"] and "aiter is not installed" in lines["aiter_arch"]
    elif not aiter.on_rocm():
        assert "gfx950  (default emulation off ROCm" in lines["aiter_arch"]
        with aiter.emulate("gfx942"):
            assert main(["env", "--device", "cpu"]) == 0
        inside = capsys.readouterr().out
        assert "gfx942  (set by an active aiter.emulate() block)" in inside


def test_commands_leave_the_iri_grammar_unimported(tmp_path):
    """A command's process never builds rfc3987_syntax's grammar (seconds on import), and notebooks
    still read and validate; a module imported before is left as it is."""
    nb = tmp_path / "a.ipynb"
    script = f"""
import sys
from gdn_lab.cli import skip_iri_grammar
skip_iri_grammar()
import jsonschema, nbformat
nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), {str(nb)!r})
nbformat.validate(nbformat.read({str(nb)!r}, as_version=4))
print(sys.modules["rfc3987_syntax"] is None)
sys.modules["rfc3987_syntax"] = "already imported"
skip_iri_grammar()
print(sys.modules["rfc3987_syntax"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "already", "imported"]
