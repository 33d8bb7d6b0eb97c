"""Reports a reader takes in at a glance: plots labelled in words, reasons summarised, an index that
opens with one verdict and says when its notebooks come from different runs or code."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from gdn_lab.experiments.common import error_note, short_reason  # noqa: E402
from gdn_lab.report import plots  # noqa: E402
from gdn_lab.report.html import index_html, report_banner, verdict  # noqa: E402
from gdn_lab.report.tables import show  # noqa: E402


def _table():
    return pd.DataFrame(
        {
            "status": ["compared"] * 4 + ["error"],
            "backend": ["torch", "torch", "triton", "triton", "aiter-triton-pa"],
            "target_len": [1, 257, 1, 257, 1],
            "exact_max_abs": [1e-6, 2e-6, 0.0, 3e-6, None],
            "rel_mae": [1e-7, 2e-7, 1e-7, 0.0, None],
            "tensor": ["out", "out", "out", "out", "out"],
            "reason": [
                "",
                "",
                "",
                "",
                "KeyError: key contains names that are not kernel arguments: " + "waves_per_eu, " * 40,
            ],
        }
    )


def test_axis_labels_are_words_not_column_names():
    fig = plots.error_vs_context(_table(), y="exact_max_abs", categorical=True)
    labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes if ax.get_ylabel() or ax.get_xlabel()]
    assert labels and all("_" not in x and "_" not in y for x, y in labels), labels
    assert ("context length (tokens)", "max |out − exact softmax|") in labels
    fig = plots.parity_bars(_table())
    assert fig.axes[0].get_ylabel() == "relative mean abs error"


def test_long_reasons_are_summarised_in_reports_and_kept_in_tables():
    table = _table()
    shown = show(table, ["backend", "status", "reason"])
    assert len(shown.reason.iloc[-1]) <= 162 and shown.reason.iloc[-1].endswith("…")
    assert table.reason.iloc[-1].count("waves_per_eu") == 40, "the table keeps the whole text"
    assert short_reason("RuntimeError: boom\n  File x.py, line 3") == "RuntimeError: boom …"
    assert error_note(table).startswith("1 ERROR rows (aiter-triton-pa: 1; first: KeyError: key contains names")


def _summary(**over):
    nb = {"name": "01_x", "status": "ok", "run_id": "r1", "source_version": "aaa", "headline": "fine", "files": {}}
    base = {
        "preset": "p",
        "run": {"id": "r1", "started": "t0", "finished": "t1", "state": "complete", "code": {"source": "aaa"}},
        "runs": {"r1": {"started": "t0"}},
        "notebooks": [nb, {**nb, "name": "02_y"}],
        "fingerprint": {},
    }
    base.update(over)
    return base


def test_the_index_opens_with_one_verdict_line():
    assert verdict(_summary()) == ("ok", "All 2 notebooks ran")
    nbs = _summary()["notebooks"]
    mixed = _summary(
        notebooks=[nbs[0], {**nbs[1], "run_id": "r0", "source_version": "bbb", "error_rows": 3}],
        runs={"r1": {"started": "t0"}, "r0": {"started": "yesterday"}},
    )
    level, line = verdict(mixed)
    assert level == "warn" and "error rows in 02_y (3)" in line and "2 runs and 2 code versions" in line
    page = index_html(mixed)
    assert page.index('class="verdict warn"') < page.index("<h2>Notebooks</h2>")
    assert "from another run: started yesterday" in page and "other code: source bbb" in page
    running = _summary(run={"id": "r1", "started": "t0", "state": "running", "pid": 1, "host": "h"})
    assert verdict(running)[0] == "fail" and "INCOMPLETE" in verdict(running)[1]


def test_the_report_banner_carries_the_headline_error_rows_and_captured_warnings():
    banner = report_banner(
        {
            "status": "ok",
            "headline": "all fine",
            "error_rows": 2,
            "warnings": {"captured": 3, "warnings": [{"name": "w"}]},
        }
    )
    assert "all fine" in banner and "2 error rows" in banner and "3 known warnings captured" in banner
