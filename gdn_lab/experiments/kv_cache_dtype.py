"""KV cache dtype: what the arch's fp8 cache costs in accuracy as the context grows, and invariance.

For each emulated arch (its fp8 format from `gdn_lab.device.fp8_dtype_for`: float8_e4m3fnuz on
gfx942, float8_e4m3fn on gfx950 and NVIDIA), each context length and each backend, the target runs
with a cache in the compute dtype and with the arch's fp8 (fixed per-tensor scales, never derived
from the batch). Each output is compared with

- the fp32 reference: the op's float64 oracle (`OpSpec.exact`) over the request's unquantized K/V;
  the error is the sum of the kernel's error and the quantization's (`ref_*`, judged by the op's
  "unquantized" tolerance);
- the oracle over the cache it read (dequantized): the kernel's own error (`kernel_max_abs`);
- itself inside a batch: bitwise (the contract columns).

On a machine whose device does not store an arch's fp8 format (e.g. float8_e4m3fnuz on an NVIDIA
GPU), that arch's fp8 rows say so (covered=False).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from gdn_lab.experiments import common
from gdn_lab.experiments.common import fmt_list
from gdn_lab.experiments.config import (
    ExperimentConfig,
    check,
    check_backends,
    known_op,
    positive,
    positive_ints,
    shape_of,
)
from gdn_lab.experiments.loop import Case, Metrics, alone_vs_batched, frame, select_backends
from gdn_lab.experiments.table import COLUMNS, RUN_COLUMNS
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import BuildOptions
from gdn_lab.routing import Backend
from gdn_lab.workloads import alone, build, make_batch, target_request

DEFAULT_CONTEXTS = (16, 256, 1024, 4096, 16383)
DEFAULT_ARCHES = ("gfx942", "gfx950")
ARCHES = ("gfx942", "gfx950", "sm_90", "auto")
EXTRA_COLUMNS = ["kv_format", "ref_max_abs", "ref_rms_ratio", "kernel_max_abs", "tolerance", "within_tolerance"]


def _arches(name: str, value: tuple[str, ...]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one arch; accepted: {', '.join(ARCHES)}")
    for a in value:
        if a not in ARCHES and not a.startswith("sm_"):
            raise ValueError(f"{name}: {a!r} is not accepted; expected gfx942, gfx950, sm_XX or auto (the device's)")


@dataclass(frozen=True, kw_only=True)
class KVCacheConfig(ExperimentConfig):
    """Compute-dtype vs fp8 KV cache, per emulated arch.

    Attributes:
        op: an op with a KV cache and a float64 oracle.
        backends: None (every registered backend) or names.
        arches: archs whose fp8 format is used ("gfx942", "gfx950", "sm_90", "auto" = the device's;
            None: the device's own arch only).
        contexts: target context lengths.
        batch_size: the batch the target is compared in.
        k_scale, v_scale: the fp8 dequantization scales (fixed).
        attention: AttentionShape fields.
        max_context: batchmates' lengths are uniform in [1, max_context].
        include_controls: also run the batch-variant controls.
    """

    op: str = field(metadata=check(known_op, "an op with a KV cache"))
    backends: tuple[str, ...] | None = None
    arches: tuple[str, ...] | None = field(
        default=DEFAULT_ARCHES, metadata=check(_arches, "archs whose fp8 format is used (None: the device's)")
    )
    contexts: tuple[int, ...] = field(default=DEFAULT_CONTEXTS, metadata=check(positive_ints))
    batch_size: int = field(default=8, metadata=check(positive))
    k_scale: float = field(default=1.0, metadata=check(positive))
    v_scale: float = field(default=1.0, metadata=check(positive))
    attention: dict[str, int] | None = None
    max_context: int = field(default=16383, metadata=check(positive))
    include_controls: bool = False

    def validate(self) -> None:
        super().validate()
        s = op_spec.get(self.op)
        if not s.kv_cache or s.exact is None:
            have = [n for n in op_spec.names() if op_spec.get(n).kv_cache and op_spec.get(n).exact is not None]
            raise ValueError(f"op: {self.op!r} needs a KV cache and a float64 oracle; accepted: {', '.join(have)}")
        check_backends("backends", self.op, self.backends)
        shape_of(self.op, {"attention": self.attention})

    def cases(self) -> list[Case]:
        shape = shape_of(self.op, {"attention": self.attention})
        resolved = [self.device_arch if a == "auto" else a for a in (self.arches or ("auto",))]
        out = []
        for arch in resolved:
            for fmt in ("compute", "fp8"):
                kv = self.kv_torch_dtype("fp8" if fmt == "fp8" else self.dtype, arch)
                opts = BuildOptions(self.torch_dtype, kv, self.k_scale, self.v_scale, self.torch_device)
                for n in self.contexts:
                    target = target_request(n, self.seed)
                    batch = make_batch(target, self.batch_size, seed=self.seed, max_len=self.max_context)
                    columns = {"kv_format": fmt}
                    out.append(
                        Case(
                            self.op,
                            shape,
                            opts,
                            self.seed,
                            target,
                            ((0, batch),),
                            alone(target, self.seed),
                            arch,
                            columns,
                        )
                    )
        return out


class _ErrorVsUnquantized(Metrics):
    def reference(self, case: Case, args: Mapping[str, Any], view: op_spec.View) -> dict[str, torch.Tensor]:
        spec = op_spec.get(case.op)
        plain = build(case.op, case.alone, case.shape, BuildOptions(dtype=case.opts.dtype, device=case.opts.device))
        return {"unquantized": spec.exact(plain)[view.rows], "own": spec.exact(args)[view.rows]}

    def alone(
        self, case: Case, backend: Backend, args: Mapping, tensors: Mapping, reference: Mapping
    ) -> dict[str, Any]:
        mine, unq = tensors["out"], reference["unquantized"]
        tol = op_spec.get(case.op).tolerance("out", case.opts.kv_dtype or case.opts.dtype, "unquantized")
        return {
            "ref_max_abs": common.max_abs(mine, unq),
            "ref_rms_ratio": tol.measure(mine, unq),
            "kernel_max_abs": common.max_abs(mine, reference["own"]),
            "tolerance": tol.name,
            "within_tolerance": tol.holds(mine, unq),
        }


def kv_cache_dtype(*, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Run the experiment.

    Args:
        progress: tqdm bar on stderr.
        **kwargs: the fields of `KVCacheConfig` (plain values).

    Returns:
        One row per (arch, kv format, context, backend): contract columns (invariance in a batch),
        `kv_format` ("compute" or "fp8"), errors against the fp32 reference and the kernel's own,
        and the named tolerance.
    """
    return run(KVCacheConfig(**kwargs), progress=progress)


def run(cfg: KVCacheConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `kv_cache_dtype`)."""
    chosen = select_backends(cfg.op, cfg.backends, cfg.include_controls)
    rows = alone_vs_batched(cfg.cases(), chosen, _ErrorVsUnquantized(), progress=progress, desc="kv cache dtype")
    return frame(rows, COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS)


def headline(df: pd.DataFrame) -> str:
    """One line for the suite index."""
    done = df[(df.status == "compared") & ~df.is_control.astype(bool)]
    if done.empty:
        reasons = "; ".join(common.short_reason(r, 100) for r in df.reason.dropna().unique()[:2])
        return common.with_errors(f"nothing ran: {reasons}", df)
    fp8 = done[done.kv_format == "fp8"]
    parts = []
    if not fp8.empty:
        worst = fp8.groupby("kv_dtype").ref_rms_ratio.max()
        parts.append("fp8 KV error vs fp32 " + ", ".join(f"{k}: rms ratio <= {v:.3g}" for k, v in worst.items()))
    off = done[~done.within_tolerance.astype(bool)]
    parts.append(
        f"all {len(done)} compared rows within tolerance" if off.empty else f"OUTSIDE tolerance: {len(off)} rows"
    )
    variant = done[~done.bitwise_equal.astype(bool)]
    parts.append(
        "bitwise invariant with both caches"
        if variant.empty
        else "batch-variant: "
        + ", ".join(sorted({f"{r.backend}{r.hardware_note or ''}/{r.kv_dtype}" for r in variant.itertuples()}))
    )
    skipped = df[df.status == "not covered"]
    if not skipped.empty:
        names = sorted({f"{r.backend}{r.hardware_note or ''}/{r.kv_dtype}" for r in skipped.itertuples()})
        parts.append(f"not covered: {', '.join(names)}")
    return common.with_errors("; ".join(parts), df)


def conclusion(df: pd.DataFrame) -> str:
    """Markdown conclusion computed from the table."""
    lines = ["## Conclusion", ""]
    done = df[df.status == "compared"]
    for (arch, kv, _backend), part in done.groupby(["arch", "kv_dtype", "backend"], sort=False):
        label = common.label(part)
        growth = ", ".join(f"{int(r.target_len)}: {r.ref_rms_ratio:.2g}" for r in part.itertuples())
        differ = part[~part.bitwise_equal.astype(bool)].target_len.tolist()
        outside = part[~part.within_tolerance.astype(bool)].target_len.tolist()
        lines.append(
            f"- **{arch} / {kv} / {label}**: rms ratio to fp32 by context ({growth}); outside "
            f"`{part.tolerance.iloc[0]}` at {fmt_list(outside)}; batch-variant at {fmt_list(differ)}."
        )
    for (arch, kv, backend), part in df[df.status != "compared"].groupby(["arch", "kv_dtype", "backend"], sort=False):
        lines.append(f"- {arch} / {kv} / {backend}: {part.status.iloc[0]}: {common.short_reason(part.reason.iloc[0])}")
    return "\n".join(lines)
