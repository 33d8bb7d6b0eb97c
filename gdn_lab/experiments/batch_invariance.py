"""Batch invariance: does a request get the same bits alone and inside batches?

For each target length, the target runs alone, then at a random position inside batches of random
batchmates (`gdn_lab.workloads`). Its output rows, and for ops with state pools its slots after the
run, are compared bitwise with the alone run (`gdn_lab.experiments.loop.alone_vs_batched`). Every
requested backend runs on the same inputs, and the op's batch-variant controls
(`routing.controls(op)`) run alongside: a run whose control shows no difference anywhere cannot
see batch variance and is flagged `insensitive`. Closeness to the op's reference backend is a
separate column (`ref_max_abs`, and `ref_within_tolerance` where the op's spec names a tolerance
for the tensor at the run's compute dtype: a float32 state of a bf16 run is held to the op's bf16 tolerance).

Example:
    >>> from gdn_lab.experiments.batch_invariance import batch_invariance, summarize
    >>> df = batch_invariance("decode_attention", backends=["torch"], targets=[5], batch_sizes=[3],
    ...                       device="cpu", dtype="float32", attention={"num_q_heads": 2, "num_kv_heads": 1,
    ...                       "head_dim": 16}, max_context=40, progress=False)
    >>> bool(df.query("covered").bitwise_equal.all())
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd
import torch

from gdn_lab import routing
from gdn_lab.experiments.common import fmt_list, label, max_abs, short_reason, with_errors
from gdn_lab.experiments.config import (
    ExperimentConfig,
    check,
    check_backends,
    known_arch,
    known_kv_dtype,
    known_op,
    known_ops,
    make_shape,
    positive,
    positive_ints,
    shape_of,
)
from gdn_lab.experiments.loop import Case, Comparison, Metrics, alone_vs_batched, frame, run_backend, select_backends
from gdn_lab.experiments.processes import run_in_processes
from gdn_lab.experiments.table import COLUMNS, RUN_COLUMNS
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import AttentionShape, BuildOptions, GDNShape
from gdn_lab.workloads import DEFAULT_MAX_CONTEXT, alone, make_batch, target_request

DEFAULT_TARGETS = (1, 255, 256, 257)
DEFAULT_BATCH_SIZES = (2, 8, 33)
DEFAULT_OPS = ("decode_attention", "prefill_attention", "gdn_decode", "gdn_prefill", "gdn_layer_prefill")

# Columns this experiment adds to the contract and run columns.
EXTRA_COLUMNS = ["ref_max_abs", "ref_within_tolerance", "control_caught", "insensitive"]


@dataclass(frozen=True, kw_only=True)
class InvarianceConfig(ExperimentConfig):
    """One op's batch-invariance experiment.

    Attributes:
        op: the op (a registered one).
        backends: backend names to test (None: every registered backend; controls always run
            unless include_controls is False).
        targets: target lengths (context tokens of attention; sequence tokens of prefill ops;
            ops with a fixed length, such as gdn_decode's one step, ignore them).
        batch_sizes: batch sizes the target is placed in, at a seeded random position.
        trials: batches per (target, batch size).
        kv_dtype: the KV-cache dtype of ops with a KV cache (None: the compute dtype; "fp8": the
            arch's fp8 format; or a compute dtype name).
        arch: the arch whose fp8 format is used (None: the device's).
        attention, gdn, linear, moe: fields of the op's shape dataclass (`AttentionShape`,
            `GDNShape`, `LinearShape`, `MoEShape`), as {name: value}; only the op's own applies.
        min_context, max_context: batchmates' lengths are uniform in this range.
        new_tokens: prefill over a cached context: each request's new tokens (None: all).
        quantize_fp8: ops that can also quantize their output to group-128 fp8 compare that too.
        include_controls: also run the op's batch-variant controls.
        strict_backends: a named backend the op lacks is an error (True) or skipped (a list
            shared by several ops).
    """

    op: str = field(metadata=check(known_op, "the op"))
    backends: tuple[str, ...] | None = None
    targets: tuple[int, ...] = field(default=DEFAULT_TARGETS, metadata=check(positive_ints, "target lengths"))
    batch_sizes: tuple[int, ...] = field(default=DEFAULT_BATCH_SIZES, metadata=check(positive_ints, "batch sizes"))
    trials: int = field(default=1, metadata=check(positive, "batches per (target, batch size)"))
    kv_dtype: str | None = field(default=None, metadata=check(known_kv_dtype, "KV cache dtype"))
    arch: str | None = field(default=None, metadata=check(known_arch, "the arch whose fp8 format is used"))
    attention: dict[str, int] | None = None
    gdn: dict[str, int] | None = None
    linear: dict[str, int] | None = None
    moe: dict[str, int] | None = None
    min_context: int = field(default=1, metadata=check(positive))
    max_context: int = field(default=DEFAULT_MAX_CONTEXT, metadata=check(positive))
    new_tokens: int | None = field(default=None, metadata=check(positive))
    quantize_fp8: bool = False
    include_controls: bool = True
    strict_backends: bool = True

    def validate(self) -> None:
        super().validate()
        check_backends("backends", self.op, self.backends, self.strict_backends)
        if self.max_context < self.min_context:
            raise ValueError(f"max_context: must be >= min_context (={self.min_context}), got {self.max_context}")
        if self.kv_dtype is not None and not self.spec.kv_cache:
            raise ValueError(
                f"kv_dtype: {self.op} has no KV cache, so kv_dtype={self.kv_dtype!r} does not apply; pass null"
            )
        self.shape  # noqa: B018  (a bad shape field is an error now)
        self.build_options()

    @property
    def spec(self) -> op_spec.OpSpec:
        return op_spec.get(self.op)

    @property
    def shape(self) -> Any:
        return shape_of(self.op, {"attention": self.attention, "gdn": self.gdn, "linear": self.linear, "moe": self.moe})

    @property
    def effective_targets(self) -> tuple[int, ...]:
        # An op whose requests have a fixed length (a decode step) has no target length to vary.
        return (self.spec.fixed_length,) if self.spec.fixed_length else self.targets

    def build_options(self) -> BuildOptions:
        arch = self.arch or self.device_arch
        return BuildOptions(
            dtype=self.torch_dtype,
            kv_dtype=self.kv_torch_dtype(self.kv_dtype, arch),
            device=self.torch_device,
            quantize_fp8=self.quantize_fp8,
            fp8_dtype=self.kv_torch_dtype("fp8", arch) if self.quantize_fp8 else None,
        )

    def cases(self) -> list[Case]:
        """One case per target: alone, then in batch_sizes x trials batches."""
        mate_max = self.spec.fixed_length or self.max_context
        mate_min = min(self.min_context, mate_max)
        opts, shape, out = self.build_options(), self.shape, []
        for length in self.effective_targets:
            target = target_request(length, self.seed, self.new_tokens)
            batches = tuple(
                (trial, make_batch(target, size, seed=self.seed, trial=trial, min_len=mate_min, max_len=mate_max,
                                   new_tokens=self.new_tokens))
                for size in self.batch_sizes for trial in range(self.trials)
            )  # fmt: skip
            out.append(Case(self.op, shape, opts, self.seed, target, batches, alone(target, self.seed), self.arch))
        return out


class _ReferenceCloseness(Metrics):
    """The op's reference backend on the target alone; each batched tensor's distance to it."""

    def reference(self, case: Case, args: Mapping[str, Any], view: op_spec.View) -> dict[str, torch.Tensor]:
        spec = op_spec.get(case.op)
        ran = run_backend(case.op, spec.reference, args)
        return spec.tensors(ran.result, ran.args, view) if ran.status == "compared" else {}

    def batched(self, c: Comparison) -> dict[str, Any]:
        spec = op_spec.get(c.case.op)
        out: dict[str, Any] = {}
        if c.tensor in c.reference:
            out["ref_max_abs"] = max_abs(spec.as_values(c.mine, c.tensor), spec.as_values(c.reference, c.tensor))
            try:  # the specs key tolerances by compute dtype, whatever the tensor's own
                tol = spec.tolerance(c.tensor, c.case.opts.dtype)
            except ValueError:
                tol = None
            if tol is not None:
                out["ref_within_tolerance"] = tol.holds(
                    spec.as_values(c.mine, c.tensor), spec.as_values(c.reference, c.tensor)
                )
        return out


def batch_invariance(op: str, *, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Run one op's batch-invariance experiment.

    Args:
        op: a registered op (`gdn_lab.ops.spec.names()`).
        progress: show a tqdm bar on stderr.
        **kwargs: the fields of `InvarianceConfig` (plain values: names, lists, dicts).

    Returns:
        One row per comparison (backend x target x batch size x trial x tensor): the contract
        columns (`table.COLUMNS`), `table.RUN_COLUMNS` and `EXTRA_COLUMNS`. A backend that cannot
        run a case gives a row with covered=False and the reason; one that raises gives status="error".
    """
    return run(InvarianceConfig(op=op, **kwargs), progress=progress)


def configs(
    ops: Sequence[str], op_overrides: Mapping[str, Mapping[str, Any]] | None = None, **common: Any
) -> list[InvarianceConfig]:
    """One InvarianceConfig per op: `common` values, replaced by `op_overrides[op]` (checked, none run).

    Names in a shared `backends` list that an op lacks are skipped for that op (an op left with
    none of them is an error), and a shared kv_dtype applies to the ops with a KV cache only.
    Overrides may name any registered op: those of ops not in `ops` are not used (a preset keeps
    every op's overrides, `-p ops=[...]` picks some).

    Raises:
        ValueError: an unknown op (in `ops` or `op_overrides`), an unknown field, or a bad value.
    """
    known_ops("ops", ops)
    overrides = dict(op_overrides or {})
    unknown = sorted(set(overrides) - set(op_spec.names()))
    if unknown:
        raise ValueError(f"op_overrides: {', '.join(unknown)} not an op; accepted: {', '.join(op_spec.names())}")
    names = {f.name for f in fields(InvarianceConfig)} - {"op"}
    out = []
    for op in ops:
        own = dict(overrides.get(op) or {})
        bad = sorted(set(own) - names)
        if bad:
            raise ValueError(f"op_overrides.{op}: {', '.join(bad)} not accepted; accepted: {', '.join(sorted(names))}")
        shared = {"strict_backends": False, **common}
        if not op_spec.get(op).kv_cache:
            shared["kv_dtype"] = None
        try:
            cfg = InvarianceConfig(op=op, **{**shared, **own})
        except ValueError as exc:
            field_name = str(exc).split(":")[0].split(".")[0].split("[")[0]
            where = f"op_overrides.{op}." if field_name in own else f"{op}: "
            raise ValueError(f"{where}{exc}") from None
        if cfg.backends is not None and not any(b in routing.backend_names(op) for b in cfg.backends):
            raise ValueError(
                f"backends: none of {', '.join(cfg.backends)} is a backend of {op}; accepted: "
                f"{', '.join(routing.backend_names(op))} (or give op_overrides.{op}.backends, or leave {op} out of ops)"
            )
        out.append(cfg)
    return out


@dataclass(frozen=True, kw_only=True)
class InvarianceByOpConfig(ExperimentConfig):
    """Several ops' batch-invariance experiments (notebook 01): shared values, per-op replacements.

    Attributes:
        ops: the ops to test, in this order.
        backends: backend names to test in every op that has them (None: every registered
            backend); each op's controls always run.
        targets, batch_sizes, trials, kv_dtype, max_context, attention, gdn, quantize_fp8: as
            `InvarianceConfig`, shared by every op (kv_dtype applies to ops with a KV cache).
        op_overrides: {op: {InvarianceConfig field: value}} replacing the shared values for one op.
        workers: processes that run the ops side by side (1: one after another in this process).
            The table is the same either way: each op's cases are seeded by the op's config
            alone. On a cold Triton cache the ops' compilations then overlap
            (`gdn_lab.experiments.processes`).
    """

    ops: tuple[str, ...] = field(default=DEFAULT_OPS, metadata=check(known_ops, "the ops to test"))
    backends: tuple[str, ...] | None = field(default=None, metadata=check(help="backends (None: all)"))
    targets: tuple[int, ...] = field(default=DEFAULT_TARGETS, metadata=check(positive_ints, "target lengths"))
    batch_sizes: tuple[int, ...] = field(default=DEFAULT_BATCH_SIZES, metadata=check(positive_ints, "batch sizes"))
    trials: int = field(default=1, metadata=check(positive, "batches per (target, batch size)"))
    kv_dtype: str | None = field(default=None, metadata=check(known_kv_dtype, "KV cache dtype"))
    max_context: int = field(default=DEFAULT_MAX_CONTEXT, metadata=check(positive, "batchmates' max length"))
    attention: dict[str, int] | None = None
    gdn: dict[str, int] | None = None
    quantize_fp8: bool = False
    op_overrides: dict[str, dict[str, Any] | None] | None = None
    workers: int = field(default=1, metadata=check(positive, "processes running the ops side by side"))

    def validate(self) -> None:
        super().validate()
        for shape in (AttentionShape, GDNShape):  # a shared shape is checked even where op_overrides replace it
            if getattr(self, shape.param) is not None:
                make_shape(shape, getattr(self, shape.param))
        self.configs()  # noqa: B018  (every op's config is checked now)

    def unused(self) -> dict[str, str]:
        """Shared fields no op reads: every op that takes the field gets its own from op_overrides,
        or no op takes it (kv_dtype without a KV-cache op, a shape no op has, targets of fixed-length ops)."""
        overrides = self.op_overrides or {}
        out = {}
        for f in fields(self):
            if f.name in _NOT_SHARED or f.name in ("seed", "device"):
                continue
            takers = [op for op in self.ops if _takes(op, f.name)]
            own = [op for op in takers if f.name in (overrides.get(op) or {})]
            if not takers:
                out[f.name] = f"none of {', '.join(self.ops)} {_TAKES_WHAT.get(f.name, 'takes it')}"
            elif len(own) == len(takers):
                out[f.name] = f"op_overrides gives {', '.join(own)} their own {f.name}"
        return out

    def configs(self) -> list[InvarianceConfig]:
        """One InvarianceConfig per op (see `configs`)."""
        common = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SHARED}
        return configs(self.ops, self.op_overrides, **common)


_NOT_SHARED = ("ops", "op_overrides", "workers")  # fields of the whole run, not of each op's config
_TAKES_WHAT = {
    "kv_dtype": "has a KV cache",
    "attention": "takes an attention shape",
    "gdn": "takes a GDN shape",
    "targets": "has a target length (fixed-length ops ignore targets)",
    "max_context": "has batchmates of varying length",
}


def _takes(op: str, name: str) -> bool:
    """Whether an op's experiment reads the shared field `name`."""
    spec = op_spec.get(op)
    if name == "kv_dtype":
        return bool(spec.kv_cache)
    if name in ("attention", "gdn", "linear", "moe"):
        return spec.shape.param == name
    if name in ("targets", "max_context"):
        return not spec.fixed_length
    return True


def run_ops(
    ops: Sequence[str],
    op_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    **common: Any,
) -> pd.DataFrame:
    """`batch_invariance` for several ops into one table (every config checked before any runs; see `configs`)."""
    return pd.concat([run(cfg, progress=progress) for cfg in configs(ops, op_overrides, **common)], ignore_index=True)


def run(
    cfg: InvarianceConfig | InvarianceByOpConfig, progress: bool = True, metrics: Metrics | None = None
) -> pd.DataFrame:
    """Run a configured experiment (see `batch_invariance`); an InvarianceByOpConfig runs each op in
    turn, or in `cfg.workers` processes side by side (the same table).

    Args:
        cfg: the experiment.
        progress: a tqdm bar on stderr (per op in turn; over the ops when they run side by side).
        metrics: the columns each comparison gets (default: the distance to the op's reference);
            a caller that needs other columns (a regression gate's hashes) passes its own; with
            workers > 1 each worker process gets a pickled copy, so the caller's object is not
            updated by the run.
    """
    if isinstance(cfg, InvarianceByOpConfig):
        configs = cfg.configs()
        if cfg.workers == 1 or len(configs) == 1:
            parts = [run(c, progress=progress, metrics=metrics) for c in configs]
        else:
            jobs = [(c, metrics, _backend_names(c)) for c in configs]
            labels = [c.op for c in configs]
            parts = run_in_processes(_run_in_worker, jobs, cfg.workers, labels=labels, progress=progress, desc="ops")
        return pd.concat(parts, ignore_index=True)
    chosen = select_backends(cfg.op, cfg.backends, cfg.include_controls, cfg.strict_backends)
    metrics = _ReferenceCloseness() if metrics is None else metrics
    rows = alone_vs_batched(cfg.cases(), chosen, metrics, progress=progress, desc=cfg.op)
    return _with_sensitivity(frame(rows, COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS))


def _backend_names(cfg: InvarianceConfig) -> list[str]:
    return [b.name for b in select_backends(cfg.op, cfg.backends, cfg.include_controls, cfg.strict_backends)]


def _run_in_worker(cfg: InvarianceConfig, metrics: Metrics | None, backends: list[str]) -> pd.DataFrame:
    """One op's run in a worker process, which must see the backends the caller saw: one the
    caller registered itself (a test's, a user's) is unknown here."""
    missing = [name for name in backends if name not in _backend_names(cfg)]
    if missing:
        raise ValueError(
            f"workers: {cfg.op} backend(s) {', '.join(missing)} are registered in the calling process only "
            "(a worker process has gdn_lab's own registry); run with workers=1"
        )
    return run(cfg, progress=False, metrics=metrics)


def _with_sensitivity(df: pd.DataFrame) -> pd.DataFrame:
    """Fill control_caught (did a control differ in at least one row?) and insensitive, per op."""
    caught: dict[str, bool | None] = {}
    for op, part in df.groupby("op"):
        ctrl = part[part.is_control & (part.status == "compared")]
        caught[str(op)] = None if ctrl.empty else bool((~ctrl.bitwise_equal.astype(bool)).any())
    df["control_caught"] = df.op.map(caught).astype(object)
    df["insensitive"] = df.op.map(lambda op: caught[op] is not True).astype(bool)
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (op, backend): how many comparisons ran, how many were bitwise equal, the verdict.

    verdict: "invariant" (every comparison equal), "variant", "not covered" (nothing ran, with the
    first reason), "error"; for a control: "caught" or "NOT caught". Columns also say whether the
    op's run was sensitive (its control caught) and mark AMD-library results off ROCm.
    """
    out = []
    for (op, backend), part in df.groupby(["op", "backend"], sort=False):
        done = part[part.status == "compared"]
        equal = int(done.bitwise_equal.astype(bool).sum())
        is_control = bool(part.is_control.iloc[0])
        errors = part[part.status == "error"]
        if not errors.empty:
            verdict = "error"
        elif done.empty:
            verdict = "not covered"
        elif is_control:
            verdict = "caught" if equal < len(done) else "NOT caught"
        else:
            verdict = "invariant" if equal == len(done) else "variant"
        uncovered = part[part.status == "not covered"]
        out.append(
            {
                "op": op,
                "backend": backend,
                "is_control": is_control,
                "comparisons": len(done),
                "bitwise_equal": equal,
                "differ": len(done) - equal,
                "not_covered": len(uncovered),
                "errors": len(errors),
                "max_ulp": int(done.max_ulp.max()) if not done.empty else None,
                "max_ref_abs": float(done.ref_max_abs.max()) if done.ref_max_abs.notna().any() else None,
                "verdict": verdict,
                "insensitive": bool(part.insensitive.iloc[0]),
                "reason": (errors.reason.iloc[0] if not errors.empty else uncovered.reason.iloc[0])
                if verdict in ("error", "not covered")
                else "",
                "label": label(part),
            }
        )
    return pd.DataFrame(out)


def headline(df: pd.DataFrame) -> str:
    """One line for the suite index, computed from the table."""
    s = summarize(df)
    tested = s[~s.is_control & (s.comparisons > 0)]
    variant = tested[tested.verdict == "variant"]
    ops = sorted(s.op.unique())
    insensitive = sorted(s[s.insensitive].op.unique())
    parts = []
    if variant.empty:
        parts.append(
            f"{len(tested)} backend/op pairs bitwise invariant in all {int(tested.comparisons.sum())} comparisons"
        )
    else:
        names = ", ".join(f"{r.label} ({r.op}: {r.differ}/{r.comparisons})" for r in variant.itertuples())
        parts.append(f"batch-variant: {names}")
    parts.append(
        f"controls caught on {len(ops) - len(insensitive)}/{len(ops)} ops"
        + (f"; INSENSITIVE: {', '.join(insensitive)}" if insensitive else "")
    )
    return with_errors("; ".join(parts), df)


def conclusion(df: pd.DataFrame) -> str:
    """A markdown conclusion computed from the table (the notebook's last cell shows it)."""
    s = summarize(df)
    lines = ["## Conclusion", ""]
    for op, part in s.groupby("op", sort=False):
        tested = part[~part.is_control]
        var = tested[tested.verdict == "variant"]
        ctrl = part[part.is_control]
        lines.append(f"**{op}**")
        lines.append(f"- bitwise invariant: {fmt_list(tested[tested.verdict == 'invariant'].label)}")
        if not var.empty:
            lines.append(
                "- batch-variant: "
                + ", ".join(
                    f"{r.label} ({r.differ} of {r.comparisons} comparisons differ, up to {r.max_ulp} ulp)"
                    for r in var.itertuples()
                )
            )
        for r in tested[tested.verdict.isin(["not covered", "error"])].itertuples():
            lines.append(f"- {r.label}: {r.verdict}: {short_reason(r.reason)}")
        if ctrl.empty or ctrl.comparisons.sum() == 0:
            lines.append("- **no batch-variant control ran: this run cannot show that it would see variance**")
        else:
            for r in ctrl.itertuples():
                what = "caught" if r.verdict == "caught" else "**NOT caught: the run is insensitive**"
                lines.append(f"- control {r.backend}: {what} ({r.differ} of {r.comparisons} comparisons differ)")
        lines.append("")
    return "\n".join(lines)
