"""One call of our kernels inside a CUDA profiler range, for Nsight Compute (`ncu --profile-from-start off`).

`decode`: `decode_attention_triton` (its partition and reduce launches) once per cache dtype, on
benchmarks/bench_decode_attention.py's inputs (random bf16 values, pages in order) and their fp8
copy with unit scales, as that bench times them.
`prefill`: `gdn_prefill`'s `triton` backend once, then fla's `chunk_gated_delta_rule` on the same
inputs when fla is installed (the bench's inputs: benchmarks/bench_gdn_prefill.py).
`layer`: `gdn_layer_prefill`'s `triton-fused` backend once, then the bench's fla chain (causal
conv1d, chunk_gated_delta_rule, rms_norm_gated) when fla is installed, on the bench's inputs.
Each is called twice before the range (compiles, autotuning), so the range holds exactly one call
of each.

On the H200 (the decode figures are in data/bench/h200/README.md, the prefill report of 2026-12-03
in data/bench/h200/ncu_gdn_prefill_ee19c6f.txt, the layer's in ncu_layer_cc729b2.txt):

    ncu --clock-control none --profile-from-start off -k regex:_decode_partition_kernel \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/probe_ncu.py decode
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python3 benchmarks/probe_ncu.py prefill
    ncu --clock-control none --profile-from-start off -k "regex:_conv_kernel|_layer_norm_kernel|_output_kernel" \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis python3 benchmarks/probe_ncu.py layer

`--smoke` runs tiny shapes (the CPU interpreter by default; see --device) and checks the outputs
are finite, without a profiler range.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, bench_device, sync  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("decode", "prefill", "layer"))
    p.add_argument(
        "--batch", type=int, default=None, help="decode: requests (default 64); prefill, layer: sequences (4)"
    )
    p.add_argument(
        "--tokens", type=int, default=None, help="decode: context per request (16384); prefill, layer: total (65536)"
    )
    p.add_argument("--page-size", type=int, default=16, help="decode: tokens per page")
    p.add_argument("--shape", default="16/2/256", help="decode: Hq/Hkv/D")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, no profiler range")
    add_device_option(p)
    a = p.parse_args(argv)
    big = {"decode": (64, 16384), "prefill": (4, 65536), "layer": (4, 65536)}[a.what]
    small = {"decode": (2, 80), "prefill": (2, 96), "layer": (2, 96)}[a.what]
    default = small if a.smoke else big
    a.batch = a.batch or default[0]
    a.tokens = a.tokens or default[1]
    if a.batch < 1 or a.tokens < 1 or a.page_size < 1:
        p.error(f"--batch, --tokens and --page-size must be >= 1, got {a.batch}, {a.tokens}, {a.page_size}")
    if a.what == "decode" and a.tokens % a.page_size:
        p.error(f"--tokens {a.tokens} must be a multiple of --page-size {a.page_size}")
    return a


def decode_calls(args: argparse.Namespace, device: torch.device) -> list:
    from bench_decode_attention import Case

    from gdn_lab.device import detect
    from gdn_lab.ops.decode_attention.triton_kernels import decode_attention_triton

    hq, hkv, d = (int(x) for x in args.shape.split("/"))
    case = Case(args.batch, args.tokens, hq, hkv, d, device, seed=0)
    fp8, one = detect(device).fp8_dtype, torch.ones(1, device=device)
    caches = [
        case.paged(args.page_size, case.k, case.v),
        case.paged(args.page_size, case.k.to(fp8), case.v.to(fp8), one, one),
    ]
    return [lambda kw=kw: decode_attention_triton(**kw, max_seq_len=args.tokens) for kw in caches]


def prefill_calls(args: argparse.Namespace, device: torch.device, layer: bool = False) -> list:
    """gdn_prefill's (or, with layer, gdn_layer_prefill's) calls: ours, then fla's where installed."""
    from bench_gdn_prefill import Shape, first_output, fla_layer, fla_prefill, fresh, layer_inputs, prefill_inputs

    from gdn_lab.routing import get

    make, op, backend = (
        (layer_inputs, "gdn_layer_prefill", "triton-fused") if layer else (prefill_inputs, "gdn_prefill", "triton")
    )
    inputs = make([args.tokens // args.batch] * args.batch, Shape(4, 8, 128), device, seed=0)
    ours = get(op, backend)
    calls = [lambda: first_output(ours.run(**fresh(inputs)))]
    if device.type == "cuda" and importlib.util.find_spec("fla") is not None:
        fla = fla_layer(fresh(inputs)) if layer else fla_prefill("chunk", fresh(inputs))
        calls.append(lambda: first_output(fla()))
    return calls


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = bench_device(args)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.what == "decode":
        calls = decode_calls(args, device)
    else:
        calls = prefill_calls(args, device, layer=args.what == "layer")
    for _ in range(2):
        for call in calls:
            call()
    sync(device)
    profiled = device.type == "cuda" and not args.smoke
    if profiled:
        torch.cuda.cudart().cudaProfilerStart()
    outs = [call() for call in calls]
    sync(device)
    if profiled:
        torch.cuda.cudart().cudaProfilerStop()
    bad = [i for i, o in enumerate(outs) if not torch.isfinite(o.float()).all()]
    print(f"[probe_ncu] {args.what}: {len(calls)} call(s) on {device}{' (profiled range)' if profiled else ''}")
    if bad:
        print(f"[probe_ncu] calls {bad} gave non-finite outputs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
