"""Fused GDN prefill parity: does a fused kernel of the whole chain match the unfused torch chain?

`gdn_layer_prefill` is the whole Gated DeltaNet prefill chain (conv1d + split, gates, delta rule,
gated RMSNorm, group-128 fp8). Its `torch` backend is the unfused chain; any other registered
backend (e.g. `triton-fused`) is compared with it on the same batch, on private state copies:

- `normalized`: relative mean absolute error (judged) and max abs;
- `conv_state`: the final conv state holds the last W-1 inputs, a copy: judged bitwise;
- `delta_state`: the final recurrent state, relative mean absolute error (judged) and max abs;
- `fp8`: the group-128 fp8 activations after dequantization (judged), plus the fraction of fp8
  codes that are identical.

Bitwise equality across batch compositions is `batch_invariance("gdn_layer_prefill", ...)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab.checks import dtype_name
from gdn_lab.device import detect
from gdn_lab.experiments.common import fmt_list, labeled, max_abs, rel_mae, run_backend, select_backends
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.table import COLUMNS, base_row
from gdn_lab.ops.gdn_layer.reference import FP8_GROUP
from gdn_lab.quant import dequantize_groups
from gdn_lab.workloads import (
    BuildOptions,
    GDNShape,
    alone,
    build,
    make_batch,
    resolve_device,
    resolve_dtype,
    resolve_kv_dtype,
    target_request,
)

OP = "gdn_layer_prefill"
REFERENCE = "torch"
DEFAULT_TARGETS = (1, 63, 64, 65, 300)
DEFAULT_BATCH_SIZES = (1, 4)

# Judged closeness to the unfused chain, per tensor and compute dtype ("bitwise" = 0).
# fp32: only the order of float32 operations differs. bf16/fp16: the unfused chain rounds the conv
# output to the input dtype between kernels, a fused kernel need not, so ~1 output ulp (2^-8) on a
# fraction of elements; an fp8 code flips where the normalized value crosses a rounding boundary.
TOLERANCES: dict[str, dict[str, float]] = {
    "normalized": {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3},
    "delta_state": {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3},
    "conv_state": {"float32": 0.0, "bfloat16": 0.0, "float16": 0.0},
    "fp8": {"float32": 5e-3, "bfloat16": 2e-2, "float16": 2e-2},
}

EXTRA_COLUMNS = [
    "tensor",
    "reference",
    "is_control",
    "status",
    "platform",
    "num_sequences",
    "tokens",
    "rel_mae",
    "codes_equal",
    "tolerance",
    "within_tolerance",
]


def _tolerance(tensor: str, dtype: torch.dtype) -> tuple[str, float]:
    limit = TOLERANCES[tensor][dtype_name(dtype)]
    return ("bitwise" if limit == 0 else f"rel_mae <= {limit:g}"), limit


def _tensors(result: Any, args: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The compared tensors of one run, over the slots the batch uses (states read after the run)."""
    normalized, quantized, scales = result
    slots = args["cache_indices"].long()
    out = {
        "normalized": normalized,
        "conv_state": args["conv_state"][slots],
        "delta_state": args["delta_state"][slots],
    }
    if quantized is not None:
        out["fp8"] = dequantize_groups(quantized, scales, FP8_GROUP)
        out["fp8_codes"] = quantized
    return out


def fused_prefill_parity(
    *,
    backends: str | Sequence[str] | None = None,
    targets: Sequence[int] = DEFAULT_TARGETS,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "bfloat16",
    gdn: Mapping[str, int] | GDNShape | None = None,
    max_context: int = 4096,
    quantize_fp8: bool = True,
    arch: str | None = None,
    include_controls: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Each backend of gdn_layer_prefill against the unfused torch chain.

    Args:
        backends: None/"all" (every registered backend but torch) or names.
        targets: the target sequence lengths.
        batch_sizes: each target alone (1) or with random batchmates.
        seed: seeds everything.
        device: "auto", "cpu" or "cuda".
        dtype: the compute dtype of projections and outputs.
        gdn: GDNShape fields (HK, HV, head_dim, conv_width).
        max_context: batchmates' lengths are uniform in [1, max_context].
        quantize_fp8: also compare the group-128 fp8 activations.
        arch: the arch whose fp8 format is used (default: the device's).
        include_controls: also run the batch-variant controls.
        progress: tqdm bar on stderr.

    Returns:
        One row per (backend, target, batch size, tensor): the contract columns (bitwise_equal etc.
        compare the backend with the torch chain over the whole batch), rel_mae, codes_equal (fp8),
        and the named tolerance.
    """
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    shape = gdn if isinstance(gdn, GDNShape) else GDNShape(**(gdn or {}))
    info = detect(dev)
    the_arch = arch or info.arch
    fp8 = resolve_kv_dtype("fp8", dt, the_arch) if quantize_fp8 else None
    opts = BuildOptions(dtype=dt, device=dev, quantize_fp8=quantize_fp8, fp8_dtype=fp8)
    chosen = [b for b in select_backends(OP, backends, include_controls) if b.name != REFERENCE]
    cases = [(n, bs) for n in targets for bs in batch_sizes]
    rows = []
    for n, bs in tqdm(cases, desc="fused prefill parity", disable=not progress, leave=False):
        target = target_request(n, seed)
        batch = alone(target, seed) if bs == 1 else make_batch(target, bs, seed=seed, max_len=max_context)
        args = build(OP, batch, shape, opts)
        ref = run_backend(OP, REFERENCE, args)
        if ref.status != "compared":
            raise RuntimeError(f"{OP}: the torch chain must run every case, but: {ref.reason}")
        ref_t = _tensors(ref.result, ref.args)
        common = dict(
            target_len=n,
            batch_size=bs,
            position=batch.position,
            trial=0,
            reference=REFERENCE,
            platform=info.platform,
            num_sequences=batch.size,
            tokens=sum(batch.lengths),
        )
        for b in chosen:
            ran = run_backend(OP, b.name, args)
            row = base_row(
                OP, b.name, dev, dt, fp8, seed, arch=the_arch, backend_ran=b.name if ran.covered else None,
                covered=ran.covered, reason=ran.error or ran.reason, is_control=b.variant_control, status=ran.status,
                **common,
            )  # fmt: skip
            if ran.status != "compared":
                rows.append({**row, "tensor": "normalized"})
                continue
            mine = _tensors(ran.result, ran.args)
            for tensor in ("normalized", "conv_state", "delta_state", "fp8"):
                if tensor not in ref_t:
                    continue
                name, limit = _tolerance(tensor, dt)
                cmp = compare(mine[tensor], ref_t[tensor])
                err = rel_mae(mine[tensor], ref_t[tensor])
                codes = None
                if tensor == "fp8":
                    codes = float(
                        (mine["fp8_codes"].view(torch.uint8) == ref_t["fp8_codes"].view(torch.uint8)).float().mean()
                    )
                rows.append(
                    {
                        **row,
                        **cmp,
                        "tensor": tensor,
                        "max_abs": max_abs(mine[tensor], ref_t[tensor]),
                        "rel_mae": err,
                        "codes_equal": codes,
                        "tolerance": name,
                        "within_tolerance": cmp["bitwise_equal"] if limit == 0 else err <= limit,
                    }
                )
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)


def headline(parity: pd.DataFrame, invariance: pd.DataFrame | None = None) -> str:
    """One line for the suite index, from the parity table and (optionally) the invariance table."""
    done = parity[(parity.status == "compared") & ~parity.is_control.astype(bool)]
    if done.empty:
        reasons = "; ".join(f"{r.backend}: {r.reason}" for r in parity.drop_duplicates("backend").itertuples())
        return f"no fused backend ran ({reasons or 'none registered'})"
    parts = []
    for backend, part in done.groupby("backend", sort=False):
        off = part[~part.within_tolerance.astype(bool)].tensor.unique().tolist()
        worst = part[part.tensor == "normalized"].rel_mae.max()
        parts.append(
            f"{labeled(str(backend), part.platform)} vs torch chain: normalized rel_mae <= {worst:.2g}, "
            + ("all tensors within tolerance" if not off else f"OUTSIDE tolerance: {', '.join(off)}")
        )
    if invariance is not None and not invariance.empty:
        inv = invariance[(invariance.status == "compared") & ~invariance.is_control.astype(bool)]
        var = sorted(inv[~inv.bitwise_equal.astype(bool)].backend.unique())
        parts.append("bitwise invariant across batches" if not var else f"batch-variant: {', '.join(var)}")
    return "; ".join(parts)


def conclusion(parity: pd.DataFrame, invariance: pd.DataFrame | None = None) -> str:
    """Markdown conclusion computed from the tables."""
    lines = ["## Conclusion", ""]
    for backend, part in parity.groupby("backend", sort=False):
        label = labeled(str(backend), part.platform)
        done = part[part.status == "compared"]
        if done.empty:
            lines.append(f"- **{label}**: {part.status.iloc[0]}: {part.reason.iloc[0]}")
            continue
        lines.append(f"- **{label}** against the unfused torch chain:")
        for tensor, t in done.groupby("tensor", sort=False):
            off = t[~t.within_tolerance.astype(bool)]
            where = fmt_list(f"{r.target_len}x{r.batch_size}" for r in off.itertuples())
            extra = f", fp8 codes identical {t.codes_equal.min():.3%} at worst" if tensor == "fp8" else ""
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
                lines.append(f"- {backend}: {part.status.iloc[0]}: {part.reason.iloc[0]}")
                continue
            differ = int((~done.bitwise_equal.astype(bool)).sum())
            kind = " (control)" if bool(part.is_control.iloc[0]) else ""
            lines.append(f"- {backend}{kind}: {differ} of {len(done)} comparisons differ")
    return "\n".join(lines)
