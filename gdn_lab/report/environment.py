"""Where am I, and which backends run here: the fingerprint and the routing of one small call per op."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from gdn_lab import routing
from gdn_lab.environment import fingerprint, notes
from gdn_lab.experiments.config import ExperimentConfig
from gdn_lab.ops import spec as op_spec


@dataclass(frozen=True, kw_only=True)
class EnvironmentConfig(ExperimentConfig):
    """Notebook 00: where am I, and how is a small call of each op routed here.

    Attributes:
        seed, device: as every experiment (seed is recorded; the example calls are fixed).
        dtype: the compute dtype of the example calls.
    """


def _note(amd_library: bool, platform: str) -> str:
    return routing.HARDWARE_NOTE if amd_library and platform != "rocm" else ""


def fingerprint_table(device: torch.device | str) -> pd.DataFrame:
    """The environment fingerprint as a table: key, value, and a note where a value needs one
    (`gdn_lab.environment.notes`: e.g. that aiter_arch is the default emulation off ROCm)."""
    fp = fingerprint(device)
    said = notes(fp)
    return pd.DataFrame([{"key": k, "value": str(v), "note": said.get(k, "")} for k, v in fp.items()])


def routing_table(device: torch.device | str, dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """`routing.explain` of every registered op on its small example call (`OpSpec.example`).

    Returns:
        One row per (op, backend): available, covered, auto, variant_control, chosen (what auto
        runs), reason, description, and `state`: "auto picks", "runs", "not covered", "unavailable".
    """
    rows = []
    for op in op_spec.names():
        rows.extend(routing.explain(op, op_spec.get(op).example(device=device, dtype=dtype)))
    df = pd.DataFrame(rows)
    df["state"] = [
        "auto picks" if r.chosen else ("runs" if r.covered else ("not covered" if r.available else "unavailable"))
        for r in df.itertuples()
    ]
    return df


def headline(table: pd.DataFrame, platform: str) -> str:
    """One line: how many backends run here, and what auto picks per op."""
    runs = table[table.state.isin(["auto picks", "runs"])]
    picks = ", ".join(f"{r.op}: {r.backend}{_note(r.amd_library, platform)}" for r in table[table.chosen].itertuples())
    return f"{len(runs)} of {len(table)} registered backends run here on a small call; auto picks {picks}"


def conclusion(table: pd.DataFrame, platform: str) -> str:
    """Markdown: per op, what auto picks and why each other backend does not run."""
    lines = ["## Conclusion", ""]
    for op, part in table.groupby("op", sort=False):
        chosen = part[part.chosen]
        pick = chosen.backend.iloc[0] if not chosen.empty else "nothing"
        lines.append(f"**{op}**: auto picks **{pick}**.")
        for r in part[~part.chosen].itertuples():
            kind = " (batch-variant control)" if r.variant_control else ""
            lines.append(f"- {r.backend}{kind}{_note(r.amd_library, platform)}: {r.state}: {r.reason}")
        lines.append("")
    return "\n".join(lines)
