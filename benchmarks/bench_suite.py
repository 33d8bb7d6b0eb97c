"""How long the notebook suite takes end to end: `gdn-lab run`, cold then warm, for each --jobs.

Issue 13.5's targets: the h200 preset in <= 150 s cold and <= 90 s warm on the H200, and the
cpu-smoke suite in <= 90 s on 2 cores, with the same tables. Each run is a fresh `gdn-lab run`
process, timed whole (imports and all). Cold: Triton's on-disk cache is an empty folder; warm: the
same folder again, which the cold run filled (the CPU interpreter compiles nothing: there the two
differ by noise). Every run's tables are compared with the first run's (`gdn-lab compare`).

Usage:
    python3 benchmarks/bench_suite.py --out OUT_DIR                           # h200, --jobs 2 and 3
    python3 benchmarks/bench_suite.py --out OUT_DIR --smoke                   # cpu-smoke, --jobs 2
    python3 benchmarks/bench_suite.py --out OUT_DIR --smoke --only 00 --jobs 1

Writes OUT_DIR/bench_suite.csv: a `suite` row per run (preset, jobs, cold, seconds, exit code,
notebooks ok, same_tables: `gdn-lab compare` against the first run found no difference) and a
`notebook` row per notebook of each run (its duration_s and status), each with the environment
fingerprint the run recorded (`env_*`). The runs stay in OUT_DIR/runs/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, run_cli, write_csv  # noqa: E402

CSV = "bench_suite.csv"
COLUMNS = [
    "kind",
    "preset",
    "jobs",
    "cold",
    "notebook",
    "seconds",
    "status",
    "exit_code",
    "notebooks_ok",
    "same_tables",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="the cpu-smoke preset (default preset: h200)")
    p.add_argument("--preset", default=None, help="a preset name or YAML file (overrides --smoke's choice)")
    p.add_argument("--jobs", default=None, help="comma-separated --jobs values (default 2,3; --smoke 2)")
    p.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOK", help="run only these notebooks")
    add_device_option(p)  # cpu or cuda: every notebook's `device` (auto: the preset's own)
    args = p.parse_args(argv)
    preset = args.preset or ("cpu-smoke" if args.smoke else "h200")
    try:
        jobs = [int(j) for j in (args.jobs or ("2" if args.smoke else "2,3")).split(",")]
    except ValueError:
        p.error(f"--jobs: expected comma-separated integers, got {args.jobs!r}")
    out = Path(args.out)
    extra = [
        *(["--only", *args.only] if args.only else []),
        *([] if args.device == "auto" else ["-p", f"device={args.device}"]),
    ]
    rows: list[dict] = []
    first: Path | None = None
    for n in jobs:
        with tempfile.TemporaryDirectory(prefix="gdn-lab-triton-cache-") as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            for cold in (True, False):
                run_dir = out / "runs" / f"{preset}-jobs{n}-{'cold' if cold else 'warm'}"
                cmd = ["run", "--preset", preset, "--jobs", str(n), "--out", str(run_dir), *extra]
                seconds, done = run_cli(*cmd, env=env)
                summary = (
                    json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
                )
                notebooks = [nb for nb in summary.get("notebooks", []) if nb.get("run_id") == summary["run"]["id"]]
                same = None
                if first is None:
                    first = run_dir
                elif done.returncode == 0:
                    same = run_cli("compare", str(first), str(run_dir))[1].returncode == 0
                fp = {f"env_{k}": v for k, v in summary.get("fingerprint", {}).items()}
                base = {"preset": preset, "jobs": n, "cold": cold, **fp}
                rows.append({
                    "kind": "suite", "seconds": round(seconds, 2), "exit_code": done.returncode, "same_tables": same,
                    "notebooks_ok": sum(nb["status"] == "ok" for nb in notebooks), **base,
                })  # fmt: skip
                rows += [
                    {
                        "kind": "notebook",
                        "notebook": nb["name"],
                        "seconds": nb["duration_s"],
                        "status": nb["status"],
                        **base,
                    }
                    for nb in notebooks
                ]
                print(f"{preset} --jobs {n} {'cold' if cold else 'warm'}: {seconds:.1f} s, exit {done.returncode}"
                      + ("" if same is None else f", same tables: {same}"), file=sys.stderr, flush=True)  # fmt: skip
                if done.returncode not in (0, 1):
                    print(done.stderr[-3000:], file=sys.stderr)
    envs = sorted({k for r in rows for k in r if k.startswith("env_")})
    print(write_csv(rows, COLUMNS + envs, out, CSV))
    suites = [r for r in rows if r["kind"] == "suite"]
    return 0 if all(r["exit_code"] == 0 and r["same_tables"] is not False for r in suites) else 1


if __name__ == "__main__":
    sys.exit(main())
