"""Benchmark decode_attention's batch-invariant Triton kernel against torch SDPA and its control.

Paged decode (one query token per request) over uniform batches: B in 1, 8, 64, 256 requests of
ctx in 1k, 4k, 16k, 64k tokens, Hq/Hkv/D in 32/8/128 and 16/2/256, a bf16 or an fp8 (e4m3) KV
cache for our kernels, page sizes 16 and 1. Timed implementations:

- `sdpa`: torch.nn.functional.scaled_dot_product_attention on the dense bf16 cache, q [B, Hq, 1, D]
  and K/V [B, Hkv, ctx, D] with enable_gqa (the upper bound: no page table). The dense K/V are a
  view of the same memory as the paged cache (pages in order), in flash attention's native
  [B, ctx, Hkv, D] layout. The first backend of flash, cuDNN, efficient that accepts the call
  runs (`sdpa_backend`); the math backend is never used.
- `triton`: `decode_attention_triton` (per-request 64/128-token blocks folded into 512- or 1024-token
  nodes; the plan, fine or coarse, from the batch, which never changes a bit; the grid bound
  passed in, so no host synchronisation).
- `control`: `decode_attention_splitk_by_batch` (splits from the batch, FA2's heuristic; the same
  kernels).

Each call is captured in a CUDA graph and its replays are timed with CUDA events, so the numbers
are GPU time, free of Python launch overhead. Bandwidth counts the bytes a call must move: the KV
read (K and V, in the cache's dtype) plus q read and out written; `roofline_frac` divides it by
the H200's 4.26 TB/s copy roofline (measured_h200.md). `ratio_vs_sdpa` = sdpa_us / us (throughput
relative to SDPA, > 1 is faster), `ratio_vs_control` = control_us / us, `fp8_speedup` = our bf16
time / our fp8 time (same case and page size). `splits` is the programs per (request, KV head)
(triton: its plan, `plan` = unit/span blocks) or the batch's split count (control).

Targets (issue 13), in `target` and `target_met`: at B >= 8 and ctx >= 4k, our kernel (bf16 and
fp8 caches, both page sizes) reaches >= 95 % of SDPA's bf16 throughput; everywhere, it is never
more than 10 % slower than the control. Cases whose cache would exceed --max-gb are rows with
status `skipped` and the reason.

Beside the timings the CSV has `invariance` rows: a 4000-token target alone vs among 63 batchmates
of 1..8000 tokens (shuffled pages), for `triton` (must be bitwise equal; its plans alone and batched
are in the note) and the control (expected to differ), per shape, page size and KV dtype, each with
its `verdict` (`mark_invariance`: our equality where the control was not caught is `insensitive`);
and `plans` rows: the same batch under every kind of plan (fine and coarse, short and long spans),
each compared bitwise with the auto plan. `--sweep` adds `sweep` rows: partition-kernel
configurations (block_n x warps x stages x register cap, a few per head dim and dtype) and forced
plans, at B = 1, 8, 64, 256 (ctx 4k and 16k) or, when --batches or --contexts is given, at the
run's batches x contexts, for choosing the fixed table and the plan policy (a few more minutes).
Every row carries the environment fingerprint (`env_*`). Run from the repository root:

    python3 benchmarks/bench_decode_attention.py --out OUT_DIR            # the H200 run
    python3 benchmarks/bench_decode_attention.py --out OUT_DIR --sweep    # plus the config sweep
    python3 benchmarks/bench_decode_attention.py --out OUT_DIR --smoke    # tiny, CPU interpreter
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402  (the scripts' shared helpers)
    ROOFLINE_TBPS,
    add_device_option,
    bench_device,
    fingerprinted,
    invariance_lines,
    mark_invariance,
    time_graph,
    write_csv,
)

SDPA_TARGET = 0.95  # >= 95 % of SDPA's throughput at B >= 8, ctx >= 4k (bf16 and fp8 caches)
CONTROL_TARGET = 1 / 1.1  # never more than 10 % slower than the control
CSV_NAME = "bench_decode_attention.csv"
COLUMNS = [
    "kind",
    "impl",
    "status",
    "Hq",
    "Hkv",
    "D",
    "B",
    "ctx",
    "kv_dtype",
    "page_size",
    "config",
    "splits",
    "plan",
    "sdpa_backend",
    "us",
    "bytes",
    "tb_s",
    "roofline_frac",
    "ratio_vs_sdpa",
    "ratio_vs_control",
    "fp8_speedup",
    "meets_sdpa_target",
    "meets_control_target",
    "target",
    "target_met",
    "max_abs_vs_sdpa",
    "target_len",
    "bitwise_equal",
    "n_diff",
    "max_abs",
    "max_ulp",
    "verdict",
    "note",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_decode_attention.csv")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--batches", default=None, help="batch sizes, e.g. 1,8,64,256")
    p.add_argument("--contexts", default=None, help="context lengths, e.g. 1024,4096,16384,65536")
    p.add_argument("--shapes", default=None, help="Hq/Hkv/D list, e.g. 32/8/128,16/2/256")
    p.add_argument("--kv-dtypes", default="bf16,fp8", help="KV cache dtypes of our kernels: bf16, fp8")
    p.add_argument("--page-sizes", default="16,1", help="page sizes of our kernels")
    p.add_argument("--max-gb", type=float, default=40.0, help="skip cases whose caches exceed this many GB")
    p.add_argument("--rep-ms", type=float, default=25.0, help="replay time budget per measurement (ms)")
    p.add_argument(
        "--sweep",
        action="store_true",
        help="also sweep the partition kernel's configuration and plans (at --batches x --contexts when given)",
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    chosen = a.batches is not None or a.contexts is not None
    a.batches = [int(x) for x in (a.batches or ("2" if a.smoke else "1,8,64,256")).split(",")]
    a.contexts = [int(x) for x in (a.contexts or ("320" if a.smoke else "1024,4096,16384,65536")).split(",")]
    if chosen:  # the sweep runs at the cases asked for
        a.sweep_cases = list(itertools.product(a.batches, a.contexts))
    else:
        a.sweep_cases = (
            [(3, 320)] if a.smoke else [(1, 4096), (1, 16384), (8, 4096), (8, 16384), (64, 4096), (256, 4096)]
        )
    a.shapes = [
        tuple(int(x) for x in s.split("/"))
        for s in (a.shapes or ("4/2/64" if a.smoke else "32/8/128,16/2/256")).split(",")
    ]
    a.kv_dtypes = a.kv_dtypes.split(",")
    a.page_sizes = [int(x) for x in a.page_sizes.split(",")]
    return a


# --- inputs -------------------------------------------------------------------------------------


class Case:
    """A uniform batch: B requests of ctx tokens in one token-major cache, viewable three ways.

    `k`/`v` are [B * ctx, Hkv, D]; page size ps views them as [B * ctx / ps, ps, Hkv, D] with
    pages in order, and SDPA sees [B, Hkv, ctx, D] (a transposed view of the same memory).
    """

    def __init__(self, B: int, ctx: int, hq: int, hkv: int, d: int, device: torch.device, seed: int):
        g = torch.Generator(device=device).manual_seed(seed)
        self.B, self.ctx, self.hq, self.hkv, self.d, self.device = B, ctx, hq, hkv, d, device
        self.q = torch.randn(B, hq, d, device=device, generator=g, dtype=torch.bfloat16)
        self.k = torch.randn(B * ctx, hkv, d, device=device, generator=g, dtype=torch.bfloat16)
        self.v = torch.randn(B * ctx, hkv, d, device=device, generator=g, dtype=torch.bfloat16)
        self.scale = d**-0.5
        self.seq_lens = torch.full((B,), ctx, dtype=torch.int32, device=device)

    def paged(self, page_size: int, k: torch.Tensor, v: torch.Tensor, k_scale=None, v_scale=None) -> dict:
        """The decode_attention arguments over `k`/`v` ([B * ctx, Hkv, D]) with pages in order."""
        pages = self.B * self.ctx // page_size
        per_req = self.ctx // page_size
        shape = (pages, page_size, self.hkv, self.d)
        return {
            "q": self.q,
            "k_cache": k.view(shape),
            "v_cache": v.view(shape),
            "kv_indptr": (torch.arange(self.B + 1, device=self.device) * per_req).to(torch.int32),
            "kv_indices": torch.arange(pages, dtype=torch.int32, device=self.device),
            "seq_lens": self.seq_lens,
            "page_size": page_size,
            "scale": self.scale,
            "k_scale": k_scale,
            "v_scale": v_scale,
        }

    def sdpa(self, backend) -> Callable[[], torch.Tensor]:
        from torch.nn.attention import sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention

        q4 = self.q[:, :, None, :]
        k4 = self.k.view(self.B, self.ctx, self.hkv, self.d).transpose(1, 2)
        v4 = self.v.view(self.B, self.ctx, self.hkv, self.d).transpose(1, 2)

        def call() -> torch.Tensor:
            with sdpa_kernel([backend]):
                return scaled_dot_product_attention(q4, k4, v4, scale=self.scale, enable_gqa=True)[:, :, 0]

        return call

    def kv_bytes(self, elem: int) -> int:
        return 2 * self.B * self.ctx * self.hkv * self.d * elem

    def qo_bytes(self) -> int:
        return 2 * self.B * self.hq * self.d * 2


def sdpa_backends(device: torch.device) -> list:
    from torch.nn.attention import SDPBackend

    if device.type != "cuda":
        return [SDPBackend.MATH]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


# --- the run ------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace):
        from gdn_lab.device import detect
        from gdn_lab.environment import fingerprint

        self.args = args
        self.device = bench_device(args)
        self.fp = fingerprint(self.device)
        self.fp8 = detect(self.device).fp8_dtype
        self.rows: list[dict] = []

    def row(self, **fields) -> dict:
        self.rows.append(fingerprinted(COLUMNS, self.fp, fields))
        return self.rows[-1]

    def kernels(self):
        from gdn_lab.ops.decode_attention import triton_kernels as triton_decode

        return triton_decode

    def mem_gb(self, B: int, ctx: int, hq: int, hkv: int, d: int) -> float:
        """Peak cache memory of a case: the bf16 K/V, their fp8 copy, and the float32 workspace."""
        kv = 2 * B * ctx * hkv * d * 2
        fp8 = kv // 2 if "fp8" in self.args.kv_dtypes else 0
        ws = B * hq * -(-ctx // 256) * (d + 2) * 4
        return (kv + fp8 + ws) / 1e9

    def timing(self, hq: int, hkv: int, d: int, B: int, ctx: int) -> None:
        base = {"kind": "timing", "Hq": hq, "Hkv": hkv, "D": d, "B": B, "ctx": ctx}
        gb = self.mem_gb(B, ctx, hq, hkv, d)
        if gb > self.args.max_gb:
            note = f"caches need {gb:.1f} GB > --max-gb {self.args.max_gb:g}"
            self.row(impl="sdpa", status="skipped", kv_dtype="bf16", note=note, **base)
            for kv, ps, impl in itertools.product(self.args.kv_dtypes, self.args.page_sizes, ("triton", "control")):
                self.row(impl=impl, status="skipped", kv_dtype=kv, page_size=ps, note=note, **base)
            return
        case = Case(B, ctx, hq, hkv, d, self.device, self.args.seed)
        sdpa_us, sdpa_out = self.time_sdpa(case, base)
        ours: dict[tuple[str, int], dict] = {}
        for kv in self.args.kv_dtypes:
            if kv == "fp8":
                one = torch.ones(1, dtype=torch.float32, device=self.device)
                k, v, ks, vs, elem = case.k.to(self.fp8), case.v.to(self.fp8), one, one, 1
            else:
                k, v, ks, vs, elem = case.k, case.v, None, None, 2
            nbytes = case.kv_bytes(elem) + case.qo_bytes()
            for ps in self.args.page_sizes:
                args = case.paged(ps, k, v, ks, vs)
                fields = dict(base, kv_dtype=kv, page_size=ps, bytes=nbytes)
                control = self.time_impl("control", args, fields, sdpa_us, sdpa_out, None)
                ours[(kv, ps)] = self.time_impl("triton", args, fields, sdpa_us, sdpa_out, control)
            del k, v
        for ps in self.args.page_sizes:
            bf16, fp8 = ours.get(("bf16", ps)), ours.get(("fp8", ps))
            if bf16 and fp8 and bf16["us"] and fp8["us"]:
                fp8["fp8_speedup"] = round(bf16["us"] / fp8["us"], 4)
        del case

    def time_sdpa(self, case: Case, base: dict) -> tuple[float | None, torch.Tensor | None]:
        errors = []
        for backend in sdpa_backends(self.device):
            fn = case.sdpa(backend)
            try:
                us, out = time_graph(fn, self.device, self.args.rep_ms)
            except RuntimeError as exc:  # this backend does not take the call: try the next
                errors.append(f"{backend.name}: {str(exc).splitlines()[0][:120]}")
                continue
            nbytes = case.kv_bytes(2) + case.qo_bytes()
            self.row(
                impl="sdpa", status="ok", kv_dtype="bf16", sdpa_backend=backend.name, us=us, bytes=nbytes,
                **self.bandwidth(nbytes, us), note="; ".join(errors), **base,
            )  # fmt: skip
            return us, out
        self.row(impl="sdpa", status="error", kv_dtype="bf16", note="; ".join(errors), **base)
        return None, None

    @staticmethod
    def bandwidth(nbytes: int, us: float) -> dict:
        tbs = nbytes / us / 1e6
        return {"tb_s": round(tbs, 4), "roofline_frac": round(tbs / ROOFLINE_TBPS, 4)}

    def time_impl(self, impl, args, fields, sdpa_us, sdpa_out, control_us) -> dict | None:
        """Time one implementation on one case; the row (None when the call failed)."""
        mod = self.kernels()
        B, ctx, d, hkv = fields["B"], fields["ctx"], fields["D"], fields["Hkv"]
        cfg = mod.decode_config(d, args["q"].dtype, args["k_cache"].dtype)
        sms = self.fp["num_sms"]
        if impl == "triton":
            plan = mod.decode_plan(B, hkv, ctx, sms, cfg)

            def fn():
                return mod.decode_attention_triton(**args, max_seq_len=ctx)

            extra = {
                "config": config_label(cfg),
                "splits": -(-ctx // (plan.span_blocks * cfg.block_n)),
                "plan": plan_label(plan),
            }
        else:

            def fn():
                return mod.decode_attention_splitk_by_batch(**args, max_seq_len=ctx)

            extra = {"config": config_label(cfg), "splits": mod.splits_for_batch(B, hkv, d, ctx, sms)}
        try:
            us, out = time_graph(fn, self.device, self.args.rep_ms)
        except Exception as exc:  # a failing case is a row, the run goes on
            self.row(impl=impl, status="error", note=_err(exc), **extra, **fields)
            return None
        r = self.row(impl=impl, status="ok", us=us, **self.bandwidth(fields["bytes"], us), **extra, **fields)
        if sdpa_out is not None:
            r["max_abs_vs_sdpa"] = float((out.float() - sdpa_out.float()).abs().max())
        if sdpa_us:
            r["ratio_vs_sdpa"] = round(sdpa_us / us, 4)
        if control_us:
            r["ratio_vs_control"] = round(control_us["us"] / us, 4)
        if impl == "triton":
            targets = []
            if B >= 8 and ctx >= 4096 and sdpa_us:
                r["meets_sdpa_target"] = sdpa_us / us >= SDPA_TARGET
                targets.append((f">={SDPA_TARGET:g}x sdpa", r["meets_sdpa_target"]))
            if control_us:
                r["meets_control_target"] = control_us["us"] / us >= CONTROL_TARGET
                targets.append((f">={CONTROL_TARGET:.3f}x control", r["meets_control_target"]))
            r["target"] = "; ".join(t for t, _ in targets)
            r["target_met"] = all(m for _, m in targets) if targets else ""
        return r

    def invariance(self, hq: int, hkv: int, d: int) -> None:
        """A target alone vs among batchmates of other lengths in shuffled pages, per backend; every plan."""
        from gdn_lab.cache import build_paged_kv, random_kv
        from gdn_lab.experiments.compare import compare

        mod = self.kernels()
        smoke = self.args.smoke
        target_len, mates, max_mate = (300, 2, 400) if smoke else (4000, 63, 8000)
        g = torch.Generator().manual_seed(self.args.seed + 1)
        lens = [int(x) for x in torch.randint(1, max_mate + 1, (mates,), generator=g)]
        pos = mates // 2
        lens = lens[:pos] + [target_len] + lens[pos:]
        kvs = [random_kv(n, hkv, d, dtype=torch.bfloat16, device=self.device, seed=100 + i) for i, n in enumerate(lens)]
        kvs[pos] = random_kv(target_len, hkv, d, dtype=torch.bfloat16, device=self.device, seed=7)
        q = torch.randn(len(lens), hq, d, generator=g).to(self.device, torch.bfloat16)
        sms = self.fp["num_sms"]
        for kv, ps in itertools.product(self.args.kv_dtypes, self.args.page_sizes):
            kv_dtype = self.fp8 if kv == "fp8" else None
            alone = build_paged_kv([kvs[pos][0]], [kvs[pos][1]], page_size=ps, kv_dtype=kv_dtype, shuffle=False)
            batch = build_paged_kv(
                [k for k, _ in kvs], [v for _, v in kvs], page_size=ps, kv_dtype=kv_dtype, seed=3, spare_pages=7
            )
            base = {"kind": "invariance", "Hq": hq, "Hkv": hkv, "D": d, "B": len(lens), "kv_dtype": kv}
            cfg = mod.decode_config(d, q.dtype, batch.k_cache.dtype)
            splits = {
                "triton": f"plan alone {plan_label(mod.decode_plan(1, hkv, target_len, sms, cfg))}, "
                f"batched {plan_label(mod.decode_plan(len(lens), hkv, max(lens), sms, cfg))}",
                "control": f"control splits alone {mod.splits_for_batch(1, hkv, d, target_len, sms)}, "
                f"batched {mod.splits_for_batch(len(lens), hkv, d, max(lens), sms)}",
            }
            for impl, fn in (
                ("triton", mod.decode_attention_triton),
                ("control", mod.decode_attention_splitk_by_batch),
            ):
                try:
                    out_a = fn(q[pos : pos + 1], **alone.op_kwargs(), scale=d**-0.5)
                    out_b = fn(q, **batch.op_kwargs(), scale=d**-0.5)
                except Exception as exc:
                    self.row(impl=impl, status="error", page_size=ps, target_len=target_len, note=_err(exc), **base)
                    continue
                self.row(
                    impl=impl, status="ok", page_size=ps, target_len=target_len,
                    note=f"target at position {pos} among batchmates of 1..{max_mate} tokens; {splits[impl]}",
                    **compare(out_a[0], out_b[pos]), **base,
                )  # fmt: skip
            self.plan_rows(q, batch, cfg, dict(base, kind="plans", page_size=ps), max(lens))

    def plan_rows(self, q, batch, cfg, base: dict, max_len: int) -> None:
        """The whole batch under every kind of plan, each compared bitwise with the auto plan."""
        from gdn_lab.experiments.compare import compare

        mod = self.kernels()
        d = q.shape[-1]
        kw = dict(batch.op_kwargs(), scale=d**-0.5, max_seq_len=max_len)
        try:
            ref = mod.decode_attention_triton(q, **kw)
        except Exception as exc:
            self.row(impl="triton", status="error", note=_err(exc), **base)
            return
        r = cfg.node_blocks
        nodes = -(-max_len // cfg.node_tokens)
        plans = [mod.DecodePlan(1, 1), mod.DecodePlan(1, 3), mod.DecodePlan(r, r), mod.DecodePlan(r, r * nodes)]
        for plan in plans:
            try:
                out = mod.decode_attention_triton(q, **kw, plan=plan)
            except Exception as exc:
                self.row(impl="triton", status="error", plan=plan_label(plan), note=_err(exc), **base)
                continue
            self.row(
                impl="triton", status="ok", plan=plan_label(plan), note="whole batch vs the auto plan",
                **compare(ref, out), **base,
            )  # fmt: skip

    def sweep(self, hq: int, hkv: int, d: int) -> None:
        """Partition-kernel configurations and forced plans at the sweep's cases (tuning input)."""
        mod = self.kernels()
        smoke = self.args.smoke
        for B, ctx in self.args.sweep_cases:
            case = Case(B, ctx, hq, hkv, d, self.device, self.args.seed)
            base = {"kind": "sweep", "impl": "triton", "Hq": hq, "Hkv": hkv, "D": d, "B": B, "ctx": ctx}
            for kv, ps in itertools.product(self.args.kv_dtypes, self.args.page_sizes):
                k, v = (case.k.to(self.fp8), case.v.to(self.fp8)) if kv == "fp8" else (case.k, case.v)
                one = torch.ones(1, device=self.device) if kv == "fp8" else None
                args = case.paged(ps, k, v, one, one)
                nbytes = case.kv_bytes(k.element_size()) + case.qo_bytes()
                default = mod.decode_config(d, args["q"].dtype, args["k_cache"].dtype)
                configs = _sweep_configs(mod, d, kv, smoke)
                trials = [(cfg, None) for cfg in (configs if default in configs else [default, *configs])]
                trials += [(default, plan) for plan in _sweep_plans(mod, default, ctx)]
                for cfg, plan in trials:
                    fields = dict(base, kv_dtype=kv, page_size=ps, config=config_label(cfg), bytes=nbytes)
                    fields["plan"] = plan_label(plan or mod.decode_plan(B, hkv, ctx, self.fp["num_sms"], cfg))
                    fields["note"] = "forced plan" if plan else ("default config" if cfg == default else "")
                    try:
                        us, _ = time_graph(
                            lambda cfg=cfg, plan=plan, args=args, ctx=ctx: mod.decode_attention_triton(
                                **args, max_seq_len=ctx, config=cfg, plan=plan
                            ),
                            self.device,
                            self.args.rep_ms,
                        )
                    except Exception as exc:
                        fields["note"] = _err(exc)
                        self.row(status="error", **fields)
                        continue
                    self.row(status="ok", us=us, **self.bandwidth(nbytes, us), **fields)
                del k, v
            del case
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def run(self) -> Path:
        for hq, hkv, d in self.args.shapes:
            for B, ctx in itertools.product(self.args.batches, self.args.contexts):
                t0 = time.perf_counter()
                self.timing(hq, hkv, d, B, ctx)
                print(f"[bench] {hq}/{hkv}/{d} B={B} ctx={ctx}: {time.perf_counter() - t0:.1f}s", flush=True)
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            self.invariance(hq, hkv, d)
            if self.args.sweep:
                self.sweep(hq, hkv, d)
        return self.write()

    def write(self) -> Path:
        mark_invariance(self.rows, ("Hq", "Hkv", "D", "kv_dtype", "page_size"), lambda r: r["impl"] == "control")
        return write_csv(self.rows, COLUMNS + [f"env_{k}" for k in self.fp], Path(self.args.out), CSV_NAME)


def config_label(cfg) -> str:
    cap = f" maxnreg={cfg.max_registers}" if cfg.max_registers else ""
    return f"block_n={cfg.block_n} node_blocks={cfg.node_blocks} warps={cfg.num_warps} stages={cfg.num_stages}{cap}"


def plan_label(plan) -> str:
    return f"unit={plan.unit_blocks} span={plan.span_blocks}" if plan else ""


def _sweep_configs(mod, d: int, kv: str, smoke: bool) -> list:
    """Candidate partition-kernel configs per head dim and cache dtype (sm_90 compiles without spills in loops)."""
    if smoke:
        return [mod.DecodeConfig(64, 4, 1, 1)]  # beside the device's default (the sweep adds it)
    c = mod.DecodeConfig
    candidates = {
        (128, "bf16"): [c(64, 16, 4, 5, 128), c(64, 16, 4, 3), c(128, 8, 4, 3), c(128, 8, 8, 3, 128), c(64, 16, 4, 4)],
        (256, "bf16"): [c(64, 16, 8, 3, 128), c(64, 16, 8, 3), c(64, 16, 8, 5), c(32, 32, 4, 3), c(32, 32, 4, 5)],
        (128, "fp8"): [c(128, 8, 8, 5, 128), c(128, 8, 4, 5), c(64, 16, 4, 5), c(128, 8, 4, 3), c(64, 16, 4, 3)],
        (256, "fp8"): [
            c(64, 16, 8, 5, 128),
            c(64, 16, 8, 3, 128),
            c(64, 16, 8, 3),
            c(32, 32, 4, 3),
            c(32, 32, 8, 5, 128),
        ],
    }
    return candidates.get((d, kv), [])


def _sweep_plans(mod, cfg, ctx: int) -> list:
    """Forced plans: every plan `decode_plan` can pick for a request of ctx tokens (fine spans of each
    divisor of a node's blocks, coarse spans of each divisor of its nodes), so that
    `replay_decode_plans.py` can judge another rule from the run."""
    r = cfg.node_blocks
    nodes = -(-ctx // cfg.node_tokens)
    fine = [mod.DecodePlan(1, s) for s in range(1, r + 1) if r % s == 0]
    return fine + [mod.DecodePlan(r, s * r) for s in range(1, nodes + 1) if nodes % s == 0]


def _err(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def summary(rows: list[dict]) -> str:
    """The log's short table: per shape, cache and page size, B x ctx cells of our ratios vs SDPA and
    vs the control ('*' = target missed); then the targets met, fp8's speed-up, invariance, sweep, errors."""
    lines = []
    timing = [r for r in rows if r["kind"] == "timing" and r["impl"] == "triton" and r["status"] == "ok"]
    shapes = dict.fromkeys((r["Hq"], r["Hkv"], r["D"]) for r in timing)
    ctxs = sorted({int(r["ctx"]) for r in timing})
    for hq, hkv, d in shapes:
        for kv, ps in dict.fromkeys((r["kv_dtype"], r["page_size"]) for r in timing):
            mine = [
                r for r in timing if (r["Hq"], r["Hkv"], r["D"], r["kv_dtype"], r["page_size"]) == (hq, hkv, d, kv, ps)
            ]
            cells = {(int(r["B"]), int(r["ctx"])): r for r in mine}
            head = f"{hq}/{hkv}/{d} {kv} page {ps}: vs sdpa / vs control (fp8: x bf16)"
            lines.append(head + "".join(f" | ctx {c}" for c in ctxs))
            for B in sorted({b for b, _ in cells}):
                row = [f"  B={B:<4}"]
                for c in ctxs:
                    r = cells.get((B, c))
                    if r is None:
                        row.append(" | -")
                        continue
                    mark = "*" if r["target_met"] is False else " "
                    fp8 = f" x{r['fp8_speedup']:.2f}" if r["fp8_speedup"] != "" else ""
                    row.append(f" | {_fmt(r['ratio_vs_sdpa'])}/{_fmt(r['ratio_vs_control'])}{mark}{fp8}")
                lines.append("".join(row))
    for col in ("meets_sdpa_target", "meets_control_target", "target_met"):
        vals = [r[col] for r in rows if r[col] != ""]
        lines.append(f"{col}: {sum(bool(v) for v in vals)}/{len(vals)} met")
    lines += invariance_lines(rows)
    plans = [r for r in rows if r["kind"] == "plans" and r["status"] == "ok"]
    if plans:
        equal = sum(r["bitwise_equal"] is True for r in plans)
        lines.append(f"plans triton: bitwise equal in {equal}/{len(plans)}")
    lines += sweep_summary(rows)
    errors = [r for r in rows if r["status"] == "error"]
    lines.append(f"errors: {len(errors)}; skipped: {sum(r['status'] == 'skipped' for r in rows)}")
    lines += [f"  {r['kind']} {r['impl']} B={r['B']} ctx={r['ctx']} {r['kv_dtype']}: {r['note']}" for r in errors]
    return "\n".join(lines)


def sweep_summary(rows: list[dict]) -> list[str]:
    """Per (D, cache, page size): each swept config's and forced plan's geometric-mean time over the
    default's (< 1 is faster), over the cases where both ran."""
    sweep = [r for r in rows if r["kind"] == "sweep" and r["status"] == "ok"]
    lines = []
    for key in dict.fromkeys((r["D"], r["kv_dtype"], r["page_size"]) for r in sweep):
        mine = [r for r in sweep if (r["D"], r["kv_dtype"], r["page_size"]) == key]
        default = {(r["B"], r["ctx"]): r["us"] for r in mine if r["note"] == "default config"}
        trials: dict[str, list[float]] = {}
        for r in mine:
            if (r["B"], r["ctx"]) in default and r["note"] != "default config":
                name = f"plan {r['plan']}" if r["note"] == "forced plan" else r["config"]
                trials.setdefault(name, []).append(r["us"] / default[(r["B"], r["ctx"])])
        lines.append(f"sweep D={key[0]} {key[1]} page {key[2]} (geomean time / default config, auto plan):")
        for name, ratios in sorted(trials.items(), key=lambda kv: _geomean(kv[1])):
            lines.append(f"  {_geomean(ratios):.3f} over {len(ratios)}: {name}")
    return lines


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _fmt(x) -> str:
    return f"{x:.2f}" if isinstance(x, float) else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench_device(args)  # before any kernel module is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    bench = Bench(args)
    t0 = time.perf_counter()
    try:
        path = bench.run()
    except Exception:
        traceback.print_exc()
        path = bench.write()
        print(f"[bench] FAILED part-way; partial CSV at {path}")
        return 1
    print(summary(bench.rows))
    print(f"[bench] wrote {len(bench.rows)} rows to {path} in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
