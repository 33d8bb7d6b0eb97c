"""Decode attention at the edges of 256-token KV partitions: accuracy and invariance.

AITER's paged decode cuts every context into 256-token partitions, normalizes each partition's
partial output, rounds it to the query dtype and merges the partitions in a fixed order
(`torch-partitioned` mirrors it). Contexts of 1, 255, 256, 257, 511, 512, 513 tokens and many
partitions probe the edges. For each backend and context the target is compared with

- the exact softmax: the op's float64 oracle over the same cache (`OpSpec.exact`): max abs error,
  max and distribution of the ulp distance to the exact value rounded to the output dtype, and
  the op's named tolerance against it (`OpSpec.tolerance("out", dtype, "exact")`);
- itself inside a batch of random batchmates: bitwise (the contract columns).

Example:
    >>> df = partition_edges(op="decode_attention", backends=["torch", "torch-partitioned"], contexts=[255, 257], device="cpu",
    ...                      dtype="float32", attention={"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 16},
    ...                      max_context=300, batch_size=3, include_controls=False, progress=False)
    >>> df[["backend", "target_len", "partitions", "within_tolerance"]].values.tolist()[:3]
    [['torch', 255, 1, True], ['torch-partitioned', 255, 1, True], ['torch', 257, 2, True]]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from gdn_lab.experiments import common
from gdn_lab.experiments.common import fmt_list
from gdn_lab.experiments.compare import ulp_distance
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
from gdn_lab.ops.paged_kv import PARTITION_SIZE
from gdn_lab.routing import Backend
from gdn_lab.workloads import alone, make_batch, target_request

DEFAULT_CONTEXTS = (1, 255, 256, 257, 511, 512, 513, 4095, 4096, 4097, 16383)
ULP_BUCKETS = ("ulp_0", "ulp_1", "ulp_2", "ulp_gt2")
EXTRA_COLUMNS = ["partitions", "exact_max_abs", "exact_max_ulp", *ULP_BUCKETS, "tolerance", "within_tolerance"]


def error_vs_exact(out: torch.Tensor, exact: torch.Tensor, tolerance: op_spec.Tolerance) -> dict[str, Any]:
    """Max abs error, ulp distance to the exact value rounded to out's dtype, the ulp histogram and the tolerance."""
    ulps = ulp_distance(out, exact.to(out.dtype)).flatten().cpu()
    n = max(ulps.numel(), 1)
    return {
        "exact_max_abs": common.max_abs(out, exact),
        "exact_max_ulp": int(ulps.max()),
        "ulp_0": float((ulps == 0).sum()) / n,
        "ulp_1": float((ulps == 1).sum()) / n,
        "ulp_2": float((ulps == 2).sum()) / n,
        "ulp_gt2": float((ulps > 2).sum()) / n,
        "tolerance": tolerance.name,
        "within_tolerance": tolerance.holds(out, exact),
    }


@dataclass(frozen=True, kw_only=True)
class PartitionEdgesConfig(ExperimentConfig):
    """Error against the exact softmax and batch invariance at partition edges.

    Attributes:
        op: an op with a KV cache and a float64 oracle (`OpSpec.exact`).
        backends: None (every registered backend) or names.
        contexts: target context lengths.
        batch_size: the batch the target is compared in (random batchmates, random position).
        trials: batches per context.
        attention: AttentionShape fields (head counts, head_dim, page_size).
        max_context: batchmates' lengths are uniform in [1, max_context].
        include_controls: also run the batch-variant controls.
    """

    op: str = field(metadata=check(known_op, "an op with a float64 oracle"))
    backends: tuple[str, ...] | None = None
    contexts: tuple[int, ...] = field(default=DEFAULT_CONTEXTS, metadata=check(positive_ints, "context lengths"))
    batch_size: int = field(default=8, metadata=check(positive))
    trials: int = field(default=1, metadata=check(positive))
    attention: dict[str, int] | None = None
    max_context: int = field(default=16383, metadata=check(positive))
    include_controls: bool = True

    def validate(self) -> None:
        super().validate()
        if op_spec.get(self.op).exact is None:
            have = [n for n in op_spec.names() if op_spec.get(n).exact is not None]
            raise ValueError(f"op: {self.op!r} has no float64 oracle (OpSpec.exact); accepted: {', '.join(have)}")
        check_backends("backends", self.op, self.backends)
        shape_of(self.op, {"attention": self.attention})

    def cases(self) -> list[Case]:
        shape = shape_of(self.op, {"attention": self.attention})
        opts = BuildOptions(dtype=self.torch_dtype, device=self.torch_device)
        out = []
        for n in self.contexts:
            target = target_request(n, self.seed)
            batches = tuple(
                (t, make_batch(target, self.batch_size, seed=self.seed, trial=t, max_len=self.max_context))
                for t in range(self.trials)
            )
            columns = {"partitions": -(-n // PARTITION_SIZE)}
            out.append(
                Case(self.op, shape, opts, self.seed, target, batches, alone(target, self.seed), columns=columns)
            )
        return out


class _ErrorVsExact(Metrics):
    def reference(self, case: Case, args: Mapping[str, Any], view: op_spec.View) -> dict[str, torch.Tensor]:
        return {"exact": op_spec.get(case.op).exact(args)[view.rows]}

    def alone(
        self, case: Case, backend: Backend, args: Mapping, tensors: Mapping, reference: Mapping
    ) -> dict[str, Any]:
        out = tensors["out"]
        return error_vs_exact(out, reference["exact"], op_spec.get(case.op).tolerance("out", out.dtype, "exact"))


def partition_edges(*, progress: bool = True, **kwargs: Any) -> pd.DataFrame:
    """Run the experiment.

    Args:
        progress: tqdm bar on stderr.
        **kwargs: the fields of `PartitionEdgesConfig` (plain values).

    Returns:
        One row per (backend, context, trial): contract columns (the invariance comparison),
        `partitions` (ceil(context / 256)), the error against the exact softmax (`exact_*`,
        fractions of elements at 0, 1, 2 and > 2 ulps), and `tolerance` / `within_tolerance`.
    """
    return run(PartitionEdgesConfig(**kwargs), progress=progress)


def run(cfg: PartitionEdgesConfig, progress: bool = True) -> pd.DataFrame:
    """Run a configured experiment (see `partition_edges`)."""
    chosen = select_backends(cfg.op, cfg.backends, cfg.include_controls)
    rows = alone_vs_batched(cfg.cases(), chosen, _ErrorVsExact(), progress=progress, desc="partition edges")
    return frame(rows, COLUMNS + RUN_COLUMNS + EXTRA_COLUMNS)


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
    tested = tested.assign(label=tested.backend + tested.hardware_note.fillna(""))
    off = tested[~tested.within_tolerance.astype(bool)].label.unique().tolist()
    variant = tested[~tested.bitwise_equal.astype(bool)].label.unique().tolist()
    # ulps near zero count sign flips across every tiny value, so the headline gives the share of
    # elements more than 2 ulp off and the worst absolute error instead of the max ulp.
    by = tested.groupby("label", sort=False)
    far, worst = by.ulp_gt2.max().to_dict(), by.exact_max_abs.max().to_dict()
    parts = [
        f"{len(tested.backend.unique())} backends over contexts {int(df.target_len.min())}..{int(df.target_len.max())}"
        f" (up to {int(df.partitions.max())} partitions)",
        f"all {len(tested)} compared rows within tolerance of the exact softmax"
        if not off
        else f"OUTSIDE tolerance: {', '.join(off)}",
        "all batch invariant" if not variant else f"batch-variant: {', '.join(variant)}",
        "worst share > 2 ulp / max abs from exact: " + ", ".join(f"{b} {far[b]:.1%} / {worst[b]:.2g}" for b in far),
    ]
    return common.with_errors("; ".join(parts), df)


def conclusion(df: pd.DataFrame) -> str:
    """Markdown conclusion computed from the table."""
    lines = ["## Conclusion", ""]
    for _backend, part in df.groupby("backend", sort=False):
        done = part[part.status == "compared"]
        label = common.label(part)
        if done.empty:
            lines.append(f"- **{label}**: not run: {common.short_reason(part.reason.iloc[0])}")
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
