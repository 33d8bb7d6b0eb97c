"""Known warnings kept out of notebooks and reports: captured, counted, and written to one file.

Two warnings come with every CPU run and say nothing about the results:

- Triton's interpreter evaluates masked-out lanes too, so numpy reports "invalid value" /
  "divide by zero" RuntimeWarnings from `triton/runtime/interpreter.py` (the masked results are
  discarded);
- flash-linear-attention warns at import that "Triton is not supported on current platform" on a
  machine without a GPU.

`capture(path)` installs a `warnings.showwarning` hook that counts those (and passes every other
warning on unchanged); the counts go to `path` (JSON), which the suite runner adds to summary.json
and the index. Python's default filter already shows a warning once per code location, so a count
is the number of distinct places, not of elements.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WARNINGS_FILE = "warnings.json"


@dataclass(frozen=True)
class Known:
    """A known warning: a name for it, its category, and patterns its file and message match."""

    name: str
    category: type[Warning]
    filename: str = ""
    message: str = ""

    def matches(self, message: Warning | str, category: type[Warning], filename: str) -> bool:
        return (
            issubclass(category, self.category)
            and re.search(self.filename, filename.replace(os.sep, "/")) is not None
            and re.search(self.message, str(message)) is not None
        )


KNOWN = (
    Known("Triton interpreter: numpy RuntimeWarning on masked lanes", RuntimeWarning, r"/triton/runtime/interpreter"),
    Known("fla: no GPU, Triton unsupported", UserWarning, r"/fla/", r"Triton is not supported on current platform"),
)


class WarningLog:
    """Counts known warnings (`KNOWN`) instead of showing them; shows every other warning."""

    def __init__(self, path: str | os.PathLike | None = None, known: tuple[Known, ...] = KNOWN) -> None:
        self.path = Path(path) if path is not None else None
        self.known = known
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}
        self._previous: Any = None

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        for k in self.known:
            if k.matches(message, category, filename):
                self.counts[k.name] = self.counts.get(k.name, 0) + 1
                self.examples.setdefault(k.name, f"{category.__name__}: {str(message).splitlines()[0][:200]}")
                self._write()
                return
        self._previous(message, category, filename, lineno, file, line)

    def _write(self) -> None:
        if self.path is None:
            return
        from gdn_lab.report.io import atomic_write_json

        atomic_write_json(self.path, self.summary())

    def summary(self) -> dict[str, Any]:
        """{"captured": total, "warnings": [{name, count, example}]}."""
        items = [{"name": n, "count": c, "example": self.examples[n]} for n, c in self.counts.items()]
        return {"captured": sum(self.counts.values()), "warnings": items}

    def install(self) -> WarningLog:
        if self._previous is None:
            self._previous = warnings.showwarning
            warnings.showwarning = self._show
        return self

    def uninstall(self) -> None:
        if self._previous is not None and warnings.showwarning == self._show:
            warnings.showwarning = self._previous
        self._previous = None


_active: WarningLog | None = None


def install(path: str | os.PathLike | None) -> WarningLog:
    """Capture known warnings for the rest of the process (a notebook's kernel), counts into `path`.

    Calling it again (a notebook's setup cell run twice) moves the counts to the new path.
    """
    global _active
    if _active is None:
        _active = WarningLog(path).install()
    else:
        _active.path = Path(path) if path is not None else None
    return _active


@contextmanager
def capture(path: str | os.PathLike | None = None) -> Iterator[WarningLog]:
    """Capture known warnings inside the block (restored on exit, nests)."""
    log = WarningLog(path).install()
    try:
        yield log
    finally:
        log.uninstall()


def read(out_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The counts a notebook wrote into its out_dir, or None."""
    path = Path(out_dir) / WARNINGS_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
