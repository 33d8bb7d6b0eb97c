"""How long the regression gate takes: a full fingerprint of SGLang's kernel-test cases, cold.

Issue 12's target: under 30 s on the H200, compile included (SGLang's own test takes about 35 s on
an MI350X). The script runs `gdn-lab fingerprint --preset h200` in a fresh process, so Triton's
in-memory caches are empty (its on-disk cache is pointed at an empty folder unless --warm), and
times the whole command, imports and all; then it runs `gdn-lab check` on the file.

Usage:
    python3 benchmarks/bench_gate.py --out OUT_DIR            # the H200 run
    python3 benchmarks/bench_gate.py --out OUT_DIR --smoke    # the CPU smoke preset's gate

Writes OUT_DIR/bench_gate.csv (one row per command: seconds, exit code, cases) with the fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import run_cli, write_csv  # noqa: E402

CSV = "bench_gate.csv"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="the cpu-smoke preset's gate (CPU interpreter)")
    p.add_argument("--warm", action="store_true", help="keep Triton's on-disk cache (default: an empty one)")
    args = p.parse_args(argv)
    preset = "cpu-smoke" if args.smoke else "h200"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    golden = out / f"golden-{preset}.json"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gdn-lab-triton-cache-") as cache:
        env = dict(os.environ)
        if not args.warm:
            env["TRITON_CACHE_DIR"] = cache
        for name, cmd in (
            ("fingerprint", ["fingerprint", "--preset", preset, "--out", str(golden), "--quiet"]),
            ("check", ["check", "--golden", str(golden), "--quiet"]),
        ):
            seconds, done = run_cli(*cmd, env=env)
            print(f"{name}: {seconds:.1f} s, exit {done.returncode}", file=sys.stderr)
            if done.returncode not in (0, 1):
                print(done.stderr[-3000:], file=sys.stderr)
            rows.append({"command": name, "preset": preset, "seconds": round(seconds, 2), "exit_code": done.returncode,
                         "cold": not args.warm, "stdout_tail": done.stdout[-400:].replace("\n", " | ")})  # fmt: skip
    doc = json.loads(golden.read_text()) if golden.exists() else {"cases": [], "environment": {}}
    fp = {f"env_{k}": v for k, v in doc["environment"].items()}
    for r in rows:
        r.update(cases=len(doc["cases"]), fingerprint_duration_s=doc.get("duration_s"), **fp)
    cols = ["command", "preset", "seconds", "exit_code", "cold", "cases", "fingerprint_duration_s", "stdout_tail", *fp]
    print(write_csv(rows, cols, out, CSV))
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
