"""The trace row stage alone: a recorded forward's reads replayed through this tree's row stage and,
with --against, through another version's.

Records one forward of bench_trace.py's Hugging Face Qwen3 (its config, bf16; a tiny one with
--smoke) at level="modules" and level="ops" with the Triton row stage, keeps every read it made (at
"ops", in the batches it ran them in), then replays exactly those reads: through this tree's
`gdn_lab/trace/triton_hash.py` (`tree`) and, given `--against FILE`, through that file's
(`against`: another revision's, e.g. `git show REV:gdn_lab/trace/triton_hash.py > FILE`), the two
taking turns. The time is the row stage's own, without the forward or the recorder's host code;
`same_bits` says both gave every row value equal (empty without --against). At level="modules"
each read class (shape, dtype) is also replayed alone.

    python3 benchmarks/probe_trace_rows.py --out OUT_DIR [--against FILE]          # the GPU run (about a minute)
    python3 benchmarks/probe_trace_rows.py --out OUT_DIR --smoke [--against FILE]  # tiny model, CPU interpreter

Writes OUT_DIR/probe_trace_rows.csv: one row per (shape, level, read class or "all", row stage) with
the reads, their words, the median ms over --reps, G words/s, same_bits, and the environment
fingerprint. Exit 1 when a row value differs, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trace  # noqa: E402
from bench_common import add_device_option, bench_device, fingerprinted, time_eager_interleaved, write_csv  # noqa: E402

CSV = "probe_trace_rows.csv"
COLUMNS = ["model", "batch", "tokens_per_request", "level", "reads", "row_stage", "against", "n_reads", "m_words", "ms",
           "gwords_per_s", "same_bits"]  # fmt: skip

Read = tuple[torch.Tensor, int, int]  # (words, rows, words per row)


def recorded_reads(model, layout, forward: Callable, level: str) -> list[list[Read]]:
    """The row stage's reads of one recorded forward, in the batches they ran in (one read each
    unless the recorder queued them)."""
    from gdn_lab.trace import hashing, record

    batches: list[list[Read]] = []
    one, many = hashing.row_values, hashing.row_values_many

    def spy_one(words, r, f, impl, out, offset=0):
        batches.append([(words, r, f)])
        one(words, r, f, impl, out, offset)

    def spy_many(items):
        batches.append([item[:3] for item in items])
        many(items)

    with bench_trace.row_stage_as(spy_one, spy_many), record(model, layout, level=level, hash_impl="triton") as trace:
        forward(None, trace)
    return batches


def row_stage_of(path: Path) -> ModuleType:
    """The module of another version's `triton_hash.py` (its kernels compile as they are there)."""
    spec = importlib.util.spec_from_file_location("triton_hash_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replay(
    batches: list[list[Read]], stage: ModuleType, device: torch.device
) -> tuple[Callable[[Any], None], torch.Tensor]:
    """(run(_): every read again through `stage`'s `row_values_many` into one buffer, the buffer)."""
    out = torch.zeros(sum(r for b in batches for _, r, _ in b) + 1, dtype=torch.int64, device=device)

    def run(_: Any) -> None:
        out.zero_()
        offset = 0
        for batch in batches:
            items = []
            for words, r, f in batch:
                items.append((words, r, f, out, offset))
                offset += r
            stage.row_values_many(items)  # a lone read launches as it is

    return run, out


def measure(
    batches: list[list[Read]], stages: dict[str, ModuleType], device: torch.device, warmup: int, reps: int
) -> dict[str, tuple[float, bool | str]]:
    """row stage -> (median ms of replaying `batches`, whether every row value equals the other
    stage's; "" with one stage)."""
    runs, outs = {}, {}
    for name, stage in stages.items():
        runs[name], outs[name] = replay(batches, stage, device)
        runs[name](None)
    same: bool | str = ""
    if len(outs) == 2:
        same = torch.equal(*outs.values())
    times = time_eager_interleaved(runs, device, warmup=warmup, reps=reps)
    return {name: (statistics.median(ms), same) for name, ms in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for probe_trace_rows.csv")
    p.add_argument("--smoke", action="store_true", help="tiny model, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--shapes", default=None, help="batch x tokens list (default 1x512,8x128,64x16; smoke 1x8,4x2)")
    p.add_argument("--reps", type=int, default=None, help="timed replays per row stage (default 10; smoke 2)")
    p.add_argument("--against", default=None, help="another version's gdn_lab/trace/triton_hash.py, replayed too")
    args = p.parse_args(argv)
    against = Path(args.against) if args.against else None
    if against is not None and not against.is_file():
        p.error(f"--against {args.against!r}: not a file; expected a copy of gdn_lab/trace/triton_hash.py")
    shapes = bench_trace.parse_shapes(p, args.shapes, args.smoke)
    reps = args.reps if args.reps is not None else (2 if args.smoke else 10)
    if reps < 1:
        p.error(f"--reps {reps}: expected at least 1")

    if importlib.util.find_spec("transformers") is None:
        print('[probe_trace_rows] needs transformers: pip install -e ".[hf]"', file=sys.stderr)
        return 2
    device = bench_device(args)  # before any kernel module is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gdn_lab.environment import fingerprint
    from gdn_lab.trace import triton_hash

    stages = {"tree": triton_hash}
    if against is not None:
        stages["against"] = row_stage_of(against)

    hf = argparse.Namespace(smoke=args.smoke, hf_vocab=bench_trace.HF_VOCAB)
    model, workload, _, _ = bench_trace.hf_model(hf, device)
    fp = fingerprint(device)
    rows = []
    print(
        f"{'shape':>8} {'level':8} {'reads':32} {'n':>4} {'M words':>8} "
        + " ".join(f"{n + ' ms':>10}" for n in stages)
        + " same"
    )
    for batch, tokens in shapes:
        layout, _, forward = workload(batch, tokens)
        for level in ("modules", "ops"):
            batches = recorded_reads(model, layout, forward, level)
            groups = {"all": batches}
            if level == "modules":  # one read per batch: each class alone too
                for b in batches:
                    words = b[0][0]
                    groups.setdefault(f"{'x'.join(map(str, words.shape))} {str(words.dtype)[6:]}", []).append(b)
            for name, group in groups.items():
                n = sum(len(b) for b in group)
                m_words = sum(r * f for b in group for _, r, f in b) / 1e6
                found = measure(group, stages, device, warmup=1 if args.smoke else 3, reps=reps)
                for stage, (ms, same) in found.items():
                    fields = dict(model=bench_trace.MODEL_NAMES["hf"], batch=batch, tokens_per_request=tokens,
                                  level=level, reads=name, row_stage=stage, against=args.against or "", n_reads=n,
                                  m_words=m_words, ms=ms, gwords_per_s=m_words / ms if ms else "", same_bits=same)  # fmt: skip
                    rows.append(fingerprinted(COLUMNS, fp, fields))
                times = " ".join(f"{ms:>10.3f}" for ms, _ in found.values())
                print(
                    f"{batch:>3}x{tokens:<4} {level:8} {name[:32]:32} {n:>4} {m_words:>8.1f} {times} {found['tree'][1]}"
                )
    path = write_csv(rows, list(rows[0]), args.out, CSV)
    print(f"[probe_trace_rows] wrote {len(rows)} rows to {path}")
    return 1 if any(r["same_bits"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
