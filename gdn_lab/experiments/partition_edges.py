"""Decode attention at the edges of 256-token KV partitions: accuracy and invariance.

AITER's paged decode cuts every context into 256-token partitions, normalizes each partition's
partial output, rounds it to the query dtype and merges the partitions in a fixed order
(`torch-partitioned` mirrors it). Contexts of 1, 255, 256, 257, 511, 512, 513 tokens and many
partitions probe the edges. For each backend and context the target is compared with

- the exact softmax: float64 dense attention over the same cache (`exact_decode_attention`):
  max abs error, max and distribution of the ulp distance to the exact value rounded to the
  output dtype, and a named tolerance (`TOLERANCES`);
- itself inside a batch of random batchmates: bitwise (the contract columns).

Example:
    >>> df = partition_edges(backends=["torch", "torch-partitioned"], contexts=[255, 257], device="cpu",
    ...                      dtype="float32", attention={"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 16},
    ...                      max_context=300, batch_size=3, include_controls=False, progress=False)
    >>> df[["backend", "target_len", "partitions", "within_tolerance"]].values.tolist()[:3]
    [['torch', 255, 1, True], ['torch-partitioned', 255, 1, True], ['torch', 257, 2, True]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from gdn_lab.checks import dtype_name
from gdn_lab.device import detect
from gdn_lab.experiments.common import fmt_list, labeled, run_backend, select_backends, target_tensors
from gdn_lab.experiments.compare import compare, ulp_distance
from gdn_lab.experiments.table import COLUMNS, base_row
from gdn_lab.ops.attention.reference import PARTITION_SIZE, gather_request
from gdn_lab.workloads import (
    AttentionShape,
    BuildOptions,
    alone,
    build,
    make_batch,
    resolve_device,
    resolve_dtype,
    target_request,
    target_view,
)

DEFAULT_CONTEXTS = (1, 255, 256, 257, 511, 512, 513, 4095, 4096, 4097, 16383)

# Closeness to the exact softmax, per output dtype: |out - exact| <= atol + rtol * |exact| everywhere.
# bf16/fp16: a couple of output ulps (AITER rounds each partition's partial to the query dtype and
# then rounds the merged result once more); fp32: accumulation order over up to 16k tokens.
TOLERANCES: dict[str, tuple[float, float]] = {
    "bfloat16": (2 * 2**-8, 2 * 2**-8),
    "float16": (2 * 2**-11, 2 * 2**-11),
    "float32": (1e-5, 1e-5),
}

ULP_BUCKETS = ("ulp_0", "ulp_1", "ulp_2", "ulp_gt2")

EXTRA_COLUMNS = [
    "is_control",
    "status",
    "platform",
    "partitions",
    "exact_max_abs",
    "exact_max_ulp",
    *ULP_BUCKETS,
    "tolerance",
    "within_tolerance",
]


def exact_decode_attention(args: Mapping[str, Any]) -> torch.Tensor:
    """Float64 dense softmax attention of every request over its (dequantized) paged context.

    Independent of the torch backend's code path: it gathers the tokens and calls SDPA in float64.

    Args:
        args: validated decode_attention arguments.

    Returns:
        [B, Hq, D] float64.
    """
    q = args["q"]
    indptr = args["kv_indptr"].tolist()
    hq, hkv = q.shape[1], args["k_cache"].shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(args["seq_lens"].tolist()):
        k = gather_request(args["k_cache"], indptr, args["kv_indices"], b, n, args["k_scale"]).double()
        v = gather_request(args["v_cache"], indptr, args["kv_indices"], b, n, args["v_scale"]).double()
        kh = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [Hq, L, D]
        vh = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        qh = q[b].double()[:, None, :]  # [Hq, 1, D]
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, scale=args["scale"])
        out[b] = o[:, 0, :]
    return out


def tolerance_for(dtype: torch.dtype) -> tuple[str, float, float]:
    """(name, atol, rtol) of the closeness judged against the exact softmax for an output dtype."""
    atol, rtol = TOLERANCES[dtype_name(dtype)]
    return f"|out-exact| <= {atol:.3g} + {rtol:.3g}*|exact|", atol, rtol


def error_vs_exact(out: torch.Tensor, exact: torch.Tensor) -> dict[str, Any]:
    """Max abs error, ulp distance to the exact value rounded to out's dtype, and the ulp histogram."""
    ulps = ulp_distance(out, exact.to(out.dtype)).flatten().cpu()
    n = max(ulps.numel(), 1)
    name, atol, rtol = tolerance_for(out.dtype)
    diff = (out.double() - exact).abs()
    return {
        "exact_max_abs": float(diff.max()),
        "exact_max_ulp": int(ulps.max()),
        "ulp_0": float((ulps == 0).sum()) / n,
        "ulp_1": float((ulps == 1).sum()) / n,
        "ulp_2": float((ulps == 2).sum()) / n,
        "ulp_gt2": float((ulps > 2).sum()) / n,
        "tolerance": name,
        "within_tolerance": bool((diff <= atol + rtol * exact.abs()).all()),
    }


def partition_edges(
    *,
    backends: str | Sequence[str] | None = None,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    batch_size: int = 8,
    trials: int = 1,
    seed: int = 0,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "bfloat16",
    attention: Mapping[str, int] | AttentionShape | None = None,
    max_context: int = 16383,
    include_controls: bool = True,
    progress: bool = True,
) -> pd.DataFrame:
    """Error against the exact softmax and batch invariance of decode attention at partition edges.

    Args:
        backends: None/"all" (every registered decode_attention backend) or names.
        contexts: target context lengths.
        batch_size: the batch the target is compared in (random batchmates, random position).
        trials: batches per context.
        seed: seeds every request and batch.
        device: "auto", "cpu" or "cuda".
        dtype: q's and the cache's dtype.
        attention: AttentionShape fields (head counts, head_dim, page_size).
        max_context: batchmates' lengths are uniform in [1, max_context].
        include_controls: also run the batch-variant controls.
        progress: tqdm bar on stderr.

    Returns:
        One row per (backend, context, trial): contract columns (the invariance comparison),
        `partitions` (ceil(context / 256)), the error against the exact softmax (`exact_*`,
        fractions of elements at 0, 1, 2 and > 2 ulps), and `tolerance` / `within_tolerance`.
    """
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    shape = attention if isinstance(attention, AttentionShape) else AttentionShape(**(attention or {}))
    chosen = select_backends("decode_attention", backends, include_controls)
    opts = BuildOptions(dtype=dt, device=dev)
    info = detect(dev)
    rows = []
    for n in tqdm(list(contexts), desc="partition edges", disable=not progress, leave=False):
        target = target_request(n, seed)
        solo = alone(target, seed)
        solo_args = build("decode_attention", solo, shape, opts)
        solo_view = target_view("decode_attention", solo, solo_args)
        exact = exact_decode_attention(solo_args)[solo_view.rows]
        batches = [
            make_batch(target, batch_size, seed=seed, trial=t, max_len=max_context, min_len=1) for t in range(trials)
        ]
        built = [(b, build("decode_attention", b, shape, opts)) for b in batches]
        for backend in chosen:
            first = run_backend("decode_attention", backend.name, solo_args)
            errors = {}
            if first.status == "compared":
                mine = target_tensors("decode_attention", first, solo_view)["out"]
                errors = error_vs_exact(mine, exact)
            for trial, (batch, args) in enumerate(built):
                ran = run_backend("decode_attention", backend.name, args) if first.status == "compared" else first
                row = base_row(
                    "decode_attention", backend.name, dev, dt, None, seed,
                    backend_ran=backend.name if ran.covered else None, covered=ran.covered,
                    reason=ran.error or ran.reason, target_len=n, batch_size=batch_size, position=batch.position,
                    trial=trial, is_control=backend.variant_control, status=ran.status, platform=info.platform,
                    partitions=-(-n // PARTITION_SIZE), **errors,
                )  # fmt: skip
                if ran.status == "compared":
                    view = target_view("decode_attention", batch, args)
                    row.update(compare(mine, target_tensors("decode_attention", ran, view)["out"]))
                rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)


def ulp_histogram(df: pd.DataFrame) -> pd.DataFrame:
    """Long form of the ulp buckets, averaged over contexts: (backend, ulp, fraction) for a bar plot."""
    done = df[df.status == "compared"]
    long = done.melt(id_vars=["backend"], value_vars=list(ULP_BUCKETS), var_name="ulp", value_name="fraction")
    long["ulp"] = long.ulp.str.removeprefix("ulp_").str.replace("gt2", ">2")
    return long.groupby(["backend", "ulp"], as_index=False, sort=False).fraction.mean()


def headline(df: pd.DataFrame) -> str:
    """One line for the suite index."""
    done = df[df.status == "compared"]
    tested = done[~done.is_control.astype(bool)]
    tested = tested.assign(label=[labeled(b, [p]) for b, p in zip(tested.backend, tested.platform)])
    off = tested[~tested.within_tolerance.astype(bool)].label.unique().tolist()
    variant = tested[~tested.bitwise_equal.astype(bool)].label.unique().tolist()
    # ulps near zero count sign flips across every tiny value, so the headline gives the share of
    # elements more than 2 ulp off and the worst absolute error instead of the max ulp.
    by = tested.groupby("label", sort=False)
    far, worst = by.ulp_gt2.max().to_dict(), by.exact_max_abs.max().to_dict()
    parts = [
        f"{len(tested.backend.unique())} backends over contexts {int(df.target_len.min())}..{int(df.target_len.max())}"
        f" (up to {int(df.partitions.max())} partitions)",
        "all within tolerance of the exact softmax" if not off else f"OUTSIDE tolerance: {', '.join(off)}",
        "all batch invariant" if not variant else f"batch-variant: {', '.join(variant)}",
        "worst share > 2 ulp / max abs from exact: " + ", ".join(f"{b} {far[b]:.1%} / {worst[b]:.2g}" for b in far),
    ]
    return "; ".join(parts)


def conclusion(df: pd.DataFrame) -> str:
    """Markdown conclusion computed from the table."""
    lines = ["## Conclusion", ""]
    for backend, part in df.groupby("backend", sort=False):
        done = part[part.status == "compared"]
        label = labeled(str(backend), part.platform)
        if done.empty:
            lines.append(f"- **{label}**: not run: {part.reason.iloc[0]}")
            continue
        worst = done.loc[done.exact_max_ulp.idxmax()]
        outside = done[~done.within_tolerance.astype(bool)].target_len.unique().tolist()
        differ = done[~done.bitwise_equal.astype(bool)].target_len.unique().tolist()
        control = " (batch-variant control)" if bool(part.is_control.iloc[0]) else ""
        lines.append(
            f"- **{label}**{control}: worst {int(worst.exact_max_ulp)} ulp / {worst.exact_max_abs:.3g} abs from the "
            f"exact softmax at context {int(worst.target_len)}; outside `{worst.tolerance}` at contexts "
            f"{fmt_list(outside)}; changes bits in a batch at contexts {fmt_list(differ)}."
        )
    skipped = df[df.status == "not covered"]
    if not skipped.empty:
        lines += ["", f"Not covered: {len(skipped)} rows (see the `reason` column)."]
    return "\n".join(lines)
