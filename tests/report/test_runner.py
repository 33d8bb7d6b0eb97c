"""The suite runner: bad input is rejected with the valid names before anything runs; a failing
notebook does not stop the others; index.html and summary.json are written after every notebook."""

import json
import tarfile

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from gdn_lab import cli
from gdn_lab.report import runner
from gdn_lab.report.runner import NotebookResult, RunError, run_suite


def write_notebook(path, body):
    params = new_code_cell(
        'preset = "x"  # the preset\ndevice = "cpu"  # where\nseed = 0  # seed\nout_dir = "out"  # tables\nvalue = 1  # a number'
    )
    params.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[params, new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


OK_BODY = (
    "import pandas as pd\n"
    "from gdn_lab.report.io import write_headline, write_table\n"
    "write_table(pd.DataFrame({'value': [value]}), out_dir, 'numbers')\n"
    "write_headline(out_dir, 'nb', f'value is {value}')\n"
    "print('TRITON_INTERPRET', __import__('os').environ.get('TRITON_INTERPRET'))"
)


@pytest.fixture
def suite(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_notebook(nbs / "01_first.ipynb", OK_BODY)
    write_notebook(nbs / "02_broken.ipynb", "raise ValueError('planted failure')")
    write_notebook(nbs / "03_last.ipynb", OK_BODY)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(
        "description: test\nparameters:\n  device: cpu\n  value: 5\nnotebooks:\n  03_last:\n    value: 7\n"
    )
    return nbs, preset


def test_failing_notebook_does_not_stop_the_others(suite, tmp_path, monkeypatch, capsys):
    nbs, preset = suite
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    out = tmp_path / "run"
    code = cli.main(
        ["run", "--preset", str(preset), "--out", str(out), "-p", "seed=3", "--archive", str(tmp_path / "run.tar.gz")]
    )
    assert code == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == f"{out}/index.html"
    assert "1 of 3 notebooks failed: 02_broken" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    status = {nb["name"]: nb["status"] for nb in summary["notebooks"]}
    assert status == {"01_first": "ok", "02_broken": "failed", "03_last": "ok"} and summary["ok"] is False
    broken = next(nb for nb in summary["notebooks"] if nb["name"] == "02_broken")
    assert "ValueError: planted failure" in broken["error"]
    last = next(nb for nb in summary["notebooks"] if nb["name"] == "03_last")
    assert last["headline"] == "value is 7" and last["parameters"]["seed"] == 3
    assert last["parameters"]["out_dir"] == str(out / "03_last")
    assert last["files"]["tables"] == ["03_last/numbers.csv"]
    for name in ("01_first", "02_broken", "03_last"):
        assert (out / f"{name}.ipynb").exists() and (out / f"{name}.html").exists()
    executed = nbformat.read(str(out / "01_first.ipynb"), as_version=4)
    assert executed.metadata.papermill["parameters"]["value"] == 5
    assert "TRITON_INTERPRET 1" in "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    page = (out / "01_first.html").read_text()
    assert "gdn-code-toggle" in page and "require.min.js" not in page and 'class="gdn-hide-code' in page
    index = (out / "index.html").read_text()
    assert "planted failure" in index and "value is 5" in index and 'href="03_last.html"' in index
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        names = tar.getnames()
    assert "run/index.html" in names and "run/03_last/numbers.csv" in names


def test_all_ok_exits_zero(suite, tmp_path, monkeypatch, capsys):
    nbs, preset = suite
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    stale = tmp_path / "r" / "03_last" / "old.csv"
    stale.parent.mkdir(parents=True)
    stale.write_text("a\n1\n")
    assert cli.main(["run", "--preset", str(preset), "--only", "03", "--out", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [nb["name"] for nb in summary["notebooks"]] == ["03_last"] and summary["ok"]
    assert not stale.exists() and summary["notebooks"][0]["files"]["tables"] == ["03_last/numbers.csv"]
    # the rest of the suite in a second call, into the same directory: one index for both
    assert cli.main(["run", "--preset", str(preset), "--only", "01", "--out", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [(nb["name"], nb["status"]) for nb in summary["notebooks"]] == [("01_first", "ok"), ("03_last", "ok")]
    assert "value is 7" in (tmp_path / "r" / "index.html").read_text()
    assert oct((tmp_path / "r" / "index.html").stat().st_mode & 0o777) != oct(0o600), "readable by colleagues"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "no-such-preset"], "preset: 'no-such-preset' is not known; accepted: "),
        (
            ["--preset", "cpu-smoke", "--only", "99_nothing"],
            "--only: '99_nothing' is not a notebook of the suite; accepted: 00_environment_and_routing",
        ),
        (
            ["--preset", "cpu-smoke", "-p", "no_such_param=1"],
            "-p: no_such_param not declared by the selected notebooks; accepted: ",
        ),
        (["--preset", "cpu-smoke", "-p", "seed"], "-p: expected KEY=VALUE"),
        (["--preset", "cpu-smoke", "--only", "02", "-p", "ops=[gdn_decode]"], "-p: ops not declared"),
        (["--preset", "cpu-smoke", "--only", "0"], "matches several notebooks"),
    ],
)
def test_bad_input_is_rejected_with_the_valid_names(args, message, tmp_path, capsys):
    out = tmp_path / "never"
    assert cli.main(["run", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists(), "nothing runs, nothing is written"


def test_unknown_preset_lists_the_presets(capsys):
    assert cli.main(["run", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    for name in ("cpu-smoke", "h200", "mi350x", "mi308x"):
        assert name in err


def test_preset_entries_are_checked_against_the_notebooks(suite, tmp_path):
    nbs, _ = suite
    bad_nb = tmp_path / "bad_nb.yaml"
    bad_nb.write_text("notebooks:\n  05_missing: {}\n")
    with pytest.raises(RunError, match="05_missing are not in the suite; accepted: 01_first, 02_broken, 03_last"):
        run_suite(str(bad_nb), notebook_dir=nbs, out=tmp_path / "x")
    bad_param = tmp_path / "bad_param.yaml"
    bad_param.write_text("notebooks:\n  01_first: {colour: red}\n")
    with pytest.raises(RunError, match="colour not declared; accepted: preset, device, seed, out_dir, value"):
        run_suite(str(bad_param), notebook_dir=nbs, out=tmp_path / "x")
    bad_top = tmp_path / "bad_top.yaml"
    bad_top.write_text("paramaters: {}\n")
    with pytest.raises(RunError, match="unknown top-level keys"):
        run_suite(str(bad_top), notebook_dir=nbs, out=tmp_path / "x")


def test_interrupted_run_keeps_what_finished(suite, tmp_path, monkeypatch):
    nbs, preset = suite
    calls = []

    def fake(nb, out, log):
        calls.append(nb.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return NotebookResult(nb.name, status="ok", duration_s=0.1, headline="done")

    monkeypatch.setattr(runner, "run_notebook", fake)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_suite(str(preset), notebook_dir=nbs, out=out)
    summary = json.loads((out / "summary.json").read_text())
    assert [nb["status"] for nb in summary["notebooks"]] == ["ok", "interrupted", "not run"]
    assert "done" in (out / "index.html").read_text()


def test_every_preset_is_consistent_with_the_notebooks(tmp_path):
    from gdn_lab.report import presets

    names = presets.available()
    assert {"cpu-smoke", "h200", "mi350x", "mi308x"} <= set(names)
    notebooks = runner.discover()
    for name in names:
        plans = runner.plan(presets.load(name), notebooks, list(notebooks), {}, tmp_path)
        assert [p.name for p in plans] == list(notebooks)
        for p in plans:
            assert p.parameters["preset"] == name and p.parameters["out_dir"] == str(tmp_path / p.name)
