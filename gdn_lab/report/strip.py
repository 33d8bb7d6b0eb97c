"""Clear a notebook's outputs and execution counts before committing it.

Usage: python -m gdn_lab.report.strip notebooks/*.ipynb   (exit 1 with --check if any was not stripped)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gdn_lab.report.io import atomic_write_text

# Metadata written by executing a notebook (papermill provenance, widget state), never committed.
RUN_METADATA = ("papermill", "widgets", "execution")


def is_stripped(nb) -> bool:
    """True if no code cell has outputs or an execution count and no run metadata is left."""
    cells_clean = all(
        not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"
    )
    cell_meta_clean = all(not any(k in c.metadata for k in RUN_METADATA) for c in nb.cells)
    return cells_clean and cell_meta_clean and not any(k in nb.metadata for k in RUN_METADATA)


def strip(nb):
    """The notebook without outputs, execution counts and run metadata (modified in place, returned)."""
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        for k in RUN_METADATA:
            c.metadata.pop(k, None)
    for k in RUN_METADATA:
        nb.metadata.pop(k, None)
    return nb


def main(argv: Sequence[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m gdn_lab.report.strip", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only report notebooks that are not stripped")
    args = parser.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        nb = nbformat.read(str(path), as_version=4)
        if is_stripped(nb):
            continue
        dirty.append(path)
        if not args.check:
            atomic_write_text(path, nbformat.writes(strip(nb)) + "\n")
    for path in dirty:
        print(f"{'not stripped' if args.check else 'stripped'}: {path}")
    return 1 if (dirty and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
