"""`gdn-lab`: the command line of the lab."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

DESCRIPTION = """\
gdn_lab asks one question of LLM inference kernels: does a request get the same bits whatever
it is batched with, and if not, which op breaks it? It runs AMD AITER/FlyDSL kernels, our own
Triton kernels, flash-linear-attention and PyTorch references behind one routed API.
"""

EPILOG = """\
examples:
  gdn-lab env                      where am I, and which backends can run here (and why not)
  gdn-lab env --json               the same as JSON (fingerprint + one row per op and backend)
"""


def _env(args: argparse.Namespace) -> int:
    import torch

    from gdn_lab.device import default_device, fingerprint
    from gdn_lab.ops import EXAMPLES
    from gdn_lab.routing import explain

    device = torch.device(args.device) if args.device else default_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA/ROCm device is visible to torch", file=sys.stderr)
        return 2
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    fp = fingerprint(device)
    rows = []
    for op, example in EXAMPLES.items():
        rows.extend(explain(op, example(device=device, dtype=dtype)))
    if args.json:
        print(json.dumps({"fingerprint": fp, "backends": rows}, indent=2, default=str))
        return 0
    width = max(len(k) for k in fp)
    print("fingerprint")
    for k, v in fp.items():
        print(f"  {k:<{width}}  {v}")
    print(f"\nbackends for a small {str(dtype).removeprefix('torch.')} call on {device}")
    print("(available: imports and platform; covered: this call's shapes and dtypes; * = auto would pick it)")
    current = None
    for r in rows:
        if r["op"] != current:
            current = r["op"]
            print(f"\n{current}")
        mark = "*" if r["chosen"] else " "
        state = "ok" if r["covered"] else ("not covered" if r["available"] else "unavailable")
        auto = "" if r["auto"] else " [named only]"
        print(f"  {mark} {r['backend']:<24} {state:<12} {r['reason']}{auto}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdn-lab",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    env = sub.add_parser(
        "env",
        help="the environment fingerprint and, for each op, which backends can run here and why not",
        description="Print the environment fingerprint (device, arch, torch/triton/fla/aiter/flydsl versions) "
        "and, for each op, every backend's availability and coverage of a small example call.",
    )
    env.add_argument("--device", choices=["cpu", "cuda"], help="device to probe (default: the GPU if any, else cpu)")
    env.add_argument("--json", action="store_true", help="print JSON instead of a table")
    env.set_defaults(func=_env)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
