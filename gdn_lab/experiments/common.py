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


def label(part: pd.DataFrame) -> str:
    """A backend's name as conclusions print it, from its rows: AMD libraries' results off ROCm
    are marked (the rows' `hardware_note`)."""
    notes = part.hardware_note.dropna().unique() if "hardware_note" in part else []
    return f"{part.backend.iloc[0]}{notes[0] if len(notes) else ''}"
