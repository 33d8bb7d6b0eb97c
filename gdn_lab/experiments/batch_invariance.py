"""Batch invariance: does a request get the same bits alone and inside batches?

For each target length, the target runs alone, then at a random position inside batches of random
batchmates (`gdn_lab.workloads`). Its output rows, and for the GDN ops its final delta state (and
conv state), are compared bitwise with the alone run (`gdn_lab.experiments.compare`). Every
requested backend runs on the same inputs, with private copies of the states it updates, and the
op's batch-variant controls (`routing.controls(op)`) run alongside: a run whose control shows no
difference anywhere cannot see batch variance and is flagged `insensitive`.

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
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab import checks
from gdn_lab.device import detect
from gdn_lab.experiments.common import (
    Ran,
    fmt_list,
    labeled,
    max_abs,
    run_backend,
    select_backends,
    target_tensors,
)
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.table import COLUMNS, base_row
from gdn_lab.workloads import (
    ATTENTION_OPS,
    DEFAULT_MAX_CONTEXT,
    AttentionShape,
    BuildOptions,
    GDNShape,
    alone,
    build,
    check_op,
    make_batch,
    resolve_device,
    resolve_dtype,
    resolve_kv_dtype,
    target_request,
    target_view,
)

DEFAULT_TARGETS = (1, 255, 256, 257)
DEFAULT_BATCH_SIZES = (2, 8, 33)

# Columns this experiment adds to the contract columns.
EXTRA_COLUMNS = [
    "tensor",
    "is_control",
    "status",
    "platform",
    "ref_max_abs",
    "batch_tokens",
    "control_caught",
    "insensitive",
]


@dataclass(frozen=True)
class InvarianceConfig:
    """One batch-invariance experiment (see `batch_invariance` for the meaning of each field)."""

    op: str
    backends: tuple[str, ...] | None = None
    targets: tuple[int, ...] = DEFAULT_TARGETS
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    trials: int = 1
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None
    arch: str | None = None
    attention: AttentionShape = field(default_factory=AttentionShape)
    gdn: GDNShape = field(default_factory=GDNShape)
    min_context: int = 1
    max_context: int = DEFAULT_MAX_CONTEXT
    new_tokens: int | None = None
    quantize_fp8: bool = False
    include_controls: bool = True
    strict_backends: bool = True

    def __post_init__(self) -> None:
        check_op(self.op)
        for name in ("targets", "batch_sizes"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name}: expected at least one value, got {values!r}")
            for v in values:
                checks.check_positive(name, v)
        checks.check_positive("trials", self.trials)
        checks.check_positive("max_context", self.max_context)

    @property
    def shape(self) -> AttentionShape | GDNShape:
        return self.attention if self.op in ATTENTION_OPS else self.gdn

    @property
    def effective_targets(self) -> tuple[int, ...]:
        # A GDN decode step is one token from a state; its "length" does not exist.
        return (1,) if self.op == "gdn_decode" else self.targets

    def build_options(self) -> BuildOptions:
        arch = self.arch or detect(self.device).arch
        fp8 = resolve_kv_dtype("fp8", self.dtype, arch) if self.quantize_fp8 else None
        return BuildOptions(
            dtype=self.dtype, kv_dtype=self.kv_dtype, device=self.device, quantize_fp8=self.quantize_fp8, fp8_dtype=fp8
        )


def make_config(
    op: str,
    *,
    backends: str | Sequence[str] | None = None,
    targets: Sequence[int] = DEFAULT_TARGETS,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    trials: int = 1,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "bfloat16",
    kv_dtype: str | torch.dtype | None = None,
    arch: str | None = None,
    attention: Mapping[str, int] | AttentionShape | None = None,
    gdn: Mapping[str, int] | GDNShape | None = None,
    min_context: int = 1,
    max_context: int = DEFAULT_MAX_CONTEXT,
    new_tokens: int | None = None,
    quantize_fp8: bool = False,
    include_controls: bool = True,
    strict_backends: bool = True,
) -> InvarianceConfig:
    """An InvarianceConfig from plain values (names, lists, dicts), as notebooks and the CLI pass them."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    the_arch = arch or detect(dev).arch
    return InvarianceConfig(
        op=op,
        backends=None if backends in (None, "all") else tuple([backends] if isinstance(backends, str) else backends),
        targets=tuple(int(t) for t in targets),
        batch_sizes=tuple(int(b) for b in batch_sizes),
        trials=trials,
        seed=seed,
        device=dev,
        dtype=dt,
        kv_dtype=resolve_kv_dtype(kv_dtype, dt, the_arch) if kv_dtype is not None else None,
        arch=arch,
        attention=attention if isinstance(attention, AttentionShape) else AttentionShape(**(attention or {})),
        gdn=gdn if isinstance(gdn, GDNShape) else GDNShape(**(gdn or {})),
        min_context=min_context,
        max_context=max_context,
        new_tokens=new_tokens,
        quantize_fp8=quantize_fp8,
        include_controls=include_controls,
        strict_backends=strict_backends,
    )


def batch_invariance(op: str, *, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Run one op's batch-invariance experiment.

    Args:
        op: decode_attention, prefill_attention, gdn_decode, gdn_prefill or gdn_layer_prefill.
        progress: show a tqdm bar on stderr.
        **kwargs: the fields of `make_config`:
            backends: None/"all" (every registered non-control backend) or names;
            targets: target lengths (context tokens; sequence tokens for the prefill ops; gdn_decode
                always uses one token);
            batch_sizes: batch sizes the target is placed in (at a random position);
            trials: batches per (target, batch size);
            seed: seeds everything (the same seed gives the same table);
            device: "auto", "cpu" or "cuda"; dtype: the compute dtype;
            kv_dtype: attention's KV cache dtype (None: dtype; "fp8": the arch's fp8);
            arch: the arch whose fp8 format is emulated (default: the device's);
            attention, gdn: head counts as dicts of AttentionShape / GDNShape fields;
            min_context, max_context: batchmates' lengths are uniform in this range;
            new_tokens: prefill_attention's new tokens per request (None: all of them);
            quantize_fp8: gdn_layer_prefill also compares its fp8 activations and scales;
            include_controls: also run the op's batch-variant controls;
            strict_backends: a named backend the op lacks raises (True) or is skipped.

    Returns:
        One row per comparison (backend x target x batch size x trial x tensor): the contract
        columns (`table.COLUMNS`) plus `EXTRA_COLUMNS`. A backend that cannot run a case gives a
        row with covered=False and the reason; one that raises gives status="error".
    """
    return run(make_config(op, **kwargs), progress=progress)


def run_ops(
    ops: Sequence[str],
    op_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    **common: Any,
) -> pd.DataFrame:
    """`batch_invariance` for several ops into one table.

    Args:
        ops: the ops, in order.
        op_overrides: per-op replacements of any keyword of `make_config` (e.g. smaller batch sizes
            for one op), {op: {name: value}}.
        progress: tqdm bars on stderr.
        **common: keywords of `make_config` shared by every op; names in a shared `backends` list
            that an op lacks are skipped for that op.
    """
    overrides = dict(op_overrides or {})
    unknown = sorted(set(overrides) - set(ops))
    if unknown:
        raise ValueError(f"op_overrides: {', '.join(unknown)} not in ops; accepted: {', '.join(ops)}")
    shared = {"strict_backends": False, **common}
    tables = [batch_invariance(op, progress=progress, **{**shared, **overrides.get(op, {})}) for op in ops]
    return pd.concat(tables, ignore_index=True)


def run(cfg: InvarianceConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `batch_invariance`)."""
    chosen = select_backends(cfg.op, cfg.backends, cfg.include_controls, cfg.strict_backends)
    opts = cfg.build_options()
    arch = cfg.arch or detect(cfg.device).arch
    kv = opts.kv_dtype if cfg.op in ATTENTION_OPS else None
    targets = cfg.effective_targets
    mate_max = 1 if cfg.op == "gdn_decode" else cfg.max_context
    mate_min = min(cfg.min_context, mate_max)
    steps = len(targets) * (1 + len(cfg.batch_sizes) * cfg.trials)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=steps, desc=cfg.op, disable=not progress, leave=False)
    try:
        for target_len in targets:
            target = target_request(target_len, cfg.seed, cfg.new_tokens)
            solo = alone(target, cfg.seed)
            solo_args = build(cfg.op, solo, cfg.shape, opts)
            solo_view = target_view(cfg.op, solo, solo_args)
            reference = run_backend(cfg.op, "torch", solo_args)
            ref = target_tensors(cfg.op, reference, solo_view) if reference.status == "compared" else {}
            solos = {b.name: run_backend(cfg.op, b.name, solo_args) for b in chosen}
            solo_out = {n: target_tensors(cfg.op, r, solo_view) for n, r in solos.items() if r.status == "compared"}
            bar.update()
            for batch_size in cfg.batch_sizes:
                for trial in range(cfg.trials):
                    batch = make_batch(
                        target,
                        batch_size,
                        seed=cfg.seed,
                        trial=trial,
                        min_len=mate_min,
                        max_len=mate_max,
                        new_tokens=cfg.new_tokens,
                    )
                    args = build(cfg.op, batch, cfg.shape, opts)
                    view = target_view(cfg.op, batch, args)
                    common = dict(
                        target_len=target_len,
                        batch_size=batch_size,
                        position=batch.position,
                        trial=trial,
                        batch_tokens=sum(batch.lengths),
                    )
                    for b in chosen:
                        first = solos[b.name]
                        ran = run_backend(cfg.op, b.name, args) if first.status == "compared" else first
                        mine = target_tensors(cfg.op, ran, view) if ran.status == "compared" else {}
                        rows += _rows(
                            cfg, arch, kv, b.name, b.variant_control, ran, solo_out.get(b.name), mine, ref, common
                        )
                    bar.update()
    finally:
        bar.close()
    return _with_sensitivity(pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS))


def _rows(cfg, arch, kv, name, is_control, ran: Ran, solo, mine, ref, common) -> list[dict[str, Any]]:
    """The rows of one backend on one batch: one per compared tensor, or one saying why not."""
    base = dict(
        backend_ran=ran.backend if ran.covered else None,
        covered=ran.covered,
        reason=ran.error or ran.reason,
        is_control=is_control,
        status=ran.status,
        platform=detect(cfg.device).platform,
        **common,
    )
    row = base_row(cfg.op, name, cfg.device, cfg.dtype, kv, cfg.seed, arch=arch, **base)
    if ran.status != "compared":
        return [{**row, "tensor": "out"}]
    out = []
    for tensor, value in mine.items():
        cmp = compare(solo[tensor], value)
        ref_abs = max_abs(value, ref[tensor]) if tensor in ref else None
        out.append({**row, "tensor": tensor, **cmp, "ref_max_abs": ref_abs})
    return out


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
                "label": labeled(str(backend), part.platform),
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
    errors = s[s.verdict == "error"]
    if not errors.empty:
        parts.append(f"errors: {', '.join(f'{r.backend}/{r.op}' for r in errors.itertuples())}")
    return "; ".join(parts)


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
            lines.append(f"- {r.label}: {r.verdict}: {r.reason}")
        if ctrl.empty or ctrl.comparisons.sum() == 0:
            lines.append("- **no batch-variant control ran: this run cannot show that it would see variance**")
        else:
            for r in ctrl.itertuples():
                what = "caught" if r.verdict == "caught" else "**NOT caught: the run is insensitive**"
                lines.append(f"- control {r.backend}: {what} ({r.differ} of {r.comparisons} comparisons differ)")
        lines.append("")
    return "\n".join(lines)
