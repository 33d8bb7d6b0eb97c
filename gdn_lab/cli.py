"""`gdn-lab`: the command line of the lab."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

DESCRIPTION = """\
gdn_lab asks one question of LLM inference kernels: does a request get the same bits whatever
it is batched with, and if not, which op breaks it? It runs AMD AITER/FlyDSL kernels, our own
Triton kernels, flash-linear-attention and PyTorch references behind one routed API.
"""

EPILOG = """\
examples:
  gdn-lab env                      where am I, and which backends can run here (and why not)
  gdn-lab env --json               the same as JSON (fingerprint + one row per op and backend)
  gdn-lab run --preset cpu-smoke   every notebook on the CPU smoke preset; prints where index.html is
  gdn-lab run --preset h200 --only 01 -p seed=3 --out /tmp/run
  gdn-lab invariance --op decode_attention --backend triton --device cpu --targets 1,257 --batch-sizes 2,8
  gdn-lab fingerprint --preset cpu-smoke --out golden.json      the regression gate's golden file
  gdn-lab check --golden golden.json                           rerun it: exit 1 if anything regressed
  gdn-lab compare runs/h200 runs/mi350x                         two runs (or fingerprints) side by side
  gdn-lab kernels --target gfx942 --op decode_attention         compile for MI300X here: LDS, VGPRs, spills

exit status: 2 for bad input everywhere (nothing runs); each command's --help gives its other codes;
130 after Ctrl-C.
"""


def _interpreter_note(device, set_here: bool) -> str:
    """How TRITON_INTERPRET came to be what it is, for `env`'s output ("" when it is not set)."""
    import os

    from gdn_lab.device import interpreting

    if set_here:
        return "TRITON_INTERPRET=1 set by gdn-lab on the CPU, as `gdn-lab run` and `gdn-lab invariance` do"
    value = os.environ.get("TRITON_INTERPRET")
    if value is None:
        return ""
    if device.type == "cpu" and not interpreting():
        return (
            f"TRITON_INTERPRET={value} from the environment: no Triton on the CPU; `gdn-lab invariance` keeps "
            "it, `gdn-lab run` sets 1 for its notebooks"
        )
    return f"TRITON_INTERPRET={value} from the environment"


def _env(args: argparse.Namespace) -> int:
    import torch

    from gdn_lab import environment
    from gdn_lab.device import default_device, interpreter_default
    from gdn_lab.ops import spec
    from gdn_lab.routing import explain

    device = torch.device(args.device) if args.device else default_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA/ROCm device is visible to torch", file=sys.stderr)
        return 2
    # What `run` and `invariance` do before any kernel is imported, so the probes below agree with them.
    set_here = interpreter_default(device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    fp = environment.fingerprint(device)
    notes = environment.notes(fp)
    interpret_note = _interpreter_note(device, set_here)
    if interpret_note:
        notes["triton_interpret"] = interpret_note
    rows = []
    for op in spec.names():
        rows.extend(explain(op, spec.get(op).example(device=device, dtype=dtype)))
    if args.json:
        print(json.dumps({"fingerprint": fp, "notes": notes, "backends": rows}, indent=2, default=str))
        return 0
    width = max(len(k) for k in fp)
    print("fingerprint")
    for k, v in fp.items():
        note = f"  ({notes[k]})" if k in notes else ""
        print(f"  {k:<{width}}  {v}{note}")
    print(f"\nbackends for a small {str(dtype).removeprefix('torch.')} call on {device}")
    print(
        "(available: imports and platform; covered: this call's shapes and dtypes; * = auto would pick it; "
        "rule: the dispatch rule its kernel follows, gdn_lab.rules)"
    )
    current = None
    for r in rows:
        if r["op"] != current:
            current = r["op"]
            print(f"\n{current}")
        mark = "*" if r["chosen"] else " "
        state = "ok" if r["covered"] else ("not covered" if r["available"] else "unavailable")
        auto = "" if r["auto"] else " [named only]"
        rule = f" [rule: {r['rule']}]" if r["rule"] else ""
        print(f"  {mark} {r['backend']:<24} {state:<12} {r['reason']}{auto}{rule}")
    return 0


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _shape(text: str) -> dict[str, int]:
    out = {}
    for pair in (p for p in text.split(",") if p.strip()):
        key, sep, value = pair.partition("=")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected FIELD=INT[,FIELD=INT...], got {text!r}") from None
        if not sep or not key.strip().isidentifier():
            raise argparse.ArgumentTypeError(f"expected FIELD=INT[,FIELD=INT...], got {text!r}")
    if not out:
        raise argparse.ArgumentTypeError(f"expected FIELD=INT[,FIELD=INT...], got {text!r}")
    return out


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


# --- gdn-lab run ------------------------------------------------------------------------------

RUN_EXIT = """exit status: 0 every selected notebook ran ok; 1 a notebook failed (or --archive could not be
written); 2 bad input (nothing ran); 130 interrupted (Ctrl-C: what finished is kept)."""


def _run_epilog() -> str:
    """The presets, the notebooks and where each notebook's parameters are documented (read now)."""
    lines = [RUN_EXIT, ""]
    try:
        from gdn_lab.report import parameters, presets, runner

        lines.append(f"presets ({presets.PRESET_DIR}; or --preset PATH.yaml):")
        for name, description in presets.describe().items():
            lines.append(f"  {name:<12} {description}")
        lines += [
            "",
            f"notebooks ({runner.NOTEBOOK_DIR}; --only takes a stem or a unique prefix) and their parameters:",
        ]
        import json

        for name, path in runner.discover().items():
            config = (json.loads(path.read_text()).get("metadata", {}).get(parameters.METADATA_KEY) or {}).get("config")
            lines.append(f"  {name:<28} {(config or 'names no Config').replace(':', '.')}")
    except Exception as exc:  # --help must print whatever state the data files are in
        lines.append(f"(could not list the presets and notebooks: {type(exc).__name__}: {exc})")
    lines += [
        "",
        "Each notebook's parameters are the fields of its Config dataclass (types, defaults and checks:",
        "python -c \"help('gdn_lab.experiments.batch_invariance.InvarianceByOpConfig')\"), one commented line",
        "each in its parameters cell (papermill --help-notebook NOTEBOOK). A value is taken from -p, else the",
        "notebook's own value, else the preset, else the Config's default; --dry-run prints what each notebook",
        "would get. -p values are YAML: -p seed=3, -p 'targets=[1, 257]', -p arches=null.",
        "",
        "examples:",
        "  gdn-lab run --preset cpu-smoke --jobs 1        # one notebook at a time (default: 3, at most the cores)",
        "  gdn-lab run --preset cpu-smoke --only 01 -p seed=3 --dry-run",
        "  gdn-lab run --preset h200 --out /tmp/h200 --archive /tmp/h200.tar.gz",
        "  gdn-lab run --resume /tmp/h200                 # rerun only what is not ok, or changed",
    ]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from gdn_lab.report.io import read_json
    from gdn_lab.report.runner import SUMMARY_FILE, RunError, check_jobs, default_jobs, prepare, run_suite

    out, preset = args.out, args.preset
    try:
        jobs = default_jobs() if args.jobs is None else args.jobs
        check_jobs(jobs)
        if args.resume is not None:
            if out is not None and Path(out).resolve() != Path(args.resume).resolve():
                raise RunError(f"--resume {args.resume} and --out {out} differ: --resume runs into its own directory")
            out = args.resume
            earlier = read_json(Path(out) / SUMMARY_FILE) or {}
            if preset is None:
                preset = earlier.get("preset")
                if preset is None:
                    raise RunError(f"--resume: {out} holds no run to resume ({SUMMARY_FILE} is missing)")
        if preset is None:
            raise RunError("--preset is required (a name or a path to a YAML file); see gdn-lab run --help")
        kwargs = dict(
            only=args.only, overrides=args.param, out=out, archive_to=args.archive, resume=args.resume is not None
        )
        if args.dry_run:
            return _dry_run(*prepare(preset, **kwargs))
        summary = run_suite(preset, **kwargs, jobs=jobs)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        index = Path(out) / "index.html" if out is not None else None
        where = f"; what finished is in {index}" if index is not None and index.exists() else " before anything ran"
        print(f"gdn-lab run: interrupted{where}", file=sys.stderr)
        return 130
    failed = summary.failed()
    if failed:
        names = ", ".join(f"{nb.name} ({nb.status})" for nb in failed)
        print(f"{len(failed)} of {len(summary.selected)} notebooks failed: {names}", file=sys.stderr)
    print(f"{summary.out}/index.html")
    return 1 if failed or summary.archive_error else 0


def _dry_run(preset, notebooks, plans, run_dir, dest, overrides) -> int:  # noqa: ANN001
    import yaml

    from gdn_lab.report.parameters import config_name

    print(f"# preset {preset.name}: {len(plans)} notebooks into {run_dir} (dry run: nothing runs)")
    for nb in plans:
        print(f"{nb.name}:  # {config_name(type(nb.config))}")
        text = yaml.safe_dump(nb.parameters, sort_keys=False, default_flow_style=None, width=120)
        print("".join(f"  {line}\n" for line in text.splitlines()), end="")
    return 0


# --- gdn-lab invariance -------------------------------------------------------------------------

EXIT_OK, EXIT_FINDING, EXIT_BAD_INPUT, EXIT_INSENSITIVE, EXIT_NOT_COVERED = 0, 1, 2, 3, 4
INVARIANCE_EXIT = """exit status:
  0  the backend ran every case, kept its bits in every comparison, and the control was caught
  1  a finding: the backend changed bits in at least one comparison
  2  bad input (nothing ran)
  3  insensitive: the backend kept its bits, but no batch-variant control showed a difference, so
     this run could not have seen variance (raise --max-context, add targets or batch sizes)
  4  incomplete: the backend did not cover (or raised on) some case, so not every case was compared
  130 interrupted (Ctrl-C)"""
CPU_MAX_CONTEXT, GPU_MAX_CONTEXT = 64, 16383
# On the CPU every Triton kernel runs in the interpreter: small heads keep a run to seconds, and keep
# the batch-variant controls able to split (their heuristics follow the CPU's few "SMs", torch threads).
CPU_SHAPES = {
    "attention": {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16},
    "gdn": {"num_k_heads": 4, "num_v_heads": 8, "head_dim": 32, "conv_width": 4},
    "linear": {"hidden": 256, "out_features": 256},
    "moe": {"hidden": 64, "num_experts": 8, "top_k": 3, "intermediate": 32},
}
# InvarianceConfig fields as the flags that set them, for error messages.
FLAGS = {"kv_dtype": "--kv-dtype", "max_context": "--max-context", "backends": "--backend", "targets": "--targets",
         "batch_sizes": "--batch-sizes", "seed": "--seed", "dtype": "--dtype", "device": "--device",
         "attention": "--shape", "gdn": "--shape", "linear": "--shape", "moe": "--shape"}  # fmt: skip


def _as_flag(message: str) -> str:
    """A Config error as the flag that set the field: "attention.num_q_heads: ..." -> "--shape: num_q_heads: ..."."""
    head, sep, rest = message.partition(":")
    field, dot, sub = head.partition(".")
    if field not in FLAGS:
        return message
    return f"{FLAGS[field]}: {sub}{sep}{rest}" if dot else f"{FLAGS[field]}{sep}{rest}"


def invariance_exit(df, backend: str) -> tuple[int, str]:  # noqa: ANN001
    """The exit status of `gdn-lab invariance` and a one-line verdict, from the experiment's table."""
    mine = df[df.backend == backend]
    done = mine[mine.status == "compared"]
    if not done.empty and not bool(done.bitwise_equal.astype(bool).all()):
        n = int((~done.bitwise_equal.astype(bool)).sum())
        return EXIT_FINDING, f"variant: {backend} changed bits in {n} of {len(done)} comparisons"
    missing = mine[mine.status != "compared"]
    if not missing.empty or done.empty:
        from gdn_lab.experiments.common import short_reason

        reason = short_reason(missing.reason.iloc[0], 120) if not missing.empty else "no case"
        return EXIT_NOT_COVERED, f"incomplete: {backend} did not run {len(missing)} of {len(mine)} rows ({reason})"
    if bool(mine.insensitive.astype(bool).any()):
        return EXIT_INSENSITIVE, (
            f"insensitive: {backend} kept its bits in all {len(done)} comparisons, but no control showed a difference"
        )
    return EXIT_OK, f"invariant: {backend} kept its bits in all {len(done)} comparisons; the control was caught"


def _invariance(args: argparse.Namespace) -> int:
    import dataclasses

    import gdn_lab.ops
    from gdn_lab.device import interpreter_default
    from gdn_lab.experiments import batch_invariance
    from gdn_lab.report import quiet
    from gdn_lab.workloads import resolve_device

    try:
        device = resolve_device(args.device)
        interpreter_default(device)  # on the CPU: TRITON_INTERPRET=1 unless set
        max_context = args.max_context or (CPU_MAX_CONTEXT if device.type == "cpu" else GPU_MAX_CONTEXT)
        param = gdn_lab.ops.spec.get(args.op).shape.param  # "attention", "gdn", "linear" or "moe"
        shape = {**(CPU_SHAPES.get(param, {}) if device.type == "cpu" else {}), **(args.shape or {})}
        shaped = param in {f.name for f in dataclasses.fields(batch_invariance.InvarianceConfig)}
        if args.shape and not shaped:
            raise ValueError(
                f"--shape: {args.op}'s shape ({param}) is not a field of InvarianceConfig; it runs with its defaults"
            )
        cfg = batch_invariance.InvarianceConfig(
            op=args.op,
            backends=[args.backend],
            targets=args.targets,
            batch_sizes=args.batch_sizes,
            seed=args.seed,
            device=str(device),
            dtype=args.dtype or ("float32" if device.type == "cpu" else "bfloat16"),
            kv_dtype=None if args.kv_dtype in (None, "auto") else args.kv_dtype,
            max_context=max_context,
            **({param: shape or None} if shaped else {}),
        )
    except ValueError as exc:
        print(f"error: {_as_flag(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with quiet.capture() as warned:
        df = batch_invariance.run(cfg, progress=not args.json)
    if args.json:
        for line in df.to_json(orient="records", lines=True).splitlines():
            print(line)
    else:
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_rows", None):
            cols = ["op", "backend", "is_control", "covered", "target_len", "batch_size", "position", "tensor"]
            print(df[cols + ["bitwise_equal", "n_diff", "max_abs", "max_ulp", "ref_max_abs", "reason"]].to_string())
            print()
            print(batch_invariance.summarize(df).drop(columns=["label"]).to_string(index=False))
    code, line = invariance_exit(df, args.backend)
    captured = warned.summary()["captured"]
    note = f" ({captured} known warnings from Triton's interpreter or fla captured)" if captured else ""
    print(f"verdict: {line} (exit {code}){note}", file=sys.stderr)
    return code


def _fingerprint(args: argparse.Namespace) -> int:
    from gdn_lab.gate import golden
    from gdn_lab.gate.fingerprint import GateConfig, fingerprint
    from gdn_lab.report import presets, quiet

    try:
        preset = presets.load(args.preset)
        if not preset.gate:
            raise ValueError(f"preset {preset.name}: has no gate section (gate: {{cases: [...]}})")
        cfg = GateConfig(**preset.gate)
        _interpret_on_cpu(cfg.torch_device)
        with quiet.capture():  # the interpreter's masked-lane RuntimeWarnings say nothing here
            doc = fingerprint(cfg, only=args.only, preset=preset.name, progress=not args.quiet)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = golden.write(args.out, doc)
    print(f"{path}: {len(doc['cases'])} cases in {doc['duration_s']} s")
    return 0


def _check(args: argparse.Namespace) -> int:
    from gdn_lab.gate import golden
    from gdn_lab.gate.check import check_documents, report
    from gdn_lab.gate.fingerprint import GateConfig, fingerprint
    from gdn_lab.report import quiet

    try:
        old = golden.read(args.golden)
        cfg = GateConfig(**old["config"])
        _interpret_on_cpu(cfg.torch_device)
        only = sorted({c["op"] for c in old["cases"]})
        with quiet.capture():
            now = fingerprint(cfg, only=only, preset=old.get("preset"), progress=not args.quiet)
    except (golden.GoldenError, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = check_documents(old, now)
    print(report(result, args.golden))
    if args.update:
        golden.write(args.golden, now)
        print(
            f"updated {args.golden} ({len(result.findings)} findings and {len(result.notes)} notes recorded as the new golden)"
        )
        return 0
    return 0 if result.ok else 1


def _compare(args: argparse.Namespace) -> int:
    from gdn_lab.report.compare import CompareError, compare, summary_text, write_html

    try:
        a, b, diff = compare(args.a, args.b, args.tolerance)
    except (CompareError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary_text(a, b, diff, args.tolerance))
    if args.out:
        print(write_html(args.out, a, b, diff, args.tolerance))
    return 0 if diff.none else 1


def _kernels(args: argparse.Namespace) -> int:
    import os

    import pandas as pd

    from gdn_lab.ops import offline_compile as oc
    from gdn_lab.ops import spec

    try:
        targets = [oc.check_target(t) for t in args.target]
        for op in args.op or []:
            spec.get(op)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Before Triton's kernels load: under the interpreter `@triton.jit` makes functions that cannot compile.
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        df = pd.concat([oc.compile_report(t.arch, ops=args.op, progress=not args.quiet) for t in targets])
    except RuntimeError as exc:  # the kernels were loaded for the interpreter before this command ran
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(oc.summary_text(df))
    if args.out:
        from gdn_lab.environment import fingerprint
        from gdn_lab.report.io import atomic_write_text

        env = {f"env_{k}": v for k, v in fingerprint("cpu").items()}  # where it compiled: Triton's version
        print(f"wrote {atomic_write_text(args.out, df.assign(**env).to_csv(index=False))}")
    return 0 if df["fits"].all() else 1


def _interpret_on_cpu(device) -> None:
    import os

    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
        description="Print the environment fingerprint (device, arch, torch/triton/fla/aiter/flydsl versions, "
        "gdn_lab's version and git commit, AITER's route and the arch it is told) and, for each op, every "
        "backend's availability and coverage of a small example call. On the CPU it first sets "
        "TRITON_INTERPRET=1 unless the environment sets it, as `run` and `invariance` do, so it reports what "
        "they would run.",
    )
    env.add_argument("--device", choices=["cpu", "cuda"], help="device to probe (default: the GPU if any, else cpu)")
    env.add_argument("--json", action="store_true", help="print JSON instead of a table")
    env.set_defaults(func=_env)

    run = sub.add_parser(
        "run",
        help="execute the notebook suite with papermill into a run directory (ipynb, html, tables, index.html)",
        description="Execute the lab's notebooks (NN_name.ipynb) with papermill on a preset. Every parameter is "
        "resolved into each notebook's Config and checked before anything runs. Writes the executed notebooks, "
        "one HTML report each, their CSV tables, index.html and summary.json into --out; a failing notebook does "
        "not stop the others. Prints the path of index.html on stdout.",
        epilog=_run_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--preset", help="preset name (see below) or a path to a YAML file; with --resume: the run's own")
    run.add_argument(
        "--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (stem or unique prefix, e.g. 01)"
    )
    run.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="set a notebook parameter in every selected notebook that has it (VALUE read as YAML); repeatable",
    )
    run.add_argument("--out", help="run directory (default: ./runs/<preset>-<time>/)")
    run.add_argument("--archive", metavar="FILE.tar.gz", help="also pack the run directory into one archive at the end")
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR: skip notebooks already ok there with the same parameters, code and "
        "environment (its -p values apply unless given again); says which it skips and why it reruns the others",
    )
    run.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="run N notebooks at once, each in its own kernel (default 3, at most the cores; the tables are the "
        "same; on the CPU preset each kernel keeps about one core busy, so 2 on a 2-core machine about halves "
        "the time; 1 runs them one after the other)",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="check everything and print each notebook's parameters; run nothing"
    )
    run.set_defaults(func=_run)

    import gdn_lab.ops

    inv = sub.add_parser(
        "invariance",
        help="one batch-invariance experiment: a target alone vs inside batches, bitwise",
        description="Run one op's batch-invariance experiment for one backend (plus the op's batch-variant "
        "controls) and print the table (JSON lines with --json); a verdict line goes to stderr.",
        epilog=INVARIANCE_EXIT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inv.add_argument("--op", required=True, choices=gdn_lab.ops.spec.names())
    inv.add_argument("--backend", required=True, help="a backend registered for the op (see `gdn-lab env`)")
    inv.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    inv.add_argument("--targets", type=_ints, default=[1, 255, 256, 257], help="target lengths (default 1,255,256,257)")
    inv.add_argument("--batch-sizes", type=_ints, default=[2, 8, 33], help="batch sizes (default 2,8,33)")
    inv.add_argument(
        "--kv-dtype",
        choices=["auto", "bf16", "fp16", "fp32", "fp8"],
        help="KV cache dtype of ops with a KV cache (default: the compute dtype; an error for other ops)",
    )
    inv.add_argument(
        "--dtype", choices=["bf16", "fp16", "fp32"], help="compute dtype (default: fp32 on the CPU, bf16 on a GPU)"
    )
    inv.add_argument(
        "--max-context",
        type=_positive_int,
        help=f"batchmates' lengths are uniform in [1, N] (default: {CPU_MAX_CONTEXT} on the CPU, where Triton runs "
        f"in its interpreter, {GPU_MAX_CONTEXT} on a GPU)",
    )
    inv.add_argument(
        "--shape",
        type=_shape,
        metavar="FIELD=N,...",
        help="the op's shape fields, e.g. num_q_heads=8,num_kv_heads=1 (attention), num_k_heads=4 (GDN), "
        "num_experts=16,top_k=4 (MoE); default on the CPU: small heads (attention 8/2/64, page 16; GDN 4/8/32; "
        "MoE H 64, 8 experts, top 3, I 32), on a GPU: Qwen3 shapes",
    )
    inv.add_argument("--seed", type=_int, default=0)
    inv.add_argument("--json", action="store_true", help="JSON lines, one per row")
    inv.set_defaults(func=_invariance)

    fp = sub.add_parser(
        "fingerprint",
        help="record the regression gate: every case's verdict, output hashes and rule prediction, as a golden file",
        description="Run the preset's gate cases (its `gate:` section) and write a versioned JSON fingerprint: per "
        "case the op, backend, shapes, batch composition, position and seed, the invariance verdict, a 64-bit hash "
        "of every output and state alone and batched, the backend's rule prediction, and the environment. "
        "Exit status: 0 written, 2 bad input.",
    )
    fp.add_argument(
        "--preset", required=True, help="preset name (data/presets/NAME.yaml) or a YAML file with a gate section"
    )
    fp.add_argument("--only", nargs="+", metavar="OP", help="only the cases of these ops")
    fp.add_argument("--out", required=True, help="the fingerprint file to write (JSON)")
    fp.add_argument("--quiet", action="store_true", help="no progress bars")
    fp.set_defaults(func=_fingerprint)

    ck = sub.add_parser(
        "check",
        help="rerun a golden fingerprint's cases; exit 1 when invariance, a control, the numerics or a rule regressed",
        description="Rerun the cases of a fingerprint file and compare. Findings (exit 1): a case that was invariant "
        "no longer is; a control is no longer caught; an output hash changed on the same device, arch and library "
        "version (hashes of autotuned backends are never compared); a predicted switch no longer happens or an "
        "unpredicted one appears; a case no longer runs. On another device, arch or library version only verdicts "
        "are compared, and the output says so. Exit status: 0 everything holds, 1 findings, 2 a missing, malformed "
        "or future-schema golden file (or bad input).",
    )
    ck.add_argument("--golden", required=True, help="the fingerprint file (gdn-lab fingerprint --out)")
    ck.add_argument(
        "--update", action="store_true", help="after an intended change: rewrite the golden file and print what moved"
    )
    ck.add_argument("--quiet", action="store_true", help="no progress bars")
    ck.set_defaults(func=_check)

    kn = sub.add_parser(
        "kernels",
        help="compile our Triton kernels for GPUs this machine lacks (sm_90, gfx942, gfx950): shared memory, registers, spills",
        description="Compile each of gdn_lab's own Triton backends on production-shaped workloads (Qwen per-rank "
        "heads, 16-bit and fp8 KV caches, a small and a large batch) for each target, without its GPU and without "
        "running anything, with the configs the lab would pick on that GPU. One line per kernel: its launch "
        "options, shared memory (AMD: LDS) against the target's limit per program, registers (AMD: VGPRs) and "
        "spills. Runs in Triton's compiled mode (TRITON_INTERPRET is ignored). Exit status: 0 every kernel compiles "
        "and fits, 1 some kernel would not launch on a target, 2 bad input.",
    )
    kn.add_argument(
        "--target", nargs="+", default=["sm_90", "gfx942", "gfx950"], help="targets (default: sm_90 gfx942 gfx950)"
    )
    kn.add_argument("--op", nargs="+", metavar="OP", help="only these ops (default: every op with a Triton backend)")
    kn.add_argument("--out", help="also write every row as CSV")
    kn.add_argument("--quiet", action="store_true", help="no progress bars")
    kn.set_defaults(func=_kernels)

    cp = sub.add_parser(
        "compare",
        help="two suite runs (or two fingerprints) side by side: verdicts, error statistics, cases, environment",
        description="Join two run directories (gdn-lab run --out) or two fingerprint files on their cases (never on "
        "where they ran) and print what changed: verdicts, error statistics beyond --tolerance, cases on one side only, "
        "environment differences; --out writes the HTML diff. Exit status: 0 no differences, 1 differences, 2 bad input.",
    )
    cp.add_argument("a", help="run directory or fingerprint file")
    cp.add_argument("b", help="run directory or fingerprint file")
    cp.add_argument(
        "--tolerance", type=float, default=0.25, help="relative change of an error statistic that counts (0.25)"
    )
    cp.add_argument("--out", help="write the HTML diff here")
    cp.set_defaults(func=_compare)
    return parser


def skip_iri_grammar() -> None:
    """Leave rfc3987_syntax unimported in this process (unless something imported it already).

    jsonschema, which nbformat (papermill's notebook format) imports, loads rfc3987_syntax where
    it is installed (jupyter-events pulls it in) for its optional "iri" format checks, and that
    module builds its grammar on import: 3-5 s of every command that reads a notebook, before
    anything runs. Nothing here checks an IRI: nbformat validates notebooks without format
    checkers. A module marked None in sys.modules raises ImportError, which jsonschema expects.
    """
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    skip_iri_grammar()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"gdn-lab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
