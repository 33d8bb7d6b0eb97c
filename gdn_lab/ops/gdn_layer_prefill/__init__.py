"""gdn_layer_prefill: the whole GDN prefill chain, as one op the unfused chain and fused kernels share.

The op's folder: this spec, the unfused torch chain (`reference.py`) and one file per library with
its backends (`triton.py`: the fused Triton chain; `aiter.py`: AITER's fused gfx950 kernel).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.cache import conv_state_pool
from gdn_lab.device import check_fp8_dtype, detect
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, GDNShape, cu_seqlens, gate_params, packed_view, randn, state_pool
from gdn_lab.ops.gdn_inputs import check_cu_seqlens
from gdn_lab.ops.gdn_layer_prefill import reference
from gdn_lab.quant import FP8_GROUP, dequantize_groups
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "gdn_layer_prefill"


def validate(
    projected_qkvz,
    projected_ba,
    conv_state,
    delta_state,
    cache_indices,
    cu_seqlens,
    has_initial_state,
    conv_weight,
    conv_bias,
    A_log,
    dt_bias,
    norm_weight,
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_dim: int = 128,
    eps: float = 1e-6,
    quantize_fp8: bool = False,
    fp8_dtype: torch.dtype | None = None,
    check_indices: bool = True,
) -> dict[str, Any]:
    """Check a gdn_layer_prefill call; return the arguments every backend's `run` receives."""
    for name, value in (("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads), ("head_dim", head_dim)):
        checks.check_positive(name, value)
    checks.check_divides("num_k_heads", num_k_heads, "num_v_heads", num_v_heads)
    r, d = num_v_heads // num_k_heads, head_dim
    conv_dim = 2 * num_k_heads * d + num_v_heads * d
    dims = checks.Dims()
    dims.bind("QKVZ", num_k_heads * (2 * d + 2 * r * d), "num_k_heads, num_v_heads, head_dim: HK*(2K + 2rV)")
    dims.bind("BA", 2 * num_v_heads, "num_v_heads: 2*HV")
    dims.bind("C", conv_dim, "num_k_heads, num_v_heads, head_dim: 2*HK*K + HV*V")
    dims.bind("HV", num_v_heads, "num_v_heads")
    dims.bind("D", d, "head_dim")
    checks.check_tensor("projected_qkvz", projected_qkvz, "T QKVZ", dims, checks.FLOAT_DTYPES)
    dev = projected_qkvz.device
    checks.check_tensor("projected_ba", projected_ba, "T BA", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("conv_weight", conv_weight, "C W", dims, checks.FLOAT_DTYPES, dev)
    if dims["W"] < 2:
        raise ValueError(f"conv_weight: the conv width (dim 1) must be at least 2, got {dims['W']}")
    checks.check_optional("conv_bias", conv_bias, "C", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("conv_state", conv_state, "Sc C Wm1", dims, checks.FLOAT_DTYPES, dev)
    if dims["Wm1"] != dims["W"] - 1:
        raise ValueError(f"conv_state: dim 2 must be the conv width - 1 (={dims['W'] - 1}), got {dims['Wm1']}")
    checks.check_tensor("delta_state", delta_state, "Sd HV D D", dims, (torch.float32,), dev)
    checks.check_tensor("cache_indices", cache_indices, "N", dims, (torch.int32,), dev)
    checks.check_tensor("cu_seqlens", cu_seqlens, "N+1", dims, (torch.int32,), dev)
    checks.check_tensor("has_initial_state", has_initial_state, "N", dims, (torch.bool,), dev)
    checks.check_tensor("A_log", A_log, "HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("dt_bias", dt_bias, "HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("norm_weight", norm_weight, "D", dims, checks.FLOAT_DTYPES, dev)
    checks.check_positive_float("eps", eps)
    checks.check_bool("quantize_fp8", quantize_fp8)
    checks.check_bool("check_indices", check_indices)
    arch = detect(dev).arch
    if fp8_dtype is None:
        fp8_dtype = detect(dev).fp8_dtype
    if quantize_fp8:
        check_fp8_dtype("fp8_dtype", fp8_dtype, arch)
        if (num_v_heads * d) % FP8_GROUP:
            raise ValueError(
                f"num_v_heads * head_dim (={num_v_heads * d}) must be divisible by the fp8 group ({FP8_GROUP})"
            )
    if check_indices:
        check_cu_seqlens(cu_seqlens, dims["T"])
        for name, pool in (("conv_state", dims["Sc"]), ("delta_state", dims["Sd"])):
            checks.check_index_range("cache_indices", cache_indices, pool, f"{name}.shape[0]", allow_negative=True)
        checks.check_distinct("cache_indices", cache_indices)
    return {
        "projected_qkvz": projected_qkvz,
        "projected_ba": projected_ba,
        "conv_state": conv_state,
        "delta_state": delta_state,
        "cache_indices": checks.dense(cache_indices),
        "cu_seqlens": checks.dense(cu_seqlens),
        "has_initial_state": checks.dense(has_initial_state),
        "conv_weight": conv_weight,
        "conv_bias": checks.dense(conv_bias),
        "A_log": checks.dense(A_log),
        "dt_bias": checks.dense(dt_bias),
        "norm_weight": checks.dense(norm_weight),
        "num_k_heads": num_k_heads,
        "num_v_heads": num_v_heads,
        "head_dim": d,
        "eps": float(eps),
        "quantize_fp8": quantize_fp8,
        "fp8_dtype": fp8_dtype,
    }


def gdn_layer_prefill(
    projected_qkvz: torch.Tensor,
    projected_ba: torch.Tensor,
    conv_state: torch.Tensor,
    delta_state: torch.Tensor,
    cache_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_dim: int = 128,
    eps: float = 1e-6,
    quantize_fp8: bool = False,
    fp8_dtype: torch.dtype | None = None,
    backend: str = "auto",
    check_indices: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The Gated DeltaNet prefill chain of Qwen3-Next after its input projections.

    causal conv1d + QKV split, gating, L2 norm, delta rule, gated RMSNorm and optional group-128 fp8
    (see `gdn_lab.ops.gdn_layer_prefill.reference` for the exact math). K = V = head_dim.

    Args:
        projected_qkvz: [T, HK * (2K + 2rV)], r = HV // HK, interleaved per key head as
            [q | k | v (r heads) | z (r heads)] (Qwen3-Next's in_proj_qkvz).
        projected_ba: [T, 2 * HV], per key head [b (r) | a (r)].
        conv_state: [num_slots, conv_dim, W - 1], conv_dim = 2*HK*K + HV*V; updated in place.
        delta_state: [num_slots, HV, V, K] float32 ("VK"); read as the initial state (callers zero
            fresh slots) and updated in place.
        cache_indices: int32 [N], each sequence's slot in both pools (distinct; negative = skip).
        cu_seqlens: int32 [N+1], sequence boundaries in T.
        has_initial_state: bool [N]; False starts the conv from zeros (the delta state is always read).
        conv_weight: [conv_dim, W]; conv_bias: [conv_dim] or None.
        A_log, dt_bias: [HV]; norm_weight: [V].
        num_k_heads, num_v_heads: HK and HV (HV divisible by HK).
        head_dim: K = V.
        eps: RMSNorm epsilon.
        quantize_fp8: also return group-128 fp8 of the normalized output.
        fp8_dtype: the fp8 format (default: the device arch's; gfx942 has only float8_e4m3fnuz).
        backend: "auto" or a backend name ("torch" is the unfused chain).
        check_indices: check index values (one host synchronisation).

    Returns:
        (normalized [T, HV, V] in projected_qkvz's dtype, quantized [T, HV*V] fp8 or None,
        scales float32 [T, HV*V/128] or None). Rows of skipped sequences are zeros.

    Example:
        >>> from gdn_lab.ops.gdn_layer_prefill import example
        >>> args = example()
        >>> normalized, quantized, scales = gdn_layer_prefill(**args, backend="torch")
        >>> normalized.shape, quantized.shape, scales.shape
        (torch.Size([40, 4, 32]), torch.Size([40, 128]), torch.Size([40, 1]))
    """
    args = validate(
        projected_qkvz, projected_ba, conv_state, delta_state, cache_indices, cu_seqlens, has_initial_state,
        conv_weight, conv_bias, A_log, dt_bias, norm_weight, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
        head_dim=head_dim, eps=eps, quantize_fp8=quantize_fp8, fp8_dtype=fp8_dtype, check_indices=check_indices,
    )  # fmt: skip
    return dispatch(OP, args, backend)[0]


def example(
    device="cpu", dtype: torch.dtype = torch.float32, lengths=(9, 31), num_k_heads: int = 2, num_v_heads: int = 4,
    head_dim: int = 32, width: int = 4, quantize_fp8: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Validated arguments of a tiny call (HK 2, HV 4, K = V = 32, width 4, two sequences, fp8 on)."""
    g = torch.Generator().manual_seed(0)
    hk, hv, d = num_k_heads, num_v_heads, head_dim
    t, n = sum(lengths), len(lengths)
    conv_dim = 2 * hk * d + hv * d

    def rnd(*shape, s=1.0):
        return (s * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return validate(
        rnd(t, hk * (2 * d + 2 * (hv // hk) * d)), rnd(t, 2 * hv), rnd(n + 1, conv_dim, width - 1),
        (0.1 * torch.randn(n + 1, hv, d, d, generator=g)).to(device), torch.arange(1, n + 1, dtype=torch.int32, device=device),
        cu, torch.tensor([i % 2 == 0 for i in range(n)], device=device), rnd(conv_dim, width, s=0.5), rnd(conv_dim, s=0.1),
        torch.randn(hv, generator=g).to(device), torch.randn(hv, generator=g).to(device), 1.0 + rnd(d, s=0.1),
        num_k_heads=hk, num_v_heads=hv, head_dim=d, quantize_fp8=quantize_fp8,
    )  # fmt: skip


def build(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: projections per request, conv and delta states in shared shuffled slots."""
    hk, hv, d, w = shape.num_k_heads, shape.num_v_heads, shape.head_dim, shape.conv_width
    r_ratio, dev, dtype = hv // hk, opts.device, opts.dtype
    qkvz = [randn(r.seed, "qkvz", r.length, hk * (2 * d + 2 * r_ratio * d), device=dev) for r in batch.requests]
    ba = [randn(r.seed, "ba", r.length, 2 * hv, device=dev) for r in batch.requests]
    delta_state, slots = state_pool(batch, shape, opts)
    conv_state = torch.full((delta_state.shape[0], shape.conv_dim, w - 1), float("nan"), dtype=dtype, device=dev)
    for r, slot in zip(batch.requests, slots.tolist()):
        conv_state[slot] = conv_state_pool(1, shape.conv_dim, w, dtype=dtype, device=dev, seed=r.seed)[0]
    ws = opts.weights_seed
    return validate(
        torch.cat(qkvz).to(dtype=dtype),
        torch.cat(ba).to(dtype=dtype),
        conv_state,
        delta_state,
        slots,
        cu_seqlens(batch.lengths, dev),
        torch.full((batch.size,), opts.initial_state, dtype=torch.bool, device=dev),
        randn(ws, "conv_weight", shape.conv_dim, w, scale=0.5, device=dev).to(dtype=dtype),
        randn(ws, "conv_bias", shape.conv_dim, scale=0.1, device=dev).to(dtype=dtype),
        *gate_params(shape, opts),
        (1.0 + randn(ws, "norm_weight", d, scale=0.1, device=dev)).to(dtype=dtype),
        num_k_heads=hk,
        num_v_heads=hv,
        head_dim=d,
        quantize_fp8=opts.quantize_fp8,
        fp8_dtype=opts.fp8_dtype,
    )


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns rows cu_seqlens[request]:cu_seqlens[request + 1] and slot cache_indices[request]."""
    return spec.View(packed_view(args["cu_seqlens"], request), int(args["cache_indices"][request]))


def dequantized(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The group-128 fp8 codes read as numbers, with their scales."""
    return dequantize_groups(tensors["quantized"], tensors["scales"], FP8_GROUP)


# Closeness to the unfused torch chain, by tensor and compute dtype. fp32: only the order of
# float32 operations differs. bf16/fp16: the unfused chain rounds the conv output to the input
# dtype between kernels, a fused kernel need not, so ~1 output ulp (2^-8) on a fraction of
# elements; an fp8 code flips where the normalized value crosses a rounding boundary. The conv
# state holds the last W-1 inputs, a copy: bitwise.
_REL_MAE = {
    "normalized": {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3},
    "delta_state": {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3},
    "quantized": {"float32": 5e-3, "bfloat16": 2e-2, "float16": 2e-2},
    "scales": {"float32": 1e-4, "bfloat16": 1e-2, "float16": 5e-3},  # amax / fp8 max of `normalized`
}
TOLERANCES = {
    **{("torch", t, dt): spec.Tolerance("rel_mae", limit=v) for t, by in _REL_MAE.items() for dt, v in by.items()},
    **{("torch", "conv_state", dt): spec.Tolerance("bitwise") for dt in ("float32", "bfloat16", "float16")},
}

SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=gdn_layer_prefill,
        validate=validate,
        example=example,
        shape=GDNShape,
        build=build,
        outputs=("normalized", "quantized", "scales"),
        states=("delta_state", "conv_state"),
        view=view,
        values={"quantized": dequantized},
        tolerances=TOLERANCES,
        description="the whole GDN prefill chain: conv1d + split, gates, delta rule, gated RMSNorm, group-128 fp8",
    )
)

register(
    Backend(
        OP,
        "torch",
        reference.gdn_layer_prefill_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="the unfused chain per sequence: conv1d, split, gating, chunked delta rule, gated RMSNorm, fp8",
    )
)

from gdn_lab.ops.gdn_layer_prefill import aiter, triton  # noqa: E402, F401  (their backends)
