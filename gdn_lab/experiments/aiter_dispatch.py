"""AITER's Triton kernels: predicted dispatch against measured batch variance, case by case.

For each AITER Triton backend (`gdn_lab.ops.attention.aiter_triton`), each target length and each
batch size, the target runs alone and inside a batch of random batchmates (`gdn_lab.workloads`).
The kernel's dispatch rule (`gdn_lab.rules.aiter_*`) predicts which variant each launch takes and,
from the target's numerics key in each (`numerics_key`), what its bits will do (`expect`): stay
"equal", "switch", or, for unified_attention's 2D against one 3D segment, differ only by the last
rounding ("rounding"). The run measures what they do (`compare`). Every case is one row with the
contract columns plus:

- `predicted_variant` / `alone_variant`: the launch variant in the batch / alone ("v1", "v2",
  "2d", "3d:16seg", "fwd:128x64"), `predicted_key` / `alone_key` the target's numerics keys;
- `expected` ("equal", "switch", "rounding") and `predicted_equal` (True, False; None for rounding);
- `prediction`: one of OUTCOMES; "predicted switch not observed" and "unpredicted difference" are
  where the rule is wrong (MISSES);
- `ref_max_abs`, `within_tolerance`: the batched target against the exact softmax of the torch
  backend, with `partition_edges.TOLERANCES` of the output dtype;
- `emulated_arch` (also in `arch`), `num_cus`, `aiter_route`, `aiter_version`, `rule_reason`.

Off ROCm AITER is told it runs on `arch` (gfx950 or gfx942) with `num_cus` CUs (default: the GPU's
own count, the emulated device's on the CPU), exactly what the predictor is given.

Example:
    >>> outcome("switch", bitwise_equal=False)
    'switch observed'
    >>> df = aiter_dispatch(backends=["aiter-triton-pa"], targets=[1100], batch_sizes=[2, 33], device="cpu",
    ...                     attention={"num_q_heads": 16, "num_kv_heads": 2, "head_dim": 16},
    ...                     max_context=8, progress=False)  # doctest: +SKIP  (needs amd-aiter and TRITON_INTERPRET=1)
    >>> df[["batch_size", "predicted_variant", "prediction"]].values.tolist()  # doctest: +SKIP
    [[2, 'v2', 'equal as predicted'], [33, 'v1', 'switch observed']]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab import aiter_loader, checks
from gdn_lab.device import detect
from gdn_lab.experiments.common import Ran, fmt_list, labeled, max_abs, run_backend, target_tensors
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.partition_edges import TOLERANCES
from gdn_lab.experiments.table import COLUMNS, base_row
from gdn_lab.rules import aiter_flash_attn_varlen, aiter_pa_decode, aiter_unified_attention
from gdn_lab.workloads import (
    AttentionShape,
    BuildOptions,
    alone,
    build,
    make_batch,
    resolve_device,
    resolve_dtype,
    resolve_kv_dtype,
    target_request,
    target_view,
)

BACKENDS = ("aiter-triton-pa", "aiter-triton-unified", "aiter-triton-mha")
DECODE_BACKENDS = ("aiter-triton-pa", "aiter-triton-unified")
PREFILL_BACKENDS = ("aiter-triton-mha",)
OP_OF = {
    "aiter-triton-pa": "decode_attention",
    "aiter-triton-unified": "decode_attention",
    "aiter-triton-mha": "prefill_attention",
}

EXTRA_COLUMNS = [
    "is_control",
    "status",
    "platform",
    "emulated_arch",
    "num_cus",
    "aiter_route",
    "aiter_version",
    "predicted_variant",
    "alone_variant",
    "predicted_key",
    "alone_key",
    "expected",
    "predicted_equal",
    "prediction",
    "rule_reason",
    "batch_max_len",
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
EXPECT = {
    "aiter-triton-pa": aiter_pa_decode.expect,
    "aiter-triton-unified": aiter_unified_attention.expect,
    "aiter-triton-mha": aiter_flash_attn_varlen.expect,
}


@dataclass(frozen=True)
class Predicted:
    """A rule's answer for one launch: its variant, the target's numerics key, and why."""

    variant: str
    key: str
    reason: str


def predict(backend: str, args: Mapping[str, Any], target_len: int, arch: str, num_cus: int) -> Predicted:
    """What `backend`'s dispatch rule says about a validated call, for a target of `target_len` tokens.

    Args:
        backend: one of BACKENDS.
        args: the call's validated arguments.
        target_len: the target's context length.
        arch: the arch AITER dispatches for.
        num_cus: the CU count AITER's heuristics see.
    """
    checks.check_choice("backend", backend, BACKENDS)
    if backend == "aiter-triton-pa":
        p = aiter_pa_decode.predict_call(args)
        return Predicted(p.variant, aiter_pa_decode.numerics_key(p, target_len), p.reason)
    if backend == "aiter-triton-unified":
        u = aiter_unified_attention.predict_call(args, num_cus)
        return Predicted(u.variant, aiter_unified_attention.numerics_key(u, target_len), u.reason)
    f = aiter_flash_attn_varlen.predict(arch, args["q"].dtype)
    return Predicted(f.variant, aiter_flash_attn_varlen.numerics_key(f, target_len), f.reason)


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


@dataclass(frozen=True)
class DispatchConfig:
    """One predicted-vs-measured experiment (see `aiter_dispatch` for the fields)."""

    backends: tuple[str, ...] = BACKENDS
    targets: tuple[int, ...] = (1, 1024, 1025, 4000)
    batch_sizes: tuple[int, ...] = (2, 16, 17, 64)
    trials: int = 1
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float16
    kv_dtype: torch.dtype | None = None
    arch: str = aiter_loader.DEFAULT_ARCH
    num_cus: int | None = None
    attention: AttentionShape = field(default_factory=lambda: AttentionShape(32, 8, 128, page_size=16))
    min_context: int = 1
    max_context: int = 4096
    new_tokens: int | None = None

    def __post_init__(self) -> None:
        for b in self.backends:
            checks.check_choice("backends", b, BACKENDS)
        for name in ("targets", "batch_sizes"):
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name}: expected at least one value, got {values!r}")
            for v in values:
                checks.check_positive(name, v)
        checks.check_positive("trials", self.trials)
        checks.check_positive("min_context", self.min_context)
        if self.max_context < self.min_context:
            raise ValueError(f"max_context: must be >= min_context (={self.min_context}), got {self.max_context}")
        aiter_loader.Emulation(self.arch, self.num_cus)  # validates arch and num_cus


def make_config(
    *,
    backends: str | Sequence[str] | None = None,
    targets: Sequence[int] = DispatchConfig.targets,
    batch_sizes: Sequence[int] = DispatchConfig.batch_sizes,
    trials: int = 1,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float16",
    kv_dtype: str | torch.dtype | None = None,
    arch: str = aiter_loader.DEFAULT_ARCH,
    num_cus: int | None = None,
    attention: Mapping[str, int] | AttentionShape | None = None,
    min_context: int = 1,
    max_context: int = 4096,
    new_tokens: int | None = None,
) -> DispatchConfig:
    """A DispatchConfig from plain values, as notebooks pass them."""
    dt = resolve_dtype(dtype)
    if attention is None:
        shape = DispatchConfig().attention
    else:
        shape = attention if isinstance(attention, AttentionShape) else AttentionShape(**{"page_size": 16, **attention})
    names = BACKENDS if backends in (None, "all") else tuple([backends] if isinstance(backends, str) else backends)
    return DispatchConfig(
        backends=names,
        targets=tuple(int(t) for t in targets),
        batch_sizes=tuple(int(b) for b in batch_sizes),
        trials=trials,
        seed=seed,
        device=resolve_device(device),
        dtype=dt,
        kv_dtype=None if kv_dtype is None else resolve_kv_dtype(kv_dtype, dt, arch),
        arch=arch,
        num_cus=num_cus,
        attention=shape,
        min_context=min_context,
        max_context=max_context,
        new_tokens=new_tokens,
    )


def aiter_dispatch(*, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Predicted vs measured batch variance of AITER's Triton kernels.

    Args:
        progress: show a tqdm bar on stderr.
        **kwargs: the fields of `make_config`:
            backends: None/"all" or names from BACKENDS;
            targets: target context lengths (prefill: the target's tokens, all new unless new_tokens);
            batch_sizes: batch sizes the target is placed in (at a seeded random position);
            trials: batches per (target, batch size);
            seed: seeds everything;
            device: "auto", "cpu" or "cuda"; dtype: "float16" or "bfloat16" (the CPU interpreter
                takes float16 only); kv_dtype: None (dtype) or "fp8" (the emulated arch's format);
            arch: the arch AITER is told off ROCm ("gfx950" or "gfx942"); ignored on ROCm;
            num_cus: the CU count AITER's heuristics see (None: the GPU's, or the emulated device's);
            attention: AttentionShape fields (default 32/8/128, page_size 16);
            min_context, max_context: batchmates' lengths are uniform in this range;
            new_tokens: prefill's new tokens per request (None: all).

    Returns:
        One row per (backend, target, batch size, trial): COLUMNS + EXTRA_COLUMNS. A backend that
        cannot run a case gives a row with covered=False and the reason.
    """
    return run(make_config(**kwargs), progress=progress)


def aiter_dispatch_by_op(
    decode: Mapping[str, Any] | None = None,
    prefill: Mapping[str, Any] | None = None,
    *,
    progress: bool = True,
    **common: Any,
) -> pd.DataFrame:
    """The decode and the prefill kernels, each with its own cases, in one table.

    Args:
        decode: `make_config` fields for the decode backends (targets, batch_sizes, min_context,
            max_context, backends); None skips them.
        prefill: the same for the prefill backend (plus new_tokens); None skips it.
        progress: show a tqdm bar.
        **common: the fields both share (seed, device, dtype, kv_dtype, arch, num_cus, attention, trials).
    """
    parts = []
    for cases, names in ((decode, DECODE_BACKENDS), (prefill, PREFILL_BACKENDS)):
        if cases is None:
            continue
        chosen = cases.get("backends") or names
        parts.append(aiter_dispatch(progress=progress, **{**common, **cases, "backends": chosen}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS + EXTRA_COLUMNS)


@dataclass
class _Solo:
    """One backend's run of the target alone, and what its rule said."""

    ran: Ran
    out: dict[str, torch.Tensor]
    predicted: Predicted | None


def run(cfg: DispatchConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `aiter_dispatch`)."""
    rows: list[dict[str, Any]] = []
    ops = list(dict.fromkeys(OP_OF[b] for b in cfg.backends))
    steps = len(ops) * len(cfg.targets) * (1 + len(cfg.batch_sizes) * cfg.trials)
    bar = tqdm(total=steps, desc="aiter dispatch", disable=not progress, leave=False)
    with aiter_loader.emulate(cfg.arch, cfg.num_cus):
        arch = aiter_loader.effective_arch(cfg.device)
        env = _environment(cfg, arch)
        opts = BuildOptions(dtype=cfg.dtype, kv_dtype=cfg.kv_dtype, device=cfg.device)
        try:
            for op in ops:
                names = [b for b in cfg.backends if OP_OF[b] == op]
                for target_len in cfg.targets:
                    rows += _target_rows(cfg, op, names, target_len, opts, env, bar)
        finally:
            bar.close()
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)


def _environment(cfg: DispatchConfig, arch: str) -> dict[str, Any]:
    fp = aiter_loader.fingerprint_fields(cfg.device)
    return {
        "platform": detect(cfg.device).platform,
        "emulated_arch": arch,
        "num_cus": aiter_loader.effective_num_cus(cfg.device),
        "aiter_route": fp["aiter_route"],
        "aiter_version": aiter_loader.probe().version,
    }


def _target_rows(cfg, op, names, target_len, opts, env, bar) -> list[dict[str, Any]]:
    """Every row of one target: alone once per backend, then each batch size and trial."""
    target = target_request(target_len, cfg.seed, cfg.new_tokens)
    solo = alone(target, cfg.seed)
    solo_args = build(op, solo, cfg.attention, opts)
    solo_view = target_view(op, solo, solo_args)
    reference = run_backend(op, "torch", solo_args)
    ref = target_tensors(op, reference, solo_view)["out"]
    solos = {}
    for name in names:
        ran = run_backend(op, name, solo_args)
        out = target_tensors(op, ran, solo_view) if ran.status == "compared" else {}
        pred = predict(name, solo_args, target_len, env["emulated_arch"], env["num_cus"]) if ran.covered else None
        solos[name] = _Solo(ran, out, pred)
    bar.update()
    rows = []
    for batch_size in cfg.batch_sizes:
        for trial in range(cfg.trials):
            batch = make_batch(
                target,
                batch_size,
                seed=cfg.seed,
                trial=trial,
                min_len=cfg.min_context,
                max_len=cfg.max_context,
                new_tokens=cfg.new_tokens,
            )
            args = build(op, batch, cfg.attention, opts)
            view = target_view(op, batch, args)
            case = dict(
                target_len=target_len,
                batch_size=batch_size,
                position=batch.position,
                trial=trial,
                batch_max_len=max(batch.lengths),
                **env,
            )
            for name in names:
                rows.append(_row(cfg, op, name, solos[name], args, view, ref, case))
            bar.update()
    return rows


def _row(cfg, op, name, solo: _Solo, args, view, ref, case) -> dict[str, Any]:
    ran = run_backend(op, name, args) if solo.ran.status == "compared" else solo.ran
    row = base_row(
        op,
        name,
        cfg.device,
        cfg.dtype,
        cfg.kv_dtype,
        cfg.seed,
        arch=case["emulated_arch"],
        backend_ran=name if ran.covered else None,
        covered=ran.covered,
        reason=ran.error or ran.reason,
        is_control=False,
        status=ran.status,
        **case,
    )
    if ran.status != "compared":
        return row
    mine = target_tensors(op, ran, view)["out"]
    predicted = predict(name, args, case["target_len"], case["emulated_arch"], case["num_cus"])
    assert solo.predicted is not None
    cmp = compare(solo.out["out"], mine)
    atol, rtol = TOLERANCES[checks.dtype_name(cfg.dtype)]
    err = (mine.double() - ref.double()).abs()
    expected = EXPECT[name](solo.predicted.key, predicted.key)
    row.update(
        cmp,
        predicted_variant=predicted.variant,
        alone_variant=solo.predicted.variant,
        predicted_key=predicted.key,
        alone_key=solo.predicted.key,
        expected=expected,
        predicted_equal={"equal": True, "switch": False}.get(expected),
        prediction=outcome(expected, cmp["bitwise_equal"]),
        rule_reason=predicted.reason,
        ref_max_abs=max_abs(mine, ref),
        within_tolerance=bool((err <= atol + rtol * ref.double().abs()).all()),
    )
    return row


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
        return "no AITER Triton kernel ran here: " + "; ".join(f"{r.backend}: {r.reason}" for r in s.itertuples())
    platforms = df.platform.dropna().unique()
    parts = []
    for r in ran.itertuples():
        switches = r.switch_observed + r.predicted_switch_not_observed
        verdict = "rule holds" if r.rule_holds else "RULE MISSES"
        parts.append(
            f"{labeled(r.backend, platforms)}: {r.switch_observed}/{switches} predicted switches seen, "
            f"{r.unpredicted_difference} unpredicted ({verdict})"
        )
    return "; ".join(parts)


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
            lines.append(f"- **{r.backend}**: did not run: {r.reason}")
            continue
        variants = fmt_list(sorted(set(part.predicted_variant.dropna()) | set(part.alone_variant.dropna())))
        lines.append(
            f"- **{labeled(r.backend, part.platform.dropna().unique())}** ({r.op}, variants seen: {variants}): {r.cases} cases; "
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
