"""The suite runner behind `gdn-lab run`: every notebook through papermill, into one run directory.

Layout of a run directory:

```
<out>/
  index.html, summary.json          rewritten (atomically) when the run starts, when each notebook
                                     starts and ends, and when the run ends or is interrupted
  NN_name.ipynb                      the executed notebook (papermill provenance in its metadata);
                                     rewritten atomically after every cell, so a reader never sees
                                     half a file, and a killed run leaves its partial notebook
  NN_name.html                       self-contained report, headline on top, code behind a toggle
  NN_name/                           the notebook's out_dir: CSV tables, headline.json, config.json
                                     (the Config it ran with), warnings.json (known warnings counted)
```

Everything is checked before anything runs (`plan`): the preset's structure, the notebook names
(`--only`), `--out` and `--archive`, and every parameter value: each notebook names its Config in
its metadata (`gdn_lab.report.parameters`), and the preset's and `-p` values are resolved into it
once, with every type, range and name checked. The resolved values (all of them, None included)
are what papermill injects, so the executed notebook shows exactly what ran.

A notebook that fails is recorded with its error (its partial notebook and HTML are kept) and the
others still run. A run into a directory that holds an earlier run of the same preset keeps the
earlier notebooks in its index, marked as from another run; `resume=True` also skips the notebooks
that are already ok there with the same parameters, code and environment. `jobs=N` runs N
notebooks at once, each in its own kernel. Ctrl-C stops the kernels, records the notebooks that
were running as interrupted and raises KeyboardInterrupt; a run killed outright leaves a
summary whose state is "running" with the partial notebook linked, which the index reports as
incomplete.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, cast

import yaml

from gdn_lab import package_data
from gdn_lab.experiments.config import ExperimentConfig
from gdn_lab.report import parameters as params_mod
from gdn_lab.report import presets as presets_mod
from gdn_lab.report import provenance, quiet
from gdn_lab.report.html import index_html, notebook_to_html
from gdn_lab.report.io import HEADLINE_FILE, atomic_write_json, atomic_write_text, read_headline, read_json
from gdn_lab.report.kernel import KERNEL_LOG, KERNEL_NAME, allow_kernels, kernelspec, kill_live_kernels, logging_to
from gdn_lab.report.notebook import CONFIG_FILE

NOTEBOOK_DIR = package_data.path("notebooks")
SUMMARY_FILE = "summary.json"
# Files a notebook run writes into its out_dir besides its tables: removed before it runs again.
RUN_FILES = (HEADLINE_FILE, CONFIG_FILE, quiet.WARNINGS_FILE, KERNEL_LOG)


class RunError(ValueError):
    """A run that cannot start: bad preset, notebook, parameter or output path (the message says what is accepted)."""


def discover(notebook_dir: Path = NOTEBOOK_DIR) -> dict[str, Path]:
    """The suite's notebooks: `NN_name.ipynb` files, by stem, in file-name order."""
    found = sorted(p for p in Path(notebook_dir).glob("[0-9][0-9]_*.ipynb") if p.is_file())
    return {p.stem: p for p in found}


def select(names: Sequence[str] | None, notebooks: Mapping[str, Path]) -> list[str]:
    """Resolve `--only` names: a stem, or a unique prefix of one ("01", "01_batch").

    Raises:
        RunError: a name that matches no notebook or several (the message lists the notebooks).
    """
    if not names:
        return list(notebooks)
    chosen: list[str] = []
    for name in names:
        stem = Path(name).stem
        matches = [n for n in notebooks if n == stem] or [n for n in notebooks if stem and n.startswith(stem)]
        if len(matches) != 1:
            what = "matches several notebooks" if matches else "is not a notebook of the suite"
            raise RunError(f"--only: {name!r} {what}; accepted: {', '.join(notebooks)}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    """`-p KEY=VALUE` pairs; VALUE is read as YAML (`3`, `[1, 2]`, `cpu`, `null`).

    Raises:
        RunError: a pair without '=', a KEY that is not a name, a KEY given twice, or VALUE that is
            not valid YAML.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RunError(f"-p: expected KEY=VALUE, got {pair!r}")
        if not key.isidentifier():
            raise RunError(f"-p: {key!r} is not a parameter name (expected KEY=VALUE, e.g. -p seed=3)")
        if key in out:
            raise RunError(f"-p: {key} is given twice ({out[key]!r} and {value!r}); give it once")
        try:
            out[key] = presets_mod.yaml_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise RunError(f"-p {key}: {value!r} is not a valid YAML value ({problem})") from None
    return out


_schemas: dict[tuple[str, int], params_mod.Schema] = {}


def schema(path: Path) -> params_mod.Schema:
    """A notebook's parameter schema (cached per file version).

    Raises:
        RunError: the notebook does not name a usable Config, or its parameters cell disagrees with it.
    """
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _schemas:
        try:
            _schemas[key] = params_mod.read_schema(path)
        except params_mod.ParameterError as exc:
            raise RunError(str(exc)) from None
    return _schemas[key]


def declared_parameters(path: Path) -> list[str]:
    """The names a notebook's parameters cell declares (papermill.inspect_notebook)."""
    import papermill

    return list(papermill.inspect_notebook(str(path)))


@dataclass
class NotebookPlan:
    """One notebook of a run.

    Attributes:
        name: the notebook's stem.
        path: its source.
        config: its Config, resolved and checked.
        parameters: what papermill injects: preset, out_dir and every Config field (plain values).
        code_version: gdn_lab's source together with this notebook (`provenance.notebook_version`).
    """

    name: str
    path: Path
    config: ExperimentConfig
    parameters: dict[str, Any]
    code_version: str = ""


def plan(
    preset: presets_mod.Preset,
    notebooks: Mapping[str, Path],
    chosen: Sequence[str],
    overrides: Mapping[str, Any],
    out: Path,
) -> list[NotebookPlan]:
    """Resolve every chosen notebook's parameters into its Config (nothing runs).

    Raises:
        RunError: a preset entry for an unknown notebook; a preset or `-p` key that no notebook
            declares (or that the runner sets: preset, out_dir); a preset entry for a parameter the
            notebook fixes in its cell; a notebook without a usable Config; a value its Config
            rejects. Messages name the notebook, the parameter, the value and what is accepted.
    """
    for key, named in (("notebooks", preset.notebooks), ("longest_first", preset.longest_first)):
        unknown_nbs = sorted(set(named) - set(notebooks))
        if unknown_nbs:
            raise RunError(
                f"preset {preset.name}: {key} {', '.join(unknown_nbs)} are not in the suite; accepted: {', '.join(notebooks)}"
            )
    runner_keys = set(params_mod.RUNNER_KEYS)
    hint = {"preset": "use --preset", "out_dir": "use --out (each notebook's tables go to <out>/<notebook>/)"}
    for where, keys in (("-p", overrides), (f"preset {preset.name}, parameters", preset.parameters)):
        for key in sorted(runner_keys & set(keys)):
            raise RunError(f"{where}: {key} is set by the runner, not a notebook parameter; {hint[key]}")
    for nb, values in preset.notebooks.items():
        for key in sorted(runner_keys & set(values)):
            raise RunError(f"preset {preset.name}, notebooks.{nb}: {key} is set by the runner; {hint[key]}")
    declared = {name: set(declared_parameters(path)) - runner_keys for name, path in notebooks.items()}
    in_suite = sorted(set().union(*declared.values()))
    in_chosen = sorted(set().union(*[declared[n] for n in chosen]))
    for where, keys, accepted, scope in (
        (f"preset {preset.name}, parameters", preset.parameters, in_suite, "any notebook of the suite"),
        ("-p", overrides, in_chosen, "the selected notebooks (" + ", ".join(chosen) + ")"),
    ):
        unknown = sorted(set(keys) - set(accepted))
        if unknown:
            raise RunError(f"{where}: {', '.join(unknown)} not declared by {scope}; accepted: {', '.join(accepted)}")
    plans = []
    for name in chosen:
        sch = schema(notebooks[name])
        fields_ = set(params_mod.field_names(sch.config))
        own = preset.notebooks.get(name, {})
        unknown = sorted(set(own) - fields_)
        if unknown:
            raise RunError(
                f"preset {preset.name}, notebooks.{name}: {', '.join(unknown)} not parameters of {name}; "
                f"accepted: {', '.join(sorted(fields_))}"
            )
        for key in sorted(set(own) & set(sch.fixed) - set(overrides)):
            raise RunError(
                f"preset {preset.name}, notebooks.{name}.{key}: the notebook fixes {key} = {sch.fixed[key]!r} in its "
                f"parameters cell, so a preset cannot change it; use -p {key}=... (or write {key} = ... in the cell)"
            )
        mine = {k: v for k, v in overrides.items() if k in fields_}
        given = {**sch.fixed, **mine}
        source = {k: "the notebook's parameters cell" for k in sch.fixed} | dict.fromkeys(mine, "-p")
        try:
            cfg = params_mod.resolve(sch.config, name, preset=preset, given=given, given_source=source)
        except params_mod.ParameterError as exc:
            raise RunError(str(exc)) from None
        unused = cfg.unused()
        for key in sorted(set(mine) & set(unused)):
            raise RunError(
                f"-p {key}: {name} would not use this value: {unused[key]}; set it where it is read "
                "(--dry-run shows every value), or leave it out"
            )
        injected = params_mod.injected(cfg, preset.name, out / name)
        plans.append(NotebookPlan(name, notebooks[name], cfg, injected, provenance.notebook_version(notebooks[name])))
    return plans


def check_writable_dir(label: str, path: Path) -> None:
    """`path` is a directory we can write, or one we can create.

    Raises:
        RunError: it is a file, or it (or the folder it would be created in) is not writable.
    """
    if path.exists() and not path.is_dir():
        raise RunError(f"{label}: {path} exists and is not a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunError(f"{label}: {path} cannot be created: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunError(f"{label}: {probe} is not writable")


def check_archive(dest: Path, out: Path) -> None:
    """The archive can be written at the end: not a directory, not inside the run, in a writable folder."""
    if dest.suffix not in (".gz", ".tgz") and not dest.name.endswith(".tar.gz"):
        raise RunError(f"--archive: {dest} must end in .tar.gz (it is a gzip-compressed tar file)")
    if dest.exists() and dest.is_dir():
        raise RunError(f"--archive: {dest} is a directory; give a file name ending in .tar.gz")
    if dest.exists() and not os.access(dest, os.W_OK):
        raise RunError(f"--archive: {dest} exists and is not writable")
    if dest.is_relative_to(out):
        raise RunError(f"--archive: {dest} is inside the run directory {out}; put it outside")
    check_writable_dir("--archive", dest.parent)


@dataclass
class NotebookResult:
    """What happened to one notebook (one entry of summary.json).

    Attributes:
        status: "not run", "running", "ok", "failed", "interrupted", or "incomplete" (its run stopped
            while it ran: killed).
        run_id: the run that produced this entry (`Summary.runs`).
        note: why it was skipped (resume), or that it comes from an earlier run.
        error_rows: rows with status "error" in its tables (`headline.json`).
        warnings: known warnings captured in its kernel (`gdn_lab.report.quiet`).
        code_version: gdn_lab's source with this notebook (`provenance.notebook_version`): what
            `--resume` compares.
        source_version: gdn_lab's source alone (`provenance.code_version()["source"]`): what the
            index compares across notebooks.
        environment: the fingerprint fields its results depend on.
        files: ipynb, html, tables (paths relative to the run directory), partial (the ipynb is unfinished).
    """

    name: str
    status: str = "not run"
    run_id: str | None = None
    started: str | None = None
    finished: str | None = None
    duration_s: float | None = None
    headline: str | None = None
    error: str | None = None
    note: str | None = None
    error_rows: int = 0
    warnings: dict[str, Any] | None = None
    config: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    code_version: str | None = None
    source_version: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NotebookResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Summary:
    """The run's summary.json.

    Attributes:
        run: this invocation: id, started, finished, state ("running", "complete", "interrupted"),
            pid, host, code (`provenance.code_version`).
        runs: every run whose notebooks the summary lists, by id (earlier ones included).
        selected: the notebooks of this invocation (run or skipped), in order.
    """

    preset: str
    out: str
    run: dict[str, Any]
    overrides: dict[str, Any]
    fingerprint: dict[str, Any]
    notebooks: list[NotebookResult]
    selected: list[str] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    archive: str | None = None
    archive_error: str | None = None

    @property
    def ok(self) -> bool:
        """Every notebook listed (this run's and earlier ones) is ok."""
        return all(nb.status == "ok" for nb in self.notebooks)

    def this_run(self) -> list[NotebookResult]:
        return [nb for nb in self.notebooks if nb.name in self.selected]

    def failed(self) -> list[NotebookResult]:
        """This invocation's notebooks that are not ok."""
        return [nb for nb in self.this_run() if nb.status != "ok"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        d["started"], d["finished"], d["state"] = self.run["started"], self.run.get("finished"), self.run["state"]
        return d


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_summary(summary: Summary, out: Path) -> None:
    """Rewrite summary.json and index.html (atomically)."""
    data = summary.to_dict()
    atomic_write_json(out / SUMMARY_FILE, data)
    atomic_write_text(out / "index.html", index_html(data))


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prepended(variable: str, first: str | os.PathLike) -> str:
    """The path list in environment variable `variable` with `first` in front (a machine may install
    its packages or kernelspecs through it, so its entries are kept)."""
    return os.pathsep.join(x for x in (str(first), os.environ.get(variable)) if x)


# --jobs's default: 3 notebooks at once ran the h200 suite in 141 s cold and 64 s warm on one H200
# with 16 host cores, 2 in 176 s and 93 s (data/bench/h200/bench_suite_ace433e_884bf87.csv); more were not
# measured. On the CPU each kernel keeps about one core busy, so never more than the cores.
DEFAULT_JOBS = 3


def default_jobs() -> int:
    """`--jobs`'s default: DEFAULT_JOBS, at most the cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(DEFAULT_JOBS, cores))


def check_jobs(jobs: object) -> None:
    """`jobs` is an int >= 1 (RunError otherwise)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise RunError(f"--jobs: expected an int >= 1, got {jobs!r}")


def kernel_env(device_type: str) -> dict[str, str]:
    """The environment a notebook's kernel gets on top of the runner's: this gdn_lab first on
    PYTHONPATH, and TRITON_INTERPRET=1 on the CPU, 0 on a GPU (Triton reads it when a kernel is
    decorated: one mode per process).

    On the CPU also OMP_WAIT_POLICY=PASSIVE unless the runner's environment sets it: idle OpenMP
    threads sleep instead of spinning, so a kernel's torch threads leave the cores to the kernel
    beside it (`--jobs`; 05 took 22 s instead of 37 s beside 01 on 2 cores). The thread counts,
    and so the results, stay as they are.
    """
    path = prepended("PYTHONPATH", package_data.source_root())
    if device_type != "cpu":
        return {"PYTHONPATH": path, "TRITON_INTERPRET": "0"}
    wait = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    return {"PYTHONPATH": path, "TRITON_INTERPRET": "1", "OMP_WAIT_POLICY": wait}


@contextlib.contextmanager
def atomic_notebook_writes(out: Path) -> Iterator[None]:
    """Papermill writes every file under `out` atomically (temp file + os.replace) while inside.

    Papermill rewrites the executed notebook after each cell; its local handler truncates and
    rewrites in place, so a reader (or a kill) can meet half a file. This registers papermill's own
    I/O extension point (`papermill_io.register`) for paths under `out` only.
    """
    from papermill.iorw import LocalHandler, papermill_io

    class AtomicLocalHandler(LocalHandler):
        def write(self, buf: str, path: str) -> None:
            atomic_write_text(path, buf)

    entry = (str(out) + os.sep, AtomicLocalHandler())
    papermill_io.register(*entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, AttributeError):
            papermill_io._handlers.remove(entry)


def _error_text(exc: BaseException) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        tail = [line for line in exc.traceback[-6:] if line.strip()]
        clean = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(tail))
        return f"cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n{clean}"
    return f"{type(exc).__name__}: {exc}"


def _files(name: str, out: Path, partial: bool = False) -> dict[str, Any]:
    executed, page, tables = out / f"{name}.ipynb", out / f"{name}.html", out / name
    log = tables / KERNEL_LOG
    return {
        "ipynb": executed.name if executed.exists() else None,
        "html": page.name if page.exists() else None,
        "tables": sorted(f"{name}/{p.name}" for p in tables.glob("*.csv")) if tables.exists() else [],
        "partial": partial,
        "kernel_log": f"{name}/{KERNEL_LOG}" if log.exists() else None,
    }


@contextlib.contextmanager
def suite_kernel(device_type: str) -> Iterator[Path]:
    """The suite's kernelspec (`kernelspec`, with `kernel_env`) in a temporary folder, on
    JUPYTER_PATH while inside; one for every notebook of a run (they share its device)."""
    with tempfile.TemporaryDirectory(prefix="gdn-lab-kernel-") as tmp:
        kernelspec(Path(tmp), kernel_env(device_type))
        with _environ(JUPYTER_PATH=prepended("JUPYTER_PATH", tmp)):
            yield Path(tmp)


def run_notebook(
    nb: NotebookPlan,
    out: Path,
    log: IO[str],
    result: NotebookResult | None = None,
    kernel_dir: Path | None = None,
    name_in_log: bool = False,
) -> NotebookResult:
    """Execute one notebook into `out`, render its HTML, read its headline. Never raises on a failure
    inside the notebook (KeyboardInterrupt still propagates).

    kernel_dir: a `suite_kernel` already in place (None: one just for this notebook).
    name_in_log: start the result line with the notebook's name (notebooks running side by side).
    """
    import papermill

    result = result or NotebookResult(nb.name, parameters=nb.parameters)
    executed, page, tables = out / f"{nb.name}.ipynb", out / f"{nb.name}.html", out / nb.name
    kernel_log = tables / KERNEL_LOG
    # a rerun into the same directory must not report an earlier run's tables or headline
    for stale in [executed, page, *(tables / f for f in RUN_FILES), *tables.glob("*.csv")]:
        stale.unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        if kernel_dir is None:
            stack.enter_context(suite_kernel(nb.config.torch_device.type))
        start = time.monotonic()
        try:
            papermill.execute_notebook(
                str(nb.path),
                str(executed),
                parameters=nb.parameters,
                kernel_name=KERNEL_NAME,
                progress_bar=False,
                cwd=str(out),
                kernel_manager_class=logging_to(kernel_log),
            )
            result.status = "ok"
        except Exception as exc:  # the failure is the result: recorded, the suite goes on
            result.status, result.error = "failed", _error_text(exc)
        finally:
            result.duration_s = round(time.monotonic() - start, 2)
            result.finished = _now()
    if kernel_log.exists() and not kernel_log.stat().st_size:  # a quiet kernel leaves no file behind
        kernel_log.unlink()
    head = read_headline(tables) if tables.exists() else None
    result.headline = head.get("headline") if head else None
    result.error_rows = int(sum((head or {}).get("error_rows", {}).values()))
    result.warnings = quiet.read(tables)
    if executed.exists():
        _render(result, out)
    result.files = _files(nb.name, out)
    said = result.headline or next(iter((result.error or "").splitlines()), "")
    who = f"{nb.name}: " if name_in_log else ""
    _say(log, f"  {who}{result.status} in {result.duration_s:.1f} s: {said}")
    return result


def _render(result: NotebookResult, out: Path) -> None:
    """The notebook's HTML report, its banner from `result`; a rendering failure is added to its
    error instead of hiding the run's own result."""
    try:
        notebook_to_html(out / f"{result.name}.ipynb", out / f"{result.name}.html", banner=asdict(result))
    except Exception as exc:
        result.error = (result.error + "\n" if result.error else "") + f"HTML export failed: {exc}"


class _Progress:
    """The progress log as the notebooks of a run see it: silent once the run is interrupted (a
    notebook running beside the interrupted one still winds down)."""

    def __init__(self, log: IO[str], stopped: threading.Event) -> None:
        self.log, self.stopped = log, stopped

    def write(self, text: str) -> None:
        if not self.stopped.is_set():
            self.log.write(text)

    def flush(self) -> None:
        self.log.flush()


def _say(log: IO[str], line: str) -> None:
    """One progress line in one write, so lines of notebooks running side by side do not interleave."""
    log.write(line + "\n")
    log.flush()


def _process_alive(run: Mapping[str, Any]) -> bool:
    if run.get("host") != socket.gethostname() or not run.get("pid"):
        return False
    try:
        os.kill(int(run["pid"]), 0)
    except (OSError, ValueError):
        return False
    return True


def _earlier(out: Path, preset: str) -> tuple[list[NotebookResult], dict[str, dict[str, Any]], dict[str, Any]]:
    """The notebooks, runs and overrides of an earlier run of `preset` in `out` (nothing if none).

    Raises:
        RunError: `out` holds a run of another preset, an unreadable summary.json, or a run in progress.
    """
    path = out / SUMMARY_FILE
    if not path.exists():
        return [], {}, {}
    earlier = read_json(path)
    if not isinstance(earlier, dict) or "notebooks" not in earlier:
        raise RunError(f"--out: {path} is not a gdn-lab summary; choose another --out")
    if earlier.get("preset") != preset:
        raise RunError(
            f"--out: {out} holds a run of preset {earlier.get('preset')!r}; add to it with --preset "
            f"{earlier.get('preset')}, or choose another --out"
        )
    run = earlier.get("run") or {"id": f"run-{earlier.get('started')}", "started": earlier.get("started"),
                                 "finished": earlier.get("finished"), "state": "complete" if earlier.get("finished") else "running"}  # fmt: skip
    if run.get("state") == "running" and _process_alive(run):
        raise RunError(
            f"--out: {out} is being written by a running gdn-lab run (pid {run['pid']}); wait for it or use another --out"
        )
    runs = dict(earlier.get("runs") or {})
    runs.setdefault(run["id"], {k: v for k, v in run.items()})
    results = []
    for d in earlier["notebooks"]:
        r = NotebookResult.from_dict(d)
        r.run_id = r.run_id or run["id"]
        if r.status == "running":  # its run stopped while it ran (killed): say so
            r.status = "incomplete"
            r.error = r.error or "the run stopped while this notebook ran (it was killed); its partial notebook is kept"
        results.append(r)
    for info in runs.values():
        if info.get("state") == "running":
            info["state"] = "incomplete"
    return results, runs, dict(earlier.get("overrides") or {})


def archive(out: Path, dest: Path) -> Path:
    """Pack a run directory into one .tar.gz (its folder name as the archive's top folder)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(out, arcname=out.name)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def default_out(preset: str) -> Path:
    return Path.cwd() / "runs" / f"{Path(preset).stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def start_order(names: Sequence[str], longest_first: Sequence[str]) -> list[str]:
    """The order `--jobs N > 1` starts notebooks in: those in the preset's `longest_first`, in its
    order, then the others as given (a pool that starts a long notebook last ends with one kernel
    running alone)."""
    rank = {name: i for i, name in enumerate(longest_first)}
    return sorted(names, key=lambda name: rank.get(name, len(rank)))


def _skip_reason(earlier: NotebookResult | None, nb: NotebookPlan, env: dict[str, Any]) -> tuple[bool, str]:
    """(skip?, why): a resumed notebook is skipped only if it is ok with the same parameters, code and environment."""
    if earlier is None:
        return False, "not in the run yet"
    if earlier.status != "ok":
        return False, f"it was {earlier.status}"
    if earlier.parameters != nb.parameters:
        changed = sorted(k for k in set(earlier.parameters) | set(nb.parameters)
                         if earlier.parameters.get(k) != nb.parameters.get(k))  # fmt: skip
        return False, f"parameters changed: {', '.join(changed)}"
    if earlier.code_version != nb.code_version:
        return False, "gdn_lab's code or the notebook changed"
    if earlier.environment and earlier.environment != env:
        changed = sorted(k for k in env if earlier.environment.get(k) != env.get(k))
        return False, f"the environment changed: {', '.join(changed)}"
    return True, f"ok in this directory since {earlier.finished or earlier.started} with the same parameters and code"


def prepare(
    preset: str | os.PathLike,
    *,
    only: Sequence[str] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    archive_to: str | Path | None = None,
    notebook_dir: Path | None = None,
    resume: bool = False,
) -> tuple[presets_mod.Preset, dict[str, Path], list[NotebookPlan], Path, Path | None, dict[str, Any]]:
    """Everything `run_suite` checks before it runs: (preset, notebooks, plans, out, archive, overrides).

    Raises:
        RunError: any bad input (see `plan`, `check_writable_dir`, `check_archive`).
    """
    try:
        p = presets_mod.load(preset)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    notebook_dir = Path(notebook_dir or NOTEBOOK_DIR)
    notebooks = discover(notebook_dir)
    if not notebooks:
        raise RunError(f"no notebooks (NN_name.ipynb) in {notebook_dir}")
    chosen = select(only, notebooks)
    ov = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    run_dir = (Path(out) if out is not None else default_out(p.name)).expanduser().resolve()
    check_writable_dir("--out", run_dir)
    if resume:
        if not (run_dir / SUMMARY_FILE).exists():
            raise RunError(f"--resume: {run_dir} holds no run to resume ({SUMMARY_FILE} is missing)")
        _, _, earlier_overrides = _earlier(run_dir, p.name)
        ov = {**earlier_overrides, **ov}
    dest = Path(archive_to).expanduser().resolve() if archive_to is not None else None
    if dest is not None:
        check_archive(dest, run_dir)
    plans = plan(p, notebooks, chosen, ov, run_dir)
    return p, notebooks, plans, run_dir, dest, ov


def run_suite(
    preset: str | os.PathLike,
    *,
    only: Sequence[str] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    archive_to: str | Path | None = None,
    notebook_dir: Path | None = None,
    log: IO[str] | None = None,
    resume: bool = False,
    jobs: int = 1,
) -> Summary:
    """Run the suite (see the module docstring).

    Args:
        preset: a preset name (data/presets) or a path to a preset YAML file.
        only: notebook names or unique prefixes; None runs every notebook.
        overrides: `KEY=VALUE` strings (VALUE as YAML) or a mapping; they replace the preset's values
            (and a notebook's own) in every selected notebook that declares KEY.
        out: the run directory (default ./runs/<preset>-<time>/).
        archive_to: also pack the run directory into this .tar.gz at the end.
        notebook_dir: where the notebooks are (default: the lab's notebooks).
        log: progress lines go here (default: stderr).
        resume: skip the notebooks already ok in `out` with the same parameters, code and
            environment (the earlier run's `-p` values apply unless given again).
        jobs: how many notebooks run at once, each in its own kernel (the tables are the same; on
            a CPU each kernel mostly keeps one core busy).

    Returns:
        The Summary (also in <out>/summary.json); `summary.failed()` lists this run's notebooks
        that are not ok.

    Raises:
        RunError: bad input, before anything runs.
        KeyboardInterrupt: Ctrl-C; the summary says interrupted and the kernels are stopped.
    """
    log = log or sys.stderr
    check_jobs(jobs)
    p, notebooks, plans, run_dir, dest, ov = prepare(
        preset, only=only, overrides=overrides, out=out, archive_to=archive_to, notebook_dir=notebook_dir, resume=resume
    )
    from gdn_lab.environment import fingerprint

    device = plans[0].config.torch_device
    fp = fingerprint(device)
    if device.type == "cpu":  # as the notebooks' kernels see it: the runner sets TRITON_INTERPRET=1 there
        fp.update(triton_interpret=True, triton_mode="interpreter" if fp.get("triton") else fp.get("triton_mode"))
    env = provenance.environment_key(fp)
    kept, runs, _ = _earlier(run_dir, p.name)
    run = {
        "id": f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}",
        "started": _now(),
        "finished": None,
        "state": "running",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "code": provenance.code_version(),
    }
    runs[run["id"]] = run
    earlier = {r.name: r for r in kept}
    order = list(notebooks)
    results = {r.name: r for r in kept if r.name in notebooks}
    for nb in plans:
        results[nb.name] = earlier.get(nb.name) or NotebookResult(nb.name, parameters=nb.parameters)
    summary = Summary(
        preset=p.name,
        out=str(run_dir),
        run=run,
        overrides=ov,
        fingerprint=fp,
        notebooks=sorted(results.values(), key=lambda r: order.index(r.name)),
        selected=[nb.name for nb in plans],
        runs=runs,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(summary, run_dir)
    print(f"gdn-lab run: preset {p.name}, {len(plans)} notebooks into {run_dir}", file=log, flush=True)

    lock, stopped = threading.Lock(), threading.Event()
    progress = cast(IO[str], _Progress(log, stopped))

    def put(result: NotebookResult) -> None:
        with lock:  # notebooks running side by side report into one summary
            if stopped.is_set():  # interrupted: the handler below has the last word
                return
            summary.notebooks = [result if r.name == result.name else r for r in summary.notebooks]
            summary.runs = {k: v for k, v in runs.items() if k in {r.run_id for r in summary.notebooks} | {run["id"]}}
            write_summary(summary, run_dir)

    def execute(i: int, nb: NotebookPlan, redo: str, kernel_dir: Path) -> None:
        if stopped.is_set():
            return
        _say(progress, f"[{i + 1}/{len(plans)}] {nb.name}{redo}")
        result = NotebookResult(
            nb.name,
            status="running",
            run_id=run["id"],
            started=_now(),
            config=params_mod.config_name(type(nb.config)),
            parameters=nb.parameters,
            code_version=nb.code_version,
            source_version=run["code"]["source"],
            environment=env,
            files={"ipynb": f"{nb.name}.ipynb", "html": None, "tables": [], "partial": True},
        )
        put(result)
        put(run_notebook(nb, run_dir, progress, result, kernel_dir, name_in_log=jobs > 1))

    allow_kernels()
    pool = ThreadPoolExecutor(jobs, thread_name_prefix="gdn-lab-notebook") if jobs > 1 else None
    try:
        with atomic_notebook_writes(run_dir), suite_kernel(device.type) as kernel_dir:
            todo = []
            for i, nb in enumerate(plans):
                skip, why = _skip_reason(earlier.get(nb.name), nb, env) if resume else (False, "")
                if skip:
                    print(f"[{i + 1}/{len(plans)}] {nb.name}: skipped: {why}", file=log, flush=True)
                    kept_result = earlier[nb.name]
                    kept_result.note = f"skipped on resume: {why}"
                    put(kept_result)
                    continue
                todo.append((i, nb, f" (rerun: {why})" if resume and nb.name in earlier else ""))
            if pool is None:
                for i, nb, redo in todo:
                    execute(i, nb, redo, kernel_dir)
            else:
                by_name = {nb.name: (i, nb, redo) for i, nb, redo in todo}
                started = [by_name[name] for name in start_order(list(by_name), p.longest_first)]
                for future in [pool.submit(execute, *job, kernel_dir) for job in started]:
                    future.result()  # Ctrl-C lands here, in the main thread
    except KeyboardInterrupt:
        with _sigint_ignored():
            with lock:
                stopped.set()
                running = [r for r in summary.notebooks if r.status == "running"]
            kill_live_kernels()
            if pool is not None:  # the notebooks beside it see their kernels die and end, quietly
                papermill_log = logging.getLogger("papermill")
                papermill_log.disabled = True
                try:
                    pool.shutdown(wait=True, cancel_futures=True)
                finally:
                    papermill_log.disabled = False
            for r in running:  # what a notebook that saw its kernel die wrote of itself is overruled
                r.status, r.error = "interrupted", "interrupted (Ctrl-C)"
                r.finished = _now()
                if (run_dir / f"{r.name}.html").exists():  # by a notebook that wound down beside: "failed"
                    _render(r, run_dir)
                r.files = _files(r.name, run_dir, partial=True)
            run["state"], run["finished"] = "interrupted", _now()
            write_summary(summary, run_dir)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    run["state"], run["finished"] = "complete", _now()
    write_summary(summary, run_dir)
    if dest is not None:
        try:
            summary.archive = str(archive(run_dir, dest))
            print(f"archive: {dest}", file=log)
        except OSError as exc:
            summary.archive_error = f"{type(exc).__name__}: {exc}"
            print(f"error: --archive {dest}: {summary.archive_error}", file=log)
        write_summary(summary, run_dir)
    return summary


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """A second Ctrl-C while an interrupted run records its state does not cut the record short."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
