"""Replay decode attention's plan rule over measured sweeps, on any machine: what would today's
`decode_plan` have cost in those runs?

Plans never change a bit, only the time, so a rule can be judged from a run that timed the
alternatives. The input is CSVs of `bench_decode_attention.py --sweep` on a GPU: per swept case
(shape, batch, context, cache dtype, page size), its "default config" row is the plan the run's
rule picked and its time, its "forced plan" rows the same call under other plans, and the timing
rows (when the sweep ran at the timing grid: --batches/--contexts) the control. For each case the
replay asks today's `decode_plan` (with today's config for the run's arch and SM count) for a plan:
where it is the run's, the time is the run's; where the run forced it, the forced time; else the
case is `not measured`. Cases whose config today differs from the run's are left out (`note`).
Only the config is compared: a run of older kernels under the same config replays their times, so
replay runs of the kernels you keep (the summary names each run's commit and device).

    python3 benchmarks/replay_decode_plans.py --out OUT_DIR data/bench/h100/bench_decode_attention_*_sweep.csv

writes OUT_DIR/replay_decode_plans.csv and prints, per shape and cache dtype, the time ratio where
the plan changes and the control target met before and after.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import write_csv  # noqa: E402  (the scripts' shared helpers)
from bench_decode_attention import CONTROL_TARGET, config_label, plan_label  # noqa: E402

from gdn_lab.ops.decode_attention import triton_kernels  # noqa: E402

CSV_NAME = "replay_decode_plans.csv"
CASE = ("Hq", "Hkv", "D", "B", "ctx", "kv_dtype", "page_size")
COLUMNS = [
    "source",
    *CASE,
    "config",
    "nodes_per_slot",
    "plan_run",
    "us_run",
    "plan_now",
    "us_now",
    "now_vs_run",
    "control_us",
    "run_vs_control",
    "now_vs_control",
    "note",
    "env_device",
    "env_gdn_lab_commit",
]

Rule = Callable[[int, int, int, int, triton_kernels.DecodeConfig], triton_kernels.DecodePlan]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help=f"directory for {CSV_NAME}")
    p.add_argument("csvs", nargs="+", type=Path, help="bench_decode_attention.csv files of --sweep runs on a GPU")
    a = p.parse_args(argv)
    for path in a.csvs:
        if not path.is_file():
            p.error(f"csvs: {path} is not a file; give bench_decode_attention.csv files of --sweep runs")
    return a


def read_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def replay(rows: Sequence[dict], source: str, rule: Rule = triton_kernels.decode_plan) -> list[dict]:
    """One row per swept case of a run's rows: the run's plan and time against `rule`'s (see the
    module docstring). Raises ValueError if the rows hold no swept case of a GPU run."""
    ok = [r for r in rows if r.get("status") == "ok"]
    swept = [r for r in ok if r["kind"] == "sweep" and r["note"] == "default config"]
    if not swept or any(r.get("env_triton_interpret") == "True" for r in swept):
        raise ValueError(
            f"{source}: no 'default config' sweep rows of a GPU run; replay needs "
            "bench_decode_attention.py --sweep run off Triton's interpreter"
        )
    forced = {(_case(r), r["plan"]): float(r["us"]) for r in ok if r["kind"] == "sweep" and r["note"] == "forced plan"}
    control = {_case(r): float(r["us"]) for r in ok if r["kind"] == "timing" and r["impl"] == "control"}
    return [_replay_case(r, source, rule, forced, control) for r in swept]


def _case(r: dict) -> tuple:
    return tuple(r[c] for c in CASE)


def _replay_case(r: dict, source: str, rule: Rule, forced: dict, control: dict) -> dict:
    hkv, d, batch, ctx = int(r["Hkv"]), int(r["D"]), int(r["B"]), int(float(r["ctx"]))
    sms, us_run = int(r["env_num_sms"]), float(r["us"])
    out = {c: r[c] for c in CASE} | {"source": source, "config": r["config"], "plan_run": r["plan"], "us_run": us_run}
    out |= {"env_device": r["env_device"], "env_gdn_lab_commit": r["env_gdn_lab_commit"]}
    control_us = control.get(_case(r))
    if control_us is not None:
        out |= {"control_us": control_us, "run_vs_control": round(control_us / us_run, 4)}
    cfg = triton_kernels.table_config(d, "fp8" if r["kv_dtype"] == "fp8" else "16bit", r["env_arch"])
    if config_label(cfg) != r["config"]:
        return out | {"note": f"config changed: today {config_label(cfg)}"}
    nodes = -(-ctx // cfg.node_tokens)
    out["nodes_per_slot"] = round(batch * hkv * nodes / (triton_kernels.PROGRAMS_PER_SM * sms), 3)
    plan = plan_label(rule(batch, hkv, ctx, sms, cfg))
    us_now = us_run if plan == r["plan"] else forced.get((_case(r), plan))
    out["plan_now"] = plan
    if us_now is None:
        return out | {"note": "not measured: the run did not force this plan"}
    out |= {"us_now": us_now, "now_vs_run": round(us_now / us_run, 4)}
    if control_us is not None:
        out["now_vs_control"] = round(control_us / us_now, 4)
    return out


def summary(rows: Sequence[dict]) -> str:
    """Per shape and cache dtype, the time ratio where the plan changed (min, geometric mean, max),
    then the control target met by the run's plans and by today's, over the cases both were timed."""
    changed = [r for r in rows if r.get("plan_now") and r["plan_now"] != r["plan_run"]]
    runs = Counter((r["source"], r["env_gdn_lab_commit"][:7], r["env_device"]) for r in rows)
    lines = [f"run {src}: {commit} on {device}, {n} cases" for (src, commit, device), n in runs.items()]
    lines.append(f"cases: {len(rows)}; today's rule picks another plan in {len(changed)}")
    groups: dict[str, list[float]] = {}
    for r in changed:
        if "now_vs_run" in r:
            groups.setdefault(f"{r['Hq']}/{r['Hkv']}/{r['D']} {r['kv_dtype']}", []).append(r["now_vs_run"])
    for name, ratios in sorted(groups.items()):
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"  {name}: time now / run {min(ratios):.3f} {geo:.3f} {max(ratios):.3f} over {len(ratios)}")
    both = [r for r in rows if "now_vs_control" in r]
    met = [sum(r[k] >= CONTROL_TARGET for r in both) for k in ("run_vs_control", "now_vs_control")]
    lines.append(
        f"control target (>= {CONTROL_TARGET:.3f}x): run's plans {met[0]}/{len(both)}, today's {met[1]}/{len(both)}"
    )
    lines += [f"  {r['source']} {'/'.join(str(r[c]) for c in CASE)}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for path in args.csvs:
        try:
            rows += replay(read_rows(path), path.name)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    path = write_csv(rows, COLUMNS, args.out, CSV_NAME)
    print(summary(rows))
    print(f"[replay] wrote {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
