"""diff two traces for one request, and find the call that first changed its bits.

Calls are matched by (step, name, call_index); a request is named by its id, so it may sit at
different rows (or be alone) in the two runs. A tensor is compared by the request's hash of its
rows when both runs could align it to the request, else by its whole-tensor hash (a weight, a
scale: equal whatever the batch).

Each tensor of a call comes out as one of:

- equal: the request's rows (or, for a tensor aligned in neither run, the whole tensor) are the same;
- changed: the request's rows differ (or the tensor is missing on one side);
- unaligned: the tensor could not be aligned to the request in both runs and its whole-tensor hash
  differs: it may differ in other requests' rows only (a [T * heads, D] reshape, a state pool).

A culprit is a call whose inputs were all equal and some output of which changed for the request,
and inside which no recorded call is itself a culprit (an enclosing module is explained by the
function or lab op in it that changed). Calls with no tensor input (factories such as arange,
whose output follows shape arguments the trace does not hash), calls with a changed or unaligned
input, and calls whose only difference is unaligned are never culprits.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import pandas as pd

from gdn_lab.trace.record import FUNCTION, LAB_OP, MODULE, Entry, TensorRecord, Trace

COLUMNS = [
    "order", "step", "name", "kind", "op", "call_index", "module", "parent", "backend_a", "backend_b",
    "n_inputs", "n_outputs", "input_equal", "output_equal", "changed_inputs", "changed_outputs",
    "unaligned_inputs", "unaligned_outputs", "matched", "error", "culprit",
]  # fmt: skip
EQUAL, CHANGED, UNALIGNED_DIFF = "equal", "changed", "unaligned"
KINDS = (MODULE, FUNCTION, LAB_OP)


def _check_request(name: str, trace: Trace, request: int | str) -> None:
    if isinstance(request, bool) or not isinstance(request, (int, str)):
        raise ValueError(f"{name}: {request!r} ({type(request).__name__}) is not a request id; accepted: an int or str")
    steps = {e.step for e in trace._entries if request in e.layout}
    if not steps:
        seen = sorted({str(r) for e in trace._entries for r in e.layout.request_ids})[:10]
        raise ValueError(
            f"{name}: request {request!r} is in none of the trace's layouts; accepted: an id recorded there "
            f"(first ids: {', '.join(seen) or 'none: the trace is empty'})"
        )


# trace -> how many of its entries passed _check_layouts (a trace is diffed against many others)
_checked: weakref.WeakKeyDictionary[Trace, int] = weakref.WeakKeyDictionary()


def _check_layouts(name: str, trace: Trace) -> None:
    """Every step must have aligned some tensor to its layout, or the layout was not the batch's."""
    if _checked.get(trace) == len(trace._entries):
        return
    aligned: dict[int, bool] = {}
    leads: dict[int, set] = {}
    for e in trace._entries:
        for r in (*e.inputs, *e.outputs):
            aligned[e.step] = aligned.get(e.step, False) or r.alignment != "unaligned"
            leads.setdefault(e.step, set()).add(r.shape[0] if r.shape else None)
    for step, ok in aligned.items():
        if not ok:
            lay = next(e.layout for e in trace._entries if e.step == step)
            seen = ", ".join(str(x) for x in sorted(leads[step], key=str)[:8])
            raise ValueError(
                f"{name}: no tensor of step {step} has a leading dim of its layout's {lay.num_rows} rows or "
                f"{lay.num_requests} requests (leading dims seen: {seen}); accepted: the layout of the batch that ran"
            )
    _checked[trace] = len(trace._entries)


def _status(ta: Trace, ra: TensorRecord, qa: int | str, tb: Trace, rb: TensorRecord, qb: int | str) -> str:
    ha, hb = ta.hash_of(ra, qa), tb.hash_of(rb, qb)
    if ha is not None and hb is not None:
        return EQUAL if ha == hb else CHANGED
    wa, wb = ta.whole_hash_of(ra), tb.whole_hash_of(rb)
    return EQUAL if wa is not None and wa == wb else UNALIGNED_DIFF


def _compare(
    ta: Trace, a: list[TensorRecord], qa: int | str, tb: Trace, b: list[TensorRecord], qb: int | str
) -> tuple[int, list[str], list[str]]:
    """(number of tensor paths compared, changed paths, unaligned paths that differ)."""
    by_a, by_b = {r.path: r for r in a}, {r.path: r for r in b}
    changed, unaligned = [], []
    paths = list(by_a) + [p for p in by_b if p not in by_a]
    for p in paths:
        status = CHANGED if p not in by_a or p not in by_b else _status(ta, by_a[p], qa, tb, by_b[p], qb)
        if status == CHANGED:
            changed.append(p)
        elif status == UNALIGNED_DIFF:
            unaligned.append(p)
    return len(paths), changed, unaligned


def _key(e: Entry) -> tuple[int, str, int]:
    return e.step, e.name, e.call_index


def _describe(keys: list[tuple[int, str, int]]) -> str:
    shown = ", ".join(f"step {s} {n!r} #{i}" for s, n, i in keys[:5])
    return f"{len(keys)} ({shown}{', ...' if len(keys) > 5 else ''})"


def diff(
    tr_a: Trace,
    tr_b: Trace,
    request_a: int | str,
    request_b: int | str | None = None,
    *,
    strict: bool = True,
    kinds: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Compare one request's hashes call by call between two traces.

    Args:
        tr_a, tr_b: traces of the same model code at the same level (e.g. the request alone, and
            inside a batch).
        request_a: the request's id in tr_a's layouts.
        request_b: its id in tr_b's layouts (default: request_a).
        strict: raise when the traces' calls differ (over the steps both hold the request); with
            False, unmatched calls are rows with matched=False and are never culprits.
        kinds: compare only calls of these kinds ("module", "function", "lab_op"; default all);
            a call's parent is then its nearest enclosing call of a kept kind, so
            `kinds=("module",)` on two level="ops" traces gives what two level="modules" traces give.

    Returns:
        One row per call of tr_a in a step where both traces hold the request, in execution order.
        Columns: order (index in tr_a), step, name, kind, op, call_index, module, parent (the
        enclosing call's name), backend_a, backend_b, n_inputs, n_outputs (tensor paths compared),
        input_equal, output_equal (every tensor equal), changed_inputs, changed_outputs,
        unaligned_inputs, unaligned_outputs (paths, "; "-joined), matched, error (the call raised in
        either run), culprit.

    Raises:
        ValueError: a trace is not a Trace, the levels differ, a request is in none of its trace's
            layouts, an unknown kind, or (strict) the traces diverge in structure.

    Example:
        >>> import torch
        >>> from gdn_lab.trace import Layout, record
        >>> class Shift(torch.nn.Module):  # batch-variant on purpose
        ...     def forward(self, x):
        ...         return x + 1e-3 * x.shape[0]
        >>> net = torch.nn.Sequential(torch.nn.ReLU(), Shift(), torch.nn.ReLU())
        >>> x = torch.randn(3, 4)
        >>> with record(net, Layout.per_request([0, 1, 2]), level="ops") as batched:
        ...     _ = net(x)
        >>> with record(net, Layout.per_request([1]), level="ops") as alone:
        ...     _ = net(x[1:2])
        >>> df = diff(alone, batched, 1)
        >>> df[["name", "input_equal", "output_equal", "culprit"]].values.tolist()
        [['Sequential', True, False, False], ['0', True, True, False], ['0.F.relu', True, True, False], ['1', True, False, False], ['1.Tensor.add', True, False, True], ['2', False, False, False], ['2.F.relu', False, False, False]]
        >>> first_culprit(df)["name"]
        '1.Tensor.add'
    """
    for name, t in (("tr_a", tr_a), ("tr_b", tr_b)):
        if not isinstance(t, Trace):
            raise ValueError(f"{name}: expected a gdn_lab.trace.Trace, got {type(t).__name__}")
    if tr_a.level != tr_b.level:
        raise ValueError(
            f"tr_a, tr_b: recorded at level {tr_a.level!r} and {tr_b.level!r}; accepted: two traces of one level"
        )
    if kinds is not None:
        kinds = tuple(kinds)
        bad = [k for k in kinds if k not in KINDS]
        if bad or not kinds:
            raise ValueError(f"kinds: {bad or 'none'} not accepted; accepted: a non-empty list of {', '.join(KINDS)}")
    request_b = request_a if request_b is None else request_b
    _check_request("request_a", tr_a, request_a)
    _check_request("request_b", tr_b, request_b)
    _check_layouts("tr_a", tr_a)
    _check_layouts("tr_b", tr_b)
    all_a = tr_a.entries

    def kept(e: Entry) -> bool:
        return kinds is None or e.kind in kinds

    def parent_of(e: Entry) -> int | None:
        p = e.parent
        while p is not None and not kept(all_a[p]):
            p = all_a[p].parent
        return p

    ea = [e for e in all_a if request_a in e.layout and kept(e)]
    eb_all = [e for e in tr_b.entries if request_b in e.layout and kept(e)]
    common = {e.step for e in ea} & {e.step for e in eb_all}
    ea = [e for e in ea if e.step in common]
    eb = {_key(e): e for e in eb_all if e.step in common}
    only_a = [_key(e) for e in ea if _key(e) not in eb]
    keys_a = {_key(e) for e in ea}
    only_b = [k for k in eb if k not in keys_a]
    if strict and (only_a or only_b):
        raise ValueError(
            f"tr_a, tr_b: the traces diverge in structure: calls only in tr_a: {_describe(only_a)}; only in tr_b: "
            f"{_describe(only_b)}. Record both runs with the same model code, or pass strict=False"
        )
    names = {e.index: e.name for e in tr_a._entries}
    parents = {e.index: parent_of(e) for e in ea}
    rows: dict[int, dict] = {}
    for e in ea:
        other = eb.get(_key(e))
        parent = parents[e.index]
        row = {
            "order": e.index, "step": e.step, "name": e.name, "kind": e.kind, "op": e.op, "call_index": e.call_index,
            "module": e.module, "parent": names.get(parent, "") if parent is not None else "",
            "backend_a": e.backend, "backend_b": other.backend if other else None,
            "matched": other is not None, "error": e.error or (other is not None and other.error), "culprit": False,
        }  # fmt: skip
        if other is None:
            row.update(n_inputs=len(e.inputs), n_outputs=len(e.outputs), input_equal=None, output_equal=None)
            row.update(changed_inputs="", changed_outputs="", unaligned_inputs="", unaligned_outputs="")
        else:
            n_in, ch_in, un_in = _compare(tr_a, e.inputs, request_a, tr_b, other.inputs, request_b)
            n_out, ch_out, un_out = _compare(tr_a, e.outputs, request_a, tr_b, other.outputs, request_b)
            row.update(n_inputs=n_in, n_outputs=n_out, input_equal=not (ch_in or un_in))
            row.update(output_equal=not (ch_out or un_out), changed_inputs="; ".join(ch_in))
            row.update(changed_outputs="; ".join(ch_out), unaligned_inputs="; ".join(un_in))
            row.update(unaligned_outputs="; ".join(un_out))
        rows[e.index] = row
    # Children start after their parent: walking backwards settles every call inside one first.
    culprit_inside: set[int] = set()
    for e in reversed(ea):
        row = rows[e.index]
        row["culprit"] = bool(
            row["matched"] and not row["error"] and row["n_inputs"] > 0 and row["input_equal"]
            and row["changed_outputs"] and e.index not in culprit_inside
        )  # fmt: skip
        parent = parents[e.index]
        if parent is not None and (row["culprit"] or e.index in culprit_inside):
            culprit_inside.add(parent)
    return pd.DataFrame([rows[e.index] for e in ea], columns=COLUMNS)


def first_culprit(df: pd.DataFrame) -> pd.Series | None:
    """The first call, in execution order, whose output changed while all its inputs were equal.

    Args:
        df: a `diff` result.

    Returns:
        Its row (name, kind, step, backend_a, ...), or None when no call is a culprit.

    Raises:
        ValueError: df is not a diff result (no culprit and order columns).
    """
    if not isinstance(df, pd.DataFrame) or not {"culprit", "order"} <= set(df.columns):
        raise ValueError("df: expected a DataFrame returned by gdn_lab.trace.diff (with culprit and order columns)")
    found = df[df["culprit"].astype(bool)].sort_values("order")
    return None if found.empty else found.iloc[0]


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Counts per kind and op: calls compared, calls whose request rows changed in an input or an
    output, calls with a difference that could not be aligned to the request, and culprits
    ("decode_attention: compared 5940 times, 0 culprits").

    Args:
        df: a `diff` result.

    Returns:
        Columns kind, op, compared, inputs_changed, outputs_changed, unaligned, culprits.

    Raises:
        ValueError: df is not a diff result.
    """
    if not isinstance(df, pd.DataFrame) or not set(COLUMNS) <= set(df.columns):
        raise ValueError("df: expected a DataFrame returned by gdn_lab.trace.diff")
    m = df[df["matched"]].copy()
    m["inputs_changed"] = m["changed_inputs"] != ""
    m["outputs_changed"] = m["changed_outputs"] != ""
    m["unaligned"] = (m["unaligned_inputs"] != "") | (m["unaligned_outputs"] != "")
    counts = ["inputs_changed", "outputs_changed", "unaligned", "culprits"]
    out = m.groupby(["kind", "op"], sort=True).agg(
        compared=("name", "size"), **{c: (c if c != "culprits" else "culprit", "sum") for c in counts}
    )
    return out.reset_index().astype({c: int for c in ["compared", *counts]})
