"""The AMD dispatch map: at which batch sizes SGLang's AMD kernels change kernel or numerics, and FlyDSL's K split run.

Two parts, one config (`DispatchMapConfig`):

1. The map, from rules only (no kernel runs): `gdn_lab.rules.batch_variance_map` for every model,
   tensor-parallel size and arch (gfx950 as an MI350X with 256 CUs, gfx942 as an MI308X with 80),
   over batch sizes 1..max_batch. One row per (model, TP, arch, op entry) with the batch sizes
   where the kernel's variant or the request's numerics key changes (`map_table`), and the long
   form, one row per batch size (`long_table`). Each row names the lab backend that runs the
   kernel (`backend`) and takes its "not yet run on AMD hardware" mark from that backend's
   metadata (`hardware_note`): the map is what the rules predict, read from the libraries' code.
2. The K split run: FlyDSL's GDN decode sums each K = 128 reduction in WARP_THREADS_K lanes, a
   number its tuned table picks by batch size. The lab's Triton decode kernel exposes the same
   knob (`gdn_decode_triton(..., k_split=...)`), so for every (arch, local GDN shape) whose SGLang
   route is FlyDSL, a target request's decode step runs alone (batch 1, the WTK of batch 1) and
   inside batches of each `run_batch_sizes` at a seeded random position, each with
   k_split = the WTK the map predicts for that batch size (capped at the run shape's padded K).
   The target's output row and state slot are compared bitwise with the alone run; the map
   predicts "switch" where the two K splits differ and "equal" where they agree
   (`ksplit_runs`). The lab's kernel stands in for FlyDSL here (which needs an AMD GPU): the rows
   are the lab's Triton kernel's (`backend` "triton", `k_split`), `stands_for` names the AMD
   backend whose table they follow. Batch sizes SGLang routes elsewhere (HIP at batch >= 24 for
   (2, 8) on gfx942, Triton) are rows with covered=False and the route as the reason.

The run shape is each mapped shape's own (HK, HV, K = V = 128) unless `run_shape` names one (the
CPU preset runs a tiny shape in Triton's interpreter: the WTK sequence is the mapped shape's, the
arithmetic the tiny shape's). Runs that coincide (same run shape, batch size and k_split) are run
once and shared.

Example:
    >>> cfg = DispatchMapConfig(models=["Qwen3.5-397B-A17B"], tps=[8], arches=["gfx942"], max_batch=30,
    ...                         include_gemm=False, run_batch_sizes=[], device="cpu")
    >>> m = map_table(cfg)
    >>> m[m.op == "gdn_decode"].iloc[0].numerics_switch_batch_sizes[-1]
    24
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from gdn_lab import checks, routing
from gdn_lab.device import detect, triton_mode
from gdn_lab.experiments.aiter_dispatch import MISSES, outcome
from gdn_lab.experiments.common import fmt_list
from gdn_lab.experiments.compare import compare
from gdn_lab.experiments.config import ExperimentConfig, check, positive, positive_ints
from gdn_lab.experiments.table import COLUMNS, RUN_COLUMNS, base_row
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import BuildOptions, GDNShape
from gdn_lab.rules import batch_variance_map as bvm
from gdn_lab.workloads import alone, build, make_batch, target_request

OP = "gdn_decode"
RUN_BACKEND = "triton"  # the lab's Triton decode, run with FlyDSL's k split
STANDS_FOR = "aiter-flydsl"
MAP_EXTRA = ["backend", "library", "hardware_note", "measured", "gemm_note"]
RUN_EXTRA = [
    "mapped_shape",
    "run_shape",
    "used_by",
    "route",
    "wtk",
    "wtk_alone",
    "k_split",
    "k_split_alone",
    "expected",
    "prediction",
    "stands_for",
    "stands_for_note",
]
HEAD_DIM = 128


def _models(name: str, value: tuple[str, ...]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one model; accepted: {', '.join(bvm.MODELS)}")
    for v in value:
        checks.check_choice(name, v, tuple(bvm.MODELS))


def _tps(name: str, value: tuple[int, ...]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one TP size; accepted: {', '.join(map(str, bvm.TPS))}")
    for v in value:
        checks.check_choice(name, v, bvm.TPS)


def _arches(name: str, value: tuple[str, ...]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one arch; accepted: {', '.join(bvm.ARCHS)}")
    for v in value:
        checks.check_choice(name, v, bvm.ARCHS)


def _batches(name: str, value: tuple[int, ...]) -> None:
    if value:
        positive_ints(name, value)


@dataclass(frozen=True, kw_only=True)
class DispatchMapConfig(ExperimentConfig):
    """The AMD dispatch map and FlyDSL's K split run (the notebook's parameters, exactly).

    Attributes:
        models: models of `batch_variance_map.MODELS` (Qwen3-8B, Qwen3-Next-80B-A3B, Qwen3.5-27B,
            Qwen3.5-397B-A17B).
        tps: tensor-parallel sizes, of 1, 2, 4, 8.
        arches: "gfx950" (as an MI350X, 256 CUs) and/or "gfx942" (as an MI308X, 80 CUs).
        max_batch: the map covers batch sizes 1..max_batch.
        include_gemm: also map AITER's Triton gemm_a16w16 (its tables are read from the installed
            aiter; without one the map leaves the gemm out and says so).
        run_batch_sizes: the batch sizes the K split run places the target in (batch 1, the target
            alone, always runs); empty: no run.
        run_shape: the GDN shape the run computes at ({num_k_heads, num_v_heads, head_dim}); None:
            each mapped shape's own (K = V = 128).
    """

    models: tuple[str, ...] = field(default=tuple(bvm.MODELS), metadata=check(_models, "models to map"))
    tps: tuple[int, ...] = field(default=bvm.TPS, metadata=check(_tps, "tensor-parallel sizes"))
    arches: tuple[str, ...] = field(default=bvm.ARCHS, metadata=check(_arches, "gfx950 and/or gfx942"))
    max_batch: int = field(default=256, metadata=check(positive, "the map covers batch sizes 1..max_batch"))
    include_gemm: bool = True
    run_batch_sizes: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 24, 32), metadata=check(_batches))
    run_shape: dict[str, int] | None = None

    def validate(self) -> None:
        super().validate()
        self.run_gdn_shape(4, 8)  # a bad run_shape field is an error now

    def run_gdn_shape(self, num_k_heads: int, num_v_heads: int) -> GDNShape:
        """The shape the run computes at for a mapped (HK, HV)."""
        if self.run_shape is None:
            return GDNShape(num_k_heads, num_v_heads, HEAD_DIM)
        given = {k: v for k, v in self.run_shape.items() if k != "conv_width"}
        try:
            return GDNShape(**given)
        except TypeError as exc:
            raise ValueError(f"run_shape: {exc}; accepted fields: num_k_heads, num_v_heads, head_dim") from None


# --- the map ------------------------------------------------------------------------------


def backend_of(op: str, kernel: str) -> str | None:
    """The lab backend that runs a map entry's kernel (None where the lab has none)."""
    if op == "decode_attention":
        for word, name in (("paged_attention_ragged", "aiter"), ("unified_attention", "aiter-triton-unified"),
                           ("pa_decode", "aiter-triton-pa")):  # fmt: skip
            if word in kernel:
                return name
        return None
    return {
        "prefill_attention": "aiter",
        "gdn_decode": "sglang-aiter",
        "gdn_prefill": "aiter-vk",
        "gdn_layer_prefill": "aiter-fused",
        "matmul": "aiter-triton-gemm",
    }.get(op)


def _marks(df: pd.DataFrame, platform: str) -> pd.DataFrame:
    backends = [backend_of(o, k) for o, k in zip(df.op, df.kernel)]
    found = [routing.get(o, b) if b in routing.backend_names(o) else None for o, b in zip(df.op, backends)]
    return df.assign(
        backend=backends,
        library=[b.library.name if b else None for b in found],
        hardware_note=[b.hardware_note([platform]) if b else routing.HARDWARE_NOTE for b in found],
    )


def _each(cfg: DispatchMapConfig, fn: Any) -> tuple[list[pd.DataFrame], str]:
    """fn(model, tp, arch, include_gemm) for every combination; without aiter, the gemm is left out."""
    parts, note = [], ""
    gemm = cfg.include_gemm
    for model in cfg.models:
        for tp in cfg.tps:
            for arch in cfg.arches:
                try:
                    parts.append(fn(model, tp, arch, gemm))
                except ImportError as exc:
                    if not gemm:
                        raise
                    gemm, note = False, f"gemm_a16w16 not mapped: {str(exc).splitlines()[0]}"
                    parts.append(fn(model, tp, arch, gemm))
    return parts, note


def map_table(cfg: DispatchMapConfig) -> pd.DataFrame:
    """One row per (model, TP, arch, op entry): `batch_variance_map.MAP_COLUMNS` + MAP_EXTRA."""
    parts, note = _each(
        cfg, lambda m, tp, a, g: bvm.batch_variance_map(m, tp, a, max_batch=cfg.max_batch, include_gemm=g)
    )
    df = pd.concat(parts, ignore_index=True)
    df = _marks(df, detect(cfg.torch_device).platform)
    return df.assign(measured=False, gemm_note=note)[bvm.MAP_COLUMNS + MAP_EXTRA]


def long_table(cfg: DispatchMapConfig) -> pd.DataFrame:
    """One row per (model, TP, arch, op entry, batch size): `batch_variance_map.LONG_COLUMNS` + backend."""
    parts, _ = _each(
        cfg, lambda m, tp, a, g: bvm.batch_variance_long(m, tp, a, max_batch=cfg.max_batch, include_gemm=g)
    )
    df = pd.concat(parts, ignore_index=True)
    return df.assign(backend=[backend_of(o, k) for o, k in zip(df.op, df.kernel)])


def summarize(map_df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, op, kernel): how many of its entries (TP, arch, and for matmul each projection)
    change numerics with the batch, where, and the first switch batch size of each."""
    out = []
    for (model, op, kernel), part in map_df.groupby(["model", "op", "kernel"], sort=False):
        moving = part[part.numerics_changes]
        first = sorted({int(b) for row in moving.numerics_switch_batch_sizes for b in row[:1]})
        out.append(
            {
                "model": model,
                "op": op,
                "kernel": kernel,
                "backend": part.backend.iloc[0],
                "entries": len(part),
                "numerics_follow_batch": len(moving),
                "where": ", ".join(dict.fromkeys(f"TP{r.tp} {r.arch}" for r in moving.itertuples())) or "none",
                "first_switch_batch_sizes": first,
                "hardware_note": part.hardware_note.iloc[0],
            }
        )
    return pd.DataFrame(out)


# --- FlyDSL's K split, run on the lab's Triton decode ---------------------------------------


def _wtk(key: str) -> int | None:
    """The WARP_THREADS_K of a gdn_decode numerics key ("flydsl:wtk=16" -> 16), None off FlyDSL."""
    return int(key.split("=")[1]) if key.startswith("flydsl:wtk=") else None


def _padded(k: int) -> int:
    return 1 << (k - 1).bit_length()


def flydsl_schedules(long_df: pd.DataFrame) -> list[dict[str, Any]]:
    """Every (arch, local GDN shape) whose SGLang decode route is FlyDSL at some batch size:
    its key per batch size and the (model, TP) pairs that have it."""
    dec = long_df[long_df.op == OP]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for (arch, shape), part in dec.groupby(["arch", "shape"], sort=False):
        if not part.key.str.startswith("flydsl:").any():
            continue
        first = part[part.batch_size == part.batch_size.min()]
        used = [f"{m} TP{t}" for m, t in dict.fromkeys(zip(first.model, first.tp))]
        keys = dict(zip(part.batch_size.astype(int), part.key))
        hk, hv = (int(x.split("=")[1]) for x in shape.split()[:2])
        out[(arch, shape)] = {"arch": arch, "shape": shape, "num_k_heads": hk, "num_v_heads": hv,
                              "keys": keys, "used_by": used}  # fmt: skip
    return list(out.values())


def _run_step(args: Mapping[str, Any], k_split: int) -> tuple[torch.Tensor, dict[str, Any]]:
    from gdn_lab.ops.gdn_decode import triton_kernels  # Triton is imported only when a run happens

    mine = {**args, "state": args["state"].clone()}
    out = triton_kernels.gdn_decode_triton(**mine, k_split=k_split)
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    return out, mine


def ksplit_runs(cfg: DispatchMapConfig, long_df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The target's bits alone and in each run batch size, with FlyDSL's K split from the map.

    Args:
        cfg: the experiment.
        long_df: `long_table(cfg)` (computed when not given).

    Returns:
        One row per (arch, mapped shape, batch size, tensor): COLUMNS + RUN_COLUMNS + RUN_EXTRA.
    """
    columns = COLUMNS + RUN_COLUMNS + RUN_EXTRA
    if not cfg.run_batch_sizes:
        return pd.DataFrame(columns=columns)
    long_df = long_table(cfg) if long_df is None else long_df
    device, dtype = cfg.torch_device, cfg.torch_dtype
    backend, spec = routing.get(OP, RUN_BACKEND), op_spec.get(OP)
    stands = routing.get(OP, STANDS_FOR)
    platform = detect(device).platform
    mode, why_not = triton_mode(device)
    sizes = sorted({1, *cfg.run_batch_sizes})
    target = target_request(1, cfg.seed)
    opts = BuildOptions(dtype=dtype, device=device)
    cache: dict[tuple[GDNShape, int, int], tuple[Any, dict[str, Any], Any]] = {}

    def run(shape: GDNShape, b: int, k_split: int) -> tuple[Any, dict[str, torch.Tensor]]:
        key = (shape, b, k_split)
        if key not in cache:
            batch = alone(target, cfg.seed) if b == 1 else make_batch(target, b, seed=cfg.seed, max_len=1)
            args = build(OP, batch, shape, opts)
            out, after = _run_step(args, k_split)
            cache[key] = (batch, spec.tensors(out, after, spec.view(batch, args, batch.position)), args)
        batch, tensors, _ = cache[key]
        return batch, tensors

    rows = []
    for sched in flydsl_schedules(long_df):
        shape = cfg.run_gdn_shape(sched["num_k_heads"], sched["num_v_heads"])
        cap = _padded(shape.head_dim)
        keys = sched["keys"]
        alone_key = keys.get(1, "")
        wtk1 = _wtk(alone_key)
        common = dict(
            mapped_shape=sched["shape"],
            run_shape=f"HK={shape.num_k_heads} HV={shape.num_v_heads} K=V={shape.head_dim}",
            used_by=", ".join(sched["used_by"]),
            wtk_alone=wtk1,
            k_split_alone=min(wtk1, cap) if wtk1 else None,
            stands_for=STANDS_FOR,
            stands_for_note=stands.hardware_note([platform]),
        )
        for b in sizes:
            key = keys.get(b)
            wtk = _wtk(key) if key else None
            fields = dict(target_len=1, batch_size=b, trial=0, route=key, wtk=wtk, **common)
            skip = None
            if mode is None:
                skip = why_not
            elif key is None:
                skip = f"batch {b} is beyond the map's max_batch {cfg.max_batch}"
            elif wtk is None or wtk1 is None:
                skip = (
                    f"SGLang takes {key if wtk is None else alone_key} at batch {b if wtk is None else 1}, not FlyDSL"
                )
            if skip:
                rows.append(base_row(backend, device, dtype, None, cfg.seed, arch=sched["arch"], backend_ran=None,
                                     covered=False, reason=skip, status="not covered", tensor="out", **fields))  # fmt: skip
                continue
            k_alone, k_b = min(wtk1, cap), min(wtk, cap)
            _, solo = run(shape, 1, k_alone)
            batch, mine = run(shape, b, k_b)
            expected = "equal" if k_alone == k_b else "switch"
            reason = f"k_split {k_b} (FlyDSL WARP_THREADS_K {wtk} at batch {b} on {sched['arch']}) vs {k_alone} alone"
            for name in spec.outputs + spec.states:
                cmp = compare(solo[name], mine[name])
                rows.append(
                    base_row(
                        backend, device, dtype, None, cfg.seed, arch=sched["arch"], backend_ran=RUN_BACKEND,
                        covered=True, reason=reason, status="compared", tensor=name, position=batch.position,
                        batch_tokens=sum(batch.lengths), batch_max_len=max(batch.lengths), k_split=k_b,
                        expected=expected, prediction=outcome(expected, bool(cmp["bitwise_equal"])), **fields, **cmp,
                    )
                )  # fmt: skip
    df = pd.DataFrame(rows, columns=None)
    return df.reindex(columns=columns + [c for c in df.columns if c not in columns])


# --- reading the tables ---------------------------------------------------------------------


def run_cases(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (arch, mapped shape, batch size) of the K split run: whether the target moved.

    A case moved when its output row or its state slot changed bits (a bf16/fp16 output can round
    a changed fp32 sum back to the same value; the fp32 state shows it); `prediction` meets the
    expectation with that.
    """
    columns = ["arch", "mapped_shape", "used_by", "batch_size", "route", "wtk", "k_split", "k_split_alone",
               "expected", "moved", "prediction", "n_diff_out", "n_diff_state", "status", "reason"]  # fmt: skip
    if runs.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for (arch, shape, b), part in runs.groupby(["arch", "mapped_shape", "batch_size"], sort=False):
        first = part.iloc[0]
        done = part[part.status == "compared"]
        moved = bool((~done.bitwise_equal.astype(bool)).any()) if len(done) else None
        by = dict(zip(done.tensor, done.n_diff))
        out.append(
            {
                "arch": arch, "mapped_shape": shape, "used_by": first.used_by, "batch_size": int(b),
                "route": first.route, "wtk": first.wtk, "k_split": first.k_split, "k_split_alone": first.k_split_alone,
                "expected": first.expected, "moved": moved,
                "prediction": outcome(first.expected, not moved) if moved is not None else None,
                "n_diff_out": by.get("out"), "n_diff_state": by.get("state"), "status": first.status,
                "reason": first.reason,
            }
        )  # fmt: skip
    return pd.DataFrame(out, columns=columns)


def headline(map_df: pd.DataFrame, runs: pd.DataFrame) -> str:
    """One line for the suite index, computed from the tables."""
    combos = map_df.groupby(["model", "tp", "arch"]).ngroups
    moving = map_df[map_df.numerics_changes]
    ops = fmt_list(sorted(moving.op.unique()))
    note = map_df.hardware_note.dropna().iloc[0] if len(map_df) else ""
    parts = [
        f"{combos} (model, TP, arch) maps: {len(moving)} of {len(map_df)} op entries change numerics with the batch "
        f"({ops}), by the rules{note}"
    ]
    cases = run_cases(runs)
    done = cases[cases.status == "compared"]
    if len(done):
        switches = done[done.expected == "switch"]
        seen = int(switches.moved.astype(bool).sum())
        missed = int(done.prediction.isin(MISSES).sum())
        parts.append(
            f"the lab's Triton decode with FlyDSL's K splits: {seen}/{len(switches)} predicted switches moved the "
            f"target's bits, {missed} against the prediction"
        )
    elif len(runs):
        parts.append(f"K split run not possible here: {runs.reason.iloc[0]}")
    return "; ".join(parts)


def conclusion(map_df: pd.DataFrame, runs: pd.DataFrame) -> str:
    """A markdown conclusion computed from the tables (the notebook's last cell shows it)."""
    lines = ["## Conclusion", ""]
    note = map_df.hardware_note.dropna().iloc[0] if len(map_df) else ""
    lines.append(
        "The map is what the libraries' dispatch rules predict, read from their code; "
        f"the AMD kernels behind it are{' not yet run on AMD hardware' if note else ' run on this AMD GPU'} by this lab."
    )
    if len(map_df) and map_df.gemm_note.iloc[0]:
        lines.append(f"({map_df.gemm_note.iloc[0]}.)")
    lines.append("")
    s = summarize(map_df)
    for model, part in s.groupby("model", sort=False):
        lines.append(f"**{model}**")
        for r in part.itertuples():
            if r.numerics_follow_batch:
                lines.append(
                    f"- {r.op} · {r.kernel}{r.hardware_note}: numerics follow the batch at {r.numerics_follow_batch}/"
                    f"{r.entries} entries ({r.where}); first switches at batch {fmt_list(r.first_switch_batch_sizes)}."
                )
            else:
                lines.append(f"- {r.op} · {r.kernel}{r.hardware_note}: one numerics key for every batch size.")
        lines.append("")
    cases = run_cases(runs)
    done = cases[cases.status == "compared"]
    if len(done):
        note = runs.stands_for_note.dropna().iloc[0]
        lines.append(f"**FlyDSL's K split on the lab's Triton decode** (a stand-in for FlyDSL{note}):")
        for (arch, shape), part in done.groupby(["arch", "mapped_shape"], sort=False):
            moved = sorted(int(b) for b in part[part.moved.astype(bool)].batch_size)
            misses = part[part.prediction.isin(MISSES)]
            ks = ", ".join(f"{int(r.batch_size)}: {int(r.k_split)}" for r in part.itertuples())
            verdict = "as predicted" if misses.empty else f"**{len(misses)} against the prediction**"
            lines.append(
                f"- {arch} {shape} ({part.used_by.iloc[0]}): k split by batch size {ks}; the target's bits moved "
                f"at batch {fmt_list(moved)}, {verdict}."
            )
    elif len(runs):
        lines.append(f"The K split run did not run here: {runs.reason.iloc[0]}.")
    return "\n".join(lines)
