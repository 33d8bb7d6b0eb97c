"""KV cache dtype: what the arch's fp8 cache costs in accuracy as the context grows, and invariance.

For each emulated arch (its fp8 format from `gdn_lab.device.fp8_dtype_for`: float8_e4m3fnuz on
gfx942, float8_e4m3fn on gfx950 and NVIDIA), each context length and each decode backend, the
target runs with a cache in the compute dtype and with the arch's fp8 (fixed per-tensor scales,
never derived from the batch). Each output is compared with

- the fp32 reference: exact (float64) softmax over the request's unquantized K/V; the error is
  the sum of the kernel's error and the quantization's (`ref_*`, judged by `TOLERANCES`);
- the exact softmax over the cache it read (dequantized): the kernel's own error (`kernel_max_abs`);
- itself inside a batch: bitwise (the contract columns).

On a machine whose device does not store an arch's fp8 format (e.g. float8_e4m3fnuz on an NVIDIA
GPU), that arch's fp8 rows say so (covered=False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab.checks import dtype_name
from gdn_lab.device import detect, is_fp8
from gdn_lab.experiments.common import fmt_list, labeled, rms_ratio, run_backend, select_backends, target_tensors
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.partition_edges import exact_decode_attention
from gdn_lab.experiments.table import COLUMNS, base_row
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

DEFAULT_CONTEXTS = (16, 256, 1024, 4096, 16383)
DEFAULT_ARCHES = ("gfx942", "gfx950")

# Closeness to the fp32 reference, judged as RMS(out - ref) / RMS(ref) (flash-linear-attention's
# ratio). A cache in the compute dtype only adds the kernel's rounding; e4m3 keeps 3 mantissa bits
# (relative step 1/8 .. 1/16), so K and V carry ~2-4 % noise, averaged down by the softmax.
TOLERANCES: dict[str, float] = {"fp8": 0.1, "bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}

EXTRA_COLUMNS = [
    "kv_format",
    "is_control",
    "status",
    "platform",
    "ref_max_abs",
    "ref_rms_ratio",
    "kernel_max_abs",
    "tolerance",
    "within_tolerance",
]


def _tolerance(kv_dtype: torch.dtype) -> tuple[str, float]:
    key = "fp8" if is_fp8(kv_dtype) else dtype_name(kv_dtype)
    limit = TOLERANCES[key]
    return f"rms(out-ref)/rms(ref) <= {limit:g}", limit


def kv_cache_dtype(
    *,
    backends: str | Sequence[str] | None = None,
    arches: Sequence[str] = DEFAULT_ARCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    batch_size: int = 8,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "bfloat16",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    attention: Mapping[str, int] | AttentionShape | None = None,
    max_context: int = 16383,
    include_controls: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Compute-dtype vs fp8 KV cache for decode attention, per emulated arch.

    Args:
        backends: None/"all" (every registered decode_attention backend) or names.
        arches: archs whose fp8 format is used ("gfx942", "gfx950", "sm_90", "auto" = the device's).
        contexts: target context lengths.
        batch_size: the batch the target is compared in.
        seed: seeds every request and batch.
        device: "auto", "cpu" or "cuda".
        dtype: the compute dtype (q, and the non-fp8 cache).
        k_scale, v_scale: the fp8 dequantization scales (fixed).
        attention: AttentionShape fields.
        max_context: batchmates' lengths are uniform in [1, max_context].
        include_controls: also run the batch-variant controls.
        progress: tqdm bar on stderr.

    Returns:
        One row per (arch, kv format, context, backend): contract columns (invariance in a batch),
        `kv_format` ("compute" or "fp8"), errors against the fp32 reference and the kernel's own,
        and the named tolerance.
    """
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    shape = attention if isinstance(attention, AttentionShape) else AttentionShape(**(attention or {}))
    chosen = select_backends("decode_attention", backends, include_controls)
    info = detect(dev)
    resolved = [info.arch if a == "auto" else a for a in arches]
    cases = [(a, fmt, n) for a in resolved for fmt in ("compute", "fp8") for n in contexts]
    rows = []
    for arch, fmt, n in tqdm(cases, desc="kv cache dtype", disable=not progress, leave=False):
        kv = resolve_kv_dtype("fp8" if fmt == "fp8" else None, dt, arch)
        target = target_request(n, seed)
        solo, batch = alone(target, seed), make_batch(target, batch_size, seed=seed, max_len=max_context)
        common = dict(target_len=n, batch_size=batch_size, position=batch.position, trial=0, kv_format=fmt)
        row0 = dict(platform=info.platform, **common)
        opts = BuildOptions(dtype=dt, kv_dtype=kv, k_scale=k_scale, v_scale=v_scale, device=dev)
        try:
            solo_args = build("decode_attention", solo, shape, opts)
            args = build("decode_attention", batch, shape, opts)
        except ValueError as exc:  # the device does not store this arch's fp8 format
            for b in chosen:
                rows.append(
                    base_row(
                        "decode_attention",
                        b.name,
                        dev,
                        dt,
                        kv,
                        seed,
                        arch=arch,
                        covered=False,
                        reason=str(exc),
                        is_control=b.variant_control,
                        status="not covered",
                        **row0,
                    )  # fmt: skip
                )
            continue
        reference = exact_decode_attention(build("decode_attention", solo, shape, BuildOptions(dtype=dt, device=dev)))
        own = exact_decode_attention(solo_args)
        view_solo, view = target_view("decode_attention", solo, solo_args), target_view("decode_attention", batch, args)
        name, limit = _tolerance(kv)
        for b in chosen:
            first = run_backend("decode_attention", b.name, solo_args)
            ran = run_backend("decode_attention", b.name, args) if first.status == "compared" else first
            row = base_row(
                "decode_attention", b.name, dev, dt, kv, seed, arch=arch,
                backend_ran=b.name if ran.covered else None, covered=ran.covered, reason=ran.error or ran.reason,
                is_control=b.variant_control, status=ran.status, **row0,
            )  # fmt: skip
            if ran.status == "compared":
                mine = target_tensors("decode_attention", first, view_solo)["out"]
                ratio = rms_ratio(mine, reference[view_solo.rows])
                row.update(
                    compare(mine, target_tensors("decode_attention", ran, view)["out"]),
                    ref_max_abs=float((mine.double() - reference[view_solo.rows]).abs().max()),
                    ref_rms_ratio=ratio,
                    kernel_max_abs=float((mine.double() - own[view_solo.rows]).abs().max()),
                    tolerance=name,
                    within_tolerance=ratio <= limit,
                )
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)


def headline(df: pd.DataFrame) -> str:
    """One line for the suite index."""
    done = df[(df.status == "compared") & ~df.is_control.astype(bool)]
    if done.empty:
        return "nothing ran: " + "; ".join(df.reason.dropna().unique()[:2])
    fp8 = done[done.kv_format == "fp8"]
    parts = []
    if not fp8.empty:
        worst = fp8.groupby("kv_dtype").ref_rms_ratio.max()
        parts.append("fp8 KV error vs fp32 " + ", ".join(f"{k}: rms ratio <= {v:.3g}" for k, v in worst.items()))
    off = done[~done.within_tolerance.astype(bool)]
    parts.append("all within tolerance" if off.empty else f"OUTSIDE tolerance: {len(off)} rows")
    variant = done[~done.bitwise_equal.astype(bool)]
    parts.append(
        "bitwise invariant with both caches"
        if variant.empty
        else "batch-variant: "
        + ", ".join(sorted({f"{labeled(r.backend, [r.platform])}/{r.kv_dtype}" for r in variant.itertuples()}))
    )
    skipped = df[df.status == "not covered"]
    if not skipped.empty:
        names = sorted({f"{labeled(r.backend, [r.platform])}/{r.kv_dtype}" for r in skipped.itertuples()})
        parts.append(f"not covered: {', '.join(names)}")
    return "; ".join(parts)


def conclusion(df: pd.DataFrame) -> str:
    """Markdown conclusion computed from the table."""
    lines = ["## Conclusion", ""]
    done = df[df.status == "compared"]
    for (arch, kv, backend), part in done.groupby(["arch", "kv_dtype", "backend"], sort=False):
        label = labeled(str(backend), part.platform)
        growth = ", ".join(f"{int(r.target_len)}: {r.ref_rms_ratio:.2g}" for r in part.itertuples())
        differ = part[~part.bitwise_equal.astype(bool)].target_len.tolist()
        outside = part[~part.within_tolerance.astype(bool)].target_len.tolist()
        lines.append(
            f"- **{arch} / {kv} / {label}**: rms ratio to fp32 by context ({growth}); outside "
            f"`{part.tolerance.iloc[0]}` at {fmt_list(outside)}; batch-variant at {fmt_list(differ)}."
        )
    for (arch, kv, backend), part in df[df.status != "compared"].groupby(["arch", "kv_dtype", "backend"], sort=False):
        lines.append(f"- {arch} / {kv} / {backend}: {part.status.iloc[0]}: {part.reason.iloc[0]}")
    return "\n".join(lines)
