"""benchmarks/bench_common.py: the invariance verdicts every benchmark's invariance rows get."""

import pytest


@pytest.fixture(scope="module")
def common(load_script):
    return load_script("bench_common.py")


def rows_of(*cases):
    """(case, impl, bitwise_equal) triples as invariance rows, with a timing row among them."""
    rows = [{"kind": "timing", "case": 0, "impl": "ours"}]
    rows += [{"kind": "invariance", "case": c, "impl": i, "bitwise_equal": e} for c, i, e in cases]
    return rows


def verdicts(rows):
    return [(r["case"], r["impl"], r["verdict"]) for r in rows if r["kind"] == "invariance"]


def test_each_case_is_judged_by_its_own_controls(common):
    rows = rows_of(
        (1, "ours", True), (1, "control", False),  # caught: the equality holds
        (2, "ours", True), (2, "control", True),  # not caught: the equality proves nothing
        (3, "ours", False), (3, "control", False),  # ours differed
        (4, "ours", True), (4, "control", True), (4, "other-control", False),  # one control of two caught
        (5, "ours", True),  # no control ran in this case
        (6, "ours", ""), (6, "control", None),  # nothing compared
    )  # fmt: skip
    common.mark_invariance(rows, ("case",), lambda r: "control" in r["impl"])
    assert verdicts(rows) == [
        (1, "ours", "invariant"), (1, "control", "caught"),
        (2, "ours", "insensitive"), (2, "control", "NOT caught"),
        (3, "ours", "variant"), (3, "control", "caught"),
        (4, "ours", "invariant"), (4, "control", "NOT caught"), (4, "other-control", "caught"),
        (5, "ours", "insensitive"),
        (6, "ours", "error"), (6, "control", "error"),
    ]  # fmt: skip
    assert "verdict" not in rows[0], "only invariance rows are judged"


def test_a_case_spans_every_column_named(common):
    rows = rows_of((1, "ours", True), (1, "control", False))
    rows += [{"kind": "invariance", "case": 1, "impl": "ours", "bitwise_equal": True, "B": 8}]
    for r in rows:
        r.setdefault("B", 1)
    common.mark_invariance(rows, ("case", "B"), lambda r: r["impl"] == "control")
    assert [r["verdict"] for r in rows[1:]] == ["invariant", "caught", "insensitive"]


def test_lines_count_each_implementations_verdicts(common):
    rows = rows_of((1, "ours", True), (1, "control", False), (2, "ours", True), (2, "control", True))
    common.mark_invariance(rows, ("case",), lambda r: r["impl"] == "control")
    assert common.invariance_lines(rows) == [
        "invariance ours: invariant 1, insensitive 1 (of 2 cases)",
        "invariance control: caught 1, NOT caught 1 (of 2 cases)",
    ]
    assert common.invariance_lines(rows, ("case", "impl"))[0] == "invariance 1 ours: invariant 1 (of 1 case)"
