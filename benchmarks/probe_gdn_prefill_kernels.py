"""Where gdn_prefill's `triton` backend spends its time: each of its launches alone, and their options.

The backend (gdn_lab.ops.delta_rule_triton) is a chunk plan and a segment plan, the chunk-parallel
prepare, the state recurrence (segment-parallel for sequences past the shape's threshold,
`segment_from_of`: the maps of segments of SEGMENT_CHUNKS chunks, the segments' entering states,
then every segment; a sequence of one segment takes the last launch alone), and the
chunk-parallel output. This probe times each through the backend's own launch functions on the
bench's inputs (benchmarks/bench_gdn_prefill.py), the whole backend call beside them, the state
recurrence at other segment lengths (`serial`: one segment per sequence), V tiles, warp counts and
pipeline stages, and the chunk-parallel launches (prepare, output) at other warp counts and
stages, the output at other V tiles: the data for choosing each kernel's fixed configuration (it
must not follow the batch) and for seeing which launch to speed up next.

Usage:
    python3 benchmarks/probe_gdn_prefill_kernels.py --out OUT_DIR          # the H200 run (~1 minute)
    python3 benchmarks/probe_gdn_prefill_kernels.py --out OUT_DIR --heads 16/32 --tokens 16384,65536
    python3 benchmarks/probe_gdn_prefill_kernels.py --out OUT_DIR --smoke  # tiny shapes (CPU interpreter; see --device)

Writes OUT_DIR/probe_gdn_prefill_kernels.csv: one row per (HK/HV, tokens, sequences, launch) with `us`
(do_bench median on a GPU, one call on the CPU), and for variants block_v (state, output), num_warps,
num_stages, segment_chunks and segment_from (state) and the status (a variant the GPU cannot run says why); every row carries the environment
fingerprint (`env_*`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, bench_device, sync, write_csv  # noqa: E402
from bench_gdn_prefill import call_once, do_bench_us, fresh, parse_heads, prefill_inputs  # noqa: E402

CSV = "probe_gdn_prefill_kernels.csv"
COLUMNS = [
    "HK",
    "HV",
    "tokens",
    "batch",
    "launch",
    "segment_chunks",
    "segment_from",
    "block_v",
    "num_warps",
    "num_stages",
    "group_heads",
    "group_tiles",
    "inverse",
    "same_bits",
    "us",
    "status",
    "reason",
]
# (block_v, warps, stages); block_v 64 is left out: on the H200 (Triton 3.6) it faults with an illegal
# memory access, which poisons the CUDA context for every later launch
VARIANTS = [(8, 4, 3), (16, 4, 3), (32, 4, 3), (32, 8, 3), (32, 4, 2), (8, 8, 3)]
# the state recurrence's segments: (chunks per segment, cut sequences of more tokens than, warps);
# "serial": every sequence one segment
SEGMENT_VARIANTS = [
    (32, 0, 4),
    (64, 0, 4),
    (128, 0, 4),
    (64, 0, 8),
    (128, 0, 8),
    ("serial", None, 4),
    ("serial", None, 8),
]
# (warps, stages) of the chunk-parallel launches; their defaults are prepare's 4 warps (8 from tiles
# of 16384 fp32 elements), output's OUTPUT_WARPS, and Triton's stages
PARALLEL_VARIANTS = [(4, 1), (4, 2), (4, 3), (8, 1), (8, 2), (8, 3)]
# the prepare's inverse of I + A, other than the default (delta_rule_triton.INVERSES)
PREPARE_INVERSES = ["doubling"]
# (block_v, warps, group_heads, group_tiles) of the output kernel's V tiles and of its programs (the
# value heads of a key head and V tiles one program takes, sharing q k^T); its default is
# (OUTPUT_BLOCK_V, OUTPUT_WARPS) grouped as `_output_groups` says, (64, 4, 1, 1) one value head's tile a
# program (the kernel before 5e29fe9), (128, 8, 1, 1) the whole row of a head at 8 warps (before
# 68de164); the default tile at other warps and stages is PARALLEL_VARIANTS'. Not (32, 4): with bf16
# dot operands, Triton 3.6's kernel for it made an illegal memory access on an H100 at 16/32, 16384
# tokens in one sequence, which ends the process (data/bench/h100/diag_output_afb0139.log)
OUTPUT_TILES = [(128, 8, 1, 1), (64, 4, 2, 1), (64, 4, 1, 1), (128, 4, 1, 1), (64, 4, 1, 2), (64, 8, 2, 2)]


def launches(args: dict, device: torch.device) -> tuple[dict, dict]:
    """name -> make(**options): a call of that launch with those options, on fresh state (the plan
    and scratch built once for every launch; a state variant's own segment plan and maps at make),
    and name -> what that launch writes, for the launches whose variants must keep the default's bits."""
    from gdn_lab.ops import delta_rule_triton as D
    from gdn_lab.routing import get

    a = fresh(args)
    q, k, v, cu, slots = a["q"], a["k"], a["v"], a["cu_seqlens"], a["slots"]
    hk, kdim = q.shape[1], q.shape[2]
    out = torch.empty(v.shape, dtype=q.dtype, device=device)
    run = D.chunked_run(cu, out, hk, kdim, D.CHUNK_SIZE)
    gates = [a[x] for x in ("a", "b", "A_log", "dt_bias")]

    def state_launches(segment_chunks=D.SEGMENT_CHUNKS, segment_from=None, **tile):
        if segment_chunks == "serial":
            segment_chunks, segment_from = D.SEGMENT_CHUNKS, q.shape[0]  # every sequence one segment
        seg = D.chunked_run(cu, out, hk, kdim, D.CHUNK_SIZE, segment_chunks, segment_from)
        mine = dataclasses.replace(
            run, segments=seg.segments, segment_chunks=segment_chunks,
            scratch=dataclasses.replace(run.scratch, trans=seg.scratch.trans, starts=seg.scratch.starts),
        )  # fmt: skip
        return lambda: D.run_state_kernel(mine, k, v, a["state"], slots, cu, **tile)

    s = run.scratch
    written = {"prepare": [s.norms, s.ts, s.bs, s.gs], "output": [out]}
    return {
        "plan+scratch": lambda: lambda: D.chunked_run(cu, out, hk, kdim, D.CHUNK_SIZE),
        "prepare": lambda **opts: (
            lambda: D.run_prepare_kernel(run, q, k, *gates, cu, slots, a["use_qk_l2norm"], **opts)
        ),
        "state": state_launches,
        "output": lambda **opts: lambda: D.run_output_kernel(run, q, k, a["scale"], out, cu, slots, **opts),
        "backend": lambda: lambda: get("gdn_prefill", "triton").run(**a),
    }, written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--heads", default=None, help="HK/HV pairs, e.g. 4/8,16/32 (default 4/8; smoke 1/2)")
    p.add_argument("--tokens", default=None, help="total tokens, e.g. 16384,65536 (default 4096,16384,65536)")
    args = p.parse_args(argv)
    shapes = parse_heads(p, args.heads or ("1/2" if args.smoke else "4/8"), 64 if args.smoke else 128)
    device = bench_device(args)
    from gdn_lab.environment import fingerprint

    env = {f"env_{k}": v for k, v in fingerprint(device).items()}
    totals = [int(t) for t in args.tokens.split(",")] if args.tokens else (128,) if args.smoke else (4096, 16384, 65536)
    cases = [(s, t, n) for s in shapes for t in totals for n in ((1, 2) if args.smoke else (1, 4, 16))]
    variants = VARIANTS[2:3] if args.smoke else VARIANTS
    parallel = PARALLEL_VARIANTS[:1] if args.smoke else PARALLEL_VARIANTS
    output_tiles = OUTPUT_TILES[:2] if args.smoke else OUTPUT_TILES
    segments = [(1, 0, 4), ("serial", None, 4)] if args.smoke else SEGMENT_VARIANTS
    # do_bench's median on a GPU, one synchronised call on the CPU (the bench's own timers)
    time_us = do_bench_us if device.type == "cuda" else (lambda fn: call_once(fn, device)[0])
    rows = []
    for shape, tokens, batch in cases:
        case = {"HK": shape.hk, "HV": shape.hv, "tokens": tokens, "batch": batch}
        calls, written = launches(prefill_inputs([tokens // batch] * batch, shape, device, seed=0), device)
        for name, make in calls.items():
            fn = make()
            fn()  # compile
            rows.append({**case, "launch": name, "us": time_us(fn), "status": "ok", **env})
        first = len(rows)
        tried = [("state", {"block_v": bv, "num_warps": w, "num_stages": st}) for bv, w, st in variants]
        tried += [
            ("state", {"segment_chunks": seg, "num_warps": w, **({} if cut is None else {"segment_from": cut})})
            for seg, cut, w in segments
        ]
        tried += [(name, {"num_warps": w, "num_stages": st}) for name in ("prepare", "output") for w, st in parallel]
        tried += [("prepare", {"inverse": inverse}) for inverse in PREPARE_INVERSES]
        tried += [
            ("output", {"block_v": bv, "num_warps": w, "group_heads": gh, "group_tiles": gv})
            for bv, w, gh, gv in output_tiles
            if (shape.hv // shape.hk) % gh == 0 and (shape.d // min(shape.d, bv)) % gv == 0
        ]
        for name, opts in tried:
            row = {**case, "launch": name, **opts, **env}
            try:
                fn = calls[name](**opts)
                if name in written:  # the default's bits from the same inputs (the state variants rewrite them)
                    calls[name]()()
                    default = [t.clone() for t in written[name]]
                    for t in written[name]:
                        t.fill_(float("nan"))
                fn()
                if name in written:
                    row["same_bits"] = all(map(torch.equal, written[name], default))
                row.update(us=time_us(fn), status="ok")
            except Exception as exc:  # a variant this GPU cannot run (shared memory): recorded, the rest go on
                row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:160]}")
            rows.append(row)
        sync(device)
        print(
            f"{shape.hk}/{shape.hv} T={tokens:6d} N={batch:3d}  "
            + "  ".join(f"{r['launch']}={r['us']:.0f}us" for r in rows[first - len(calls) : first]),
            flush=True,
        )
    print(f"wrote {write_csv(rows, COLUMNS + sorted(env), args.out, CSV)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
