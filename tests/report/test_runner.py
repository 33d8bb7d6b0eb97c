"""The suite runner: a failing notebook does not stop the others; index.html and summary.json say
what ran, from which run; --only and --resume add to one directory honestly."""

import json
import tarfile
import threading

import nbformat
import pytest

from gdn_lab import cli
from gdn_lab.report import runner
from gdn_lab.report.runner import NotebookResult, RunError, run_suite


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
    assert "1 of 3 notebooks failed: 02_broken (failed)" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    status = {nb["name"]: nb["status"] for nb in summary["notebooks"]}
    assert status == {"01_first": "ok", "02_broken": "failed", "03_last": "ok"} and summary["ok"] is False
    assert summary["state"] == "complete" and summary["run"]["finished"]
    broken = next(nb for nb in summary["notebooks"] if nb["name"] == "02_broken")
    assert "ValueError: planted failure" in broken["error"]
    last = next(nb for nb in summary["notebooks"] if nb["name"] == "03_last")
    assert last["headline"] == "value is 7" and last["parameters"]["seed"] == 3
    assert last["parameters"]["out_dir"] == str(out / "03_last")
    assert last["parameters"]["sizes"] is None, "an explicit null from the preset is a value, injected as None"
    assert last["files"]["tables"] == ["03_last/numbers.csv"] and not last["files"]["partial"]
    # A quiet kernel leaves no log. libzmq's context teardown can abort a kernel at its exit, after
    # the notebook's results are in ("Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)":
    # poll reports a hang-up, zeromq/libzmq#3715; seen once in CI): that line is the kernel's own,
    # rightly kept and linked. Anything else in the log fails.
    log = out / "03_last" / "kernel.log"
    said = log.read_text().splitlines() if log.exists() else []
    assert all(line.startswith("Assertion failed: ") and "(src/signaler.cpp:" in line for line in said), said
    assert last["files"]["kernel_log"] == ("03_last/kernel.log" if said else None)
    for name in ("01_first", "02_broken", "03_last"):
        assert (out / f"{name}.ipynb").exists() and (out / f"{name}.html").exists()
    executed = nbformat.read(str(out / "01_first.ipynb"), as_version=4)
    assert executed.metadata.papermill["parameters"]["value"] == 5
    assert "TRITON_INTERPRET 1" in "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    page = (out / "01_first.html").read_text()
    assert "gdn-code-toggle" in page and "require.min.js" not in page and 'class="gdn-hide-code' in page
    assert page.index("value is 5") < page.index('<div class="jp-Cell'), "the headline sits on top of the report"
    index = (out / "index.html").read_text()
    assert "planted failure" in index and "value is 5" in index and 'href="03_last.html"' in index
    assert "1 of 3 notebooks are not ok: 02_broken" in index, "the index starts with the overall verdict"
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        names = tar.getnames()
    assert "run/index.html" in names and "run/03_last/numbers.csv" in names


def test_the_kernel_process_writes_its_own_output_to_the_notebooks_kernel_log(tmp_path, tiny_config, notebook, capfd):
    """What ipykernel itself prints (fd 2, outside any cell's capture) goes to <name>/kernel.log,
    linked from the index, not into the run's log."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    notebook.write(nbs / "01_first.ipynb", "import os\nos.write(2, b'said by the kernel process\\n')", notebook.ok)
    preset = tmp_path / "tiny.yaml"
    preset.write_text("parameters:\n  device: cpu\n  value: 2\n")
    out = tmp_path / "run"
    summary = run_suite(str(preset), out=out, notebook_dir=nbs)
    assert [nb.status for nb in summary.this_run()] == ["ok"]
    assert "said by the kernel process" not in capfd.readouterr().err
    assert "said by the kernel process" in (out / "01_first" / "kernel.log").read_text()
    assert summary.this_run()[0].files["kernel_log"] == "01_first/kernel.log"
    assert 'href="01_first/kernel.log">kernel log</a>' in (out / "index.html").read_text()


def test_parameters_injected_are_exactly_the_ones_that_ran(suite, tmp_path, monkeypatch):
    """The executed notebook's injected cell and papermill metadata hold the values the Config got."""
    nbs, preset = suite
    out = tmp_path / "run"
    summary = run_suite(str(preset), only=["01"], out=out, notebook_dir=nbs, overrides=["label=null"])
    assert [nb.status for nb in summary.this_run()] == ["ok"]
    seen = json.loads((out / "01_first" / "config.json").read_text())
    executed = nbformat.read(str(out / "01_first.ipynb"), as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1
    namespace: dict = {}
    exec(injected[0].source, namespace)  # the cell holds literals only
    cell = {k: v for k, v in namespace.items() if not k.startswith("__")}
    ran = {"preset": seen["preset"], "out_dir": seen["out_dir"], **seen["parameters"]}
    assert cell == ran == executed.metadata.papermill["parameters"] == summary.this_run()[0].parameters
    assert ran["label"] is None and ran["sizes"] is None and ran["value"] == 5 and ran["device"] == "cpu"
    assert set(seen["parameters"]) == {"seed", "device", "dtype", "value", "label", "sizes"}


def test_only_into_an_existing_directory_reports_the_selected_notebooks(suite, tmp_path, monkeypatch, capsys):
    nbs, preset = suite
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    out = tmp_path / "r"
    assert cli.main(["run", "--preset", str(preset), "--out", str(out)]) == 1  # 02 fails
    stale = out / "03_last" / "old.csv"
    stale.write_text("a\n1\n")
    capsys.readouterr()
    assert cli.main(["run", "--preset", str(preset), "--only", "03", "--out", str(out)]) == 0
    assert "failed" not in capsys.readouterr().err, "02's earlier failure is not this run's"
    summary = json.loads((out / "summary.json").read_text())
    assert [nb["name"] for nb in summary["notebooks"]] == ["01_first", "02_broken", "03_last"]
    assert summary["selected"] == ["03_last"] and len(summary["runs"]) == 2
    runs = {nb["name"]: nb["run_id"] for nb in summary["notebooks"]}
    assert runs["03_last"] == summary["run"]["id"] != runs["01_first"] == runs["02_broken"]
    assert not stale.exists() and summary["notebooks"][2]["files"]["tables"] == ["03_last/numbers.csv"]
    index = (out / "index.html").read_text()
    assert index.count("from another run") == 2 and "the notebooks come from 2 runs" in index
    assert oct((out / "index.html").stat().st_mode & 0o777) != oct(0o600), "readable by colleagues"


def test_resume_skips_what_is_ok_with_the_same_parameters_and_says_so(suite, tmp_path, monkeypatch, capsys):
    nbs, preset = suite
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    out = tmp_path / "r"
    assert cli.main(["run", "--preset", str(preset), "--only", "01", "03", "--out", str(out)]) == 0
    capsys.readouterr()
    first = json.loads((out / "summary.json").read_text())
    assert cli.main(["run", "--resume", str(out), "--only", "01", "03"]) == 0
    err = capsys.readouterr().err
    assert "01_first: skipped: ok in this directory" in err and "03_last: skipped" in err
    again = json.loads((out / "summary.json").read_text())
    assert [nb["run_id"] for nb in again["notebooks"]] == [nb["run_id"] for nb in first["notebooks"]]
    assert (out / "01_first.ipynb").read_bytes(), "the skipped notebook's files are kept"
    # a changed parameter reruns the notebooks that have it, and only those
    assert cli.main(["run", "--resume", str(out), "--only", "01", "03", "-p", "seed=4"]) == 0
    err = capsys.readouterr().err
    assert "01_first (rerun: parameters changed: seed)" in err and "03_last (rerun: parameters changed: seed)" in err
    # resuming reruns a notebook that failed
    assert cli.main(["run", "--resume", str(out)]) == 1
    err = capsys.readouterr().err
    assert "[2/3] 02_broken\n" in err and "01_first: skipped" in err and "03_last: skipped" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resume", "{tmp}/nothing-here"], "--resume: {tmp}/nothing-here holds no run to resume"),
        (["--preset", "{preset}", "--resume", "{tmp}/r", "--out", "{tmp}/other"], "--resume {tmp}/r and --out"),
    ],
)
def test_resume_bad_input(args, message, suite, tmp_path, capsys):
    _, preset = suite
    fill = {"tmp": str(tmp_path), "preset": str(preset)}
    assert cli.main(["run", *[a.format(**fill) for a in args]]) == 2
    assert message.format(**fill) in capsys.readouterr().err


def test_a_directory_of_another_preset_is_refused(suite, tmp_path, monkeypatch, capsys):
    nbs, preset = suite
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    out = tmp_path / "r"
    assert cli.main(["run", "--preset", str(preset), "--only", "03", "--out", str(out)]) == 0
    other = tmp_path / "other.yaml"
    other.write_text(preset.read_text())
    assert cli.main(["run", "--preset", str(other), "--only", "03", "--out", str(out)]) == 2
    assert f"holds a run of preset '{preset}'" in capsys.readouterr().err


def test_preset_entries_are_checked_against_the_notebooks(suite, tmp_path):
    nbs, _ = suite
    cases = {
        "notebooks:\n  05_missing: {value: 1}\n": "05_missing are not in the suite; accepted: 01_first, 02_broken, 03_last",
        "notebooks:\n  01_first: {colour: red}\n": "colour not parameters of 01_first; accepted: device, dtype, label",
        "notebooks:\n  01_first: {label: y}\n": "the notebook fixes label = 'x' in its parameters cell",
        "parameters: {colour: red}\n": "parameters: colour not declared by any notebook of the suite",
        "paramaters: {}\n": "unknown top-level keys",
        "longest_first: [05_missing]\nparameters: {value: 1}\n": "longest_first 05_missing are not in the suite",
        "longest_first: 01_first\nparameters: {value: 1}\n": "longest_first must be a list of notebook names",
        "longest_first: [01_first, 01_first]\nparameters: {value: 1}\n": "longest_first names a notebook twice",
        "parameters: {value: 0}\n": "01_first: value: expected a positive number, got 0 (value=0 from preset",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        with pytest.raises(RunError) as err:
            run_suite(str(path), notebook_dir=nbs, out=tmp_path / "x")
        assert message in str(err.value), (text, str(err.value))
    assert not (tmp_path / "x").exists()


def test_a_notebook_without_a_config_is_refused_before_anything_runs(tiny_config, notebook, tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    notebook.write(nbs / "01_plain.ipynb", notebook.ok, config=None)
    notebook.write(nbs / "02_wrong.ipynb", notebook.ok, config="tiny_config:Nope")
    notebook.write(nbs / "03_cell.ipynb", notebook.ok, params='preset = "x"  # p\nout_dir = "o"  # o\nvalue = 1  # v')
    preset = tmp_path / "p.yaml"
    preset.write_text("parameters: {value: 2}\n")
    for only, message in (
        ("01", "01_plain: the notebook names no parameter schema: set its metadata gdn_lab.config"),
        ("02", "02_wrong: metadata gdn_lab.config: 'tiny_config:Nope' does not import"),
        ("03", "03_cell: its parameters must be preset, out_dir and the fields of tiny_config:TinyConfig; missing"),
    ):
        with pytest.raises(RunError, match=message):
            run_suite(str(preset), notebook_dir=nbs, only=[only], out=tmp_path / "x")


def test_interrupted_run_keeps_what_finished(suite, tmp_path, monkeypatch):
    nbs, preset = suite
    calls = []

    def fake(nb, out, log, result=None, kernel_dir=None, **_):
        calls.append(nb.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        result.status, result.duration_s, result.headline = "ok", 0.1, "done"
        return result

    monkeypatch.setattr(runner, "run_notebook", fake)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_suite(str(preset), notebook_dir=nbs, out=out)
    summary = json.loads((out / "summary.json").read_text())
    assert [nb["status"] for nb in summary["notebooks"]] == ["ok", "interrupted", "not run"]
    assert summary["state"] == "interrupted"
    index = (out / "index.html").read_text()
    assert "done" in index and "INTERRUPTED" in index


def test_every_preset_is_consistent_with_the_notebooks(tmp_path):
    """Every preset resolves into every notebook's Config (GPU presets checked with device=cpu here)."""
    from gdn_lab.report import presets

    names = presets.available()
    assert {"cpu-smoke", "h200", "mi350x", "mi308x"} <= set(names)
    notebooks = runner.discover()
    for name in names:
        p = presets.load(name)
        overrides = {} if p.parameters.get("device") == "cpu" else {"device": "cpu"}
        plans = runner.plan(p, notebooks, list(notebooks), overrides, tmp_path)
        assert [pl.name for pl in plans] == list(notebooks)
        for pl in plans:
            assert pl.parameters["preset"] == name and pl.parameters["out_dir"] == str(tmp_path / pl.name)
            assert pl.parameters == {"preset": name, "out_dir": str(tmp_path / pl.name), **pl.config.plain()}


def test_notebook_result_reads_older_summaries():
    old = {"name": "x", "status": "ok", "duration_s": 1.0, "headline": "h", "parameters": {}, "files": {}, "gone": 1}
    assert NotebookResult.from_dict(old).headline == "h"


STAMP = (
    "import json, pathlib, time\n"
    "start = time.time(); time.sleep(2.0)\n"
    "pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)\n"
    "pathlib.Path(out_dir, 'span.json').write_text(json.dumps([start, time.time()]))"
)


@pytest.mark.slow
def test_jobs_run_notebooks_side_by_side(tmp_path, tiny_config, notebook, monkeypatch, capsys):
    """--jobs 2: two kernels at once (their busy spans overlap), the same statuses and tables as one
    at a time, and every progress line whole."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    for name in ("01_a", "02_b", "03_c"):
        notebook.write(nbs / f"{name}.ipynb", STAMP, notebook.ok)
    preset = tmp_path / "tiny.yaml"
    preset.write_text("parameters:\n  device: cpu\n  value: 4\n")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbs)
    out = tmp_path / "run"
    assert cli.main(["run", "--preset", str(preset), "--out", str(out), "--jobs", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sorted(line for line in err if line.startswith("[")) == ["[1/3] 01_a", "[2/3] 02_b", "[3/3] 03_c"]
    assert sorted(line.split(":")[0] for line in err if line.startswith("  ")) == ["  01_a", "  02_b", "  03_c"]
    spans = {n: json.loads((out / n / "span.json").read_text()) for n in ("01_a", "02_b", "03_c")}
    (a0, a1), (b0, b1) = spans["01_a"], spans["02_b"]
    assert a0 < b1 and b0 < a1, f"01 and 02 did not run at the same time: {spans}"
    summary = json.loads((out / "summary.json").read_text())
    assert [nb["status"] for nb in summary["notebooks"]] == ["ok", "ok", "ok"] and summary["state"] == "complete"
    assert all(nb["headline"] == "value is 4" for nb in summary["notebooks"])


def test_jobs_start_the_presets_longest_notebooks_first(suite, tmp_path, monkeypatch):
    """--jobs 2 starts the preset's longest_first in its order, then the rest in file order; the
    summary still lists the notebooks in file order."""
    nbs, preset = suite
    assert runner.start_order(["01_first", "02_broken", "03_last"], ["03_last"]) == ["03_last", "01_first", "02_broken"]
    assert runner.start_order(["01_first", "02_broken"], []) == ["01_first", "02_broken"]
    started = []
    both_started = threading.Barrier(2, timeout=30)

    def fake(nb, out, log, result=None, kernel_dir=None, **_):
        started.append(nb.name)
        if len(started) <= 2:  # the first two run together: the third starts only after one ends
            both_started.wait()
        result.status, result.duration_s = "ok", 0.1
        return result

    monkeypatch.setattr(runner, "run_notebook", fake)
    first = tmp_path / "first.yaml"
    first.write_text(preset.read_text() + "longest_first: [03_last, 02_broken]\n")
    summary = run_suite(str(first), notebook_dir=nbs, out=tmp_path / "run", jobs=2)
    assert set(started[:2]) == {"03_last", "02_broken"} and started[2] == "01_first"
    assert [nb.name for nb in summary.notebooks] == ["01_first", "02_broken", "03_last"]


def test_cpu_kernels_let_idle_openmp_threads_sleep(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert runner.kernel_env("cpu")["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in runner.kernel_env("cuda")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert runner.kernel_env("cpu")["OMP_WAIT_POLICY"] == "ACTIVE", "the runner's own setting wins"


@pytest.mark.parametrize(("cores", "want"), [(1, 1), (2, 2), (16, runner.DEFAULT_JOBS)])
def test_the_default_jobs_are_at_most_the_cores(cores, want, monkeypatch):
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert runner.default_jobs() == want


def test_run_without_jobs_takes_the_default(tmp_path, monkeypatch):
    """`gdn-lab run` without --jobs runs `default_jobs()` notebooks at once; --jobs N overrides it."""
    seen = []

    def run_suite(preset, jobs, **kwargs):
        seen.append(jobs)
        raise runner.RunError("stopped by the test")

    monkeypatch.setattr(runner, "default_jobs", lambda: 5)
    monkeypatch.setattr(runner, "run_suite", run_suite)
    for extra in ([], ["--jobs", "1"]):
        assert cli.main(["run", "--preset", "cpu-smoke", "--out", str(tmp_path / "r"), *extra]) == 2
    assert seen == [5, 1]


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_jobs_must_be_positive(jobs, suite, tmp_path, capsys):
    nbs, preset = suite
    out = tmp_path / "never"
    assert cli.main(["run", "--preset", str(preset), "--out", str(out), "--jobs", jobs]) == 2
    assert f"--jobs: expected an int >= 1, got {jobs}" in capsys.readouterr().err
    assert not out.exists()
