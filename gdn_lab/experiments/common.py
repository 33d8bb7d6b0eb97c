"""Small helpers the experiments' metrics and conclusions share."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import torch


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64 (NaN if either holds NaN where the other does not)."""
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).abs().max())


def fmt_list(items: Iterable[object]) -> str:
    items = list(items)
    return ", ".join(str(i) for i in items) if items else "none"


def short_reason(text: object, limit: int = 160) -> str:
    """A reason or exception text as one short line for reports: its first line, cut at a word
    boundary after about `limit` characters (" …" marks the cut); tables keep the full text.

    Example:
        >>> short_reason("KeyError: key contains names that are not kernel arguments: " + "x, " * 100, 60)
        'KeyError: key contains names that are not kernel arguments: …'
    """
    if text is None or (isinstance(text, float) and text != text):
        return ""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if len(first) <= limit:
        return first + (" …" if len(lines) > 1 else "")
    cut = first[:limit]
    cut = cut.rsplit(" ", 1)[0] if " " in cut else cut
    return cut.rstrip(",; ") + " …"


def error_note(*tables: pd.DataFrame | None) -> str:
    """ "N ERROR rows (backend: n, ...; first: <summary>)" over the tables' rows with status "error",
    or "" when there are none: every headline starts with it, so a run with failing backends never
    reads as clean."""
    parts = [t[t.status == "error"] for t in tables if t is not None and "status" in t and len(t)]
    errors = pd.concat(parts) if parts else pd.DataFrame()
    if errors.empty:
        return ""
    by = errors.groupby("backend", sort=False).size()
    first = short_reason(errors.reason.iloc[0], 100) if "reason" in errors else ""
    return f"{len(errors)} ERROR rows ({', '.join(f'{b}: {n}' for b, n in by.items())}; first: {first})"


def with_errors(headline: str, *tables: pd.DataFrame | None) -> str:
    """The headline with `error_note` in front when any table has error rows."""
    note = error_note(*tables)
    return f"{note}; {headline}" if note else headline


def label(part: pd.DataFrame) -> str:
    """A backend's name as conclusions print it, from its rows: AMD libraries' results off ROCm
    are marked (the rows' `hardware_note`)."""
    notes = part.hardware_note.dropna().unique() if "hardware_note" in part else []
    return f"{part.backend.iloc[0]}{notes[0] if len(notes) else ''}"
