"""Where SGLang's AMD kernels change kernel or numerics as the batch grows, per model, TP and arch.

For one model at one tensor-parallel size on one arch, every op of its layers gets the kernel SGLang
(or the lab, where said) runs on AMD and, for batch sizes 1..max_batch, the variant each batch size
takes and the numerics key a request gets (from the rule modules beside this one). Where the variant
changes between two batch sizes the kernel or its config switches; where the key changes, a
request's bits can change with its batchmates.

Shapes are per rank (aiter_contracts.md 7): TP splits the query, KV, GDN key and value heads, and
KV heads are replicated when H_kv < TP. Each model's full-attention, GDN and projection shapes:

| model | full attention Hq / Hkv / D | GDN HK / HV / K / V | hidden |
|---|---|---|---|
| Qwen3-8B | 32 / 8 / 128 | - | 4096 |
| Qwen3-Next-80B-A3B | 16 / 2 / 256 | 16 / 32 / 128 / 128 | 2048 |
| Qwen3.5-27B | 24 / 4 / 256 (output gate) | 16 / 48 / 128 / 128 | 5120 |
| Qwen3.5-397B-A17B | 32 / 2 / 256 | 16 / 64 / 128 / 128 | 4096 |

The ops and what is assumed of the batch (uniform requests; see the keyword arguments):

- decode_attention, AITER `paged_attention_ragged` (SGLang's AiterAttnBackend default): batch
  invariant by code reading (aiter_contracts.md 1.3; not measured on AMD): one variant throughout.
- decode_attention, AITER Triton `unified_attention` (SGLang with SGLANG_USE_AITER_UNIFIED_ATTN or a
  sliding-window pool): `aiter_unified_attention`, every request `context_len` tokens, KV blocks of
  `page_size`.
- decode_attention, AITER Triton `pa_decode` (the lab's `aiter-triton-pa` backend, not an SGLang
  route): `aiter_pa_decode` at `context_len`.
- prefill_attention, CK `mha_batch_prefill` (SGLang's forward_extend): `ck_batch_prefill`, every
  request `extend_len` new tokens, bf16 KV.
- gdn_decode, SGLang's AiterGDNKernel (HIP / FlyDSL / Triton, FlyDSL's WARP_THREADS_K by batch):
  `sglang_gdn`, bf16 activations, fp32 state.
- gdn_prefill, SGLang's AiterGDNKernel.extend: `sglang_gdn`, `gdn_prefill_len` tokens per sequence.
- gdn_layer_prefill, AITER `fused_gdn_prefill_qkvz` (only its covered shape: local heads 4/8 on
  gfx950, i.e. Qwen3-Next-80B at TP4): `aiter_fused_gdn_prefill`, `fused_prefill_tokens` tokens in
  all, batches 1..64 (beyond: the unfused chain).
- matmul, AITER Triton `gemm_a16w16` (the lab's `aiter-triton-gemm`; whether SGLang sends a given
  linear there is not established by the sources read): `aiter_gemm_a16w16` with M = the batch size
  (one decode token per request), for the attention qkv/o and GDN in/out projections. The MLP and
  MoE projections are not mapped (their sizes are not in the reference's model table).

Not mapped, for want of a rule: AITER's fused GDN decode (`fused_gdn_decode_qkvz`, by token count),
the FlyDSL prefill's V tile, and SGLang's fp8 ASM prefill on gfx950 with head dim 256.

Example:
    >>> df = batch_variance_map("Qwen3.5-397B-A17B", 8, "gfx942")
    >>> row = df[df.op == "gdn_decode"].iloc[0]
    >>> row["shape"], 24 in row.switch_batch_sizes, bool(row.numerics_changes)
    ('HK=2 HV=8 K=128 V=128', True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import torch

from gdn_lab import aiter, checks
from gdn_lab.rules import (
    aiter_fused_gdn_prefill,
    aiter_gemm_a16w16,
    aiter_pa_decode,
    aiter_unified_attention,
    ck_batch_prefill,
    flydsl_gdr_decode,
    sglang_gdn,
)

ARCHS = ("gfx942", "gfx950")
TPS = (1, 2, 4, 8)
PA_RAGGED_SOURCE = (
    "aiter e4048607, csrc/cpp_itfs/pa/pa_ragged.py + pa_kernels.cuh (aiter_contracts.md 1.3, code reading)"
)
FUSED_SOURCE = (
    "aiter PR #5606, aiter/ops/triton/gated_delta_net/fused_gdn_prefill_qkvz.py::_select_tile_key (+ launchers)"
)
# FlyDSL's untuned NUM_WARPS and NUM_BLOCKS_PER_V_DIM (aiter_contracts.md 3.3; WTK: flydsl_gdr_decode.DEFAULT_WTK)
FLYDSL_DEFAULT_WARPS, FLYDSL_DEFAULT_V_BLOCKS = 4, 1
MAP_COLUMNS = [
    "model",
    "tp",
    "arch",
    "device",
    "num_cus",
    "op",
    "kernel",
    "shape",
    "batch_sizes",
    "switch_batch_sizes",
    "numerics_switch_batch_sizes",
    "numerics_changes",
    "variants",
    "numerics_keys",
    "rule_source",
    "note",
]
LONG_COLUMNS = [
    "model",
    "tp",
    "arch",
    "device",
    "num_cus",
    "op",
    "kernel",
    "shape",
    "batch_size",
    "variant",
    "key",
]


@dataclass(frozen=True)
class ModelShape:
    """A model's layer shapes (whole model, before TP), from aiter_contracts.md 7.

    Attributes:
        name: the model.
        layers, full_attention_layers, gdn_layers: layer counts.
        hidden: the hidden size.
        num_q_heads, num_kv_heads, head_dim: the full-attention layers.
        attn_output_gate: the attention q projection also produces an output gate (Hq x D more).
        gdn_heads: the GDN layers' (HK, HV), None for a dense model.
        gdn_head_dims: the GDN layers' (K, V).
    """

    name: str
    layers: int
    full_attention_layers: int
    gdn_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    attn_output_gate: bool = False
    gdn_heads: tuple[int, int] | None = None
    gdn_head_dims: tuple[int, int] = (128, 128)


MODELS = {
    m.name: m
    for m in (
        ModelShape("Qwen3-8B", 36, 36, 0, 4096, 32, 8, 128),
        ModelShape("Qwen3-Next-80B-A3B", 48, 12, 36, 2048, 16, 2, 256, gdn_heads=(16, 32)),
        ModelShape("Qwen3.5-27B", 64, 16, 48, 5120, 24, 4, 256, attn_output_gate=True, gdn_heads=(16, 48)),
        ModelShape("Qwen3.5-397B-A17B", 60, 15, 45, 4096, 32, 2, 256, gdn_heads=(16, 64)),
    )
}


@dataclass(frozen=True)
class Device:
    """An AMD device: its arch and CU count (public specs)."""

    name: str
    arch: str
    num_cus: int


DEVICES = {
    d.name: d
    for d in (
        Device("MI350X", "gfx950", 256),
        Device("MI355X", "gfx950", 256),
        Device("MI300X", "gfx942", 304),
        Device("MI308X", "gfx942", 80),
    )
}


@dataclass(frozen=True)
class LocalShape:
    """A model's per-rank heads at one TP size.

    Attributes:
        num_q_heads, num_kv_heads: full-attention heads on one rank (KV replicated when H_kv < TP).
        num_k_heads, num_v_heads: GDN heads on one rank (None for a dense model).
    """

    num_q_heads: int
    num_kv_heads: int
    num_k_heads: int | None
    num_v_heads: int | None


def local_shape(model: str, tp: int) -> LocalShape:
    """The per-rank head counts of `model` at tensor-parallel size `tp`.

    Example:
        >>> local_shape("Qwen3.5-27B", 8)
        LocalShape(num_q_heads=3, num_kv_heads=1, num_k_heads=2, num_v_heads=6)
    """
    m = _model(model)
    checks.check_choice("tp", tp, TPS)
    hkv = m.num_kv_heads // tp if m.num_kv_heads >= tp else 1
    hk, hv = (m.gdn_heads[0] // tp, m.gdn_heads[1] // tp) if m.gdn_heads else (None, None)
    return LocalShape(m.num_q_heads // tp, hkv, hk, hv)


def _model(model: object) -> ModelShape:
    checks.check_choice("model", model, tuple(MODELS))
    return MODELS[model]  # type: ignore[index]


def _device(arch: str, device: str | None) -> Device:
    checks.check_choice("arch", arch, ARCHS)
    if device is None:
        emulated = aiter.EMULATED_DEVICES[arch]
        return DEVICES[emulated.name]
    checks.check_choice("device", device, tuple(DEVICES))
    d = DEVICES[device]
    if d.arch != arch:
        same = [n for n, x in DEVICES.items() if x.arch == arch]
        raise ValueError(f"device: {device} is a {d.arch} device, not {arch}; for {arch} use one of {', '.join(same)}")
    return d


@dataclass(frozen=True)
class _Entry:
    """One op of the map: what it is, and its (variant, key) at a batch size."""

    op: str
    kernel: str
    shape: str
    rule_source: str
    note: str
    at: Callable[[int], tuple[str, str]]


def _attention_entries(m: ModelShape, loc: LocalShape, dev: Device, opts: dict[str, int]) -> Iterator[_Entry]:
    hq, hkv, d = loc.num_q_heads, loc.num_kv_heads, m.head_dim
    shape = f"Hq={hq} Hkv={hkv} D={d}"
    ctx, page, extend = opts["context_len"], opts["page_size"], opts["extend_len"]
    yield _Entry(
        "decode_attention",
        "aiter paged_attention_ragged (HIP)",
        shape,
        PA_RAGGED_SOURCE,
        "batch invariant by code reading (per-sequence work, absolute 256-token partitions, "
        "max_num_partitions fixed per deployment); not measured on AMD",
        lambda b: ("paged_attention_ragged: 256-token partitions", "pa_ragged"),
    )

    def unified(b: int) -> tuple[str, str]:
        p = aiter_unified_attention.predict(b, b, hq, hkv, 1, ctx, page, dev.num_cus)
        return p.variant, aiter_unified_attention.numerics_key(p, ctx)

    yield _Entry(
        "decode_attention",
        "aiter Triton unified_attention (SGLANG_USE_AITER_UNIFIED_ATTN or SWA)",
        shape,
        aiter_unified_attention.SOURCE,
        f"every request {ctx} tokens, KV blocks of {page}",
        unified,
    )

    def pa_decode(b: int) -> tuple[str, str]:
        p = aiter_pa_decode.predict(b, hq, ctx)
        return p.variant, aiter_pa_decode.numerics_key(p, ctx)

    yield _Entry(
        "decode_attention",
        "aiter Triton pa_decode (the lab's aiter-triton-pa; not an SGLang route)",
        shape,
        aiter_pa_decode.SOURCE,
        f"every request {ctx} tokens; the rule's claim that V2's padded reduce is bitwise neutral "
        "is contradicted by an H200 measurement (issue 11)",
        pa_decode,
    )

    def ck(b: int) -> tuple[str, str]:
        p = ck_batch_prefill.select_tile(b, hq, extend, d, dev.num_cus, "bf16")
        return p.variant, ck_batch_prefill.numerics_key(p)

    yield _Entry(
        "prefill_attention",
        "CK mha_batch_prefill (SGLang forward_extend)",
        shape,
        ck_batch_prefill.SOURCE,
        f"every request {extend} new tokens, bf16 KV, {dev.num_cus} CUs",
        ck,
    )


def _gdn_entries(m: ModelShape, loc: LocalShape, arch: str, opts: dict[str, int]) -> Iterator[_Entry]:
    hk, hv = loc.num_k_heads, loc.num_v_heads
    assert hk is not None and hv is not None
    dk, dv = m.gdn_head_dims
    shape = f"HK={hk} HV={hv} K={dk} V={dv}"

    def decode(b: int) -> tuple[str, str]:
        r = sglang_gdn.decode_route(hk, hv, b, arch, head_k_dim=dk, head_v_dim=dv)
        if r.backend != "flydsl":
            return r.backend, r.key
        _, row = flydsl_gdr_decode.warp_threads_k(arch, b, hk, hv, dk, dv, torch.bfloat16, torch.float32)
        warps = row.num_warps if row else FLYDSL_DEFAULT_WARPS
        vblocks = row.num_blocks_per_v_dim if row else FLYDSL_DEFAULT_V_BLOCKS
        return f"flydsl wtk={r.warp_threads_k} warps={warps} vblocks={vblocks}", r.key

    yield _Entry(
        "gdn_decode",
        "SGLang AiterGDNKernel (HIP / FlyDSL / Triton)",
        shape,
        f"{sglang_gdn.SOURCE}; FlyDSL WTK: data/aiter/gdr_decode_tuned.csv (aiter e4048607)",
        "bf16 activations, fp32 state; the HIP kernel's own batch dependence is not known",
        decode,
    )
    plen = opts["gdn_prefill_len"]

    def prefill(b: int) -> tuple[str, str]:
        r = sglang_gdn.prefill_route(hk, hv, [plen] * b, head_k_dim=dk, head_v_dim=dv)
        return r.backend, r.key

    yield _Entry(
        "gdn_prefill",
        "SGLang AiterGDNKernel.extend (AITER opt_vk / Triton)",
        shape,
        sglang_gdn.SOURCE,
        f"every sequence {plen} tokens; AITER needs one sequence of >= {sglang_gdn.prefill_min_tokens(hv)} tokens",
        prefill,
    )
    if (hk, hv, dk, dv) == (4, 8, 128, 128) and arch == "gfx950":
        tokens = opts["fused_prefill_tokens"]

        def fused(b: int) -> tuple[str, str]:
            s = aiter_fused_gdn_prefill.schedule(tokens, b) if b <= tokens else None
            if s is None:
                return "not covered: the unfused chain", "unfused"
            v = f"{s.tile} chunk={s.chunk_size} vtile={s.value_tile} {s.scan}"
            return v, v

        yield _Entry(
            "gdn_layer_prefill",
            "aiter fused_gdn_prefill_qkvz (SGLANG_QWEN3_NEXT_GDN_FUSED_BACKEND=aiter)",
            shape,
            FUSED_SOURCE,
            f"{tokens} tokens in all, split over the batch's sequences; covered for 1..64 sequences",
            fused,
        )


def _gemm_entries(m: ModelShape, loc: LocalShape, arch: str) -> Iterator[_Entry]:
    projections = [
        ("attn.qkv_proj", (loc.num_q_heads * (2 if m.attn_output_gate else 1) + 2 * loc.num_kv_heads) * m.head_dim, m.hidden),
        ("attn.o_proj", m.hidden, loc.num_q_heads * m.head_dim),
    ]  # fmt: skip
    if loc.num_k_heads is not None and loc.num_v_heads is not None:
        dk, dv = m.gdn_head_dims
        hk, hv = loc.num_k_heads, loc.num_v_heads
        projections += [
            ("gdn.in_proj_qkvz", 2 * hk * dk + 2 * hv * dv, m.hidden),
            ("gdn.in_proj_ba", 2 * hv, m.hidden),
            ("gdn.out_proj", m.hidden, hv * dv),
        ]
    for name, n, k in projections:
        file = aiter_gemm_a16w16.config_file(arch, n, k)

        def at(b: int, file=file, n=n, k=k) -> tuple[str, str]:
            try:
                c = aiter_gemm_a16w16.config_from(file, b, n, k, arch)
            except aiter_gemm_a16w16.NoConfigEntry:
                return "no config entry (AITER raises KeyError)", "error"
            return c.variant, c.key

        yield _Entry(
            "matmul",
            "aiter Triton gemm_a16w16 (the lab's aiter-triton-gemm)",
            f"{name} N={n} K={k}",
            f"{aiter_gemm_a16w16.SOURCE}: read {file.path.name} from aiter {file.aiter_version}",
            "M = the batch size (one token per request)",
            at,
        )


def _evaluate(
    model: str, tp: int, arch: str, max_batch: int, device: str | None, include_gemm: bool, opts: dict[str, int]
) -> tuple[ModelShape, Device, list[tuple[_Entry, list[tuple[str, str]]]]]:
    """Validate, build the model's entries, and evaluate each at batch sizes 1..max_batch."""
    m = _model(model)
    loc = local_shape(model, tp)
    dev = _device(arch, device)
    checks.check_positive("max_batch", max_batch)
    for name, value in opts.items():
        checks.check_positive(name, value)
    checks.check_bool("include_gemm", include_gemm)
    entries = list(_attention_entries(m, loc, dev, opts))
    if m.gdn_heads is not None:
        entries += _gdn_entries(m, loc, arch, opts)
    if include_gemm:
        try:
            entries += _gemm_entries(m, loc, arch)
        except ImportError as exc:
            raise ImportError(f"{exc} (or pass include_gemm=False to map the other ops)") from exc
    return m, dev, [(e, [e.at(b) for b in range(1, max_batch + 1)]) for e in entries]


def batch_variance_long(
    model: str,
    tp: int,
    arch: str,
    *,
    max_batch: int = 512,
    device: str | None = None,
    context_len: int = 4096,
    page_size: int = 16,
    extend_len: int = 1,
    gdn_prefill_len: int = 4096,
    fused_prefill_tokens: int = 2048,
    include_gemm: bool = True,
) -> pd.DataFrame:
    """For batch sizes 1..max_batch, the variant and numerics key of every op of the model (for plotting).

    Args:
        model: one of MODELS ("Qwen3-8B", "Qwen3-Next-80B-A3B", "Qwen3.5-27B", "Qwen3.5-397B-A17B").
        tp: tensor-parallel size, 1, 2, 4 or 8.
        arch: "gfx942" or "gfx950".
        max_batch: the largest batch size mapped.
        device: one of DEVICES on `arch` (its CU count); None: the lab's emulated device for the
            arch (`aiter.EMULATED_DEVICES`: MI350X for gfx950, MI308X for gfx942).
        context_len: every decode request's context (unified_attention, pa_decode).
        page_size: the KV block size unified_attention sees.
        extend_len: every prefill request's new tokens (CK batch prefill).
        gdn_prefill_len: every GDN prefill sequence's tokens (SGLang's GDN prefill routing).
        fused_prefill_tokens: the fused GDN prefill batch's tokens in all.
        include_gemm: map gemm_a16w16 (needs an installed aiter).

    Returns:
        A DataFrame with LONG_COLUMNS, one row per (op, kernel, shape, batch size).

    Raises:
        ValueError: a bad parameter (the message names it, its value and what is accepted).
        ImportError: `include_gemm` without an installed aiter.

    Example:
        >>> df = batch_variance_long("Qwen3.5-397B-A17B", 8, "gfx942", max_batch=30, include_gemm=False)
        >>> df[(df.op == "gdn_decode") & df.batch_size.isin([23, 24])].key.tolist()
        ['flydsl:wtk=8', 'hip']
    """
    opts = dict(
        context_len=context_len,
        page_size=page_size,
        extend_len=extend_len,
        gdn_prefill_len=gdn_prefill_len,
        fused_prefill_tokens=fused_prefill_tokens,
    )
    m, dev, evaluated = _evaluate(model, tp, arch, max_batch, device, include_gemm, opts)
    rows = [
        (m.name, tp, arch, dev.name, dev.num_cus, e.op, e.kernel, e.shape, b, variant, key)
        for e, values in evaluated
        for b, (variant, key) in enumerate(values, start=1)
    ]
    return pd.DataFrame(rows, columns=LONG_COLUMNS)


def _runs(values: list[str]) -> list[str]:
    """["a", "a", "b"] -> ["1-2: a", "3: b"] (batch sizes from 1)."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            span = f"{start + 1}" if i - 1 == start else f"{start + 1}-{i}"
            out.append(f"{span}: {values[start]}")
            start = i
    return out


def _switches(values: list[str]) -> list[int]:
    """The batch sizes b (from 2) whose value differs from b - 1's."""
    return [i + 1 for i in range(1, len(values)) if values[i] != values[i - 1]]


def batch_variance_map(
    model: str,
    tp: int,
    arch: str,
    *,
    max_batch: int = 512,
    device: str | None = None,
    context_len: int = 4096,
    page_size: int = 16,
    extend_len: int = 1,
    gdn_prefill_len: int = 4096,
    fused_prefill_tokens: int = 2048,
    include_gemm: bool = True,
) -> pd.DataFrame:
    """Per op of the model at TP `tp` on `arch`, the batch sizes where its kernel or numerics config changes.

    Args:
        model, tp, arch, max_batch, device, context_len, page_size, extend_len, gdn_prefill_len,
        fused_prefill_tokens, include_gemm: as `batch_variance_long`.

    Returns:
        A DataFrame with MAP_COLUMNS, one row per (op, kernel, shape):
        `switch_batch_sizes` the batch sizes b whose variant (kernel or config) or key differs from
        b - 1's; `numerics_switch_batch_sizes` those whose numerics key differs (a request's bits
        can move there, by the rule); `numerics_changes` whether there is any; `variants` and
        `numerics_keys` the runs of batch sizes ("1-23: ...") with what runs there; `rule_source` where the
        rule was read; `note` the assumptions of the row.

    Raises:
        ValueError: a bad parameter (the message names it, its value and what is accepted).
        ImportError: `include_gemm` without an installed aiter.

    Example:
        >>> df = batch_variance_map("Qwen3-8B", 1, "gfx950", include_gemm=False)
        >>> df[df.op == "prefill_attention"].iloc[0].switch_batch_sizes
        [7]
    """
    opts = dict(
        context_len=context_len,
        page_size=page_size,
        extend_len=extend_len,
        gdn_prefill_len=gdn_prefill_len,
        fused_prefill_tokens=fused_prefill_tokens,
    )
    m, dev, evaluated = _evaluate(model, tp, arch, max_batch, device, include_gemm, opts)
    rows = []
    for e, values in evaluated:
        variants, keys = [v for v, _ in values], [k for _, k in values]
        numerics = _switches(keys)
        rows.append(
            (
                m.name,
                tp,
                arch,
                dev.name,
                dev.num_cus,
                e.op,
                e.kernel,
                e.shape,
                f"1..{max_batch}",
                sorted(set(_switches(variants)) | set(numerics)),
                numerics,
                bool(numerics),
                _runs(variants),
                _runs(keys),
                e.rule_source,
                e.note,
            )
        )
    return pd.DataFrame(rows, columns=MAP_COLUMNS)
