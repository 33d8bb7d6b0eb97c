"""What changes a request's bits in AITER's Triton pa_decode V2: the width of its reduce.

Issue 11 item 3: on the H200 a 4,000-token target changed one element in a batch although, by the
V1/V2 rule, it ran V2 both alone and batched. The V2 reduce loads a request's partitions as one tile
of next_pow2(max_num_partitions) rows, the batch's padded partition count, and `tl.sum`s over it.
This probe holds the inputs fixed (the target plus one one-token batchmate, the same cache, the same
pages) and changes only the `max_seq_len` argument AITER is given, so the only thing that moves is
that width: a difference then has no other cause. Widths equal to the target's own are the control
(they must never differ). Seeds vary the data, since only some roundings show.

Usage:
    python3 benchmarks/probe_aiter_pa_decode_reduce.py --out OUT_DIR           # the H200 run (~1 minute)
    python3 benchmarks/probe_aiter_pa_decode_reduce.py --out OUT_DIR --smoke   # CPU interpreter, tiny

Writes OUT_DIR/probe_aiter_pa_decode_reduce.csv: one row per (target, seed, max_seq_len) with the
target's own and the launch's reduce width, n_diff and max_ulp against the launch at the target's
own max_seq_len, and the environment fingerprint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, bench_device, write_csv  # noqa: E402

CSV = "probe_aiter_pa_decode_reduce.csv"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--seeds", type=int, default=8)
    args = p.parse_args(argv)

    device = bench_device(args)  # before any kernel module is imported
    from gdn_lab import aiter
    from gdn_lab.environment import fingerprint
    from gdn_lab.experiments.compare import compare
    from gdn_lab.ops.aiter_paged import block_table, compute_type, to_head_major
    from gdn_lab.ops.batch import AttentionShape, BuildOptions
    from gdn_lab.workloads import build, make_batch, target_request

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    shape = AttentionShape(32, 8, 128, 16) if device.type == "cuda" else AttentionShape(4, 2, 16, 16)
    targets = [1025, 2000, 4000, 7000] if device.type == "cuda" else [1100]
    widths = [2048, 4096, 8192, 16383, 32768] if device.type == "cuda" else [2048, 4096]
    fp = {f"env_{k}": v for k, v in fingerprint(device).items()}
    rows = []
    with aiter.emulate("gfx950"):
        module = aiter.load("pa_decode")
        arch, cus = aiter.effective_arch(device), aiter.effective_num_cus(device)
        for length in targets:
            for seed in range(args.seeds if device.type == "cuda" else 1):
                target = target_request(length, seed)
                batch = make_batch(target, 2, seed=seed, position=0, max_len=1)  # a one-token batchmate
                a = build("decode_attention", batch, shape, BuildOptions(dtype=dtype, device=device))
                one = torch.ones(1, dtype=torch.float32, device=device)
                fixed = (
                    a["q"], to_head_major(a["k_cache"]), to_head_major(a["v_cache"]), a["seq_lens"],
                    block_table(a["kv_indptr"], a["kv_indices"], 2), a["scale"],
                )  # fmt: skip

                def launch(max_seq_len: int, fixed=fixed, one=one) -> torch.Tensor:
                    out = torch.empty_like(fixed[0])
                    with aiter.shims(arch, cus):
                        module.paged_attention_decode(out, *fixed, max_seq_len, compute_type(dtype), one, one)
                    return out[0]

                own = launch(length)
                own_width = 1 << (-(-length // 1024) - 1).bit_length()
                for m in sorted({length + 1, *widths}):
                    if m < length:
                        continue
                    width = 1 << (-(-m // 1024) - 1).bit_length()
                    cmp = compare(own, launch(m))
                    rows.append(
                        {"target_len": length, "seed": seed, "max_seq_len": m, "own_width": own_width,
                         "reduce_width": width, "same_width": width == own_width, **cmp, **fp}
                    )  # fmt: skip
    cols = ["target_len", "seed", "max_seq_len", "own_width", "reduce_width", "same_width", "bitwise_equal"]
    cols += ["n_diff", "max_abs", "max_ulp", *fp]
    path = write_csv(rows, cols, args.out, CSV)
    import pandas as pd

    df = pd.DataFrame(rows)
    summary = df.groupby(["target_len", "reduce_width"]).agg(
        launches=("bitwise_equal", "size"), differ=("bitwise_equal", lambda s: int((~s.astype(bool)).sum()))
    )
    print(summary.to_string())
    print(
        f"same width as the target's own: {int((~df[df.same_width].bitwise_equal.astype(bool)).sum())} of {int(df.same_width.sum())} differ"
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
