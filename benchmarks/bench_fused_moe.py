"""Benchmark fused_moe's batch-invariant Triton backend against AITER's Triton MoE at Qwen MoE shapes.

The routed experts of one MoE layer per rank, bf16: Qwen3-Next-80B-A3B at TP4 (hidden 2048, 512
experts, top 10, expert width 512 / 4 = 128) and Qwen3-30B-A3B at TP1 (2048, 128 experts, top 8,
width 768), M tokens in 1, 8, 64, 255, 256, 1023, 1024, 4096 (both sides of AITER's config switches
at 256 and 1024). Routing as the model routes (softmax of random logits, top-k, renormalised).

Implementations, each through the public `fused_moe(..., backend=NAME, check_indices=False)`:
`triton` (ours: fixed tiles, batch-invariant) and `aiter-triton-moe` (AITER's `moe_op.fused_moe`
with the config its `get_optimal_moe_config` picks by M; off ROCm it runs emulated, with the
gfx950 (MI350X) table, so its figures are AITER's kernel with MI350X tiles on this GPU, not AITER's
speed on AMD hardware). Each call is captured in a CUDA graph and timed with CUDA events
(`time_graph`). Columns: us, TFLOP/s (6 M top_k I H / time), TB/s (x, the weights of the experts
the batch routes to, the output and the routing / time), `ratio_vs_aiter` = aiter_us / us (> 1:
ours is faster), `config` (ours: the fixed tile; AITER's: the rule's table entry and numerics key).

`invariance` rows: a target token's output alone (M = 1) against the same token at a random
position in a batch of M (torch.equal), for every M above and each implementation, plus the
batch-variant control `triton-atomic-by-batch` (it must be caught once M exceeds the experts);
`verdict` per M (`mark_invariance`: an equality at an M where the control was not caught is
`insensitive`).
Every row carries the environment fingerprint (`env_*`). Run from the repository root:

    python3 benchmarks/bench_fused_moe.py --out OUT_DIR            # the GPU run
    python3 benchmarks/bench_fused_moe.py --out OUT_DIR --smoke    # tiny, CPU interpreter (fp32)
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

CSV_NAME = "bench_fused_moe.csv"
COLUMNS = [
    "kind", "impl", "status", "shape", "M", "H", "E", "top_k", "I", "dtype", "position", "us", "tflops", "tb_s",
    "ratio_vs_aiter", "config", "expected", "bitwise_equal", "n_diff", "max_abs", "max_ulp", "verdict",
    "note",
]  # fmt: skip
SHAPES = "qwen3-next-tp4=2048x512x10x128,qwen3-30b-a3b=2048x128x8x768"  # name=H x E x top_k x I
TIMED = ("triton", "aiter-triton-moe")
CONTROL = "triton-atomic-by-batch"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_fused_moe.csv")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--shapes", default=None, help="name=HxExTOPKxI list (default: " + SHAPES + ")")
    p.add_argument("--ms", default=None, help="token counts, e.g. 1,8,64,255,256,1023,1024,4096")
    p.add_argument("--rep-ms", type=float, default=25.0, help="replay time budget per measurement (ms)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    shapes = a.shapes or ("tiny=32x8x3x16" if a.smoke else SHAPES)
    try:
        a.shapes = [
            (n, tuple(int(x) for x in s.split("x"))) for n, s in (item.split("=") for item in shapes.split(","))
        ]
        a.ms = [int(x) for x in (a.ms or ("1,9" if a.smoke else "1,8,64,255,256,1023,1024,4096")).split(",")]
    except ValueError:
        p.error(f"--shapes {shapes!r} / --ms {a.ms!r}: expected name=HxExTOPKxI,... and integers,...")
    if any(len(s) != 4 for _, s in a.shapes) or min(a.ms) < 1:
        p.error(f"--shapes: four sizes per shape (H x E x top_k x I); --ms: positive counts; got {shapes!r}, {a.ms}")
    return a


def make_inputs(h: int, e: int, top_k: int, inter: int, m: int, dtype: torch.dtype, device: torch.device, seed: int):
    """x, w1, w2, topk_weights, topk_ids for m tokens, routed as Qwen3-Next routes."""
    g = torch.Generator(device=device).manual_seed(seed)
    w1 = (torch.randn(e, 2 * inter, h, device=device, generator=g) * h**-0.5).to(dtype)
    w2 = (torch.randn(e, h, inter, device=device, generator=g) * inter**-0.5).to(dtype)
    x = torch.randn(m, h, device=device, generator=g).to(dtype)
    probs = torch.softmax(torch.randn(m, e, device=device, generator=g), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return x, w1, w2, (w / w.sum(-1, keepdim=True)).contiguous(), ids.to(torch.int32).contiguous()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = bench_device(args)  # before any kernel module is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gdn_lab.environment import fingerprint
    from gdn_lab.experiments.compare import compare
    from gdn_lab.ops.fused_moe import fused_moe, validate
    from gdn_lab.ops.fused_moe.triton_kernels import atomic_sum_for_batch, moe_config
    from gdn_lab.routing import route
    from gdn_lab.rules import aiter_triton_moe

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    fp = fingerprint(device)
    rows: list[dict] = []
    rng = torch.Generator().manual_seed(args.seed)

    def row(**fields) -> None:
        rows.append(fingerprinted(COLUMNS, fp, {**fields, "dtype": str(dtype).removeprefix("torch.")}))

    def expected(impl: str, m: int, e: int) -> str:
        """What the implementation's own rule says of a token alone vs in a batch of m."""
        if impl == "aiter-triton-moe":
            alone, batched = (aiter_triton_moe.get_config(n, "gfx950", dtype).key for n in (1, m))
            return "equal" if alone == batched else "differs"
        if impl == CONTROL:
            return "differs" if atomic_sum_for_batch(m, e) else "equal"
        return "equal"

    def config_of(impl: str, m: int) -> str:
        if impl == "aiter-triton-moe":
            c = aiter_triton_moe.get_config(m, "gfx950", dtype)
            return f"{c.entry} ({c.key})"
        c = moe_config(dtype)
        return f"BM{c.block_m} BN{c.block_n} BK{c.block_k}"

    t0 = time.perf_counter()
    for name, (h, e, top_k, inter) in args.shapes:
        base = {"shape": name, "H": h, "E": e, "top_k": top_k, "I": inter}
        x, w1, w2, tw, ids = make_inputs(h, e, top_k, inter, max(args.ms), dtype, device, args.seed)
        for m in args.ms:
            call = (x[:m], w1, w2, tw[:m], ids[:m])
            used = int(torch.unique(ids[:m]).numel())
            moved = (2 * m * h + used * 3 * inter * h) * x.element_size() + m * top_k * 8
            us: dict[str, float] = {}
            for impl in TIMED:
                try:
                    route("fused_moe", validate(*call, check_indices=False), impl)
                    us[impl], _ = time_graph(
                        lambda impl=impl, call=call: fused_moe(*call, backend=impl, check_indices=False),
                        device, args.rep_ms,
                    )  # fmt: skip
                except Exception as exc:  # a failing or uncovered case is a row, the run goes on
                    row(
                        kind="timing", impl=impl, status="error", M=m, note=f"{type(exc).__name__}: {exc}"[:300], **base
                    )
                    continue
                row(
                    kind="timing", impl=impl, status="ok", M=m, us=us[impl], tflops=6 * m * top_k * inter * h / us[impl] / 1e6,
                    tb_s=moved / us[impl] / 1e6, config=config_of(impl, m), note=f"{used} experts routed to", **base,
                )  # fmt: skip
            if len(us) == 2:
                next(r for r in reversed(rows) if r["impl"] == "triton")["ratio_vs_aiter"] = (
                    us["aiter-triton-moe"] / us["triton"]
                )
        target = int(torch.randint(max(args.ms), (1,), generator=rng))
        for impl in (*TIMED, CONTROL):
            try:
                one = slice(target, target + 1)
                alone = fused_moe(x[one], w1, w2, tw[one], ids[one], backend=impl)
            except Exception as exc:
                row(
                    kind="invariance", impl=impl, status="error", M=1, note=f"{type(exc).__name__}: {exc}"[:300], **base
                )
                continue
            for m in args.ms[1:] if args.ms[0] == 1 else args.ms:
                # the target at a random position among m - 1 other tokens
                pos = int(torch.randint(m, (1,), generator=rng))
                others = torch.cat([torch.arange(target), torch.arange(target + 1, max(args.ms))])[: m - 1]
                order = torch.cat([others[:pos], torch.tensor([target]), others[pos:]]).to(device)
                out = fused_moe(x[order], w1, w2, tw[order], ids[order], backend=impl)
                row(
                    kind="invariance", impl=impl, status="ok", M=m, position=pos, config=config_of(impl, m), expected=expected(impl, m, e),
                    note=f"token {target} alone vs at position {pos} of {m}" + (" (control)" if impl == CONTROL else ""),
                    **compare(alone[0], out[pos]), **base,
                )  # fmt: skip
        print(f"[bench] {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    mark_invariance(rows, ("shape", "M"), lambda r: r["impl"] == CONTROL)
    path = write_csv(rows, COLUMNS + [f"env_{key}" for key in fp], Path(args.out), CSV_NAME)
    for r in rows:
        if r["kind"] == "timing" and r["status"] == "ok":
            print(f"{r['shape']:15s} {r['impl']:17s} M={r['M']:5d} {r['us']:9.1f} us  {r['config']}")
    for (shape, impl), group in _groups(rows, "invariance"):
        equal = [r["M"] for r in group if r["bitwise_equal"] is True]
        differ = [r["M"] for r in group if r["bitwise_equal"] is False]
        wrong = [r["M"] for r in group if (r["expected"] == "equal") != r["bitwise_equal"]]
        print(f"invariance {shape} {impl}: equal at M={equal}, differs at M={differ}, against the rule at M={wrong}")
    print("\n".join(invariance_lines(rows, ("shape", "impl"))))
    print(f"[bench] wrote {len(rows)} rows to {path} in {time.perf_counter() - t0:.0f}s")
    return 0


def _groups(rows: list[dict], kind: str) -> list[tuple[tuple[str, str], list[dict]]]:
    keys = dict.fromkeys((r["shape"], r["impl"]) for r in rows if r["kind"] == kind and r["status"] == "ok")
    return [(k, [r for r in rows if r["kind"] == kind and (r["shape"], r["impl"]) == k]) for k in keys]


if __name__ == "__main__":
    sys.exit(main())
