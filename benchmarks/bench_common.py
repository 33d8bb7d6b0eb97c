"""What the benchmark scripts share: the device option, CUDA-graph timing, synchronisation, and the CSV they write."""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

ROOFLINE_TBPS = 4.26  # H200 device-to-device copy, bytes read + written (shared/reference/measured_h200.md)
MATMUL_CSV = Path(__file__).resolve().parents[1] / "data" / "bench" / "h200" / "bench_matmul.csv"


def bf16_peak_tflops(path: Path = MATMUL_CSV) -> float | None:
    """The H200's measured bf16 peak: the fastest torch (cuBLAS) bf16 matmul of bench_matmul.csv,
    in TFLOP/s; None without that file."""
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rates = [
            float(r["tflops"]) for r in csv.DictReader(f)
            if r["impl"] == "torch" and r["dtype"] == "bfloat16" and r["tflops"]
        ]  # fmt: skip
    return max(rates) if rates else None


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """`--device auto|cpu|cuda` (see `bench_device`)."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where it runs (default auto: the GPU when torch sees one, but the CPU under Triton's "
        "interpreter with --smoke; --smoke --device cuda runs the tiny shapes on the GPU)",
    )


def bench_device(args: argparse.Namespace) -> torch.device:
    """The device `--device` and `--smoke` pick. On the CPU Triton's interpreter is switched on, so
    call this before any kernel module is imported (triton.jit reads TRITON_INTERPRET then)."""
    name = args.device
    if name == "auto":
        name = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here; use --device cpu (Triton's interpreter)")
    if name == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_graph(fn: Callable[[], object], device: torch.device, rep_ms: float = 30.0) -> tuple[float, object]:
    """(microseconds per call, an output of `fn`).

    On the GPU: `fn` captured once in a CUDA graph (after warm-up on a side stream), then replays
    timed with CUDA events, as many as fit in `rep_ms` (5..5000), so the figure is GPU time with no
    Python launch cost. On the CPU (the interpreter: a smoke check only): one call's wall time.
    """
    if device.type != "cuda":
        start = time.perf_counter()
        out = fn()
        return (time.perf_counter() - start) * 1e6, out
    out = fn()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    sync(device)
    start.record()
    graph.replay()
    end.record()
    sync(device)
    reps = int(max(5, min(5000, rep_ms * 1e3 / max(start.elapsed_time(end) * 1e3, 1.0))))
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    sync(device)
    us = start.elapsed_time(end) * 1e3 / reps
    del graph
    return us, out


def fingerprinted(
    columns: Sequence[str], fp: Mapping[str, object], fields: Mapping[str, object], empty: object = ""
) -> dict:
    """One CSV row: every column (`empty` where `fields` gives none), then the environment
    fingerprint `fp` as env_* columns."""
    return {**dict.fromkeys(columns, empty), **fields, **{f"env_{k}": v for k, v in fp.items()}}


def mark_invariance(rows: Sequence[dict], case: Sequence[str], is_control: Callable[[dict], bool]) -> None:
    """Give each `invariance` row a `verdict`, judged within its case (the rows equal in the `case`
    columns): a control 'caught' (it differed) or 'NOT caught'; any other implementation 'variant'
    (it differed), 'invariant' (bitwise equal, and a control of its case was caught) or
    'insensitive' (equal, but no control of its case differed: the case could not show a
    difference, so its equality proves nothing); a row that compared nothing 'error'."""
    inv = [r for r in rows if r["kind"] == "invariance"]
    caught: dict[tuple, bool] = {}
    for r in inv:
        if is_control(r) and r.get("bitwise_equal") not in (None, ""):
            key = tuple(r[c] for c in case)
            caught[key] = caught.get(key, False) or not r["bitwise_equal"]
    for r in inv:
        equal = r.get("bitwise_equal")
        if equal in (None, ""):
            r["verdict"] = "error"
        elif is_control(r):
            r["verdict"] = "NOT caught" if equal else "caught"
        elif not equal:
            r["verdict"] = "variant"
        else:
            r["verdict"] = "invariant" if caught.get(tuple(r[c] for c in case)) else "insensitive"


def invariance_lines(rows: Sequence[dict], by: Sequence[str] = ("impl",)) -> list[str]:
    """Per implementation (the `by` columns), how its `invariance` rows' verdicts (`mark_invariance`)
    fall: "invariance triton: invariant 3, insensitive 1 (of 4 cases)"."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["kind"] == "invariance":
            groups.setdefault(" ".join(str(r[c]) for c in by), []).append(r["verdict"])
    return [
        f"invariance {name}: "
        + ", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts))
        + f" (of {len(verdicts)} case{'s' if len(verdicts) != 1 else ''})"
        for name, verdicts in groups.items()
    ]


def write_csv(rows: Sequence[dict], columns: Sequence[str], out: str | Path, name: str) -> Path:
    """Write rows to out/name atomically (a temporary file, then os.replace); missing keys are empty."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    path = out / name
    os.replace(tmp, path)
    return path


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, the finished process, output captured as text) of one `gdn-lab` command in a
    fresh interpreter: imports and all, nothing cached in memory from this process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gdn_lab.cli", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done


def time_once(run: Callable[[object], object], device: torch.device, state: object = None) -> float:
    """Milliseconds of one eager `run(state)` (no CUDA graph): CUDA events on the GPU, wall time on the CPU.

    For work with host code in the loop (hooks, modes, Python dispatch), which a CUDA graph would
    capture away; the event pair includes the device idling while the host catches up.
    """
    sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        run(state)
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run(state)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_eager_interleaved(
    runs: Mapping[str, Callable[[object], object]],
    device: torch.device,
    *,
    warmup: int = 3,
    reps: int = 10,
    setup: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Milliseconds per repetition of each `runs[name](setup())`, the names taking turns.

    Every run is warmed up first; then repetition i times each name once, in turn, so a change in
    machine load (a shared host, clocks) reaches all of them alike and their ratios stay honest.
    `setup` (untimed) builds each repetition's fresh input, e.g. an empty cache.
    """
    for run in runs.values():
        for _ in range(warmup):
            run(setup() if setup else None)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            times[name].append(time_once(run, device, setup() if setup else None))
    return times
