"""Benchmark GDN prefill: the fused Triton layer against the unfused chains, the chunked Triton delta rule against fla.

Qwen3-Next at TP4 and at TP1: HK/HV = 4/8 and 16/32 (`--heads`), K = V = 128, conv width 4, bf16
activations, fp32 states, fp8 on; T in 1k, 4k, 16k, 64k total tokens, split into 1, 4 or 16
equal-length sequences (varlen, cu_seqlens).

gdn_layer_prefill (conv1d + split + gates + L2 norm + delta rule + gated RMSNorm + group-128 fp8):
- `triton-fused`: ours (conv, prepare, state and output launches), conv and delta states updated in place;
- `torch-chain`: the lab's unfused torch reference (Python loops over sequences and chunks), timed
  ONCE per shape after one warm-up call at the first shape (`timing` = "once"): do_bench would take
  minutes at 16k tokens;
- `fla-chain` (fla installed): fla's causal_conv1d (varlen, initial/final state) + fla's
  chunk_gated_delta_rule (gates, beta sigmoid and L2 norm in kernel, V-first state) + fla's
  rms_norm_gated, with torch for the q/k/v split, the state gathers/scatters and the fp8 quantization.
gdn_prefill (the delta rule alone, raw a/b gates, VK state pool):
- `triton`: ours (chunk 64); `torch` (once, as above);
- `fla-chunk`: chunk_gated_delta_rule with the same in-kernel gates, L2 norm and V-first state;
- `fla-recurrent`: fused_recurrent_gated_delta_rule, same flags: the token-by-token kernel, the data
  point for chunked vs recurrent prefill.
The fla calls include the gather of the initial states from the pool and the scatter of the final
ones (what the op contract requires), and run with FLA_DISABLE_BACKEND_DISPATCH=1 as the lab's fla
backend does.

Columns: `us` (do_bench median on the GPU, one call on the CPU), `tokens_per_s`,
`speedup_vs_unfused` (the torch chain's or torch reference's us / this us) and `speedup_vs_fla`
(fla-chain's or fla-chunk's us / this us), parity against the torch reference on fresh states
(`max_abs_vs_ref`, `rel_mae_vs_ref` of the output, `state_max_abs_vs_ref` of the delta state), and
an `invariance` section (`invariance_cases`): a target alone vs batched, bitwise (`bitwise_equal`),
for ours and the controls (which must differ): the registered ones (the chunk size by AITER's rule)
and a bench-local one that sizes the state recurrence's segments by the batch; a target of 1000
tokens first among 15 of 100, and one the recurrence cuts into segments at a random position among 7
of random lengths (1 token to twice the target); each row's `verdict` within its case
(`mark_invariance`: our equality where no control was caught is `insensitive`). The gates' A runs
from 0.01 to 16 over the heads (`decay_gates`), so that some heads remember across chunks and
segments. Every row carries the environment fingerprint (`env_*`).

How close each timing is to the H200's limit: `bytes_moved` (every input and output tensor once,
the in-place states read and written), `flops` (the chunked delta rule's dots at chunk 64:
HV T (64 (6K + 4V) + 6 K V): the algorithm's work, the same for fla; the segment maps' extra dots
of sequences cut by our state recurrence, the layer's conv, norms and fp8 are left out) and
`limit_frac` = the
larger of bytes over 4.26 TB/s and flops over the measured bf16 peak (the fastest cuBLAS bf16
matmul in data/bench/h200/bench_matmul.csv), divided by the measured time.

    python3 benchmarks/bench_gdn_prefill.py --out OUT_DIR          # the H200 run (~2-3 minutes)
    python3 benchmarks/bench_gdn_prefill.py --out OUT_DIR --smoke  # tiny shapes, CPU interpreter
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402  (the scripts' shared helpers)
    ROOFLINE_TBPS,
    add_device_option,
    bench_device,
    bf16_peak_tflops,
    invariance_lines,
    mark_invariance,
    sync,
    write_csv,
)

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # read when fla is imported (see gated_delta_rule/fla.py)

CSV_NAME = "bench_gdn_prefill.csv"
COLUMNS = [
    "kind",
    "op",
    "impl",
    "tokens",
    "batch",
    "seq_len",
    "HK",
    "HV",
    "head_dim",
    "dtype",
    "us",
    "timing",
    "tokens_per_s",
    "speedup_vs_unfused",
    "speedup_vs_fla",
    "max_abs_vs_ref",
    "rel_mae_vs_ref",
    "state_max_abs_vs_ref",
    "bytes_moved",
    "flops",
    "limit_frac",
    "bitwise_equal",
    "n_diff",
    "max_abs",
    "verdict",
    "note",
]
LAYER, PREFILL = "gdn_layer_prefill", "gdn_prefill"


@dataclass(frozen=True)
class Shape:
    hk: int
    hv: int
    d: int
    width: int = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_gdn_prefill.csv")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU interpreter; see --device)")
    add_device_option(p)
    p.add_argument("--tokens", default=None, help="total tokens, e.g. 1024,4096,16384")
    p.add_argument("--batches", default=None, help="sequences per batch (equal lengths), e.g. 1,4,16")
    p.add_argument(
        "--heads", default=None, help="HK/HV pairs, e.g. 4/8,16/32 (default: both; smoke: 1/2); K = V = 128 (smoke 64)"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.tokens = [int(t) for t in (args.tokens or ("64" if args.smoke else "1024,4096,16384,65536")).split(",")]
    args.batches = [int(b) for b in (args.batches or ("1,2" if args.smoke else "1,4,16")).split(",")]
    args.shapes = parse_heads(p, args.heads or ("1/2" if args.smoke else "4/8,16/32"), 64 if args.smoke else 128)
    return args


def parse_heads(p: argparse.ArgumentParser, text: str, d: int) -> list[Shape]:
    """--heads "HK/HV,...": one Shape per pair; HV a multiple of HK (GQA), both >= 1."""
    try:
        pairs = [tuple(int(x) for x in item.split("/")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(h) != 2 or min(h) < 1 or h[1] % h[0] for h in pairs):
        p.error(
            f"--heads {text!r}: expected HK/HV pairs, both >= 1 and HV a multiple of HK, comma-separated (e.g. 4/8,16/32)"
        )
    return [Shape(hk, hv, d) for hk, hv in pairs]


# --- inputs ------------------------------------------------------------------------------------


def _sequences(
    lengths: list[int], seeds: list[int], device, make: Callable[[torch.Generator, int], list[torch.Tensor]]
):
    """Per-sequence tensors from per-sequence seeds, drawn on `device`, concatenated field by field.

    A sequence's content depends only on its seed and length, so a target given its seed anywhere in
    a batch is the same request as the target alone.
    """
    per = [make(torch.Generator(device).manual_seed(sd), n) for sd, n in zip(seeds, lengths, strict=True)]
    return [torch.cat([p[f] for p in per]) for f in range(len(per[0]))]


def decay_gates(hv: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log, dt_bias) [hv] float32: A from 0.01 to 16 in geometric steps over the heads (the range
    of HF Qwen3-Next's U(0.01, 16) init, spread so that every batch has heads of long memory: about
    1 % decay per token at A 0.01), dt_bias 1 (HF's init). With the random A_log of mean 0 used
    before, the state faded within a chunk: at the smoke shapes segments of 1, 2, 3 or 5 chunks
    gave the same bits, so the entering state was invisible in them."""
    A = torch.logspace(math.log10(0.01), math.log10(16.0), hv, dtype=torch.float64)
    return A.log().float().to(device), torch.ones(hv, device=device)


def layer_inputs(
    lengths: list[int], shape: Shape, device, seed: int, dtype=torch.bfloat16, seeds: list[int] | None = None
) -> dict[str, Any]:
    """Validated gdn_layer_prefill arguments: slots 0..N-1, initial states on, fp8 on (the device's
    format); sequence i drawn from seeds[i] (default seed + i), the weights from seed - 1."""
    from gdn_lab.device import detect
    from gdn_lab.ops.gdn_layer_prefill import validate

    hk, hv, d, w = shape.hk, shape.hv, shape.d, shape.width
    n, conv_dim = len(lengths), 2 * hk * d + hv * d

    def sequence(g, length):
        return [
            torch.randn(length, hk * (2 * d + 2 * (hv // hk) * d), generator=g, device=device).to(dtype),
            torch.randn(length, 2 * hv, generator=g, device=device).to(dtype),
            torch.randn(1, conv_dim, w - 1, generator=g, device=device).to(dtype),
            0.1 * torch.randn(1, hv, d, d, generator=g, device=device),
        ]

    seeds = seeds or [seed + i for i in range(n)]
    qkvz, ba, conv_state, delta_state = _sequences(lengths, seeds, device, sequence)
    g = torch.Generator().manual_seed(seed - 1)  # the layer's weights, shared by every sequence

    def weight(*size, scale=1.0, dt=dtype):
        return (scale * torch.randn(*size, generator=g)).to(device=device, dtype=dt)

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return validate(
        qkvz, ba, conv_state, delta_state, torch.arange(n, dtype=torch.int32, device=device), cu,
        torch.ones(n, dtype=torch.bool, device=device), weight(conv_dim, w, scale=0.5), weight(conv_dim, scale=0.1),
        *decay_gates(hv, device), weight(d, scale=0.1) + 1.0,
        num_k_heads=hk, num_v_heads=hv, head_dim=d, quantize_fp8=True, fp8_dtype=detect(device).fp8_dtype,
    )  # fmt: skip


def prefill_inputs(
    lengths: list[int], shape: Shape, device, seed: int, dtype=torch.bfloat16, seeds: list[int] | None = None
) -> dict[str, Any]:
    """Validated gdn_prefill arguments: raw gates, slots 0..N-1 of a pool of random states; seeds as
    `layer_inputs`'."""
    from gdn_lab.ops.gdn_prefill import validate

    hk, hv, d = shape.hk, shape.hv, shape.d

    def sequence(g, length):
        return [
            *(torch.randn(length, h, d, generator=g, device=device).to(dtype) for h in (hk, hk, hv)),
            *(torch.randn(length, hv, generator=g, device=device).to(dtype) for _ in range(2)),
            0.1 * torch.randn(1, hv, d, d, generator=g, device=device),
        ]

    seeds = seeds or [seed + i for i in range(len(lengths))]
    q, k, v, a, b, state = _sequences(lengths, seeds, device, sequence)
    A_log, dt_bias = decay_gates(hv, device)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.arange(len(lengths), dtype=torch.int32, device=device)
    return validate(q, k, v, a, b, A_log, dt_bias, cu, state, slots)


def fresh(args: dict[str, Any]) -> dict[str, Any]:
    """A copy whose state pools are private (the calls update them in place)."""
    return {k: v.clone() if k in ("state", "conv_state", "delta_state") else v for k, v in args.items()}


# --- fla chains ----------------------------------------------------------------------------------


def fla_available() -> tuple[bool, str]:
    if importlib.util.find_spec("fla") is None:
        return False, "fla-core not installed"
    if not torch.cuda.is_available():
        return False, "fla's chunk kernels need a GPU"
    return True, ""


def fla_delta_rule(kernel: str, q, k, v, a, b, A_log, dt_bias, cu64, state, slots, scale):
    """fla's delta rule on [T, H, D] inputs with raw gates; state[slots] is the initial state and receives the final."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    fn = chunk_gated_delta_rule if kernel == "chunk" else fused_recurrent_gated_delta_rule
    o, final = fn(
        q=q[None], k=k[None], v=v[None], g=a[None], beta=b[None], scale=scale, initial_state=state[slots],
        output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
        dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu64,
    )  # fmt: skip
    state[slots] = final
    return o[0]


def fla_prefill(kernel: str, args: dict[str, Any]) -> Callable[[], torch.Tensor]:
    cu64, slots = args["cu_seqlens"].long(), args["slots"].long()
    keys = ("q", "k", "v", "a", "b", "A_log", "dt_bias")

    def run():
        return fla_delta_rule(kernel, *(args[k] for k in keys), cu64, args["state"], slots, args["scale"])

    return run


def fla_layer(args: dict[str, Any]) -> Callable[[], tuple]:
    """The unfused chain on fla's kernels: conv1d, split, delta rule, gated RMSNorm (+ torch glue, fp8)."""
    import torch.nn.functional as F
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.modules.norm.fused_norm_gate import rms_norm_gated

    from gdn_lab.ops.gdn_layer_prefill.reference import split_qkvz
    from gdn_lab.quant import FP8_GROUP, quantize_groups

    hk, hv, d = args["num_k_heads"], args["num_v_heads"], args["head_dim"]
    cu64, slots = args["cu_seqlens"].long(), args["cache_indices"].long()
    keep = args["has_initial_state"][:, None, None]

    def run():
        T = args["projected_qkvz"].shape[0]
        q, k, v, z, b, a = split_qkvz(args["projected_qkvz"], args["projected_ba"], hk, hv, d)
        mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=1)
        history = F.pad(args["conv_state"][slots] * keep, (1, 0))  # fla's conv state holds W inputs
        y, final = causal_conv1d(
            mixed[None], weight=args["conv_weight"], bias=args["conv_bias"], initial_state=history,
            output_final_state=True, activation="silu", cu_seqlens=cu64,
        )  # fmt: skip
        args["conv_state"][slots] = final[..., 1:].to(args["conv_state"].dtype)
        qc, kc, vc = y[0].split([hk * d, hk * d, hv * d], dim=1)
        o = fla_delta_rule(
            "chunk", qc.reshape(T, hk, d), kc.reshape(T, hk, d), vc.reshape(T, hv, d), a, b, args["A_log"],
            args["dt_bias"], cu64, args["delta_state"], slots, d**-0.5,
        )  # fmt: skip
        normalized = rms_norm_gated(
            o.reshape(T * hv, d), z.reshape(T * hv, d), args["norm_weight"], None, activation="swish", eps=args["eps"]
        ).reshape(T, hv, d)
        quantized, scales = quantize_groups(normalized.reshape(T, -1), args["fp8_dtype"], FP8_GROUP)
        return normalized, quantized, scales

    return run


# --- timing and comparison -----------------------------------------------------------------------


def call_once(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """(microseconds, result) of one synchronised call."""
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    return 1e6 * (time.perf_counter() - start), result


def do_bench_us(fn: Callable[[], object]) -> float:
    import triton.testing

    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def first_output(result):
    return result[0] if isinstance(result, tuple) else result


STATES = {LAYER: ("delta_state", "conv_state"), PREFILL: ("state",)}


def ideal_work(op: str, args: dict[str, Any], outputs: Any) -> dict[str, float]:
    """The case's bytes moved and delta-rule FLOPs (see the module docstring)."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    tensors = [v for v in args.values() if isinstance(v, torch.Tensor)] + [
        o for o in outs if isinstance(o, torch.Tensor)
    ]
    written = [args[k] for k in STATES[op]]
    nbytes = sum(t.numel() * t.element_size() for t in tensors + written)
    state = args[STATES[op][0]]  # [slots, HV, V, K]
    hv, v, k = state.shape[1:]
    tokens = args["cu_seqlens"][-1].item()
    return {"bytes_moved": nbytes, "flops": hv * tokens * (64 * (6 * k + 4 * v) + 6 * k * v)}


def limit_frac(work: dict[str, float], us: float, peak_tflops: float | None) -> float:
    """max(bytes / roofline, flops / peak) / time: the fraction of the device's limit reached."""
    floor = work["bytes_moved"] / (ROOFLINE_TBPS * 1e12)
    if peak_tflops:
        floor = max(floor, work["flops"] / (peak_tflops * 1e12))
    return floor / (us * 1e-6)


def parity(out, state, ref_out, ref_state) -> dict[str, float]:
    diff = (out.float() - ref_out.float()).abs()
    return {
        "max_abs_vs_ref": float(diff.max()),
        "rel_mae_vs_ref": float(diff.mean() / ref_out.float().abs().mean()),
        "state_max_abs_vs_ref": float((state - ref_state).abs().max()),
    }


class Bench:
    def __init__(self, args: argparse.Namespace):
        from gdn_lab.environment import fingerprint

        self.args = args
        self.device = bench_device(args)
        self.env = {f"env_{k}": v for k, v in fingerprint(self.device).items()}
        self.rows: list[dict[str, Any]] = []
        self.fla_ok, self.fla_reason = fla_available()
        self.peak_tflops = bf16_peak_tflops()
        self.shape = args.shapes[0]  # the shape being measured (main sets each in turn)

    def row(self, **kw: Any) -> None:
        s = self.shape
        # heads: the printed summary's label (the CSV has HK and HV)
        base = {"HK": s.hk, "HV": s.hv, "heads": f"{s.hk}/{s.hv}", "head_dim": s.d, "dtype": "bfloat16"}
        self.rows.append({**base, **kw, **self.env})

    def impls(self, op: str, args: dict[str, Any]) -> dict[str, tuple[Callable[[dict], Callable[[], Any]], bool]]:
        """name -> (make a call on given args, timed once)."""
        from gdn_lab.routing import get

        def backend(name):
            run = get(op, name).run
            return lambda a: lambda: run(**a)

        if op == LAYER:
            out = {"torch-chain": (backend("torch"), True), "triton-fused": (backend("triton-fused"), False)}
            if self.fla_ok:
                out["fla-chain"] = (fla_layer, False)
        else:
            out = {"torch": (backend("torch"), True), "triton": (backend("triton"), False)}
            if self.fla_ok:
                out["fla-chunk"] = (lambda a: fla_prefill("chunk", a), False)
                out["fla-recurrent"] = (lambda a: fla_prefill("recurrent", a), False)
        return out

    def timing(self, op: str, tokens: int, batch: int) -> None:
        lengths = [tokens // batch] * batch
        make = layer_inputs if op == LAYER else prefill_inputs
        args = make(lengths, self.shape, self.device, self.args.seed)
        state_key = "delta_state" if op == LAYER else "state"
        impls = self.impls(op, args)
        results: dict[str, dict[str, Any]] = {}
        reference = None
        for name, (factory, once) in impls.items():
            try:
                is_reference = name in ("torch", "torch-chain")  # first in `impls`
                results[name] = self.measure(factory, once, args, state_key, reference, is_reference)
            except Exception as exc:  # one failing implementation (say fla's API moved) must not lose the rest
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{op} {name} T={tokens} B={batch}: {results[name]['error']}", file=sys.stderr)
                continue
            if is_reference:
                reference = results[name]
        work = next((ideal_work(op, args, r["outputs"]) for r in results.values() if "outputs" in r), None)
        unfused = results["torch-chain" if op == LAYER else "torch"].get("us")
        fla = results.get("fla-chain" if op == LAYER else "fla-chunk", {}).get("us")
        for name, r in results.items():
            common = {
                "kind": "timing",
                "op": op,
                "impl": name,
                "tokens": tokens,
                "batch": batch,
                "seq_len": tokens // batch,
            }
            if "error" in r:
                self.row(**common, note=r["error"])
                continue
            self.row(
                **common, us=r["us"], timing=r["timing"], tokens_per_s=tokens / (r["us"] * 1e-6),
                speedup_vs_unfused=(unfused / r["us"]) if unfused else "", speedup_vs_fla=(fla / r["us"]) if fla else "",
                max_abs_vs_ref=r["max_abs_vs_ref"], rel_mae_vs_ref=r["rel_mae_vs_ref"],
                state_max_abs_vs_ref=r["state_max_abs_vs_ref"], note="" if self.fla_ok else self.fla_reason,
                **(work or {}), limit_frac=limit_frac(work, r["us"], self.peak_tflops) if work else "",
            )  # fmt: skip

    def measure(self, factory, once, args, state_key, reference: dict | None, is_reference: bool) -> dict:
        """Parity of a first call on fresh states against `reference` (the torch run), then the timing.

        On the GPU the first call also compiles and warms up, and the timing is a second measurement;
        on the CPU the first call is the measurement.
        """
        mine = fresh(args)
        us, out = call_once(factory(mine), self.device)
        result = {"out": first_output(out), "state": mine[state_key], "outputs": out}
        if self.device.type != "cuda":
            timing = "once, on the CPU (Triton interpreter)"
        elif once:
            us, timing = call_once(factory(fresh(args)), self.device)[0], "once (Python loops; not do_bench)"
        else:
            us, timing = do_bench_us(factory(fresh(args))), "do_bench median"
        ref = result if reference is None else reference
        gaps = parity(result["out"], result["state"], ref["out"], ref["state"])
        if reference is None and not is_reference:  # the reference failed: nothing to compare with
            gaps = dict.fromkeys(gaps, float("nan"))
        return {**result, "us": us, "timing": timing, **gaps}

    def invariance(self, op: str, target: int, mates: list[int], position: int) -> None:
        """One target alone vs at `position` among `mates`: bitwise, for ours and the controls."""
        from gdn_lab.ops.delta_rule import CHUNK_SIZE
        from gdn_lab.routing import get

        make = layer_inputs if op == LAYER else prefill_inputs
        names = ("triton-fused", "triton-fused-tiles-by-batch") if op == LAYER else ("triton", "triton-chunk-by-batch")
        runs = {name: get(op, name).run for name in names}
        if target > CHUNK_SIZE:  # a one-chunk target has one segment in any batch
            runs[SEGMENTS_BY_BATCH] = segments_by_batch
        lengths = [*mates[:position], target, *mates[position:]]
        seeds = [self.args.seed + 1 + i for i in range(len(lengths))]
        seeds[position] = self.args.seed  # the target's own seed, alone and batched
        alone = make([target], self.shape, self.device, self.args.seed, seeds=[self.args.seed])
        batched = make(lengths, self.shape, self.device, self.args.seed, seeds=seeds)
        for name, run in runs.items():
            common = {"kind": "invariance", "op": op, "impl": name, "tokens": sum(lengths)}
            common.update(batch=len(lengths), seq_len=target)
            note = "control: must differ" if "by-batch" in name else "must be equal"
            note += f"; target at {position}, batchmates {min(mates)}-{max(mates)} tokens"
            try:
                results = self.target_comparisons(run, op, alone, batched, sum(lengths[:position]), target, position)
            except Exception as exc:  # recorded, so that the timings already measured are written
                self.row(**common, note=f"{note}; error: {type(exc).__name__}: {exc}")
                continue
            self.row(
                **common, bitwise_equal=all(r["bitwise_equal"] for r in results),
                n_diff=sum(r["n_diff"] for r in results), max_abs=max(r["max_abs"] for r in results), note=note,
            )  # fmt: skip

    @staticmethod
    def target_comparisons(run, op: str, alone: dict, batched: dict, start: int, target: int, slot: int) -> list[dict]:
        """compare() of every output's target rows (from `start`) and of the target's state slots, alone vs batched."""
        from gdn_lab.experiments.compare import compare

        a, b = fresh(alone), fresh(batched)
        outs_a, outs_b = run(**a), run(**b)
        pairs = list(zip(outs_a, outs_b)) if op == LAYER else [(outs_a, outs_b)]
        pairs = [(x, y[start : start + target]) for x, y in pairs]  # the target's rows
        pairs += [(a[key][0], b[key][slot]) for key in ("state", "delta_state", "conv_state") if key in a]
        return [compare(x, y) for x, y in pairs]

    def write(self) -> Path:
        mark_invariance(self.rows, ("op", "HK", "HV", "seq_len", "batch"), lambda r: "by-batch" in r["impl"])
        return write_csv(self.rows, COLUMNS + sorted(self.env), self.args.out, CSV_NAME)


SEGMENTS_BY_BATCH = "triton-segments-by-batch"


def segments_by_batch(**args) -> torch.Tensor:
    """CONTROL (bench-local) of either op: the chunked kernels (gdn_prefill's, or the fused layer's)
    with the state recurrence's segments sized by the batch, one chunk per sequence of the batch,
    every sequence cut (fewer, longer segments where the batch already fills the GPU); a target
    longer than a chunk gets other segments alone than batched, so its bits follow the batch."""
    from gdn_lab.ops.delta_rule_triton import gdn_prefill_chunked
    from gdn_lab.ops.gdn_layer_prefill.triton_kernels import gdn_layer_prefill_fused

    if "projected_qkvz" in args:
        return gdn_layer_prefill_fused(**args, segment_chunks=args["cache_indices"].numel(), segment_from=0)
    return gdn_prefill_chunked(**args, segment_chunks=args["slots"].numel(), segment_from=0)


def invariance_cases(args: argparse.Namespace) -> list[tuple[int, list[int], int]]:
    """(target tokens, batchmates' tokens, the target's position): a short target among 15 short
    mates, first (the controls chunk by 64 alone and by 32 in it: 16 sequences, <= 3071 tokens), and
    a target past SEGMENT_FROM tokens by a segment and a part (which the state recurrence cuts into
    segments at shapes of few heads, `segment_from_of`, and the segments-by-batch control at any)
    at a random position among 7 mates of random lengths, from 1 token to twice the target."""
    from gdn_lab.ops.delta_rule import CHUNK_SIZE
    from gdn_lab.ops.delta_rule_triton import SEGMENT_CHUNKS, SEGMENT_FROM

    g = torch.Generator().manual_seed(args.seed)
    if args.smoke:
        return [(40, [7, 30, 3, 12], 0), (150, [1, 200, 64, 9], int(torch.randint(0, 5, (1,), generator=g)))]
    segment = CHUNK_SIZE * SEGMENT_CHUNKS
    target = SEGMENT_FROM + segment + 808
    mates = [1, 2 * target, *torch.randint(2, 2 * target, (5,), generator=g).tolist()]
    mates = [mates[i] for i in torch.randperm(len(mates), generator=g).tolist()]
    return [(1000, [100] * 15, 0), (target, mates, int(torch.randint(0, len(mates) + 1, (1,), generator=g)))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench_device(args)  # before any kernel module is imported
    bench = Bench(args)
    for shape in args.shapes:
        bench.shape = shape
        for op in (LAYER, PREFILL):
            for tokens in args.tokens:
                for batch in args.batches:
                    before = len(bench.rows)
                    bench.timing(op, tokens, batch)
                    print(
                        f"{op:18s} {shape.hk}/{shape.hv:<3d} T={tokens:6d} B={batch:3d}  "
                        + "  ".join(f"{x['impl']}={x.get('us') or float('nan'):.0f}us" for x in bench.rows[before:]),
                        flush=True,
                    )
        for op in (LAYER, PREFILL):
            for target, mates, position in invariance_cases(args):
                bench.invariance(op, target, mates, position)
    path = bench.write()
    for r in bench.rows:
        if r["kind"] == "invariance":
            print(
                f"invariance {r['op']:18s} {r['heads']:5s} {r['impl']:28s} bitwise_equal={r.get('bitwise_equal')}"
                f"  {r['verdict']}  ({r['note']})"
            )
    print("\n".join(invariance_lines(bench.rows, ("op", "heads", "impl"))))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
