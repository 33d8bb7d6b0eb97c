"""The suite runner behind `gdn-lab run`: every notebook through papermill, into one run directory.

Layout of a run directory:

```
<out>/
  index.html, summary.json          rewritten (atomically) after every notebook
  NN_name.ipynb                      the executed notebook (papermill provenance in its metadata)
  NN_name.html                       self-contained report, code hidden behind a toggle
  NN_name/                           the notebook's out_dir: its CSV tables and headline.json
```

Everything is checked before anything runs: the preset, the notebook names (`--only`), and every
parameter (the preset's and `-p KEY=VALUE`) against the parameters each notebook declares
(`papermill.inspect_notebook`). A notebook that fails is recorded with its error (its partial
executed notebook and HTML are kept) and the others still run; the exit status is 0 only if all
ran. An interrupted run keeps what finished, and a later run of the same preset into the same
directory (e.g. the rest of the suite with `--only`) keeps the earlier notebooks in its index.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from gdn_lab.report import presets as presets_mod
from gdn_lab.report.html import index_html, notebook_to_html
from gdn_lab.report.io import HEADLINE_FILE, atomic_write_json, atomic_write_text, read_headline

if TYPE_CHECKING:
    import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
KERNEL_NAME = "python3"


class RunError(ValueError):
    """A run that cannot start: unknown preset, notebook or parameter (the message lists valid ones)."""


def discover(notebook_dir: Path = NOTEBOOK_DIR) -> dict[str, Path]:
    """The suite's notebooks: `NN_name.ipynb` files, by stem, in file-name order."""
    found = sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb") if p.is_file())
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
        matches = [n for n in notebooks if n == stem] or [n for n in notebooks if n.startswith(stem)]
        if len(matches) != 1:
            what = "matches several notebooks" if matches else "is not a notebook of the suite"
            raise RunError(f"--only: {name!r} {what}; accepted: {', '.join(notebooks)}")
        if matches[0] not in chosen:
            chosen.append(matches[0])
    return chosen


def parse_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    """`-p KEY=VALUE` pairs; VALUE is read as YAML (`3`, `[1, 2]`, `cpu`, `null`).

    Raises:
        RunError: a pair without '='.
    """
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise RunError(f"-p: expected KEY=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def declared_parameters(path: Path) -> dict[str, dict[str, Any]]:
    """The parameters a notebook declares (papermill.inspect_notebook): {name: {default, help, ...}}."""
    import papermill

    return dict(papermill.inspect_notebook(str(path)))


@dataclass
class NotebookPlan:
    """One notebook of a run: its source and the parameters papermill injects."""

    name: str
    path: Path
    parameters: dict[str, Any]


def plan(
    preset: presets_mod.Preset,
    notebooks: Mapping[str, Path],
    chosen: Sequence[str],
    overrides: Mapping[str, Any],
    out: Path,
) -> list[NotebookPlan]:
    """Check every parameter against the notebooks' declarations; return what each notebook gets.

    Raises:
        RunError: a preset entry for an unknown notebook, a preset parameter that no notebook of the
            suite declares, a notebook entry with a parameter that notebook lacks, or an override (-p) that
            no chosen notebook declares. Messages list the accepted names.
    """
    unknown_nbs = sorted(set(preset.notebooks) - set(notebooks))
    if unknown_nbs:
        raise RunError(
            f"preset {preset.name}: notebooks {', '.join(unknown_nbs)} are not in the suite; accepted: {', '.join(notebooks)}"
        )
    declared = {name: declared_parameters(path) for name, path in notebooks.items()}
    in_suite = sorted(set().union(*[set(d) for d in declared.values()]))
    in_chosen = sorted(set().union(*[set(declared[n]) for n in chosen]))
    for where, keys, accepted, scope in (
        ("preset parameters", preset.parameters, in_suite, "the suite's notebooks"),
        ("-p", overrides, in_chosen, "the selected notebooks"),
    ):
        unknown = sorted(set(keys) - set(accepted))
        if unknown:
            raise RunError(f"{where}: {', '.join(unknown)} not declared by {scope}; accepted: {', '.join(accepted)}")
    plans = []
    for name in chosen:
        own = preset.notebooks.get(name, {})
        unknown = sorted(set(own) - set(declared[name]))
        if unknown:
            raise RunError(
                f"preset {preset.name}, notebook {name}: {', '.join(unknown)} not declared; accepted: {', '.join(declared[name])}"
            )
        params = {k: v for k, v in preset.for_notebook(name).items() if k in declared[name]}
        params.update({k: v for k, v in overrides.items() if k in declared[name]})
        params.update({k: v for k, v in (("preset", preset.name), ("out_dir", str(out / name))) if k in declared[name]})
        plans.append(NotebookPlan(name, notebooks[name], params))
    return plans


@dataclass
class NotebookResult:
    """What happened to one notebook (one entry of summary.json)."""

    name: str
    status: str = "not run"
    duration_s: float | None = None
    headline: str | None = None
    error: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)


@dataclass
class Summary:
    """The run's summary.json."""

    preset: str
    out: str
    started: str
    overrides: dict[str, Any]
    fingerprint: dict[str, Any]
    notebooks: list[NotebookResult]
    finished: str | None = None

    @property
    def ok(self) -> bool:
        return all(nb.status == "ok" for nb in self.notebooks)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_summary(summary: Summary, out: Path) -> None:
    """Rewrite summary.json and index.html (atomically)."""
    data = summary.to_dict()
    atomic_write_json(out / "summary.json", data)
    atomic_write_text(out / "index.html", index_html(data))


@contextlib.contextmanager
def kernel_environment(device: torch.device) -> Iterator[None]:
    """The environment the notebooks' kernels start in; restored on exit.

    - a `python3` kernelspec that runs this interpreter, first on JUPYTER_PATH, so papermill finds a
      kernel in a fresh venv and never picks another Python's `python3`;
    - this checkout first on PYTHONPATH, so the kernel imports the same gdn_lab as the runner;
    - TRITON_INTERPRET=1 when the notebooks run on the CPU (it must be set before the kernel
      imports any Triton kernel).
    """
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PYTHONPATH", "TRITON_INTERPRET")}
    with tempfile.TemporaryDirectory(prefix="gdn-lab-kernel-") as tmp:
        spec = Path(tmp) / "kernels" / KERNEL_NAME
        spec.mkdir(parents=True)
        kernel = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({sys.executable})",
            "language": "python",
            "metadata": {"debugger": False},
        }
        atomic_write_json(spec / "kernel.json", kernel)
        os.environ["JUPYTER_PATH"] = os.pathsep.join(x for x in (tmp, saved["JUPYTER_PATH"]) if x)
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), saved["PYTHONPATH"]) if x)
        if device.type == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _error_text(exc: BaseException) -> str:
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        tail = [line for line in exc.traceback[-6:] if line.strip()]
        clean = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(tail))
        return f"cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n{clean}"
    return f"{type(exc).__name__}: {exc}"


def run_notebook(nb: NotebookPlan, out: Path, log: IO[str]) -> NotebookResult:
    """Execute one notebook into `out`, render its HTML, read its headline. Never raises on a failure
    inside the notebook (KeyboardInterrupt still propagates)."""
    import papermill

    result = NotebookResult(nb.name, parameters=nb.parameters)
    executed, page = out / f"{nb.name}.ipynb", out / f"{nb.name}.html"
    tables = out / nb.name
    # a rerun into the same directory must not report an earlier run's tables or headline
    for stale in [executed, page, tables / HEADLINE_FILE, *tables.glob("*.csv")]:
        stale.unlink(missing_ok=True)
    start = time.monotonic()
    try:
        papermill.execute_notebook(
            str(nb.path),
            str(executed),
            parameters=nb.parameters,
            kernel_name=KERNEL_NAME,
            progress_bar=False,
            cwd=str(REPO_ROOT),
        )
        result.status = "ok"
    except Exception as exc:  # the failure is the result: recorded, the suite goes on
        result.status, result.error = "failed", _error_text(exc)
    finally:
        result.duration_s = round(time.monotonic() - start, 2)
    if executed.exists():
        try:
            notebook_to_html(executed, page)
        except Exception as exc:  # a rendering failure must not hide the run's own result
            result.error = (result.error + "\n" if result.error else "") + f"HTML export failed: {exc}"
    head = read_headline(tables) if tables.exists() else None
    result.headline = head.get("headline") if head else None
    result.files = {
        "ipynb": executed.name if executed.exists() else None,
        "html": page.name if page.exists() else None,
        "tables": sorted(f"{nb.name}/{p.name}" for p in tables.glob("*.csv")) if tables.exists() else [],
    }
    print(f"  {result.status} in {result.duration_s:.1f} s: {result.headline or result.error or ''}", file=log)
    return result


def _earlier_results(out: Path, preset: str, notebooks: Mapping[str, Path], running: set[str]) -> list[NotebookResult]:
    """Results of notebooks not run this time, from an earlier run of the same preset into `out`,
    so a suite can be run in parts (`--only`) into one directory and keep one index."""
    path = out / "summary.json"
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if earlier.get("preset") != preset:
        return []
    fields = set(NotebookResult.__dataclass_fields__)
    return [
        NotebookResult(**{k: v for k, v in nb.items() if k in fields})
        for nb in earlier.get("notebooks", [])
        if nb.get("name") in notebooks and nb.get("name") not in running
    ]


def archive(out: Path, dest: Path) -> Path:
    """Pack a run directory into one .tar.gz (its folder name as the archive's top folder)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    os.replace(tmp, dest)
    return dest


def default_out(preset: str) -> Path:
    return REPO_ROOT / "runs" / f"{Path(preset).stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_suite(
    preset: str,
    *,
    only: Sequence[str] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    archive_to: str | Path | None = None,
    notebook_dir: Path | None = None,
    log: IO[str] | None = None,
) -> Summary:
    """Run the suite (see the module docstring).

    Args:
        preset: a preset name (data/presets) or a path to a preset YAML file.
        only: notebook names or unique prefixes; None runs every notebook.
        overrides: `KEY=VALUE` strings (VALUE as YAML) or a mapping; they replace the preset's values
            in every selected notebook that declares KEY.
        out: the run directory (default runs/<preset>-<time>/).
        archive_to: also pack the run directory into this .tar.gz at the end.
        notebook_dir: where the notebooks are (default: the checkout's notebooks/).
        log: progress lines go here (default: stderr).

    Returns:
        The Summary (also in <out>/summary.json); `summary.ok` says whether every notebook ran.

    Raises:
        RunError: an unknown preset, notebook or parameter, before anything runs.
    """
    log = log or sys.stderr
    notebook_dir = notebook_dir or NOTEBOOK_DIR
    try:
        p = presets_mod.load(preset)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    notebooks = discover(notebook_dir)
    if not notebooks:
        raise RunError(f"no notebooks (NN_name.ipynb) in {notebook_dir}")
    chosen = select(only, notebooks)
    ov = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    run_dir = Path(out) if out is not None else default_out(p.name)
    run_dir = run_dir.resolve()
    plans = plan(p, notebooks, chosen, ov, run_dir)
    from gdn_lab.environment import fingerprint
    from gdn_lab.workloads import resolve_device

    try:
        device = resolve_device(str(ov.get("device", p.device)))
    except ValueError as exc:
        raise RunError(str(exc)) from None
    run_dir.mkdir(parents=True, exist_ok=True)
    with kernel_environment(device):  # the fingerprint sees the TRITON_INTERPRET the notebooks get
        fp = fingerprint(device)
    summary = Summary(
        preset=p.name,
        out=str(run_dir),
        started=_now(),
        overrides=ov,
        fingerprint=fp,
        notebooks=[NotebookResult(nb.name, parameters=nb.parameters) for nb in plans],
    )
    kept = _earlier_results(run_dir, p.name, notebooks, {nb.name for nb in plans})
    order = list(notebooks)
    summary.notebooks = sorted(summary.notebooks + kept, key=lambda r: order.index(r.name))
    write_summary(summary, run_dir)
    print(f"gdn-lab run: preset {p.name}, {len(plans)} notebooks into {run_dir}", file=log)
    with kernel_environment(device):
        try:
            for i, nb in enumerate(plans):
                print(f"[{i + 1}/{len(plans)}] {nb.name}", file=log, flush=True)
                at = next(j for j, r in enumerate(summary.notebooks) if r.name == nb.name)
                summary.notebooks[at] = NotebookResult(nb.name, status="running", parameters=nb.parameters)
                summary.notebooks[at] = run_notebook(nb, run_dir, log)
                write_summary(summary, run_dir)
        except KeyboardInterrupt:
            for r in summary.notebooks:
                if r.status == "running":
                    r.status, r.error = "interrupted", "interrupted (KeyboardInterrupt)"
            summary.finished = _now()
            write_summary(summary, run_dir)
            raise
    summary.finished = _now()
    write_summary(summary, run_dir)
    if archive_to is not None:
        dest = archive(run_dir, Path(archive_to).resolve())
        print(f"archive: {dest}", file=log)
    return summary
