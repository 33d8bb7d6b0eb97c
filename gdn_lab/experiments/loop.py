"""The one experiment loop: runs, comparisons, status and rows, for every experiment.

Two comparisons, one loop:

- `alone_vs_batched`: each backend runs a target request alone, then the same target inside
  batches of batchmates; the target's rows of every output and its state slots are compared
  bitwise (invariance);
- `against_reference`: each backend and the op's reference run the same batch; every tensor is
  compared with the reference's (parity).

A requested backend is routed by name (`gdn_lab.routing.decide`), never replaced: a call it cannot
run is a row with covered=False and the reason, a call that raises is a row with status "error",
and a case whose inputs cannot be built here (an fp8 format the device does not store) is a
not-covered row for every backend. Each run gets private copies of the states it updates.

An experiment supplies only what differs: its cases (`Case`), its metrics (`Metrics` hooks, which
add columns) and its extra columns. Rows carry the contract columns (`table.COLUMNS`) and
`table.RUN_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab import routing
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.table import base_row
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import Batch, BuildOptions, Request
from gdn_lab.workloads import build, fresh_copy


def select_backends(
    op: str, requested: str | Sequence[str] | None = None, include_controls: bool = True, strict: bool = True
) -> list[routing.Backend]:
    """The backends an experiment runs for `op`, in the registry's order.

    Args:
        op: the op.
        requested: None or "all" for every registered backend; else names.
        include_controls: add the op's batch-variant controls (`routing.controls(op)`) if not named.
        strict: a requested name that is not a backend of `op` raises; when False it is skipped
            (a list of names shared by several ops).

    Raises:
        ValueError: (strict) a requested name is not a backend of `op`; the message lists the registered ones.
    """
    if requested is None or requested == "all":
        chosen = [b for b in routing.backends(op) if not b.variant_control]
    else:
        names = [requested] if isinstance(requested, str) else list(requested)
        registered = set(routing.backend_names(op))
        chosen = [routing.get(op, n) for n in names if strict or n in registered]
    if include_controls:
        chosen += [c for c in routing.controls(op) if c.name not in {b.name for b in chosen}]
    return chosen


@dataclass
class Ran:
    """One backend's run of one call.

    Attributes:
        backend: the requested name.
        covered: whether the backend could take the call.
        reason: routing's reason (why it ran, or why not), or the error.
        result: what the op returned, or None.
        args: the arguments it ran on (with its private state copies, now updated).
        error: "ExcType: message" when the run raised.
    """

    backend: str
    covered: bool
    reason: str
    result: Any = None
    args: dict[str, Any] | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        if not self.covered:
            return "not covered"
        return "error" if self.error else "compared"


def run_backend(op: str, name: str, args: Mapping[str, Any]) -> Ran:
    """Run backend `name` on private copies of the states in `args`; never another backend."""
    decision = routing.decide(op, args, name)
    if decision.backend is None:
        return Ran(name, False, decision.reason)
    mine = fresh_copy(op, args)
    try:
        result = decision.backend.runner(**mine)
        if isinstance(result, torch.Tensor) and result.device.type == "cuda":
            torch.cuda.synchronize(result.device)
    except Exception as exc:  # a backend that claims a case and then fails is reported, not fatal
        return Ran(name, True, decision.reason, error=f"{type(exc).__name__}: {exc}")
    return Ran(name, True, decision.reason, result, mine)


@dataclass(frozen=True)
class Case:
    """One target request and the batches it is compared in.

    Attributes:
        op: the op.
        shape: the op's shape dataclass instance.
        opts: how the batches become tensors.
        seed: the experiment seed (the rows' `seed` column).
        target: the target request.
        batches: (trial, batch) pairs, each batch holding the target.
        alone: the target alone (`alone_vs_batched`), or None (`against_reference`).
        arch: the arch the rows stand for when the case emulates one (an fp8 format), else None.
        columns: extra columns every row of the case carries.
    """

    op: str
    shape: Any
    opts: BuildOptions
    seed: int
    target: Request
    batches: tuple[tuple[int, Batch], ...]
    alone: Batch | None = None
    arch: str | None = None
    columns: Mapping[str, Any] = field(default_factory=dict)


class Metrics:
    """What an experiment adds to the rows; every hook is optional (the defaults add nothing)."""

    def reference(self, case: Case, args: Mapping[str, Any], view: op_spec.View) -> dict[str, torch.Tensor]:
        """Ground-truth tensors of the target alone, by name (given to the other hooks)."""
        return {}

    def alone(
        self,
        case: Case,
        backend: routing.Backend,
        args: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        reference: Mapping[str, torch.Tensor],
    ) -> dict[str, Any]:
        """Columns of every row of `backend` in `case`, from its run of the target alone (`args`)."""
        return {}

    def batched(self, row: Comparison) -> dict[str, Any]:
        """Columns of one compared tensor of one batched run."""
        return {}


class Combined(Metrics):
    """Several experiments' metrics on one run: each hook's columns merged, in order."""

    def __init__(self, *parts: Metrics) -> None:
        self.parts = parts

    def reference(self, case: Case, args: Mapping[str, Any], view: op_spec.View) -> dict[str, torch.Tensor]:
        return {k: v for m in self.parts for k, v in m.reference(case, args, view).items()}

    def alone(self, case, backend, args, tensors, reference) -> dict[str, Any]:
        return {k: v for m in self.parts for k, v in m.alone(case, backend, args, tensors, reference).items()}

    def batched(self, row: Comparison) -> dict[str, Any]:
        return {k: v for m in self.parts for k, v in m.batched(row).items()}


@dataclass(frozen=True)
class Comparison:
    """One compared tensor, as `Metrics.batched` sees it.

    Attributes:
        case, backend, batch, args: where it ran (args: the batched call's validated arguments).
        tensor: the tensor's name.
        bitwise_equal: whether its bits equal the baseline's.
        mine: the batched run's tensors; baseline: the tensors compared with (the target alone,
            or the reference on the same batch); reference: `Metrics.reference`'s.
        alone: the columns `Metrics.alone` gave this backend in this case.
    """

    case: Case
    backend: routing.Backend
    batch: Batch
    args: Mapping[str, Any]
    tensor: str
    bitwise_equal: bool
    mine: Mapping[str, torch.Tensor]
    baseline: Mapping[str, torch.Tensor]
    reference: Mapping[str, torch.Tensor]
    alone: Mapping[str, Any]


def frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """The rows as a table: `columns` first, in order (present even with no rows), then any other
    column a caller's metrics added."""
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in columns))
    return pd.DataFrame(list(rows), columns=[*columns, *extra])


def batch_view(spec: op_spec.OpSpec, batch: Batch, args: Mapping[str, Any]) -> op_spec.View:
    """Every request of the batch: all output rows, and the state slots the batch uses."""
    slots = [spec.view(batch, args, i).slot for i in range(batch.size)] if spec.states else None
    return op_spec.View(slice(None), slots)


def _case_columns(case: Case, batch: Batch, trial: int) -> dict[str, Any]:
    return dict(
        target_len=case.target.length,
        batch_size=batch.size,
        position=batch.position,
        trial=trial,
        batch_tokens=sum(batch.lengths),
        batch_max_len=max(batch.lengths),
        **case.columns,
    )


def _row(case: Case, backend: routing.Backend, ran: Ran, **fields: Any) -> dict[str, Any]:
    opts = case.opts
    kv = opts.kv_dtype if op_spec.get(case.op).kv_cache else None
    return base_row(
        backend,
        opts.device,
        opts.dtype,
        kv,
        case.seed,
        arch=case.arch,
        backend_ran=ran.backend if ran.covered else None,
        covered=ran.covered,
        reason=ran.error or ran.reason,
        status=ran.status,
        **fields,
    )


def _compared_rows(
    case: Case,
    backend: routing.Backend,
    ran: Ran,
    batch: Batch,
    args: Mapping[str, Any],
    mine: Mapping[str, torch.Tensor],
    baseline: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    metrics: Metrics,
    fields: Mapping[str, Any],
    alone: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One row per tensor both runs have (or one row saying why nothing was compared)."""
    if ran.status != "compared" or not baseline:
        return [_row(case, backend, ran, tensor=op_spec.get(case.op).outputs[0], **fields, **alone)]
    rows = []
    for name, value in mine.items():
        if name not in baseline:
            continue
        cmp = compare(baseline[name], value)
        c = Comparison(case, backend, batch, args, name, cmp["bitwise_equal"], mine, baseline, reference, alone)
        rows.append(_row(case, backend, ran, **{"tensor": name, **fields, **alone, **cmp, **metrics.batched(c)}))
    return rows


def _uncovered(case: Case, backends: Iterable[routing.Backend], reason: str) -> list[dict[str, Any]]:
    """Rows for a case whose inputs cannot be built here."""
    fields = _case_columns(case, case.batches[0][1] if case.batches else case.alone, 0)
    return [
        _row(case, b, Ran(b.name, False, reason), tensor=op_spec.get(case.op).outputs[0], **fields) for b in backends
    ]


def alone_vs_batched(
    cases: Sequence[Case],
    backends: Sequence[routing.Backend],
    metrics: Metrics | None = None,
    *,
    progress: bool = True,
    desc: str = "",
) -> list[dict[str, Any]]:
    """Every backend on every case: the target alone, then in each batch, compared bitwise.

    Args:
        cases: the cases (each with `alone` set).
        backends: the backends to run (`select_backends`).
        metrics: the experiment's hooks.
        progress: a tqdm bar on stderr.
        desc: the bar's label.

    Returns:
        Rows (dicts): one per (case, batch, backend, compared tensor).
    """
    metrics = metrics or Metrics()
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=sum(1 + len(c.batches) for c in cases), desc=desc, disable=not progress, leave=False)
    try:
        for case in cases:
            assert case.alone is not None, "alone_vs_batched needs each case's target alone"
            spec = op_spec.get(case.op)
            try:
                solo_args = build(case.op, case.alone, case.shape, case.opts)
            except ValueError as exc:  # e.g. an fp8 format this device does not store
                rows += _uncovered(case, backends, str(exc))
                bar.update(1 + len(case.batches))
                continue
            solo_view = spec.view(case.alone, solo_args, case.alone.position)
            reference = metrics.reference(case, solo_args, solo_view)
            solos = {}
            for b in backends:
                ran = run_backend(case.op, b.name, solo_args)
                tensors = spec.tensors(ran.result, ran.args, solo_view) if ran.status == "compared" else {}
                extra = metrics.alone(case, b, solo_args, tensors, reference) if tensors else {}
                solos[b.name] = (ran, tensors, extra)
            bar.update()
            for trial, batch in case.batches:
                args = build(case.op, batch, case.shape, case.opts)
                view = spec.view(batch, args, batch.position)
                for b in backends:
                    first, alone_tensors, extra = solos[b.name]
                    ran = run_backend(case.op, b.name, args) if first.status == "compared" else first
                    mine = spec.tensors(ran.result, ran.args, view) if ran.status == "compared" else {}
                    fields = _case_columns(case, batch, trial)
                    rows += _compared_rows(
                        case, b, ran, batch, args, mine, alone_tensors, reference, metrics, fields, extra
                    )
                bar.update()
    finally:
        bar.close()
    return rows


def against_reference(
    cases: Sequence[Case],
    backends: Sequence[routing.Backend],
    metrics: Metrics | None = None,
    *,
    progress: bool = True,
    desc: str = "",
) -> list[dict[str, Any]]:
    """Every backend against the op's reference backend on the same batches, tensor by tensor.

    The whole batch is compared: every output row and the state slots the batch uses.

    Raises:
        RuntimeError: the reference did not run a case (it must cover every case).
    """
    metrics = metrics or Metrics()
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=sum(len(c.batches) for c in cases), desc=desc, disable=not progress, leave=False)
    try:
        for case in cases:
            spec = op_spec.get(case.op)
            for trial, batch in case.batches:
                args = build(case.op, batch, case.shape, case.opts)
                view = batch_view(spec, batch, args)
                ref = run_backend(case.op, spec.reference, args)
                if ref.status != "compared":
                    raise RuntimeError(
                        f"{case.op}: the reference {spec.reference!r} must run every case, but: {ref.reason}"
                    )
                baseline = spec.tensors(ref.result, ref.args, view)
                for b in backends:
                    if b.name == spec.reference:
                        continue
                    ran = run_backend(case.op, b.name, args)
                    mine = spec.tensors(ran.result, ran.args, view) if ran.status == "compared" else {}
                    fields = _case_columns(case, batch, trial)
                    rows += _compared_rows(case, b, ran, batch, args, mine, baseline, baseline, metrics, fields, {})
                bar.update()
    finally:
        bar.close()
    return rows
