"""Seaborn plots of the experiment tables (each returns the matplotlib Figure it drew).

In a notebook, end the call with `;`: the inline backend shows the figure once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import matplotlib.pyplot as plt
import matplotlib.ticker as ticker
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

# Axis labels for the table columns the plots draw (a plot never shows a bare column name).
LABELS = {
    "exact_max_abs": "max |out − exact softmax|",
    "exact_max_ulp": "max ulps from the exact softmax",
    "ref_max_abs": "max |out − reference|",
    "ref_rms_ratio": "rms(out − fp32 ref) / rms(ref)",
    "kernel_max_abs": "max |out − exact over the cache read|",
    "rel_mae": "relative mean abs error",
    "max_abs": "max |a − b|",
    "max_ulp": "max ulp distance",
    "target_len": "context length (tokens)",
    "batch_size": "batch size",
    "fraction": "fraction of elements",
    "ulp": "ulps from the exact value",
    "tensor": "tensor",
}


def label_of(column: str) -> str:
    """The axis label of a table column (LABELS), else the column name with spaces."""
    return LABELS.get(column, column.replace("_", " "))


def _styled(plot: Callable[..., Figure] | None = None, *, style: str = "whitegrid"):
    """Draw in a seaborn style (heatmaps: "white", no grid) without changing the caller's global style."""

    def decorate(fn: Callable[..., Figure]) -> Callable[..., Figure]:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs) -> Figure:
            with sns.axes_style(style), sns.plotting_context("notebook"):
                return fn(*args, **kwargs)

        return wrapper

    return decorate(plot) if plot is not None else decorate


def _empty(title: str, message: str) -> Figure:
    fig, ax = plt.subplots(figsize=(6, 1.5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.4, message, ha="center", va="center")
    return fig


@_styled(style="white")
def mismatch_heatmap(df: pd.DataFrame, title: str = "Comparisons that changed bits") -> Figure:
    """Differing comparisons per (op, backend) row and (target length x batch size) column.

    Cells count the compared tensors whose bits changed in a batch (0 = invariant); not-covered
    cells are blank. Controls are marked "(control)".
    """
    done = df[df.status == "compared"].copy()
    if done.empty:
        return _empty(title, "nothing ran")
    done["differs"] = (~done.bitwise_equal.astype(bool)).astype(int)
    done["row"] = done.op + " · " + done.backend + done.is_control.map({True: " (control)", False: ""})
    done["case"] = done.target_len.astype(int).astype(str) + "×" + done.batch_size.astype(int).astype(str)
    order = done.drop_duplicates("case").sort_values(["target_len", "batch_size"]).case.tolist()
    grid = done.pivot_table(index="row", columns="case", values="differs", aggfunc="sum", sort=False)[order]
    height = 1.2 + 0.35 * len(grid)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(order) + 4), height))
    sns.heatmap(grid, annot=True, fmt=".0f", cmap="Reds", vmin=0, cbar=False, linewidths=0.5, ax=ax)
    ax.set_xlabel("target length × batch size")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    return fig


@_styled
def ulp_histogram(long: pd.DataFrame, title: str = "Distance to the exact softmax (output ulps)") -> Figure:
    """Bars of the fraction of output elements at 0, 1, 2 and > 2 ulps, per backend.

    Args:
        long: `gdn_lab.experiments.partition_edges.ulp_histogram(table)`.
    """
    if long.empty:
        return _empty(title, "nothing ran")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    sns.barplot(data=long, x="ulp", y="fraction", hue="backend", ax=ax)
    ax.set_title(title)
    ax.set_xlabel(label_of("ulp"))
    ax.set_ylabel(label_of("fraction"))
    fig.tight_layout()
    return fig


@_styled
def error_vs_context(
    df: pd.DataFrame,
    y: str,
    hue: str = "backend",
    style: str | None = None,
    col: str | None = None,
    title: str = "",
    logy: bool = True,
    categorical: bool = False,
    ylabel: str | None = None,
) -> Figure:
    """`y` against the context length, a line per `hue` (and `style`), one panel per `col`.

    Args:
        ylabel: the y axis label (default: `LABELS[y]`).
        categorical: one evenly spaced x position per context (for clustered contexts such as
            partition edges 255, 256, 257); otherwise a log x axis.
    """
    done = df[(df.status == "compared") & df[y].notna()].copy()
    if done.empty:
        return _empty(title or label_of(y), "nothing ran")
    done[y] = done[y].astype(float)
    if logy:
        # a zero error has no place on a log axis: show it at the smallest positive value / 2
        positive = done.loc[done[y] > 0, y]
        floor = positive.min() / 2 if not positive.empty else 1e-12
        done[y] = done[y].clip(lower=floor)
    contexts = sorted(done.target_len.astype(int).unique())
    if categorical:
        done["context"] = done.target_len.astype(int).astype(str)
        grid = sns.catplot(
            data=done, x="context", y=y, hue=hue, col=col, kind="point", order=[str(c) for c in contexts],
            height=3.5, aspect=1.4, markers="o", linestyles="-", dodge=0.3,
        )  # fmt: skip
        if logy:
            grid.set(yscale="log")
    else:
        grid = sns.relplot(
            data=done, x="target_len", y=y, hue=hue, style=style, col=col, kind="line", marker="o",
            height=3.5, aspect=1.3, facet_kws={"sharey": True},
        )  # fmt: skip
        grid.set(xscale="log", yscale="log" if logy else "linear")
        for ax in grid.axes.flat:
            ax.set_xticks(contexts)
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            plt.setp(ax.get_xticklabels(), rotation=45 if len(contexts) > 6 else 0)
    grid.set_axis_labels(label_of("target_len"), ylabel or label_of(y))
    if title:
        grid.figure.suptitle(title, y=1.02)
    return grid.figure


@_styled
def parity_bars(df: pd.DataFrame, title: str = "Fused vs unfused chain (relative mean abs error)") -> Figure:
    """Worst rel_mae per tensor and backend (log y); bitwise-equal tensors show at the floor."""
    done = df[df.status == "compared"].copy()
    if done.empty:
        return _empty(title, "nothing ran")
    worst = done.groupby(["backend", "tensor"], as_index=False, sort=False).rel_mae.max()
    positive = worst.rel_mae[worst.rel_mae > 0]
    worst["rel_mae"] = worst.rel_mae.clip(lower=(positive.min() / 10) if not positive.empty else 1e-12)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    sns.barplot(data=worst, x="tensor", y="rel_mae", hue="backend", ax=ax)
    ax.set_yscale("log")
    ax.set_xlabel(label_of("tensor"))
    ax.set_ylabel(label_of("rel_mae"))
    ax.set_title(title)
    fig.tight_layout()
    return fig


ROUTING_STATES = ["auto picks", "runs", "not covered", "unavailable"]


@_styled(style="white")
def routing_heatmap(table: pd.DataFrame, title: str = "Backends on a small call per op") -> Figure:
    """One cell per (op, backend): auto picks / runs / not covered / unavailable (blank: not registered)."""
    codes = table.assign(code=table.state.map({s: i for i, s in enumerate(ROUTING_STATES)}))
    grid = codes.pivot_table(index="op", columns="backend", values="code", aggfunc="first", sort=False)
    labels = codes.pivot_table(index="op", columns="backend", values="state", aggfunc="first", sort=False)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * grid.shape[1] + 2), 1.0 + 0.5 * grid.shape[0]))
    palette = sns.color_palette(["#2da44e", "#9be9a8", "#f2cc60", "#d0d7de"])
    sns.heatmap(
        grid, annot=labels.reindex_like(grid).fillna(""), fmt="", cmap=palette, vmin=-0.5, vmax=3.5,
        cbar=False, linewidths=0.5, ax=ax, annot_kws={"fontsize": 7},
    )  # fmt: skip
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    return fig


@_styled
def dispatch_heatmaps(df: pd.DataFrame, title: str = "AITER dispatch: predicted against measured") -> Figure:
    """One panel per AITER backend: target length x batch size, colored by how the bits met the rule.

    Colors follow `aiter_dispatch.OUTCOMES`: equal as predicted (light green), predicted switch
    observed (green), a last-step rounding difference that kept / changed the bits (light blue /
    blue), and the rule's misses: predicted switch not observed (amber), unpredicted difference
    (red). Cells show the batch's predicted variant, rows the variant of the target alone.
    Args: a `gdn_lab.experiments.aiter_dispatch` table.
    """
    from gdn_lab.experiments.aiter_dispatch import OUTCOMES, outcome_map

    maps = [(b, *outcome_map(df, b)) for b in df.backend.unique()]
    maps = [(b, codes, labels) for b, codes, labels in maps if not codes.empty]
    if not maps:
        return _empty(title, "no AITER kernel ran")
    fig, axes = plt.subplots(
        1, len(maps), figsize=(sum(2.5 + 0.8 * c.shape[1] for _, c, _ in maps), 1.5 + 0.45 * max(len(c) for _, c, _ in maps)),
        squeeze=False,
    )  # fmt: skip
    palette = sns.color_palette(["#d8f3dc", "#52b788", "#cfe2ff", "#6ea8fe", "#f2cc60", "#e5534b"])
    for ax, (backend, codes, labels) in zip(axes[0], maps):
        sns.heatmap(
            codes, annot=labels.fillna(""), fmt="", cmap=palette, vmin=-0.5, vmax=len(OUTCOMES) - 0.5,
            cbar=False, linewidths=0.5, ax=ax, annot_kws={"fontsize": 7},
        )  # fmt: skip
        ax.set_title(backend)
        ax.set_xlabel("batch size")
        ax.set_ylabel("target length")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette]
    fig.legend(handles, OUTCOMES, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def _short_kernel(kernel: str) -> str:
    return kernel.split(" (")[0]


@_styled(style="white")
def dispatch_switch_map(
    map_df: pd.DataFrame, title: str = "Batch sizes where a request's numerics change (by the rules)"
) -> Figure:
    """One row per (model, op, kernel), one column per (arch, TP): how many batch sizes in 1..max_batch
    change the request's numerics key (0: batch invariant by the rules; blank: not mapped there).

    Cells show the first such batch size. Args: `gdn_lab.experiments.dispatch_map.map_table(...)`.
    """
    if map_df.empty:
        return _empty(title, "nothing mapped")
    df = map_df.assign(
        row=map_df.model + " · " + map_df.op + ": " + map_df.kernel.map(_short_kernel),
        col=map_df.arch + " TP" + map_df.tp.astype(str),
    )
    switches = df.groupby(["row", "col"], sort=False).numerics_switch_batch_sizes.agg(
        lambda lists: sorted({int(b) for lst in lists for b in lst})
    )
    counts = switches.map(len).unstack("col")
    labels = switches.map(lambda s: str(s[0]) if s else "–").unstack("col")
    cols = [c for a in dict.fromkeys(df.arch) for c in dict.fromkeys(df.col) if c.startswith(a)]
    counts, labels = counts.reindex(columns=cols), labels.reindex(columns=cols)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.0 * len(cols) + 6), 1.0 + 0.32 * len(counts)))
    sns.heatmap(counts, annot=labels.fillna(""), fmt="", cmap="Reds", vmin=0, cbar_kws={"label": "switch batch sizes"},
                linewidths=0.5, ax=ax, annot_kws={"fontsize": 7})  # fmt: skip
    ax.set_xlabel("arch, tensor-parallel size (cell: first batch size whose numerics change)")
    ax.set_ylabel("")
    ax.set_title(title)
    plt.setp(ax.get_yticklabels(), fontsize=7)


@_styled(style="white")
def response_heatmap(df: pd.DataFrame, title: str = "Responses that changed bits (of those compared)") -> Figure:
    """Model invariance: per (mode, backend) row and (prompt length x batch size) column, the share
    of compared responses whose token ids or logprobs changed in the batch; controls marked.

    Args:
        df: a `gdn_lab.experiments.model_invariance` table.
    """
    done = df[df.status == "compared"].copy()
    if done.empty:
        return _empty(title, "nothing ran")
    done["differs"] = (~done.bitwise_equal.astype(bool)).astype(int)
    done["row"] = done["mode"] + " · " + done.backend + done.is_control.map({True: " (control)", False: ""})
    done["case"] = done.target_len.astype(int).astype(str) + "×" + done.batch_size.astype(int).astype(str)
    order = done.drop_duplicates("case").sort_values(["target_len", "batch_size"]).case.tolist()
    share = done.pivot_table(index="row", columns="case", values="differs", aggfunc="mean", sort=False)[order]
    counts = done.pivot_table(index="row", columns="case", values="differs", aggfunc=["sum", "size"], sort=False)
    labels = share.copy().astype(object)
    for r in share.index:
        for c in share.columns:
            n = counts[("size", c)].get(r)
            labels.loc[r, c] = "" if pd.isna(n) else f"{int(counts[('sum', c)][r])}/{int(n)}"
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(order) + 5), 1.2 + 0.4 * len(share)))
    sns.heatmap(share, annot=labels, fmt="", cmap="Reds", vmin=0, vmax=1, cbar=False, linewidths=0.5, ax=ax)
    ax.set_xlabel("prompt length × batch size")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    return fig


@_styled
def flydsl_wtk_steps(
    long_df: pd.DataFrame, title: str = "FlyDSL's WARP_THREADS_K by batch size (SGLang's GDN decode)"
) -> Figure:
    """WARP_THREADS_K against batch size, one panel per (model, arch), one line per TP.

    Batch sizes SGLang routes to HIP or Triton are gaps (no FlyDSL K split there).
    Args: `gdn_lab.experiments.dispatch_map.long_table(...)` (its gdn_decode rows are used).
    """
    dec = long_df[long_df.op == "gdn_decode"]
    if dec.empty:
        return _empty(title, "no GDN model mapped")
    dec = dec.assign(
        wtk=dec.key.map(lambda k: float(k.split("=")[1]) if k.startswith("flydsl:wtk=") else float("nan")),
        TP=dec.tp.astype(str),
    )
    g = sns.relplot(data=dec, x="batch_size", y="wtk", hue="TP", row="model", col="arch", kind="line",
                    drawstyle="steps-post", height=2.2, aspect=2.2, facet_kws={"sharey": True})  # fmt: skip
    for ax in g.axes.flat:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%d"))
        ax.set_yticks([4, 8, 16, 32])
    g.set_axis_labels("batch size", "WARP_THREADS_K")
    g.set_titles("{row_name} · {col_name}")
    g.figure.suptitle(title)
    g.figure.tight_layout()
    return g.figure


@_styled(style="white")
def ksplit_bits(
    runs: pd.DataFrame, title: str = "The target's bits under FlyDSL's K split (lab Triton decode)"
) -> Figure:
    """One row per (arch, mapped GDN shape), one column per batch size: how the target (its output
    row and state slot) met the prediction (colors of `aiter_dispatch.OUTCOMES`); cells show the
    k split, or the kernel SGLang takes there instead of FlyDSL.

    Args: `gdn_lab.experiments.dispatch_map.ksplit_runs(...)`.
    """
    from gdn_lab.experiments.aiter_dispatch import OUTCOMES
    from gdn_lab.experiments.dispatch_map import run_cases

    cases = run_cases(runs)
    if cases.empty:
        return _empty(title, "no run")
    if not (cases.status == "compared").any():
        return _empty(title, f"no run here: {cases.reason.iloc[0]}")
    cases["row"] = cases.arch + " · " + cases.mapped_shape.str.replace(" K=128 V=128", "", regex=False)
    # a batch size SGLang sends to another kernel gets its own color (seaborn leaves NaN cells unlabelled)
    cases["code"] = cases.prediction.map({o: i for i, o in enumerate(OUTCOMES)}).fillna(len(OUTCOMES))
    cases["label"] = [
        str(int(r.k_split)) if r.status == "compared" else (str(r.route).split(":")[0] if r.route else "")
        for r in cases.itertuples()
    ]
    codes = cases.pivot_table(index="row", columns="batch_size", values="code", aggfunc="max", sort=False, dropna=False)
    labels = cases.pivot_table(index="row", columns="batch_size", values="label", aggfunc="first", sort=False)
    labels = labels.reindex(index=codes.index, columns=codes.columns)
    palette = sns.color_palette(["#d8f3dc", "#52b788", "#cfe2ff", "#6ea8fe", "#f2cc60", "#e5534b", "#e6e6e6"])
    fig, ax = plt.subplots(figsize=(max(8.0, 0.7 * codes.shape[1] + 5), 2.0 + 0.3 * len(codes)))
    sns.heatmap(codes, annot=labels.fillna(""), fmt="", cmap=palette, vmin=-0.5, vmax=len(OUTCOMES) + 0.5,
                cbar=False, linewidths=0.5, ax=ax, annot_kws={"fontsize": 7})  # fmt: skip
    ax.set_xlabel("batch size (cell: the k split, or the kernel SGLang takes instead)")
    ax.set_ylabel("")
    ax.set_title(title)
    plt.setp(ax.get_yticklabels(), fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette]
    names = [*OUTCOMES, "SGLang takes another kernel"]
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08 + 1.0 / (2.0 + 0.3 * len(codes)), 1, 1))


@_styled(style="white")
def layer_divergence(
    layers: pd.DataFrame, title: str = "Where along the layers the request's hashes first diverge", max_rows: int = 12
) -> Figure:
    """One row per compared response whose hashes changed, at the first step where any did; one
    column per layer (embed: before the first layer, 0..L-1, head: after the last). A cell is the
    share of that layer's calls whose output changed for the request; * marks a culprit (a call
    whose inputs were equal): the change starts there and spreads to the layers after it.

    Args:
        layers: `Result.layers` of `gdn_lab.experiments.model_invariance`.
        max_rows: responses shown (the first per mode, backend and batch size, then the rest).
    """
    changed = layers[layers.outputs_changed > 0]
    if changed.empty:
        return _empty(title, "no layer changed the request's bits in any compared response")
    first_step = changed.groupby("comparison").step.min()
    at = layers[layers.step == layers.comparison.map(first_step)].copy()
    at = at[at.comparison.isin(first_step.index)]
    at["share"] = at.outputs_changed / at.calls.clip(lower=1)
    heads = at.drop_duplicates("comparison")
    lead = heads.drop_duplicates(["mode", "backend", "batch_size"]).comparison.tolist()
    chosen = (lead + [c for c in heads.comparison if c not in lead])[:max_rows]
    names = {
        r.comparison: f"{r.mode} · {r.backend}{' (control)' if r.is_control else ''} · {r.target_len} tok × {r.batch_size}"
        + (f" · row {r.position}" if r.mode == "single" else "")
        + f" · step {int(r.step)}"
        for r in heads.itertuples()
    }
    columns = layers.drop_duplicates("layer").sort_values("layer")[["layer", "layer_label"]]
    share = at.pivot_table(index="comparison", columns="layer", values="share", aggfunc="max")
    share = share.reindex(index=chosen, columns=columns.layer)
    culprits = at.pivot_table(index="comparison", columns="layer", values="culprits", aggfunc="sum")
    culprits = culprits.reindex(index=chosen, columns=columns.layer).fillna(0)
    annot = share.copy().astype(object)
    for comp in share.index:
        for lay in share.columns:
            v = share.loc[comp, lay]
            annot.loc[comp, lay] = "" if pd.isna(v) else f"{v:.0%}{'*' if culprits.loc[comp, lay] > 0 else ''}"
    share.index = [names[c] for c in share.index]
    share.columns = columns.layer_label.tolist()
    fig, ax = plt.subplots(figsize=(max(7.0, 0.7 * share.shape[1] + 6), 1.5 + 0.42 * len(share)))
    sns.heatmap(
        share.astype(float), annot=annot, fmt="", cmap="Reds", vmin=0, vmax=1, linewidths=0.5, ax=ax,
        cbar_kws={"label": "share of the layer's calls changed"}, annot_kws={"fontsize": 8},
    )  # fmt: skip
    ax.set_xlabel("layer (embed: before the first layer, head: after the last)")
    ax.set_ylabel("")
    ax.set_title(title)
    fig.tight_layout()
    return fig
