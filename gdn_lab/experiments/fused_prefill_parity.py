"""Fused GDN prefill parity: does a fused kernel of the whole chain match the unfused torch chain?

`gdn_layer_prefill` is the whole Gated DeltaNet prefill chain (conv1d + split, gates, delta rule,
gated RMSNorm, group-128 fp8). Its reference backend is the unfused chain; every other backend
(e.g. `triton-fused`) runs the same batch on private state copies, and each tensor of the whole
batch is compared with the reference's (`gdn_lab.experiments.loop.against_reference`), judged by
the op's named tolerance (`OpSpec.tolerance`):

- `normalized`, `delta_state`: relative mean absolute error;
- `conv_state`: the final conv state holds the last W-1 inputs, a copy: bitwise;
- `quantized`: the group-128 fp8 codes, judged on their dequantized values (with `scales`), plus
  the fraction of codes that are identical (`codes_equal`).

Bitwise equality across batch compositions is `batch_invariance("gdn_layer_prefill", ...)`.
"""

from __future__ import annotations

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
    known_arch,
    known_op,
    positive,
    positive_ints,
    shape_of,
)
from gdn_lab.experiments.loop import Case, Comparison, Metrics, against_reference, frame, select_backends
from gdn_lab.experiments.table import COLUMNS, RUN_COLUMNS
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import BuildOptions
from gdn_lab.ops.spec import Tolerance
from gdn_lab.workloads import alone, make_batch, target_request

DEFAULT_TARGETS = (1, 63, 64, 65, 300)
DEFAULT_BATCH_SIZES = (1, 4)
EXTRA_COLUMNS = ["reference", "num_sequences", "tokens", "rel_mae", "codes_equal", "tolerance", "within_tolerance"]
_REL_MAE = Tolerance("rel_mae")


@dataclass(frozen=True, kw_only=True)
class ParityConfig(ExperimentConfig):
    """Each backend of an op against its reference backend on the same batches.

    Attributes:
        op: the op (its spec names the reference and the tolerances).
        backends: None (every registered backend but the reference) or names.
        targets: the target sequence lengths.
        batch_sizes: each target alone (1) or with random batchmates.
        gdn: GDNShape fields (HK, HV, head_dim, conv_width).
        max_context: batchmates' lengths are uniform in [1, max_context].
        quantize_fp8: also compare the group-128 fp8 activations.
        arch: the arch whose fp8 format is used (default: the device's).
        include_controls: also run the batch-variant controls.
    """

    op: str = field(metadata=check(known_op))
    backends: tuple[str, ...] | None = None
    targets: tuple[int, ...] = field(default=DEFAULT_TARGETS, metadata=check(positive_ints))
    batch_sizes: tuple[int, ...] = field(default=DEFAULT_BATCH_SIZES, metadata=check(positive_ints))
    gdn: dict[str, int] | None = None
    max_context: int = field(default=4096, metadata=check(positive))
    quantize_fp8: bool = True
    arch: str | None = field(default=None, metadata=check(known_arch, "the arch whose fp8 format is used"))
    include_controls: bool = False

    def validate(self) -> None:
        super().validate()
        check_backends("backends", self.op, self.backends)
        shape_of(self.op, {"gdn": self.gdn})

    def cases(self) -> list[Case]:
        shape = shape_of(self.op, {"gdn": self.gdn})
        arch = self.arch or self.device_arch
        fp8 = self.kv_torch_dtype("fp8", arch) if self.quantize_fp8 else None
        opts = BuildOptions(
            dtype=self.torch_dtype, device=self.torch_device, quantize_fp8=self.quantize_fp8, fp8_dtype=fp8
        )
        out = []
        for n in self.targets:
            for bs in self.batch_sizes:
                target = target_request(n, self.seed)
                batch = (
                    alone(target, self.seed)
                    if bs == 1
                    else make_batch(target, bs, seed=self.seed, max_len=self.max_context)
                )
                columns = {
                    "reference": op_spec.get(self.op).reference,
                    "num_sequences": batch.size,
                    "tokens": sum(batch.lengths),
                }
                out.append(Case(self.op, shape, opts, self.seed, target, ((0, batch),), arch=arch, columns=columns))
        return out


class _Closeness(Metrics):
    def batched(self, c: Comparison) -> dict[str, Any]:
        spec = op_spec.get(c.case.op)
        mine, ref = spec.as_values(c.mine, c.tensor), spec.as_values(c.baseline, c.tensor)
        out: dict[str, Any] = {"max_abs": common.max_abs(mine, ref), "rel_mae": _REL_MAE.measure(mine, ref)}
        if c.tensor in spec.values:  # codes read through their scales: how many codes are identical
            codes, ref_codes = c.mine[c.tensor], c.baseline[c.tensor]
            out["codes_equal"] = float((codes.view(torch.uint8) == ref_codes.view(torch.uint8)).float().mean())
        try:
            tol = spec.tolerance(c.tensor, c.case.opts.dtype)
        except ValueError:
            return out
        return {**out, "tolerance": tol.name, "within_tolerance": tol.holds(mine, ref)}


@dataclass(frozen=True, kw_only=True)
class FusedPrefillConfig(ExperimentConfig):
    """Notebook 04: parity with the reference on the same batches, then invariance across batches.

    Attributes:
        op: the op whose backends are compared with its reference backend.
        backends: None (every registered backend but the reference) or names.
        targets: target sequence lengths (both comparisons).
        batch_sizes: parity batches: 1 (the target alone) or with random batchmates.
        invariance_batch_sizes: batch sizes of the invariance comparison (the target alone vs inside).
        gdn: GDNShape fields.
        max_context: batchmates' lengths are uniform in [1, max_context].
        quantize_fp8: also compare the group-128 fp8 activations.
        arch: the arch whose fp8 format is used (None: the device's).
    """

    op: str = field(default="gdn_layer_prefill", metadata=check(known_op, "the op"))
    backends: tuple[str, ...] | None = None
    targets: tuple[int, ...] = field(default=DEFAULT_TARGETS, metadata=check(positive_ints, "target lengths"))
    batch_sizes: tuple[int, ...] = field(default=DEFAULT_BATCH_SIZES, metadata=check(positive_ints, "parity batches"))
    invariance_batch_sizes: tuple[int, ...] = field(
        default=(2, 8, 33), metadata=check(positive_ints, "invariance batch sizes")
    )
    gdn: dict[str, int] | None = None
    max_context: int = field(default=4096, metadata=check(positive))
    quantize_fp8: bool = True
    arch: str | None = field(default=None, metadata=check(known_arch, "the arch whose fp8 format is used"))

    def validate(self) -> None:
        super().validate()
        self.parity()  # noqa: B018  (both experiments' configs are checked now)
        self.invariance()

    def _shared(self) -> dict[str, Any]:
        names = ("op", "backends", "targets", "gdn", "max_context", "quantize_fp8", "arch", "seed", "device", "dtype")
        return {n: getattr(self, n) for n in names}

    def parity(self) -> ParityConfig:
        return ParityConfig(**self._shared(), batch_sizes=self.batch_sizes)

    def invariance(self) -> Any:
        from gdn_lab.experiments.batch_invariance import InvarianceConfig

        return InvarianceConfig(**self._shared(), batch_sizes=self.invariance_batch_sizes)


def fused_prefill_parity(*, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Each backend of the op against its reference backend.

    Args:
        progress: tqdm bar on stderr.
        **kwargs: the fields of `ParityConfig` (plain values).

    Returns:
        One row per (backend, target, batch size, tensor): the contract columns (bitwise_equal etc.
        compare the backend with the reference over the whole batch), rel_mae, codes_equal (fp8),
        and the named tolerance.
    """
    return run(ParityConfig(**kwargs), progress=progress)


def run(cfg: ParityConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `fused_prefill_parity`)."""
    reference = op_spec.get(cfg.op).reference
    chosen = [b for b in select_backends(cfg.op, cfg.backends, cfg.include_controls) if b.name != reference]
    rows = against_reference(cfg.cases(), chosen, _Closeness(), progress=progress, desc="fused prefill parity")
    return frame(rows, COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS)


def headline(parity: pd.DataFrame, invariance: pd.DataFrame | None = None) -> str:
    """One line for the suite index, from the parity table and (optionally) the invariance table."""
    done = parity[(parity.status == "compared") & ~parity.is_control.astype(bool)]
    if done.empty:
        reasons = "; ".join(
            f"{r.backend}: {common.short_reason(r.reason, 100)}" for r in parity.drop_duplicates("backend").itertuples()
        )
        return common.with_errors(f"no fused backend ran ({reasons or 'none registered'})", parity, invariance)
    parts = []
    for _backend, part in done.groupby("backend", sort=False):
        off = part[~part.within_tolerance.astype(bool)].tensor.unique().tolist()
        worst = part[part.tensor == "normalized"].rel_mae.max()
        parts.append(
            f"{common.label(part)} vs torch chain: normalized rel_mae <= {worst:.2g}, "
            + ("all tensors within tolerance" if not off else f"OUTSIDE tolerance: {', '.join(off)}")
        )
    if invariance is not None and not invariance.empty:
        inv = invariance[(invariance.status == "compared") & ~invariance.is_control.astype(bool)]
        var = sorted(inv[~inv.bitwise_equal.astype(bool)].backend.unique())
        parts.append("bitwise invariant across batches" if not var else f"batch-variant: {', '.join(var)}")
    return common.with_errors("; ".join(parts), parity, invariance)


def conclusion(parity: pd.DataFrame, invariance: pd.DataFrame | None = None) -> str:
    """Markdown conclusion computed from the tables."""
    lines = ["## Conclusion", ""]
    for _backend, part in parity.groupby("backend", sort=False):
        label = common.label(part)
        done = part[part.status == "compared"]
        if done.empty:
            lines.append(f"- **{label}**: {part.status.iloc[0]}: {common.short_reason(part.reason.iloc[0])}")
            continue
        lines.append(f"- **{label}** against the unfused torch chain:")
        for tensor, t in done.groupby("tensor", sort=False):
            off = t[~t.within_tolerance.astype(bool)]
            where = fmt_list(f"{r.target_len}x{r.batch_size}" for r in off.itertuples())
            extra = f", fp8 codes identical {t.codes_equal.min():.3%} at worst" if t.codes_equal.notna().any() else ""
            lines.append(
                f"  - {tensor}: rel_mae <= {t.rel_mae.max():.3g}, max abs <= {t.max_abs.max():.3g}, "
                f"bitwise equal in {int(t.bitwise_equal.astype(bool).sum())}/{len(t)}{extra}; outside "
                f"`{t.tolerance.iloc[0]}` at (target x batch) {where}"
            )
    if invariance is not None and not invariance.empty:
        lines += ["", "Across batch compositions (target alone vs inside batches):"]
        for backend, part in invariance.groupby("backend", sort=False):
            done = part[part.status == "compared"]
            if done.empty:
                lines.append(f"- {backend}: {part.status.iloc[0]}: {common.short_reason(part.reason.iloc[0])}")
                continue
            differ = int((~done.bitwise_equal.astype(bool)).sum())
            kind = " (control)" if bool(part.is_control.iloc[0]) else ""
            lines.append(f"- {backend}{kind}: {differ} of {len(done)} comparisons differ")
    return "\n".join(lines)
