"""Benchmark the batch-invariant Triton matmul against torch.matmul (cuBLAS) at Qwen-like shapes.

x [M, K] @ w [K, N] in bf16 for the projections of a Qwen3-8B-sized layer (hidden 4096: fused QKV
4096 -> 6144, output 4096 -> 4096, fused gate/up 4096 -> 24576, down 12288 -> 4096) and M in 1, 8,
64, 256, 1024, 4096 tokens. Each call is captured in a CUDA graph and timed with CUDA events
(`time_graph` from bench_common.py). Columns: us, TFLOP/s (2 M N K / time), TB/s (bytes
of x, w and out / time), `ratio_vs_torch` = torch_us / us (> 1: ours is faster).

`invariance` rows compare row 0 of a 1-row call with row 0 of the 4096-row call (torch.equal) for
both, per shape: ours must be equal; cuBLAS is the shape's control. Which shapes cuBLAS changes
depends on the GPU (an H200 changed 4096 x 4096 and 12288 x 4096, an H100 4096 x 6144 and 12288 x
4096: data/bench/), so `verdict` (`mark_invariance`) calls our equality `insensitive` at a shape
where cuBLAS kept its bits.
Every row carries the environment fingerprint (`env_*`). Run from the repository root:

    python3 benchmarks/bench_matmul.py --out OUT_DIR            # the H200 run (well under a minute)
    python3 benchmarks/bench_matmul.py --out OUT_DIR --smoke    # tiny, CPU interpreter
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402  (the scripts' shared helpers)
    add_device_option,
    bench_device,
    fingerprinted,
    invariance_lines,
    mark_invariance,
    time_graph,
    write_csv,
)

CSV_NAME = "bench_matmul.csv"
COLUMNS = [
    "kind",
    "impl",
    "status",
    "M",
    "K",
    "N",
    "dtype",
    "us",
    "tflops",
    "tb_s",
    "ratio_vs_torch",
    "bitwise_equal",
    "n_diff",
    "max_abs",
    "max_ulp",
    "verdict",
    "note",
]
SHAPES = "4096x6144,4096x4096,4096x24576,12288x4096"  # K x N


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_matmul.csv")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--shapes", default=None, help="K x N list, e.g. 4096x6144,12288x4096")
    p.add_argument("--ms", default=None, help="row counts, e.g. 1,8,64,256,1024,4096")
    p.add_argument("--rep-ms", type=float, default=25.0, help="replay time budget per measurement (ms)")
    a = p.parse_args(argv)
    a.shapes = [tuple(int(x) for x in s.split("x")) for s in (a.shapes or ("64x48" if a.smoke else SHAPES)).split(",")]
    a.ms = [int(x) for x in (a.ms or ("1,33" if a.smoke else "1,8,64,256,1024,4096")).split(",")]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = bench_device(args)  # before any kernel module is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gdn_lab.environment import fingerprint
    from gdn_lab.experiments.compare import compare
    from gdn_lab.ops.matmul.triton_kernels import matmul_triton

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    fp = fingerprint(device)
    rows: list[dict] = []

    def row(**fields) -> None:
        rows.append(fingerprinted(COLUMNS, fp, {**fields, "dtype": str(dtype).removeprefix("torch.")}))

    impls = {"triton": matmul_triton, "torch": torch.matmul}
    t0 = time.perf_counter()
    for k, n in args.shapes:
        g = torch.Generator(device=device).manual_seed(0)
        w = torch.randn(k, n, device=device, generator=g, dtype=dtype) * k**-0.5
        x = torch.randn(max(args.ms), k, device=device, generator=g, dtype=dtype)
        for m in args.ms:
            xm = x[:m].clone()
            us = {}
            for name, fn in impls.items():
                try:
                    us[name], _ = time_graph(lambda fn=fn, xm=xm, w=w: fn(xm, w), device, args.rep_ms)
                except Exception as exc:  # a failing case is a row, the run goes on
                    row(kind="timing", impl=name, status="error", M=m, K=k, N=n, note=f"{type(exc).__name__}: {exc}")
                    continue
                row(
                    kind="timing", impl=name, status="ok", M=m, K=k, N=n, us=us[name],
                    tflops=2 * m * n * k / us[name] / 1e6, tb_s=(m * k + k * n + m * n) * 2 / us[name] / 1e6,
                )  # fmt: skip
            if len(us) == 2:
                rows[-2]["ratio_vs_torch"] = us["torch"] / us["triton"]
        for name, fn in impls.items():
            alone, full = fn(x[:1].clone(), w), fn(x, w)
            row(
                kind="invariance", impl=name, status="ok", M=x.shape[0], K=k, N=n,
                note="row 0 of a 1-row call vs row 0 of the full call", **compare(alone[0], full[0]),
            )  # fmt: skip
        print(f"[bench] {k}x{n}: {time.perf_counter() - t0:.1f}s", flush=True)
    mark_invariance(rows, ("K", "N"), lambda r: r["impl"] == "torch")
    path = write_csv(rows, COLUMNS + [f"env_{key}" for key in fp], Path(args.out), CSV_NAME)
    for r in rows:
        if r["kind"] == "invariance":
            print(f"invariance {r['impl']} K={r['K']} N={r['N']}: bitwise_equal={r['bitwise_equal']} {r['verdict']}")
    print("\n".join(invariance_lines(rows)))
    print(f"[bench] wrote {len(rows)} rows to {path} in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
