"""The fingerprint file: versioned JSON, written atomically, read with clear errors.

```json
{"kind": "gdn_lab.fingerprint", "schema": 1, "created": "...", "preset": "cpu-smoke",
 "config": {...the gate config that made it...}, "environment": {...}, "cases": [{...}, ...]}
```

A file from a newer gdn_lab (a higher schema), a file that is not a fingerprint, a missing file or
malformed JSON are `GoldenError`s (the CLI exits 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gdn_lab.report.io import atomic_write_json

KIND = "gdn_lab.fingerprint"
SCHEMA = 1
REQUIRED = ("kind", "schema", "config", "environment", "cases")


class GoldenError(ValueError):
    """A fingerprint file that cannot be used; the message says which file and why."""


def write(path: str | os.PathLike, doc: dict[str, Any]) -> Path:
    """Write a fingerprint document (atomically)."""
    return atomic_write_json(path, doc)


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a fingerprint file.

    Raises:
        GoldenError: missing, not JSON, not a fingerprint, a future schema, or fields missing.
    """
    p = Path(path)
    if not p.is_file():
        raise GoldenError(f"golden: {p} does not exist (make one with: gdn-lab fingerprint --preset NAME --out {p})")
    try:
        doc = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GoldenError(f"golden: {p} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise GoldenError(f"golden: {p} is not a gdn_lab fingerprint (its 'kind' is not {KIND!r})")
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema < 1:
        raise GoldenError(f"golden: {p} has no valid 'schema' (got {schema!r}; this gdn_lab reads 1..{SCHEMA})")
    if schema > SCHEMA:
        raise GoldenError(
            f"golden: {p} has schema {schema}, written by a newer gdn_lab; this one reads schemas up to {SCHEMA}"
        )
    missing = [k for k in REQUIRED if k not in doc]
    if missing or not isinstance(doc["cases"], list):
        raise GoldenError(f"golden: {p} lacks {', '.join(missing) or 'a list of cases'}")
    return doc
