"""Where a notebook's time goes: its code cells as one script under cProfile, and every Triton compile.

Issue 13.5 asks where the suite's time goes (Triton compiles, references, host loops). This runs
one notebook in this process with a preset's values: the parameters cell's `preset`, `out_dir`
and (with --device) `device` are replaced, and the plot and display lines are skipped (what the
tables cost, not the figures). cProfile inflates Python-heavy code, so read its times as shares,
and time the suite itself with bench_suite.py. Triton's compile hooks (`triton.knobs.runtime`, in
Triton 3.6 and 3.9) time each compile; Triton's interpreter compiles nothing. Run it twice with
the same TRITON_CACHE_DIR for a cold and a warm profile.

Usage:
    python3 benchmarks/profile_notebook.py 05_layer_hash_bisect --out OUT_DIR       # preset h200
    python3 benchmarks/profile_notebook.py 00_environment_and_routing --preset cpu-smoke --out OUT_DIR

Writes OUT_DIR/<notebook>.prof (pstats), OUT_DIR/profile_<notebook>.csv (the --top functions by
cumulative time, and the whole run as `kind=run`) and OUT_DIR/compiles_<notebook>.csv (one row per
Triton compile: kernel, seconds), every row with the environment fingerprint (`env_*`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, write_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE_COLUMNS = ["kind", "notebook", "preset", "function", "ncalls", "tottime_s", "cumtime_s", "seconds"]
COMPILE_COLUMNS = ["notebook", "preset", "kernel", "seconds"]
_SKIPPED = ("plots.", "display(")


def script(notebook: Path, values: dict[str, str]) -> str:
    """The notebook's code cells as one script, `values` (name -> Python literal) written into its
    parameters cell, plot and display lines left out."""
    cells = json.loads(notebook.read_text())["cells"]
    parts = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            for name, literal in values.items():
                src, n = re.subn(rf"^{name} = .*$", f"{name} = {literal}", src, flags=re.M)
                if n != 1:
                    raise SystemExit(f"{notebook.name}: its parameters cell has no single `{name} = ...` line")
        parts.append("\n".join(line for line in src.splitlines() if not line.startswith(_SKIPPED)))
    return "\n".join(parts)


class _Compiles:
    """Triton's pre- and post-compile hooks, timing each compile (none without those knobs)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._start: dict[str, float] = {}
        try:
            from triton import knobs
        except ImportError:
            return
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._before, self._after

    def _before(self, **kw) -> bool:
        self._start[kw["repr"]] = time.perf_counter()
        return False  # compile as usual

    def _after(self, **kw) -> bool:
        seconds = time.perf_counter() - self._start.pop(kw["repr"], time.perf_counter())
        fn = kw["fn"]
        self.rows.append({"kernel": getattr(getattr(fn, "fn", fn), "__qualname__", str(fn)), "seconds": seconds})
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebook", help="a notebook's stem, e.g. 05_layer_hash_bisect")
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="h200", help="a preset name or YAML file (default h200)")
    p.add_argument("--top", type=int, default=60, help="functions kept in the profile CSV (by cumulative time)")
    add_device_option(p)  # auto: the preset's own device
    args = p.parse_args(argv)
    path = ROOT / "notebooks" / f"{args.notebook}.ipynb"
    if not path.is_file():
        p.error(f"notebook: {args.notebook!r} is not in {ROOT / 'notebooks'}; accepted: a notebook's stem")
    if args.top < 1:
        p.error(f"--top: expected a positive int, got {args.top}")
    out = Path(args.out)
    values = {"preset": repr(args.preset), "out_dir": repr(str(out / "results" / args.notebook))}
    if args.device != "auto":
        values["device"] = repr(args.device)
    src = script(path, values)

    import matplotlib

    matplotlib.use("Agg")
    compiles = _Compiles()
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    namespace = {"__name__": "__main__"}
    exec(compile(src, str(path), "exec"), namespace)
    prof.disable()
    seconds = time.perf_counter() - start

    from gdn_lab.environment import fingerprint

    fp = {f"env_{k}": v for k, v in fingerprint(namespace["p"].device).items()}  # the device setup() resolved
    out.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(out / f"{args.notebook}.prof")
    ids = {"notebook": args.notebook, "preset": args.preset, **fp}
    rows = [{"kind": "run", "seconds": seconds, **ids}]
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, tottime, cumtime, callers)
    for (file, line, name), (_, calls, tot, cum, _) in sorted(stats.items(), key=lambda kv: -kv[1][3])[: args.top]:
        rows.append({"kind": "function", "function": f"{file}:{line}({name})", "ncalls": calls, "tottime_s": tot,
                     "cumtime_s": cum, **ids})  # fmt: skip
    write_csv(rows, PROFILE_COLUMNS + list(fp), out, f"profile_{args.notebook}.csv")
    write_csv([{**r, **ids} for r in compiles.rows], COMPILE_COLUMNS + list(fp), out, f"compiles_{args.notebook}.csv")
    print(f"{args.notebook} ({args.preset}): {seconds:.1f} s under cProfile, {len(compiles.rows)} Triton compiles "
          f"({sum(r['seconds'] for r in compiles.rows):.1f} s); {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
