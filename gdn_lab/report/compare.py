"""`gdn-lab compare A B`: two suite runs, or two fingerprints, side by side.

Each side is a run directory (`summary.json` plus each notebook's CSV tables) or a fingerprint file
(`gdn-lab fingerprint`). Rows are joined on the case columns both sides have (op, backend,
target_len, batch_size, trial, tensor, and kv_format or kv_dtype), never on where they ran (device,
arch), so an H200 run joins an MI350X run. The comparison reports:

- verdicts that changed (bitwise_equal, within_tolerance, ref_within_tolerance, prediction, status);
- error statistics that moved beyond a stated relative tolerance (`ERROR_COLUMNS`);
- cases and tables present on one side only;
- environment differences (the fingerprints' keys).

Example:
    >>> a = pd.DataFrame({"op": ["x"], "backend": ["t"], "bitwise_equal": [True], "ref_max_abs": [1.0]})
    >>> d = compare_tables({"t": a}, {"t": a.assign(ref_max_abs=2.0)}, tolerance=0.5)
    >>> d.errors.column.tolist(), d.verdicts.empty
    (['ref_max_abs'], True)
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gdn_lab.report.io import atomic_write_text

KEY_COLUMNS = ("op", "backend", "kv_format", "kv_dtype", "target_len", "batch_size", "trial", "tensor")
VERDICT_COLUMNS = ("status", "covered", "bitwise_equal", "within_tolerance", "ref_within_tolerance", "prediction")
ERROR_COLUMNS = (
    "ref_max_abs", "exact_max_abs", "exact_max_ulp", "ref_rms_ratio", "kernel_max_abs", "rel_mae", "max_abs", "max_ulp",
)  # fmt: skip
ATOL = 1e-12  # differences below this are equal whatever the tolerance


class CompareError(ValueError):
    """A side that is neither a run directory nor a fingerprint file."""


@dataclass
class Side:
    """One side: its tables by name, its environment, and what it is."""

    path: str
    kind: str
    tables: dict[str, pd.DataFrame]
    environment: dict[str, Any] = field(default_factory=dict)


def load(path: str | Path) -> Side:
    """A run directory or a fingerprint file.

    Raises:
        CompareError: neither (the message says what was found).
    """
    p = Path(path)
    if p.is_dir():
        summary = p / "summary.json"
        if not summary.is_file():
            raise CompareError(f"{p}: a run directory holds summary.json (gdn-lab run --out DIR); none found")
        data = json.loads(summary.read_text())
        tables = {f"{csv.parent.name}/{csv.stem}": pd.read_csv(csv) for csv in sorted(p.glob("*/*.csv"))}
        return Side(str(p), "run", tables, dict(data.get("fingerprint") or {}))
    from gdn_lab.gate import golden

    try:
        doc = golden.read(p)
    except golden.GoldenError as exc:
        raise CompareError(f"{p}: neither a run directory nor a fingerprint ({exc})") from None
    return Side(str(p), "fingerprint", {"fingerprint": pd.DataFrame(doc["cases"])}, dict(doc["environment"]))


@dataclass
class Differences:
    """What differs (each a DataFrame; empty when nothing does)."""

    verdicts: pd.DataFrame
    errors: pd.DataFrame
    one_side: pd.DataFrame
    environment: pd.DataFrame

    @property
    def none(self) -> bool:
        return self.verdicts.empty and self.errors.empty and self.one_side.empty


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return str(a) == str(b)


def _keys(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    keys = [k for k in KEY_COLUMNS if k in a.columns and k in b.columns]
    if "kv_format" in keys and "kv_dtype" in keys:
        keys.remove("kv_dtype")  # the format joins archs whose fp8 dtypes differ
    return keys


def compare_tables(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame], tolerance: float = 0.25) -> Differences:
    """Join every table both sides have; see the module docstring."""
    verdicts, errors, one_side = [], [], []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            one_side.append({"table": name, "case": "(whole table)", "side": "A" if name in a else "B"})
            continue
        ta, tb = a[name], b[name]
        keys = _keys(ta, tb)
        if not keys:
            continue
        ia = ta.assign(_case=ta[keys].astype(str).agg(" | ".join, axis=1)).drop_duplicates("_case").set_index("_case")
        ib = tb.assign(_case=tb[keys].astype(str).agg(" | ".join, axis=1)).drop_duplicates("_case").set_index("_case")
        for case in sorted(set(ia.index) ^ set(ib.index)):
            one_side.append({"table": name, "case": case, "side": "A" if case in ia.index else "B"})
        common = sorted(set(ia.index) & set(ib.index))
        for col in VERDICT_COLUMNS:
            if col in ia.columns and col in ib.columns:
                for case in common:
                    va, vb = ia.at[case, col], ib.at[case, col]
                    if not _same(va, vb):
                        verdicts.append({"table": name, "case": case, "column": col, "A": va, "B": vb})
        for col in ERROR_COLUMNS:
            if col in ia.columns and col in ib.columns:
                for case in common:
                    va, vb = (
                        pd.to_numeric(ia.at[case, col], errors="coerce"),
                        pd.to_numeric(ib.at[case, col], errors="coerce"),
                    )
                    if pd.isna(va) and pd.isna(vb):
                        continue
                    if pd.isna(va) != pd.isna(vb) or (
                        abs(va - vb) > ATOL and abs(va - vb) > tolerance * max(abs(va), abs(vb))
                    ):
                        errors.append({"table": name, "case": case, "column": col, "A": va, "B": vb})
    return Differences(
        pd.DataFrame(verdicts, columns=["table", "case", "column", "A", "B"]),
        pd.DataFrame(errors, columns=["table", "case", "column", "A", "B"]),
        pd.DataFrame(one_side, columns=["table", "case", "side"]),
        pd.DataFrame(columns=["key", "A", "B"]),
    )


def compare(path_a: str | Path, path_b: str | Path, tolerance: float = 0.25) -> tuple[Side, Side, Differences]:
    """Load both sides and compare them (tolerance: the relative change of an error statistic that counts).

    Raises:
        CompareError: a side cannot be read, or the two are of different kinds.
        ValueError: tolerance is not positive.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance: expected a positive relative change, got {tolerance!r}")
    a, b = load(path_a), load(path_b)
    if a.kind != b.kind:
        raise CompareError(f"compare: {a.path} is a {a.kind} but {b.path} is a {b.kind}; compare runs with runs")
    diff = compare_tables(a.tables, b.tables, tolerance)
    env = [
        {"key": k, "A": a.environment.get(k), "B": b.environment.get(k)}
        for k in sorted(set(a.environment) | set(b.environment))
    ]
    diff.environment = pd.DataFrame([e for e in env if not _same(e["A"], e["B"])], columns=["key", "A", "B"])
    return a, b, diff


def summary_text(a: Side, b: Side, diff: Differences, tolerance: float) -> str:
    """The lines `gdn-lab compare` prints."""
    lines = [
        f"A: {a.path}",
        f"B: {b.path}",
        f"verdicts changed: {len(diff.verdicts)}",
        f"error statistics moved by more than {tolerance:.0%}: {len(diff.errors)}",
        f"cases on one side only: {len(diff.one_side)}",
        f"environment differences: {len(diff.environment)}"
        + (f" ({', '.join(diff.environment.key.head(8))})" if not diff.environment.empty else ""),
    ]
    if not diff.verdicts.empty:
        with pd.option_context("display.width", 200, "display.max_colwidth", 80):
            lines += ["", diff.verdicts.head(40).to_string(index=False)]
    lines.append("no differences" if diff.none else "differences found")
    return "\n".join(lines)


def _table_html(df: pd.DataFrame, title: str) -> str:
    if df.empty:
        return f"<h2>{html.escape(title)}</h2><p>none</p>"
    return f"<h2>{html.escape(title)} ({len(df)})</h2>" + df.to_html(index=False, escape=True, border=0)


def to_html(a: Side, b: Side, diff: Differences, tolerance: float) -> str:
    """A self-contained page of the comparison."""
    css = (
        "body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px}"
        "table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #d0d7de;padding:4px 8px;"
        "text-align:left;vertical-align:top;word-break:break-word}th{background:#f6f8fa}"
    )
    verdict = "no differences" if diff.none else "differences found"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>gdn-lab compare</title><style>{css}</style></head><body>",
        f"<h1>{html.escape(verdict)}</h1>",
        f"<p>A: {html.escape(a.path)}<br>B: {html.escape(b.path)}<br>error statistics count when they move by more than {tolerance:.0%}</p>",
        _table_html(diff.verdicts, "Verdicts changed"),
        _table_html(diff.errors, "Error statistics moved"),
        _table_html(diff.one_side, "On one side only"),
        _table_html(diff.environment, "Environment differences"),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_html(path: str | Path, a: Side, b: Side, diff: Differences, tolerance: float) -> Path:
    return atomic_write_text(path, to_html(a, b, diff, tolerance))
