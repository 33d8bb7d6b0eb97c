"""Dispatch rules against measured batch variance, case by case, for every backend that carries a rule.

A backend whose kernel follows the batch names its dispatch rule (`Backend.rule`, a
`gdn_lab.rules.base.DispatchRule`: AITER's Triton kernels today, the AMD libraries' own later). For
each such backend, each target length and each batch size, the target runs alone and inside a batch
of random batchmates (`gdn_lab.experiments.loop.alone_vs_batched`). The rule predicts which variant
each launch takes and, from the target's numerics key in each, what its bits will do (`expect`):
stay "equal", "switch", or, for unified_attention's 2D against one 3D segment, differ only by the
last rounding ("rounding"). The run measures what they do. Every case is one row with the contract
columns plus:

- `predicted_variant` / `alone_variant`: the launch variant in the batch / alone ("v1", "v2",
  "2d", "3d:16seg", "fwd:128x64"), `predicted_key` / `alone_key` the target's numerics keys;
- `expected` ("equal", "switch", "rounding") and `predicted_equal` (True, False; None for rounding);
- `prediction`: one of OUTCOMES; "predicted switch not observed" and "unpredicted difference" are
  where the rule is wrong (MISSES): findings, never passes;
- `ref_max_abs`, `within_tolerance`: the batched target against the op's reference backend, with
  the op's tolerance (`OpSpec.tolerance("out", dtype, "torch")`);
- `rule`, `rule_source`, `rule_reason`; `emulated_arch` (also in `arch`), `num_cus`, `aiter_route`,
  `aiter_version`.

Off ROCm AITER is told it runs on `arch` (gfx950 or gfx942) with `num_cus` CUs (default: the GPU's
own count, the emulated device's on the CPU), exactly what the rule is given.

Example:
    >>> outcome("switch", bitwise_equal=False)
    'switch observed'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch

from gdn_lab import aiter, checks, routing
from gdn_lab.experiments import common
from gdn_lab.experiments.common import fmt_list, max_abs
from gdn_lab.experiments.config import (
    DTYPES,
    ExperimentConfig,
    check,
    known_kv_dtype,
    known_op,
    one_of,
    positive,
    positive_ints,
    shape_of,
)
from gdn_lab.experiments.loop import Case, Comparison, Metrics, alone_vs_batched, frame, run_backend
from gdn_lab.experiments.table import COLUMNS, RUN_COLUMNS
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import BuildOptions
from gdn_lab.rules.base import RuleEnv
from gdn_lab.workloads import alone, make_batch, target_request

EXTRA_COLUMNS = [
    "emulated_arch",
    "num_cus",
    "aiter_route",
    "aiter_version",
    "rule",
    "rule_source",
    "predicted_variant",
    "alone_variant",
    "predicted_key",
    "alone_key",
    "expected",
    "predicted_equal",
    "prediction",
    "rule_reason",
    "ref_max_abs",
    "within_tolerance",
]

OUTCOMES = (
    "equal as predicted",
    "switch observed",
    "rounding kept the bits",
    "rounding changed the bits",
    "predicted switch not observed",
    "unpredicted difference",
)
MISSES = OUTCOMES[4:]


def ruled_backends(op: str | None = None) -> list[routing.Backend]:
    """Every registered backend that carries a dispatch rule (of `op`, or of every op)."""
    ops = [op] if op is not None else op_spec.names()
    return [b for o in ops for b in routing.backends(o) if b.rule is not None]


def outcome(expected: str, bitwise_equal: bool) -> str:
    """How a measurement meets the rule's expectation ("equal", "switch" or "rounding"): one of OUTCOMES."""
    checks.check_choice("expected", expected, ("equal", "switch", "rounding"))
    return {
        ("equal", True): OUTCOMES[0],
        ("switch", False): OUTCOMES[1],
        ("rounding", True): OUTCOMES[2],
        ("rounding", False): OUTCOMES[3],
        ("switch", True): OUTCOMES[4],
        ("equal", False): OUTCOMES[5],
    }[(expected, bool(bitwise_equal))]


def _ruled_names(name: str, value: tuple[str, ...]) -> None:
    known = [b.name for b in ruled_backends()]
    for v in value:
        checks.check_choice(name, v, tuple(known))


@dataclass(frozen=True, kw_only=True)
class DispatchConfig(ExperimentConfig):
    """One predicted-vs-measured experiment.

    Attributes:
        op: only this op's backends (None: every op's); backend names repeat across ops (`aiter`
            is paged_attention_ragged for decode_attention and mha_batch_prefill for prefill_attention).
        backends: backends that carry a rule (None: all of them); each runs on its own op.
        targets: target context lengths (prefill: the target's tokens, all new unless new_tokens).
        batch_sizes: batch sizes the target is placed in (at a seeded random position).
        trials: batches per (target, batch size).
        kv_dtype: None (the compute dtype) or "fp8" (the emulated arch's format).
        arch: the arch AITER is told off ROCm ("gfx950" or "gfx942"); ignored on ROCm.
        num_cus: the CU count AITER's heuristics see (None: the GPU's, or the emulated device's).
        attention: AttentionShape fields (default 32/8/128, page_size 16).
        min_context, max_context: batchmates' lengths are uniform in this range.
        new_tokens: prefill's new tokens per request (None: all).
    """

    dtype: str = field(default="float16", metadata=check(one_of(DTYPES), "the compute dtype"))
    op: str | None = field(default=None, metadata=check(known_op))
    backends: tuple[str, ...] | None = field(default=None, metadata=check(_ruled_names))
    targets: tuple[int, ...] = field(default=(1, 1024, 1025, 4000), metadata=check(positive_ints))
    batch_sizes: tuple[int, ...] = field(default=(2, 16, 17, 64), metadata=check(positive_ints))
    trials: int = field(default=1, metadata=check(positive))
    kv_dtype: str | None = field(default=None, metadata=check(known_kv_dtype))
    arch: str = aiter.DEFAULT_ARCH
    num_cus: int | None = field(default=None, metadata=check(positive))
    attention: dict[str, int] | None = None
    min_context: int = field(default=1, metadata=check(positive))
    max_context: int = field(default=4096, metadata=check(positive))
    new_tokens: int | None = field(default=None, metadata=check(positive))

    def validate(self) -> None:
        super().validate()
        if self.max_context < self.min_context:
            raise ValueError(f"max_context: must be >= min_context (={self.min_context}), got {self.max_context}")
        aiter.Emulation(self.arch, self.num_cus)  # validates arch and num_cus
        for b in self.chosen():
            shape_of(b.op, self.shapes)

    @property
    def shapes(self) -> dict[str, dict[str, int]]:
        return {
            "attention": {
                "num_q_heads": 32,
                "num_kv_heads": 8,
                "head_dim": 128,
                "page_size": 16,
                **(self.attention or {}),
            }
        }

    def chosen(self) -> list[routing.Backend]:
        ruled = ruled_backends(self.op)
        return ruled if self.backends is None else [b for b in ruled if b.name in self.backends]

    def cases(self) -> list[Case]:
        kv = self.kv_torch_dtype(self.kv_dtype, self.arch)
        opts = BuildOptions(dtype=self.torch_dtype, kv_dtype=kv, device=self.torch_device)
        out = []
        for op in dict.fromkeys(b.op for b in self.chosen()):
            for length in self.targets:
                target = target_request(length, self.seed, self.new_tokens)
                batches = tuple(
                    (t, make_batch(target, size, seed=self.seed, trial=t, min_len=self.min_context,
                                   max_len=self.max_context, new_tokens=self.new_tokens))
                    for size in self.batch_sizes for t in range(self.trials)
                )  # fmt: skip
                shape = shape_of(op, self.shapes)
                out.append(Case(op, shape, opts, self.seed, target, batches, alone(target, self.seed)))
        return out


class RulePredictions(Metrics):
    """The backend's rule on both launches, against the bits; the reference backend for closeness.

    Backends without a rule get no prediction columns; `closeness=False` skips the reference run.
    """

    def __init__(self, env: RuleEnv, closeness: bool = True) -> None:
        self.env, self.closeness = env, closeness

    def reference(self, case: Case, args: Mapping[str, Any], view: Any) -> dict[str, torch.Tensor]:
        if not self.closeness:
            return {}
        spec = op_spec.get(case.op)
        ran = run_backend(case.op, spec.reference, args)
        return spec.tensors(ran.result, ran.args, view) if ran.status == "compared" else {}

    def alone(self, case: Case, backend: routing.Backend, args: Any, tensors: Any, reference: Any) -> dict[str, Any]:
        if backend.rule is None:
            return {}
        p = backend.rule.predict(args, case.alone.position, self.env)
        return {"alone_variant": p.variant, "alone_key": p.key}

    def batched(self, c: Comparison) -> dict[str, Any]:
        rule, spec = c.backend.rule, op_spec.get(c.case.op)
        if rule is None:
            return {}
        p = rule.predict(c.args, c.batch.position, self.env)
        expected = rule.expect(c.alone["alone_key"], p.key)
        mine = c.mine[c.tensor]
        out: dict[str, Any] = {
            "rule": rule.name,
            "rule_source": rule.source,
            "predicted_variant": p.variant,
            "predicted_key": p.key,
            "expected": expected,
            "predicted_equal": {"equal": True, "switch": False}.get(expected),
            "prediction": outcome(expected, c.bitwise_equal),
            "rule_reason": p.reason,
        }
        if c.tensor in c.reference:
            ref = c.reference[c.tensor]
            out["ref_max_abs"] = max_abs(mine, ref)
            out["within_tolerance"] = spec.tolerance(c.tensor, mine.dtype, spec.reference).holds(mine, ref)
        return out


def aiter_dispatch(*, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Predicted vs measured batch variance of the backends that carry a rule.

    Args:
        progress: show a tqdm bar on stderr.
        **kwargs: the fields of `DispatchConfig` (plain values).

    Returns:
        One row per (backend, target, batch size, trial): COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS. A
        backend that cannot run a case gives a row with covered=False and the reason.
    """
    return run(DispatchConfig(**kwargs), progress=progress)


CASE_FIELDS = ("targets", "batch_sizes", "min_context", "max_context", "new_tokens", "trials", "kv_dtype", "backends")


def by_op_configs(
    ops: Mapping[str, Mapping[str, Any] | Sequence[Mapping[str, Any]] | None], **common: Any
) -> list[DispatchConfig]:
    """One DispatchConfig per case set of each op of `ops` that is not None, over the `common` fields.

    Raises:
        ValueError: an op without ruled backends (the message lists those with), a case field that
            is not one of CASE_FIELDS, or a bad value (named `ops.<op>.<field>`, `ops.<op>[i].<field>`).
    """
    configs = []
    have = sorted({b.op for b in ruled_backends()})
    for op, cases in ops.items():
        if cases is None:
            continue
        names = [b.name for b in ruled_backends(op)] if op in op_spec.names() else []
        if not names:
            raise ValueError(f"ops: {op!r} has no backend that carries a dispatch rule; accepted: {', '.join(have)}")
        sets = [cases] if isinstance(cases, Mapping) else list(cases)
        if not sets:
            raise ValueError(f"ops.{op}: expected its cases or a non-empty list of case sets, got {cases!r}")
        for i, one in enumerate(sets):
            where = f"ops.{op}" if isinstance(cases, Mapping) else f"ops.{op}[{i}]"
            if not isinstance(one, Mapping):
                raise ValueError(f"{where}: expected a mapping of {', '.join(CASE_FIELDS)}, got {one!r}")
            bad = sorted(set(one) - set(CASE_FIELDS))
            if bad:
                raise ValueError(f"{where}: {', '.join(bad)} not accepted; accepted: {', '.join(CASE_FIELDS)}")
            for b in one.get("backends") or ():
                checks.check_choice(f"{where}.backends", b, tuple(names))
            try:
                configs.append(DispatchConfig(**{**common, **one, "op": op, "backends": one.get("backends") or names}))
            except ValueError as exc:
                prefix = f"{where}." if str(exc).split(":")[0].split(".")[0].split("[")[0] in one else f"{op}: "
                raise ValueError(f"{prefix}{exc}") from None
    return configs


def aiter_dispatch_by_op(
    ops: Mapping[str, Mapping[str, Any] | Sequence[Mapping[str, Any]] | None], *, progress: bool = True, **common: Any
) -> pd.DataFrame:
    """Each op's ruled backends with that op's own cases, in one table.

    Args:
        ops: {op: DispatchConfig fields for its backends (CASE_FIELDS: targets, batch_sizes,
            min_context, max_context, new_tokens, trials, backends), or a list of such case sets
            (e.g. batchmates shorter than the targets, then batchmates of any length)}; an op given
            None is skipped.
        progress: show a tqdm bar.
        **common: the fields every op shares (seed, device, dtype, kv_dtype, arch, num_cus, attention, trials).

    Raises:
        ValueError: an op without ruled backends (the message lists those with), or a bad field.
    """
    return run_by_op(DispatchByOpConfig(ops=ops, **common), progress=progress)


@dataclass(frozen=True, kw_only=True)
class DispatchByOpConfig(ExperimentConfig):
    """Notebook 07: each op's ruled backends with that op's own cases.

    Attributes:
        ops: {op: its cases {targets, batch_sizes, min_context, max_context, new_tokens, trials,
            backends}, or a list of such case sets}; an op given None is skipped.
        trials, kv_dtype, arch, num_cus, attention: as `DispatchConfig`, shared by every op.
    """

    dtype: str = field(default="float16", metadata=check(one_of(DTYPES), "the compute dtype"))
    ops: dict[str, dict[str, Any] | tuple[dict[str, Any], ...] | None] = field(
        default_factory=lambda: {"decode_attention": {}, "prefill_attention": {}},
        metadata=check(help="{op: its cases}; null skips the op"),
    )
    trials: int = field(default=1, metadata=check(positive))
    kv_dtype: str | None = field(default=None, metadata=check(known_kv_dtype))
    arch: str = aiter.DEFAULT_ARCH
    num_cus: int | None = field(default=None, metadata=check(positive))
    attention: dict[str, int] | None = None

    def validate(self) -> None:
        super().validate()
        if not any(cases is not None for cases in self.ops.values()):
            raise ValueError(f"ops: every op is null, so nothing would run; got {self.ops!r}")
        self.configs()

    def unused(self) -> dict[str, str]:
        """Shared fields every case set replaces (trials, kv_dtype): nothing reads the shared value."""
        sets = [
            one
            for cases in self.ops.values()
            if cases is not None
            for one in ([cases] if isinstance(cases, Mapping) else cases)
        ]
        return {
            name: f"every case set of ops gives its own {name}"
            for name in ("trials", "kv_dtype")
            if sets and all(isinstance(one, Mapping) and name in one for one in sets)
        }

    def configs(self) -> list[DispatchConfig]:
        common = {n: getattr(self, n) for n in ("seed", "device", "dtype", "trials", "kv_dtype", "arch", "num_cus")}
        return by_op_configs(self.ops, **common, attention=self.attention)


def run_by_op(cfg: DispatchByOpConfig, progress: bool = True) -> pd.DataFrame:
    """Run every op's configured experiment into one table (see `aiter_dispatch_by_op`)."""
    parts = [run(c, progress=progress) for c in cfg.configs()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS)


def run(cfg: DispatchConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `aiter_dispatch`)."""
    with aiter.emulate(cfg.arch, cfg.num_cus):
        device = cfg.torch_device
        env = RuleEnv(aiter.effective_arch(device), aiter.effective_num_cus(device))
        columns = {
            "emulated_arch": env.arch,
            "num_cus": env.num_cus,
            "aiter_route": aiter.current_route()[0],
            "aiter_version": aiter.probe().version,
        }
        cases = [replace(c, arch=env.arch, columns=columns) for c in cfg.cases()]
        rows = []
        for op in dict.fromkeys(c.op for c in cases):
            backends = [b for b in cfg.chosen() if b.op == op]
            mine = [c for c in cases if c.op == op]
            rows += alone_vs_batched(mine, backends, RulePredictions(env), progress=progress, desc="dispatch rules")
    return frame(rows, COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS)


# --- reading the table ----------------------------------------------------------------------


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per backend: cases, how each met its prediction, and the error against the exact softmax."""
    out = []
    for backend, part in df.groupby("backend", sort=False):
        done = part[part.status == "compared"]
        counts = done.prediction.value_counts()
        out.append(
            {
                "backend": backend,
                "op": part.op.iloc[0],
                "cases": len(done),
                "not_covered": int((part.status == "not covered").sum()),
                "errors": int((part.status == "error").sum()),
                **{o.replace(" ", "_"): int(counts.get(o, 0)) for o in OUTCOMES},
                "rule_holds": bool(~done.prediction.isin(MISSES).any()) if len(done) else None,
                "max_ref_abs": float(done.ref_max_abs.max()) if len(done) else None,
                "within_tolerance": bool(done.within_tolerance.astype(bool).all()) if len(done) else None,
                "reason": "" if len(done) else str(part.reason.iloc[0]),
                "amd_hardware": bool((part.platform == "rocm").all()),
                "label": common.label(part),
            }
        )
    return pd.DataFrame(out)


def invariance_map(df: pd.DataFrame, backend: str) -> pd.DataFrame:
    """target_len x batch_size: the fraction of trials whose target bits equal its alone run (NaN: not run)."""
    part = df[(df.backend == backend) & (df.status == "compared")]
    if part.empty:
        return pd.DataFrame()
    return part.assign(eq=part.bitwise_equal.astype(float)).pivot_table(
        index="target_len", columns="batch_size", values="eq", aggfunc="mean"
    )


def outcome_map(df: pd.DataFrame, backend: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(codes, labels), target_len x batch_size, for a heatmap of predicted against measured.

    codes: the worst outcome over trials as its index in OUTCOMES (4 and 5 are rule misses);
    labels: the batch's predicted variant(s); the row index reads "<target_len> (alone: <variant>)".
    """
    part = df[(df.backend == backend) & (df.status == "compared")]
    if part.empty:
        return pd.DataFrame(), pd.DataFrame()
    alone_of = part.groupby("target_len").alone_variant.first()
    part = part.assign(
        code=part.prediction.map(OUTCOMES.index),
        row=part.target_len.map(lambda t: f"{t} (alone: {alone_of[t]})"),
    )
    order = [f"{t} (alone: {alone_of[t]})" for t in sorted(alone_of.index)]
    codes = part.pivot_table(index="row", columns="batch_size", values="code", aggfunc="max").reindex(order)
    labels = part.pivot_table(
        index="row", columns="batch_size", values="predicted_variant", aggfunc=lambda v: "/".join(sorted(set(v)))
    ).reindex(order)
    return codes, labels


def misses(df: pd.DataFrame) -> pd.DataFrame:
    """The cases where the rule was wrong (a predicted switch kept the bits, or bits changed unpredicted)."""
    cols = ["backend", "target_len", "batch_size", "trial", "batch_max_len", "alone_variant", "predicted_variant"]
    cols += ["alone_key", "predicted_key", "prediction", "n_diff", "max_ulp", "rule_reason"]
    return df[df.prediction.isin(MISSES)][cols]


def headline(df: pd.DataFrame) -> str:
    """One line for the suite index, computed from the table."""
    s = summarize(df)
    ran = s[s.cases > 0]
    if ran.empty:
        reasons = "; ".join(f"{r.backend}: {common.short_reason(r.reason, 100)}" for r in s.itertuples())
        return common.with_errors(f"no AITER Triton kernel ran here: {reasons}", df)
    parts = []
    for r in ran.itertuples():
        switches = r.switch_observed + r.predicted_switch_not_observed
        verdict = "rule holds" if r.rule_holds else "RULE MISSES"
        parts.append(
            f"{r.label}: {r.switch_observed}/{switches} predicted switches seen, "
            f"{r.unpredicted_difference} unpredicted ({verdict})"
        )
    return common.with_errors("; ".join(parts), df)


def conclusion(df: pd.DataFrame) -> str:
    """A markdown conclusion computed from the table (the notebook's last cell shows it)."""
    s = summarize(df)
    env = df.iloc[0] if len(df) else None
    lines = ["## Conclusion", ""]
    if env is not None:
        lines.append(
            f"AITER {env.aiter_version} via {env.aiter_route}, dispatching for {env.emulated_arch} "
            f"with {env.num_cus} CUs on {env.device}."
        )
        lines.append("")
    for r in s.itertuples():
        part = df[df.backend == r.backend]
        if r.cases == 0:
            lines.append(f"- **{r.backend}**: did not run: {common.short_reason(r.reason)}")
            continue
        variants = fmt_list(sorted(set(part.predicted_variant.dropna()) | set(part.alone_variant.dropna())))
        lines.append(
            f"- **{r.label}** ({r.op}, variants seen: {variants}): {r.cases} cases; "
            f"{r.switch_observed} predicted switches changed the bits, {r.equal_as_predicted} predicted-equal "
            f"cases stayed bitwise equal."
        )
        if r.rounding_kept_the_bits or r.rounding_changed_the_bits:
            lines.append(
                f"  - {r.rounding_kept_the_bits + r.rounding_changed_the_bits} cases differ from the target alone only "
                f"in the last rounding (2D against one 3D segment): {r.rounding_changed_the_bits} changed the bits."
            )
        if r.predicted_switch_not_observed or r.unpredicted_difference:
            lines.append(
                f"  - **the rule missed**: {r.predicted_switch_not_observed} predicted switches kept the bits, "
                f"{r.unpredicted_difference} differences were not predicted."
            )
        tol = "within" if r.within_tolerance else "**outside**"
        lines.append(f"  - error against the exact softmax: up to {r.max_ref_abs:.3g}, {tol} the dtype's tolerance.")
    return "\n".join(lines)
