"""`gdn-lab invariance`: the table on stdout, JSON lines with --json, the exit status says invariant or not."""

import json

from gdn_lab import cli


def test_json_lines_one_per_row(capsys):
    code = cli.main(
        ["invariance", "--op", "gdn_decode", "--backend", "torch", "--device", "cpu", "--batch-sizes", "2,3", "--json"]
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    assert len(torch_rows) == 4 and all(r["bitwise_equal"] for r in torch_rows)  # out and state, 2 batch sizes
    assert {r["tensor"] for r in torch_rows} == {"out", "state"}
    assert all(r["target_len"] == 1 and r["seed"] == 0 for r in torch_rows)


def test_table_and_summary(capsys):
    code = cli.main(
        ["invariance", "--op", "decode_attention", "--backend", "torch-partitioned", "--device", "cpu",
         "--targets", "3,257", "--batch-sizes", "2", "--max-context", "16", "--seed", "5"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "torch-partitioned" in out and "invariant" in out and "bitwise_equal" in out


def test_bad_input_exit_2(capsys):
    assert cli.main(["invariance", "--op", "gdn_decode", "--backend", "nope", "--device", "cpu"]) == 2
    assert "backends: 'nope' is not a backend of gdn_decode; accepted: " in capsys.readouterr().err
