import json
import subprocess
import sys

from gdn_lab.cli import main


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
