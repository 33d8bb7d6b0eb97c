"""Did a change to decode_attention's Triton kernels keep their bits? Save the outputs, change, compare.

`gdn-lab check` compares golden hashes only on the device, arch and library versions that wrote
them (elsewhere it compares verdicts), and its cases are the gate's. A kernel change that must not
move a bit (a smaller tile, another plan, a loop restructured) is checked here instead, on one
machine: `save` before the change, `compare` after it. Both run `decode_attention_triton` on the
same requests: lengths at the edges (n - 1, n, n + 1) of every node, of the first two blocks and of
every power-of-two block count up to 16385 tokens, and 12 random ones up to 20000 (the smoke
shapes: up to 300 tokens), in shuffled pages, for the Qwen attention shapes 32/8/128 and 16/2/256,
a bf16 and an fp8 cache, page sizes 1 and 16, and every kind of plan (the auto plan, fine plans of
one block and of a node per program, coarse plans of one and of four nodes per program).
`compare` writes one row per (shape, KV dtype, page size, plan): the requests compared, how many
kept every bit, and the lengths of those that did not.

    python3 benchmarks/probe_decode_bits.py save FILE.pt                  # before the change
    python3 benchmarks/probe_decode_bits.py compare FILE.pt --out DIR     # after: DIR/probe_decode_bits.csv
    python3 benchmarks/probe_decode_bits.py save FILE.pt --smoke          # tiny, CPU interpreter

Exit codes: 0 saved, or every request kept its bits; 1 some request's output changed; 2 bad input
(a FILE of another probe configuration or device, an unknown argument).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import add_device_option, bench_device, fingerprinted, write_csv  # noqa: E402  (the scripts' shared helpers)

CSV_NAME = "probe_decode_bits.csv"
COLUMNS = [
    "Hq", "Hkv", "D", "kv_dtype", "page_size", "plan", "requests", "equal_requests", "changed_lengths",
    "saved_commit", "saved_device",
]  # fmt: skip
EDGE_MAX = 16385
RANDOM_LENGTHS = 12


def lengths(smoke: bool, block_n: int, node_tokens: int, seed: int) -> list[int]:
    """The edges n - 1, n, n + 1 of every node, of the first two blocks and of every power-of-two
    block count (where the kernel's structure changes, from the request alone) up to the cap,
    then random lengths."""
    cap = 300 if smoke else EDGE_MAX
    edges = {1}
    for n in range(block_n, cap + 1, block_n):
        if n % node_tokens == 0 or n <= 2 * block_n or (n & (n - 1)) == 0:
            edges.update(x for x in (n - 1, n, n + 1) if 1 <= x <= cap)
    rng = random.Random(seed)
    return sorted(edges) + [rng.randint(1, 300 if smoke else 20000) for _ in range(RANDOM_LENGTHS)]


def outputs(device: torch.device, smoke: bool) -> dict[tuple, tuple[torch.Tensor, list[int]]]:
    """Every case's output [B, Hq, D] (on the CPU) and its request lengths."""
    from gdn_lab.device import detect
    from gdn_lab.ops.batch import AttentionShape, Batch, BuildOptions, Request, derive_seed
    from gdn_lab.ops.decode_attention.triton_kernels import DecodePlan, decode_attention_triton, decode_config
    from gdn_lab.workloads import build, resolve_kv_dtype

    shapes = [(4, 2, 16)] if smoke else [(32, 8, 128), (16, 2, 256)]
    kv_names = ["bf16"] if smoke else ["bf16", "fp8"]
    arch = detect(device).arch
    found = {}
    for hq, hkv, d in shapes:
        for kv_name in kv_names:
            kv_dtype = resolve_kv_dtype(None if kv_name == "bf16" else "fp8", torch.bfloat16, arch)
            cfg = decode_config(d, torch.bfloat16, kv_dtype)
            lens = lengths(smoke, cfg.block_n, cfg.node_tokens, seed=d)
            requests = tuple(Request(n, derive_seed(0, "probe_decode_bits", i, n)) for i, n in enumerate(lens))
            opts = BuildOptions(dtype=torch.bfloat16, kv_dtype=kv_dtype, k_scale=0.7, v_scale=1.3, device=device)
            plans = {
                "auto": None,
                "fine 1 block": DecodePlan(1, 1),
                "fine 1 node": DecodePlan(1, cfg.node_blocks),
                "coarse 1 node": DecodePlan(cfg.node_blocks, cfg.node_blocks),
                "coarse 4 nodes": DecodePlan(cfg.node_blocks, 4 * cfg.node_blocks),
            }
            for page in (1, 16):
                batch = Batch(requests, 0, derive_seed(0, "probe_decode_bits", "placement", hq, d, page))
                args = build("decode_attention", batch, AttentionShape(hq, hkv, d, page), opts)
                for name, plan in plans.items():
                    out = decode_attention_triton(**args, max_seq_len=max(lens), plan=plan)
                    found[(hq, hkv, d, kv_name, page, name)] = (out.cpu(), lens)
    return found


def compare(saved: dict, now: dict, fp: dict) -> tuple[list[dict], int]:
    """The rows of `CSV_NAME` and the number of requests whose output changed."""
    rows, changed = [], 0
    for key, (out, lens) in now.items():
        before = saved["cases"][key][0]
        equal = [torch.equal(out[i], before[i]) for i in range(len(lens))]
        changed += equal.count(False)
        hq, hkv, d, kv_name, page, plan = key
        rows.append(fingerprinted(COLUMNS, fp, {
            "Hq": hq, "Hkv": hkv, "D": d, "kv_dtype": kv_name, "page_size": page, "plan": plan,
            "requests": len(lens), "equal_requests": sum(equal),
            "changed_lengths": " ".join(str(n) for n, e in zip(lens, equal) if not e),
            "saved_commit": saved["fingerprint"].get("gdn_lab_commit"), "saved_device": saved["fingerprint"].get("device"),
        }))  # fmt: skip
    return rows, changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("save", "compare"), help="save the outputs, or compare with saved ones")
    p.add_argument("file", help="the saved outputs (.pt)")
    p.add_argument("--out", default=None, help="directory for probe_decode_bits.csv (compare)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    args = p.parse_args(argv)
    if args.action == "compare" and args.out is None:
        p.error("compare: --out DIR is required")

    device = bench_device(args)  # before any kernel module is imported
    from gdn_lab.environment import fingerprint

    fp = fingerprint(device)
    if args.action == "save":
        now = outputs(device, args.smoke)
        torch.save({"fingerprint": fp, "smoke": args.smoke, "cases": now}, args.file)
        print(f"[probe] saved {len(now)} outputs of {sum(len(v[1]) for v in now.values())} requests to {args.file}")
        return 0
    saved = torch.load(args.file, weights_only=False)
    if saved["smoke"] != args.smoke or saved["fingerprint"].get("device") != fp["device"]:
        return _another_probe(args.file, saved, args.smoke, fp)
    now = outputs(device, args.smoke)
    if set(saved["cases"]) != set(now):
        return _another_probe(args.file, saved, args.smoke, fp)
    rows, changed = compare(saved, now, fp)
    path = write_csv(rows, COLUMNS + [f"env_{k}" for k in fp], args.out, CSV_NAME)
    total = sum(r["requests"] for r in rows)
    print(f"[probe] {total - changed} of {total} request outputs kept every bit ({path})")
    return 1 if changed else 0


def _another_probe(file: str, saved: dict, smoke: bool, fp: dict) -> int:
    print(
        f"file: {file} holds another probe (smoke={saved['smoke']}, device {saved['fingerprint'].get('device')}, "
        f"{len(saved['cases'])} cases); this run is smoke={smoke} on {fp['device']}: save and compare with the "
        "same options and code of the probe on one machine",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
