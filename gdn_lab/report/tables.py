"""Tables as a report shows them: the columns a reader needs, long reasons summarised.

The CSV tables (`io.write_table`) keep every column and the full reason and exception texts;
`show` is only for what a notebook displays.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gdn_lab.experiments.common import short_reason

REASON_COLUMNS = ("reason", "rule_reason", "error")


def show(df: pd.DataFrame, columns: Sequence[str] | None = None, limit: int = 160) -> pd.DataFrame:
    """A copy of `df` with only `columns` (all if None, in that order) and every reason or exception
    text (REASON_COLUMNS) cut to its first line of about `limit` characters.

    Example:
        >>> show(pd.DataFrame({"backend": ["x"], "reason": ["RuntimeError: boom\\ntraceback ..."]})).reason[0]
        'RuntimeError: boom …'
    """
    out = df[list(columns)].copy() if columns is not None else df.copy()
    for col in REASON_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda t: short_reason(t, limit))
    return out
