"""Benchmark per-layer hashing (gdn_lab.trace.record) against the unhooked forward.

Two prefill forwards, each at batch x tokens 1x512, 8x128 and 64x16 (the shapes of the hashing
anchor in shared/reference/measured_h200.md):

- `lab-qwen3-next-tp4`: gdn_lab.model at the qwen3-next-80b-tp4 preset (one TP4 rank of
  Qwen3-Next-80B-A3B; --layers, default all 48), bf16, every op on backend --backend (default
  "auto": our Triton kernels on the GPU), one packed prefill of the batch;
- `hf-qwen3`: a Hugging Face Qwen3 built from a config (hidden 2048, 8 layers, 16/4 heads of 128,
  MLP 6144, vocabulary --hf-vocab, bf16, SDPA, random weights, use_cache=False); its rows are
  skipped with the reason when transformers is not installed (pip install -e ".[hf]").

Modes: `plain` (no hooks); `modules` (record(level="modules"): every module's inputs and outputs
hashed per request); `ops` (level="ops": also torch functions and lab ops); `modules-host` and
`ops-host` (the same recording with the row stage, the one pass over each tensor's bits, replaced
by a no-op: what the recorder's host code costs alone; their hashes mean nothing); `debugmode`
(torch's DebugMode with log_tensor_hashes("hash_tensor"), the comparison point; skipped with the
reason when this torch lacks it). Everything runs eager, without CUDA graphs (hooks are host code): CUDA events
around each forward, the median of --reps after --warmup. A hooked repetition includes entering
and leaving `record`; reading the trace (its one device-to-host copy) is `finalize_ms`, measured
once, and `ratio_with_read` adds it to the hooked forward (recording one forward and reading its
hashes, against the plain forward); n_tensors counts the tensors hashed, n_read those read from
memory (a tensor several calls see unchanged is read once), n_flush the batches the Triton row
stage ran them in at level="ops" (queued until a write, a lab op or 32 reads; 0: one launch each,
as at level="modules"). --inference-mode runs every forward
(plain ones too) under torch.inference_mode, as vLLM's model runner does: its activations keep no
version counter, so the recorder reads each at every call (`grad_mode` says which ran). Targets (ratio_vs_plain, judged on CUDA only): <= 1.5 at modules, <= 3 at ops. Every row
carries the environment fingerprint (`env_*`). Run from the repository root:

    python3 benchmarks/bench_trace.py --out OUT_DIR              # the H200 run (a few minutes)
    python3 benchmarks/bench_trace.py --out OUT_DIR --smoke      # tiny models on the CPU, seconds

Where a mode's time goes: `--profile MODE` prints cProfile's top host functions over 5 forwards;
`--timeline MODE` records 3 forwards with torch.profiler (OUT_DIR/timeline_*.json.gz, for
chrome://tracing or Perfetto) and prints the device's busy time and the runtime calls, so a wait on
the device (a synchronisation) shows.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import fingerprinted, sync, time_eager_interleaved, write_csv  # noqa: E402  (the scripts' shared helpers)

CSV_NAME = "bench_trace.csv"
COLUMNS = [
    "model", "mode", "hash_impl", "batch", "tokens_per_request", "tokens", "status", "reason", "ms", "ms_min",
    "ms_max", "reps", "ratio_vs_plain", "target_ratio", "meets_target", "n_entries", "n_tensors", "n_read", "n_flush", "finalize_ms",
    "ratio_with_read", "dtype", "grad_mode", "note",
]  # fmt: skip
MODELS = ("lab", "hf")
MODES = ("plain", "modules", "ops", "modules-host", "ops-host", "debugmode")
HOST_ONLY = "-host"  # the suffix of a mode whose row stage is a no-op
TARGETS = {"modules": 1.5, "ops": 3.0}
MODEL_NAMES = {"lab": "lab-qwen3-next-tp4", "hf": "hf-qwen3"}
HF_VOCAB = 151936  # Qwen3Config's default vocabulary

# A workload: (layout, setup() -> per-repetition state, forward(state, trace) -> output)
Workload = tuple[Any, Callable[[], Any] | None, Callable[[Any, Any], Any]]


def parse_shapes(p: argparse.ArgumentParser, text: str | None, smoke: bool) -> list[tuple[int, int]]:
    """--shapes as (batch, tokens per request) pairs, the defaults when not given; a bad item is a
    usage error (exit 2)."""
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in (text or ("1x8,4x2" if smoke else "1x512,8x128,64x16")).split(",")]  # fmt: skip
        if any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        p.error(f"--shapes {text!r}: expected BATCHxTOKENS items, both >= 1, comma-separated (e.g. 1x512,8x128)")
    return shapes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_trace.csv")
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU, seconds")
    p.add_argument("--shapes", default=None, help="batch x tokens list (default 1x512,8x128,64x16; smoke 1x8,4x2)")
    p.add_argument("--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument("--layers", type=int, default=None, help="layers of the lab model (default: the preset's 48)")
    p.add_argument("--backend", default=None, help="backend of every lab op (default: auto on CUDA, torch on the CPU)")
    p.add_argument("--hash-impl", default="auto", choices=("auto", "torch", "triton"), help="row-hash implementation")
    p.add_argument(
        "--inference-mode", action="store_true", help="every forward under torch.inference_mode (default: no_grad)"
    )
    p.add_argument("--hf-vocab", type=int, default=HF_VOCAB, help="vocabulary of the HF Qwen3 (its config default)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3; smoke 1)")
    p.add_argument("--reps", type=int, default=None, help="timed calls (default 10; smoke 5)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's; smoke 1)")
    p.add_argument(
        "--profile", default=None, help="also print the host functions that took longest in 5 forwards of this mode"
    )
    p.add_argument(
        "--timeline",
        default=None,
        help="also record 3 forwards of this mode with torch.profiler: a chrome trace in --out, and the "
        "runtime calls (syncs among them) and device busy time printed",
    )
    a = p.parse_args(argv)
    a.shapes = parse_shapes(p, a.shapes, a.smoke)
    a.models = [m for m in a.models.split(",") if m]
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.models if m not in MODELS] + [m for m in a.modes if m not in MODES]
    if bad:
        p.error(f"unknown model or mode {bad}; accepted models {MODELS}, modes {MODES}")
    for name in ("profile", "timeline"):
        if getattr(a, name) not in (None, *a.modes):
            p.error(f"--{name}: {getattr(a, name)!r} is not among the modes run; accepted: {', '.join(a.modes)}")
    a.warmup = a.warmup if a.warmup is not None else (1 if a.smoke else 3)
    a.reps = a.reps if a.reps is not None else (5 if a.smoke else 10)
    # One thread for the CPU run: on a shared machine torch's OpenMP threads wait on each other and a
    # tiny forward's time swings tenfold (measured: median 27 ms with 2 threads, 1.9 ms with 1).
    a.threads = a.threads if a.threads is not None else (1 if a.smoke else None)
    return a


def lab_model(args: argparse.Namespace, device: torch.device):
    """The lab's hybrid model and its prefill workloads."""
    from gdn_lab.model import OPS, Model, ModelConfig
    from gdn_lab.trace import Layout

    cfg = ModelConfig.from_name("tiny") if args.smoke else ModelConfig.from_name("qwen3-next-80b-tp4")
    if args.layers is not None:
        cfg = ModelConfig.from_name(cfg.name, num_layers=args.layers)
    backend = args.backend or ("auto" if device.type == "cuda" else "torch")
    model = Model(cfg, backends=dict.fromkeys(OPS, backend), device=device)

    def workload(batch: int, tokens: int) -> Workload:
        g = torch.Generator().manual_seed(batch * 100003 + tokens)
        prompts = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=g).tolist()
        ids = list(range(batch))
        layout = Layout.packed([i * tokens for i in range(batch + 1)], ids)

        def setup():  # a fresh cache each repetition: a prefill starts from empty states
            return model.new_cache([tokens] * batch, 1, request_ids=ids)

        def forward(cache, trace):
            return model.prefill(prompts, cache, trace=trace)

        return layout, setup, forward

    note = f"{cfg.name}, {cfg.num_layers} layers, backend {backend}, {str(cfg.dtype).removeprefix('torch.')}"
    return model, workload, cfg.dtype, note


def hf_model(args: argparse.Namespace, device: torch.device):
    """A Hugging Face Qwen3 from a config, and its prefill workloads."""
    import transformers

    from gdn_lab.trace import Layout

    if args.smoke:
        sizes = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
        dtype = torch.float32
    else:
        sizes = dict(vocab_size=args.hf_vocab, hidden_size=2048, intermediate_size=6144, num_hidden_layers=8,
                     num_attention_heads=16, num_key_value_heads=4, head_dim=128)  # fmt: skip
        dtype = torch.bfloat16
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**sizes, attn_implementation="sdpa")
    model = transformers.Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()

    def workload(batch: int, tokens: int) -> Workload:
        g = torch.Generator().manual_seed(batch * 100003 + tokens)
        ids = torch.randint(0, cfg.vocab_size, (batch, tokens), generator=g).to(device)

        def forward(_state, _trace):
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False)

        return Layout.per_request(list(range(batch))), None, forward

    note = f"transformers {transformers.__version__}, {cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}, sdpa"
    return model, workload, dtype, note


def debug_mode_missing() -> str | None:
    if importlib.util.find_spec("torch.utils._debug_mode") is None:
        return f"torch {torch.__version__} has no torch.utils._debug_mode"
    from torch.utils._debug_mode import DebugMode

    if not hasattr(DebugMode, "log_tensor_hashes") or not hasattr(torch, "hash_tensor"):
        return f"torch {torch.__version__}: DebugMode.log_tensor_hashes or torch.hash_tensor is missing"
    return None


def runner(
    mode: str, model, work: Workload, hash_impl: str, last: dict[str, Any], inference: bool = False
) -> Callable[[Any], None]:
    """One forward in `mode` (under torch.inference_mode when `inference`); record modes leave their
    trace in last[mode]."""
    run = _runner(mode, model, work, hash_impl, last)
    if not inference:
        return run

    def under_inference_mode(state):
        with torch.inference_mode():
            run(state)

    return under_inference_mode


def _runner(mode: str, model, work: Workload, hash_impl: str, last: dict[str, Any]) -> Callable[[Any], None]:
    from gdn_lab.trace import record

    layout, _, forward = work
    if mode == "plain":
        return lambda state: forward(state, None)
    if mode == "debugmode":
        from torch.utils._debug_mode import DebugMode

        def run(state):
            with DebugMode(), DebugMode.log_tensor_hashes(hash_fn="hash_tensor"):
                forward(state, None)

        return run

    level = mode.removesuffix(HOST_ONLY)

    def run(state):
        with row_stage_skipped(mode.endswith(HOST_ONLY)), record(model, layout, level=level, hash_impl=hash_impl) as tr:
            forward(state, tr)
        last[mode] = tr

    return run


@contextlib.contextmanager
def row_stage_as(one: Callable[..., None], many: Callable[[list], None]) -> Iterator[None]:
    """Inside the block, the row stage's two entry points, `hashing.row_values` (one tensor) and
    `hashing.row_values_many` (a batch), are `one` and `many`."""
    from gdn_lab.trace import hashing

    real = hashing.row_values, hashing.row_values_many
    hashing.row_values, hashing.row_values_many = one, many
    try:
        yield
    finally:
        hashing.row_values, hashing.row_values_many = real


def row_stage_skipped(skip: bool) -> contextlib.AbstractContextManager[None]:
    """Inside the block, when `skip`, hashing reads no tensor: the row stage is a no-op."""
    if not skip:
        return contextlib.nullcontext()
    return row_stage_as(lambda words, r, f, impl, out, offset=0: None, lambda items: None)


def profile_host(run: Callable[[Any], None], setup: Callable[[], Any] | None, title: str, top: int = 15) -> None:
    """Print the `top` functions by own host time over 5 calls of `run` (cProfile; not timed)."""
    import cProfile
    import pstats

    states = [setup() if setup else None for _ in range(5)]
    prof = cProfile.Profile()
    prof.enable()
    for state in states:
        run(state)
    prof.disable()
    print(f"[profile] {title}: 5 forwards", flush=True)
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def timeline(run: Callable[[Any], None], setup: Callable[[], Any] | None, device: torch.device, title: str,
             path: Path) -> None:  # fmt: skip
    """Record 3 calls of `run` with torch.profiler (host, and device on CUDA): write the chrome trace
    to `path` and print the wall time, the device's busy time (its events' self time) and the
    runtime API calls by total time. A device that is busy for much less than the wall time while
    the recording still costs its row stage's device time points at a wait: a cudaStreamSynchronize,
    cudaEventSynchronize, cudaDeviceSynchronize or a synchronous copy among those calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    states = [setup() if setup else None for _ in range(3)]
    sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for state in states:
            run(state)
        sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3
    part = path.with_name(f".{path.name}.part.gz")  # written whole, then moved into place
    prof.export_chrome_trace(str(part))
    os.replace(part, path)
    events = prof.key_averages()
    busy = "no device activity (a CPU run)"
    if device.type == "cuda":  # the sum torch's own table reports as its self device time total
        busy = f"device busy {sum(e.self_device_time_total for e in events) / 1e3:.2f} ms"
    api = sorted((e for e in events if e.key.startswith(("cu", "hip"))), key=lambda e: -e.cpu_time_total)
    print(f"[timeline] {title}: 3 forwards in {wall_ms:.2f} ms, {busy}; trace {path}", flush=True)
    for e in api[:15]:
        print(f"[timeline]   {e.key:40s} {e.count:6d} calls {e.cpu_time_total / 1e3:9.3f} ms", flush=True)


def read_trace(trace, device: torch.device) -> dict[str, Any]:
    """The trace's size, and the time to read its hashes (its one device-to-host copy)."""
    sync(device)
    t0 = time.perf_counter()
    n_entries = len(trace.entries)
    ms = (time.perf_counter() - t0) * 1e3
    return {
        "n_entries": n_entries,
        "finalize_ms": ms,
        "n_tensors": trace.n_tensors,
        "n_read": trace.n_read,
        "n_flush": trace.n_flush,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if not args.smoke and not torch.cuda.is_available():
        print("[bench] no GPU here: pass --smoke for the CPU run", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, device)
    finally:  # a caller in the same process (a test) keeps its own thread count
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, device: torch.device) -> int:
    from gdn_lab.environment import fingerprint
    from gdn_lab.trace.hashing import resolve_impl

    fp = fingerprint(device)
    impl = resolve_impl(args.hash_impl, device)
    rows: list[dict] = []

    def row(**fields) -> dict:
        rows.append(fingerprinted(COLUMNS, fp, fields))
        return rows[-1]

    builders = {"lab": lab_model, "hf": hf_model}
    debug_missing = debug_mode_missing()
    t_start = time.perf_counter()
    for key in args.models:
        name = MODEL_NAMES[key]
        shapes = [dict(batch=b, tokens_per_request=t, tokens=b * t) for b, t in args.shapes]
        if key == "hf" and importlib.util.find_spec("transformers") is None:
            for s in shapes:
                for mode in args.modes:
                    row(
                        model=name,
                        mode=mode,
                        status="skipped",
                        reason='transformers is not installed (pip install -e ".[hf]")',
                        **s,
                    )
            continue
        try:
            model, workload, dtype, note = builders[key](args, device)
        except Exception as exc:  # a model that cannot be built is a row per case, the run goes on
            for s in shapes:
                for mode in args.modes:
                    row(model=name, mode=mode, status="error", reason=f"{type(exc).__name__}: {exc}", **s)
            continue
        dt = str(dtype).removeprefix("torch.")
        grad_mode = "inference_mode" if args.inference_mode else "no_grad"
        for s in shapes:
            work = workload(s["batch"], s["tokens_per_request"])
            base = dict(model=name, dtype=dt, grad_mode=grad_mode, note=note, **s)
            runs, last = {}, {}
            for mode in args.modes:
                if mode == "debugmode" and debug_missing:
                    row(mode=mode, status="skipped", reason=debug_missing, **base)
                    continue
                run = runner(mode, model, work, args.hash_impl, last, args.inference_mode)
                try:  # a mode that fails is a row; the others are still timed
                    run(work[1]() if work[1] else None)
                except Exception as exc:
                    row(mode=mode, status="error", reason=f"{type(exc).__name__}: {exc}", **base)
                    continue
                runs[mode] = run
            times = time_eager_interleaved(runs, device, warmup=args.warmup, reps=args.reps, setup=work[1])
            shape = f"{s['batch']}x{s['tokens_per_request']}"
            if args.profile in runs:
                profile_host(runs[args.profile], work[1], f"{name} {shape} {args.profile}")
            if args.timeline in runs:
                trace_path = Path(args.out) / f"timeline_{name}_{shape}_{args.timeline}.json.gz"
                trace_path.parent.mkdir(parents=True, exist_ok=True)
                timeline(runs[args.timeline], work[1], device, f"{name} {shape} {args.timeline}", trace_path)
            plain_ms = statistics.median(times["plain"]) if "plain" in times else None
            for mode, ts in times.items():
                ms = statistics.median(ts)
                r = row(mode=mode, status="ok", ms=ms, ms_min=min(ts), ms_max=max(ts), reps=len(ts), **base)
                r["hash_impl"] = impl if mode in TARGETS else ("skipped" if mode.endswith(HOST_ONLY) else "")
                r["target_ratio"] = TARGETS.get(mode, "")
                if mode in last:
                    r.update(read_trace(last[mode], device))
                if plain_ms and mode != "plain":
                    r["ratio_vs_plain"] = ms / plain_ms
                    if r["finalize_ms"] != "":
                        r["ratio_with_read"] = (ms + r["finalize_ms"]) / plain_ms
                    if mode in TARGETS and device.type == "cuda":
                        r["meets_target"] = r["ratio_vs_plain"] <= TARGETS[mode]
            print(f"[bench] {name} {shape}: {time.perf_counter() - t_start:.1f}s", flush=True)
        del model
    path = write_csv(rows, COLUMNS + [f"env_{k}" for k in fp], Path(args.out), CSV_NAME)
    print(
        f"\n{'model':20} {'mode':12} {'batch x tok':>12} {'ms':>10} {'x plain':>8} {'target':>7} {'meets':>6}  status"
    )
    for r in rows:
        ms = f"{r['ms']:.2f}" if r["ms"] != "" else "-"
        ratio = f"{r['ratio_vs_plain']:.2f}" if r["ratio_vs_plain"] != "" else "-"
        shape = f"{r['batch']} x {r['tokens_per_request']}"
        status = r["status"] + (f" ({r['reason']})" if r["reason"] else "")
        print(
            f"{r['model']:20} {r['mode']:12} {shape:>12} {ms:>10} {ratio:>8} {r['target_ratio']!s:>7} {r['meets_target']!s:>6}  {status}"
        )
    print(f"[bench] wrote {len(rows)} rows to {path} in {time.perf_counter() - t_start:.0f}s on {fp['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
