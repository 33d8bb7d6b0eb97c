"""The trace row stage alone: a recorded forward's reads replayed, under two tile rules.

Records one forward of bench_trace.py's Hugging Face Qwen3 (its config, bf16; a tiny one with
--smoke) at level="modules" and level="ops" with the Triton row stage, keeps every read it made (at
"ops", in the batches it ran them in), then replays exactly those reads, the rules taking turns:
`fit` (a tile has no more rows than its tensor: `triton_hash.FIT_ROWS`, this tree's) and `fixed`
(tile rows by the row width alone, as before). The time is the row stage's own, without the
forward or the recorder's host code; `same_bits` says both rules gave every row value equal.
At level="modules" each read class (shape, dtype) is also replayed alone.

    python3 benchmarks/probe_trace_rows.py --out OUT_DIR           # the GPU run (about a minute)
    python3 benchmarks/probe_trace_rows.py --out OUT_DIR --smoke   # tiny model, CPU interpreter

Writes OUT_DIR/probe_trace_rows.csv: one row per (shape, level, read class or "all", rule) with the
reads, their words, the median ms over --reps, G words/s, same_bits, and the environment fingerprint.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trace  # noqa: E402
from bench_common import add_device_option, bench_device, fingerprinted, time_eager_interleaved, write_csv  # noqa: E402

CSV = "probe_trace_rows.csv"
COLUMNS = ["model", "batch", "tokens_per_request", "level", "reads", "rule", "n_reads", "m_words", "ms", "gwords_per_s",
           "same_bits"]  # fmt: skip
RULES = {"fit": True, "fixed": False}  # -> triton_hash.FIT_ROWS

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


def use_rule(fit: bool) -> None:
    """The tile rule `triton_hash._launch_config` follows from now on (`FIT_ROWS`)."""
    from gdn_lab.trace import triton_hash

    if triton_hash.FIT_ROWS is not fit:
        triton_hash.FIT_ROWS = fit
        triton_hash._launch_config.cache_clear()


def replay(batches: list[list[Read]], device: torch.device) -> tuple[Callable[[bool], None], torch.Tensor]:
    """(run(fit): every read again into one buffer under that tile rule, the buffer)."""
    from gdn_lab.trace import triton_hash

    out = torch.zeros(sum(r for b in batches for _, r, _ in b) + 1, dtype=torch.int64, device=device)

    def run(fit: bool) -> None:
        use_rule(fit)
        out.zero_()
        offset = 0
        for batch in batches:
            items = []
            for words, r, f in batch:
                items.append((words, r, f, out, offset))
                offset += r
            triton_hash.row_values_many(items)  # a lone read launches as it is

    return run, out


def measure(batches: list[list[Read]], device: torch.device, warmup: int, reps: int) -> dict[str, tuple[float, bool]]:
    """rule -> (median ms of replaying `batches`, whether its row values equal the other rule's)."""
    run, out = replay(batches, device)
    values = {}
    for rule, fit in RULES.items():
        run(fit)
        values[rule] = out.clone()
    times = time_eager_interleaved(
        {rule: (lambda _, fit=fit: run(fit)) for rule, fit in RULES.items()}, device, warmup=warmup, reps=reps
    )
    same = torch.equal(values["fit"], values["fixed"])
    use_rule(True)  # this tree's rule again, for the recordings that follow
    return {rule: (statistics.median(ms), same) for rule, ms in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for probe_trace_rows.csv")
    p.add_argument("--smoke", action="store_true", help="tiny model, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--shapes", default=None, help="batch x tokens list (default 1x512,8x128,64x16; smoke 1x8,4x2)")
    p.add_argument("--reps", type=int, default=None, help="timed replays per rule (default 10; smoke 2)")
    args = p.parse_args(argv)
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

    hf = argparse.Namespace(smoke=args.smoke, hf_vocab=bench_trace.HF_VOCAB)
    model, workload, _, _ = bench_trace.hf_model(hf, device)
    fp = fingerprint(device)
    rows = []
    print(f"{'shape':>8} {'level':8} {'reads':32} {'n':>4} {'M words':>8} {'fit ms':>8} {'fixed ms':>9} same")
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
                found = measure(group, device, warmup=1 if args.smoke else 3, reps=reps)
                for rule, (ms, same) in found.items():
                    fields = dict(model=bench_trace.MODEL_NAMES["hf"], batch=batch, tokens_per_request=tokens,
                                  level=level, reads=name, rule=rule, n_reads=n, m_words=m_words, ms=ms,
                                  gwords_per_s=m_words / ms if ms else "", same_bits=same)  # fmt: skip
                    rows.append(fingerprinted(COLUMNS, fp, fields))
                (fit, same), (fixed, _) = found["fit"], found["fixed"]
                print(
                    f"{batch:>3}x{tokens:<4} {level:8} {name[:32]:32} {n:>4} {m_words:>8.1f} {fit:>8.3f} {fixed:>9.3f} {same}"
                )
    path = write_csv(rows, list(rows[0]), args.out, CSV)
    print(f"[probe_trace_rows] wrote {len(rows)} rows to {path}")
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
