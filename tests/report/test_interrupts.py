"""Real interruptions of `gdn-lab run` in a subprocess: Ctrl-C (SIGINT to its process group, as a
terminal sends it) and SIGKILL. Either way the run directory says what happened, the partial
executed notebook is a whole file, and `--resume` finishes the run."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import nbformat
import pytest

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)"
PID = "import os, pathlib\npathlib.Path(out_dir, 'kernel.pid').parent.mkdir(parents=True, exist_ok=True)\npathlib.Path(out_dir, 'kernel.pid').write_text(str(os.getpid()))"


def start(nbs, preset, out, *extra):
    # SIGINT handled as in a terminal's foreground job, even where this test runs in the background
    # (a shell without job control starts background jobs with SIGINT ignored, and they inherit it)
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "import sys; from pathlib import Path; from gdn_lab.report import runner; "
        f"runner.NOTEBOOK_DIR = Path({str(nbs)!r}); from gdn_lab.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [sys.executable, "-c", code, "run", "--preset", str(preset), "--out", str(out), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_until_sleeping(out, name, proc, timeout=120):
    """Until the executed notebook shows the pid cell done (papermill saves after each cell): the sleeper runs."""
    path = out / f"{name}.ipynb"
    deadline = time.monotonic() + timeout
    reads = 0
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if path.exists():
            nb = nbformat.reads(path.read_text(), as_version=4)  # never half a file: written atomically
            reads += 1
            pid_cell = [c for c in nb.cells if c.source == PID]
            if (out / name / "kernel.pid").exists() and pid_cell and pid_cell[0].get("execution_count"):
                time.sleep(1.0)  # the sleeper has started
                return int((out / name / "kernel.pid").read_text()), reads
        time.sleep(0.2)
    raise AssertionError(f"{name} never reached its sleeping cell")


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def wait_dead(pid, timeout=20):
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


@pytest.fixture
def sleepy(tmp_path, tiny_config, notebook):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    notebook.write(nbs / "01_first.ipynb", notebook.ok)
    notebook.write(nbs / "02_sleepy.ipynb", PID, SLEEPER)
    notebook.write(nbs / "03_last.ipynb", notebook.ok)
    preset = tmp_path / "tiny.yaml"
    preset.write_text("parameters:\n  device: cpu\n  value: 2\n")
    return nbs, preset


def wait_until_ok(out, name, proc, timeout=120):
    """Until summary.json says notebook `name` is ok."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        done = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        if any(nb["name"] == name and nb["status"] == "ok" for nb in done.get("notebooks", [])):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never finished")


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_prints_one_line_exits_130_and_stops_the_kernel(sleepy, tmp_path, jobs):
    """With --jobs 2, 01 and 02 start together and 03 runs beside the sleeping 02: Ctrl-C after 03
    finished leaves it ok."""
    nbs, preset = sleepy
    out = tmp_path / "run"
    proc = start(nbs, preset, out, "--jobs", jobs)
    kernel, _ = wait_until_sleeping(out, "02_sleepy", proc)
    if jobs == "2":
        wait_until_ok(out, "03_last", proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    progress = re.compile(r"gdn-lab run: preset|\[\d/3\] |  (\d\d_\w+: )?ok in ")
    lines = [line for line in err.splitlines() if not progress.match(line)]
    assert lines == [f"gdn-lab run: interrupted; what finished is in {out}/index.html"], err
    assert wait_dead(kernel), "the kernel is stopped with the run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted"
    want = ["ok", "interrupted", "not run"] if jobs == "1" else ["ok", "interrupted", "ok"]
    assert [nb["status"] for nb in summary["notebooks"]] == want
    page = out / "02_sleepy.html"
    assert not page.exists() or "DeadKernelError" not in page.read_text(), "the report says interrupted"
    assert summary["notebooks"][1]["files"]["partial"] and "notebook (partial)" in (out / "index.html").read_text()


@pytest.mark.slow
def test_sigkill_leaves_an_incomplete_index_with_the_partial_notebook_and_resume_finishes(sleepy, tmp_path, notebook):
    nbs, preset = sleepy
    out = tmp_path / "run"
    proc = start(nbs, preset, out, "--jobs", "1")  # 03 not yet started when 02 is killed
    kernel, reads = wait_until_sleeping(out, "02_sleepy", proc)
    assert reads > 0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    try:
        assert wait_dead(kernel), "ipykernel exits once its parent is gone"
    finally:
        if alive(kernel):  # do not leave it behind if it did not
            os.kill(kernel, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "running" and summary["finished"] is None
    assert [nb["status"] for nb in summary["notebooks"]] == ["ok", "running", "not run"]
    index = (out / "index.html").read_text()
    assert "INCOMPLETE" in index and "or it was killed" in index
    assert 'href="02_sleepy.ipynb">notebook (partial)</a>' in index
    partial = nbformat.read(str(out / "02_sleepy.ipynb"), as_version=4)  # a whole notebook
    assert partial.cells[-1].source == SLEEPER
    # resume: 01 is kept (ok, same parameters and code), the killed 02 (made quick) and 03 run
    notebook.write(nbs / "02_sleepy.ipynb", notebook.ok)
    again = start(nbs, preset, out, "--resume", str(out))
    _, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    assert "01_first: skipped" in err and "02_sleepy (rerun: it was incomplete)" in err
    for noise in ("[IPKernelApp]", "KeyboardInterrupt caught in kernel", "without encryption", "Traceback"):
        assert noise not in err, err  # a normal run is quiet
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "complete" and [nb["status"] for nb in summary["notebooks"]] == ["ok"] * 3
    assert len(summary["runs"]) == 2 and "INCOMPLETE" not in (out / "index.html").read_text()
