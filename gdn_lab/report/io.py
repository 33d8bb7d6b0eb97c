"""Atomic files for reports: tables (CSV), a notebook's headline (JSON), any text.

Every file is written to a temporary file in its folder and moved into place with os.replace,
so a reader (the runner, a colleague, an interrupted run) never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

HEADLINE_FILE = "headline.json"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; a report is for colleagues: the usual mode under the umask
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's content, or None when it is missing or does not parse (e.g. a run in progress)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_table(df: pd.DataFrame, out_dir: str | os.PathLike, name: str) -> Path:
    """Write one table as `<out_dir>/<name>.csv` (atomic). Returns the path.

    Args:
        df: the table.
        out_dir: the notebook's table folder.
        name: the table's name: letters, digits, '_' and '-' only.
    """
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"name: {name!r} must be non-empty and use only letters, digits, '_' and '-'")
    return atomic_write_text(Path(out_dir) / f"{name}.csv", df.to_csv(index=False))


def error_rows(out_dir: str | os.PathLike) -> dict[str, int]:
    """{table name: rows with status "error"} over the CSV tables in out_dir (tables without errors left out)."""
    counts = {}
    for path in sorted(Path(out_dir).glob("*.csv")):
        try:
            status = pd.read_csv(path, usecols=lambda c: c == "status").get("status")
        except (ValueError, pd.errors.EmptyDataError):
            continue
        n = int((status == "error").sum()) if status is not None else 0
        if n:
            counts[path.stem] = n
    return counts


def write_headline(out_dir: str | os.PathLike, notebook: str, headline: str, **extra: Any) -> Path:
    """Write the notebook's headline finding (`headline.json`), which the runner reads for the index.

    The file also lists the notebook's tables and counts their error rows (`error_rows`, rows with
    status "error"), so the index can say where backends failed whatever the headline says.

    Args:
        out_dir: the notebook's table folder.
        notebook: the notebook's stem ("01_batch_invariance").
        headline: one line computed from the tables by a gdn_lab function.
        **extra: more JSON-serializable fields (e.g. flags a test reads).
    """
    tables = sorted(p.name for p in Path(out_dir).glob("*.csv"))
    return atomic_write_json(
        Path(out_dir) / HEADLINE_FILE,
        {"notebook": notebook, "headline": headline, "tables": tables, "error_rows": error_rows(out_dir), **extra},
    )


def read_headline(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The headline a notebook wrote, or None when it wrote none (e.g. it failed first)."""
    return read_json(Path(out_dir) / HEADLINE_FILE)
