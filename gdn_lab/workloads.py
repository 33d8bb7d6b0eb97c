"""Seeded workloads: a target request among batchmates of random lengths, built into each op's inputs.

An invariance experiment runs one *target* request alone and then inside batches. For the
comparison to mean anything, the target must be the same request every time:

- its content (K/V, queries, projections, initial states) comes from its own seed, whatever the
  batch, its position in it, or where its pages and state slots land;
- each batchmate's content comes from its own seed, derived from the experiment seed, the target
  length, the batch size, the trial and the batchmate's index;
- lengths, the target's position and the page/slot placement are drawn from the experiment seed,
  so the same seed gives the same batches.

The builders return the op's validated argument dict (its `validate()`), so any backend's `run`
takes it as keywords; `target_view` says which output rows and state slot belong to the target.

Example:
    >>> from gdn_lab.workloads import AttentionShape, alone, make_batch, target_request, build
    >>> t = target_request(300, seed=0)
    >>> b = make_batch(t, 4, seed=0, max_len=500)
    >>> args = build("decode_attention", b, AttentionShape(4, 2, 32), dtype=torch.float32)
    >>> args["q"].shape, b.requests[b.position] == t
    (torch.Size([4, 4, 32]), True)
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.cache import build_paged_kv, conv_state_pool, gdn_state_pool, random_kv
from gdn_lab.device import fp8_dtype_for

DEFAULT_MAX_CONTEXT = 16383  # batchmates draw 1..16383 tokens unless a preset scales it down
SPARE_SLOTS = 3  # state-pool slots no request owns (NaN), so reading the wrong slot shows

ATTENTION_OPS = ("decode_attention", "prefill_attention")
GDN_OPS = ("gdn_decode", "gdn_prefill", "gdn_layer_prefill")
OPS = ATTENTION_OPS + GDN_OPS

_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


# --- parameters -------------------------------------------------------------------------------


def resolve_device(name: str | torch.device) -> torch.device:
    """ "auto" (the GPU if torch sees one, else the CPU), "cpu" or "cuda" as a torch.device.

    Raises:
        ValueError: an unknown name, or "cuda" on a machine without a visible GPU.
    """
    if isinstance(name, torch.device):
        return name
    checks.check_choice("device", name, ("auto", "cpu", "cuda"))
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch sees no CUDA/ROCm device; accepted here: auto, cpu")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """A compute dtype from its name: bf16/bfloat16, fp16/float16, fp32/float32."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype: {name!r} is not accepted; expected one of {', '.join(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def resolve_kv_dtype(name: str | torch.dtype | None, dtype: torch.dtype, arch: str) -> torch.dtype:
    """The KV-cache dtype: None/"auto" is the compute dtype, "fp8" the arch's native fp8 format
    (float8_e4m3fnuz on gfx942, float8_e4m3fn elsewhere), else a compute dtype name."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return dtype
    if name == "fp8":
        return fp8_dtype_for(arch)
    if name not in _DTYPE_NAMES:
        raise ValueError(f"kv_dtype: {name!r} is not accepted; expected auto, fp8 or one of {', '.join(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from an experiment seed and a path of keys (stable across runs and machines)."""
    text = repr((int(seed), *keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


# --- shapes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """Heads per TP rank of a full-attention layer (default: Qwen3-8B at TP1, 32/8/128).

    Attributes:
        num_q_heads, num_kv_heads: Hq and Hkv (Hq divisible by Hkv).
        head_dim: D.
        page_size: tokens per KV page (1: SGLang's token pool as AITER sees it).
    """

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 1

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "page_size"):
            checks.check_positive(name, getattr(self, name))
        checks.check_divides("num_kv_heads", self.num_kv_heads, "num_q_heads", self.num_q_heads)


@dataclass(frozen=True)
class GDNShape:
    """Heads per TP rank of a Gated DeltaNet layer (default: Qwen3-Next-80B at TP4, 4/8/128).

    Attributes:
        num_k_heads, num_v_heads: HK and HV (HV divisible by HK).
        head_dim: K = V.
        conv_width: the causal conv's kernel width (gdn_layer_prefill).
    """

    num_k_heads: int = 4
    num_v_heads: int = 8
    head_dim: int = 128
    conv_width: int = 4

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "head_dim", "conv_width"):
            checks.check_positive(name, getattr(self, name))
        checks.check_divides("num_k_heads", self.num_k_heads, "num_v_heads", self.num_v_heads)
        if self.conv_width < 2:
            raise ValueError(f"conv_width: must be at least 2, got {self.conv_width}")

    @property
    def conv_dim(self) -> int:
        return (2 * self.num_k_heads + self.num_v_heads) * self.head_dim


# --- requests and batches ---------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request of a batch.

    Attributes:
        length: its tokens: the KV context (attention), the sequence (GDN prefill); 1 for gdn_decode.
        seed: seeds all of its content.
        new_tokens: prefill_attention only: how many of its last tokens are new queries
            (None: all of them, a plain prefill).
    """

    length: int
    seed: int
    new_tokens: int | None = None

    @property
    def query_tokens(self) -> int:
        return self.length if self.new_tokens is None else min(self.new_tokens, self.length)


@dataclass(frozen=True)
class Batch:
    """Requests in batch order; the target at `position`; `placement_seed` shuffles pages and slots."""

    requests: tuple[Request, ...]
    position: int
    placement_seed: int

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def target(self) -> Request:
        return self.requests[self.position]

    @property
    def lengths(self) -> list[int]:
        return [r.length for r in self.requests]


def target_request(length: int, seed: int, new_tokens: int | None = None) -> Request:
    """The target of an experiment: its content depends only on (seed, length)."""
    checks.check_positive("target length", length)
    return Request(length, derive_seed(seed, "target", length), new_tokens)


def alone(target: Request, seed: int) -> Batch:
    """The target as a batch of one (its pages still shuffled, from the experiment seed)."""
    return Batch((target,), 0, derive_seed(seed, "alone", target.length, target.seed))


def make_batch(
    target: Request,
    batch_size: int,
    *,
    seed: int,
    trial: int = 0,
    position: int | None = None,
    min_len: int = 1,
    max_len: int = DEFAULT_MAX_CONTEXT,
    new_tokens: int | None = None,
) -> Batch:
    """The target inside `batch_size - 1` batchmates of random lengths.

    Args:
        target: the target request (from `target_request`).
        batch_size: requests in the batch, the target included (>= 1).
        seed: the experiment seed; lengths, position, batchmates' seeds and placement follow from it.
        trial: distinguishes repeated batches of one (target, batch size).
        position: the target's index; None draws it uniformly.
        min_len, max_len: batchmates' lengths are uniform in [min_len, max_len].
        new_tokens: batchmates' new tokens (prefill_attention), as `Request.new_tokens`.

    Returns:
        A Batch.
    """
    checks.check_positive("batch_size", batch_size)
    checks.check_positive("min_len", min_len)
    if max_len < min_len:
        raise ValueError(f"max_len: must be >= min_len (={min_len}), got {max_len}")
    key = ("batch", target.length, target.seed, batch_size, trial)
    rng = random.Random(derive_seed(seed, *key))
    if position is None:
        position = rng.randrange(batch_size)
    elif not 0 <= position < batch_size:
        raise ValueError(f"position: must be in [0, {batch_size}), got {position}")
    mates = [
        Request(rng.randint(min_len, max_len), derive_seed(seed, *key, "mate", i), new_tokens)
        for i in range(batch_size - 1)
    ]
    mates.insert(position, target)
    return Batch(tuple(mates), position, derive_seed(seed, *key, "placement"))


# --- content ----------------------------------------------------------------------------------


def _randn(seed: int, stream: str, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Standard normal float32 on the CPU from (seed, stream): one request's tensors never share a stream."""
    g = torch.Generator().manual_seed(derive_seed(seed, stream))
    return scale * torch.randn(*shape, generator=g)


def _slot_table(batch: Batch, device: torch.device) -> tuple[torch.Tensor, int]:
    """Distinct state slots for the requests, scattered over a pool with spare slots."""
    pool = batch.size + SPARE_SLOTS
    g = torch.Generator().manual_seed(batch.placement_seed)
    slots = torch.randperm(pool, generator=g)[: batch.size].to(torch.int32)
    return slots.to(device), pool


def _cu_seqlens(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class BuildOptions:
    """How a batch becomes tensors (the same for the target alone and in its batches).

    Attributes:
        dtype: the compute dtype (q, k, v, projections).
        kv_dtype: the KV-cache dtype (attention); None keeps `dtype`; an fp8 dtype quantizes
            with the fixed scales below (never derived from the batch).
        k_scale, v_scale: per-tensor fp8 dequantization scales.
        device: where the tensors live.
        weights_seed: seeds what the requests share (gate parameters, conv and norm weights).
        initial_state: GDN ops start from a random state of the request's own (True) or zeros.
        quantize_fp8: gdn_layer_prefill also returns group-128 fp8 activations.
        fp8_dtype: their format (None: the device arch's).
    """

    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    weights_seed: int = 0
    initial_state: bool = True
    quantize_fp8: bool = False
    fp8_dtype: torch.dtype | None = None


def _paged_kv(batch: Batch, shape: AttentionShape, opts: BuildOptions):
    kvs = [
        random_kv(r.length, shape.num_kv_heads, shape.head_dim, dtype=opts.dtype, device=opts.device, seed=r.seed)
        for r in batch.requests
    ]
    fp8 = opts.kv_dtype is not None and opts.kv_dtype in checks.FP8_DTYPES
    return build_paged_kv(
        [k for k, _ in kvs],
        [v for _, v in kvs],
        page_size=shape.page_size,
        kv_dtype=opts.kv_dtype,
        k_scale=opts.k_scale if fp8 else None,
        v_scale=opts.v_scale if fp8 else None,
        seed=batch.placement_seed,
        shuffle=True,
        spare_pages=SPARE_SLOTS,
    )


def _queries(batch: Batch, shape: AttentionShape, opts: BuildOptions, decode: bool) -> torch.Tensor:
    rows = [
        _randn(r.seed, "q", 1 if decode else r.query_tokens, shape.num_q_heads, shape.head_dim) for r in batch.requests
    ]
    return torch.cat(rows).to(device=opts.device, dtype=opts.dtype)


def decode_attention_inputs(batch: Batch, shape: AttentionShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated decode_attention arguments: one query per request over its `length`-token context."""
    from gdn_lab.ops.attention import decode

    kv = _paged_kv(batch, shape, opts)
    return decode.validate(_queries(batch, shape, opts, decode=True), **kv.op_kwargs())


def prefill_attention_inputs(batch: Batch, shape: AttentionShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated prefill_attention arguments: each request's last `query_tokens` tokens attend causally."""
    from gdn_lab.ops.attention import prefill

    kv = _paged_kv(batch, shape, opts)
    qo = _cu_seqlens([r.query_tokens for r in batch.requests], opts.device)
    kw = kv.op_kwargs()
    return prefill.validate(
        _queries(batch, shape, opts, decode=False),
        kw.pop("k_cache"),
        kw.pop("v_cache"),
        qo,
        kw.pop("kv_indptr"),
        kw.pop("kv_indices"),
        kw.pop("seq_lens"),
        **kw,
    )


def _gate_params(shape: GDNShape, opts: BuildOptions) -> tuple[torch.Tensor, torch.Tensor]:
    hv = shape.num_v_heads
    a_log = _randn(opts.weights_seed, "A_log", hv, scale=0.5)
    dt_bias = _randn(opts.weights_seed, "dt_bias", hv, scale=0.5)
    return a_log.to(opts.device), dt_bias.to(opts.device)


def _state_pool(batch: Batch, shape: GDNShape, opts: BuildOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-filled delta-state pool with each request's initial state in its (shuffled) slot."""
    slots, pool = _slot_table(batch, opts.device)
    d, hv = shape.head_dim, shape.num_v_heads
    state = torch.full((pool, hv, d, d), float("nan"), dtype=torch.float32, device=opts.device)
    for r, slot in zip(batch.requests, slots.tolist()):
        state[slot] = gdn_state_pool(1, hv, d, d, device=opts.device, seed=r.seed if opts.initial_state else None)[0]
    return state, slots


def _gdn_tokens(r: Request, n: int, shape: GDNShape) -> list[torch.Tensor]:
    """q, k [n, HK, K]; v [n, HV, V]; a, b [n, HV] of one request (float32, CPU)."""
    hk, hv, d = shape.num_k_heads, shape.num_v_heads, shape.head_dim
    return [
        _randn(r.seed, "q", n, hk, d),
        _randn(r.seed, "k", n, hk, d),
        _randn(r.seed, "v", n, hv, d),
        _randn(r.seed, "a", n, hv),
        _randn(r.seed, "b", n, hv),
    ]


def _packed_gdn_tokens(batch: Batch, shape: GDNShape, opts: BuildOptions, decode: bool) -> list[torch.Tensor]:
    per_request = [_gdn_tokens(r, 1 if decode else r.length, shape) for r in batch.requests]
    return [torch.cat(parts).to(device=opts.device, dtype=opts.dtype) for parts in zip(*per_request)]


def gdn_decode_inputs(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated gdn_decode arguments: one token per request from its own initial state."""
    from gdn_lab.ops.gated_delta_rule import decode

    q, k, v, a, b = _packed_gdn_tokens(batch, shape, opts, decode=True)
    state, slots = _state_pool(batch, shape, opts)
    return decode.validate(q, k, v, a, b, *_gate_params(shape, opts), state, slots)


def gdn_prefill_inputs(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated gdn_prefill arguments: `length` tokens per request, token-packed."""
    from gdn_lab.ops.gated_delta_rule import prefill

    q, k, v, a, b = _packed_gdn_tokens(batch, shape, opts, decode=False)
    state, slots = _state_pool(batch, shape, opts)
    cu = _cu_seqlens(batch.lengths, opts.device)
    return prefill.validate(q, k, v, a, b, *_gate_params(shape, opts), cu, state, slots)


def gdn_layer_prefill_inputs(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated gdn_layer_prefill arguments: projections per request, conv and delta states in shared slots."""
    from gdn_lab.ops.gdn_layer import layer_prefill

    hk, hv, d, w = shape.num_k_heads, shape.num_v_heads, shape.head_dim, shape.conv_width
    r_ratio, dev, dtype = hv // hk, opts.device, opts.dtype
    qkvz = [_randn(r.seed, "qkvz", r.length, hk * (2 * d + 2 * r_ratio * d)) for r in batch.requests]
    ba = [_randn(r.seed, "ba", r.length, 2 * hv) for r in batch.requests]
    delta_state, slots = _state_pool(batch, shape, opts)
    conv_state = torch.full((delta_state.shape[0], shape.conv_dim, w - 1), float("nan"), dtype=dtype, device=dev)
    for r, slot in zip(batch.requests, slots.tolist()):
        conv_state[slot] = conv_state_pool(1, shape.conv_dim, w, dtype=dtype, device=dev, seed=r.seed)[0]
    ws = opts.weights_seed
    return layer_prefill.validate(
        torch.cat(qkvz).to(device=dev, dtype=dtype),
        torch.cat(ba).to(device=dev, dtype=dtype),
        conv_state,
        delta_state,
        slots,
        _cu_seqlens(batch.lengths, dev),
        torch.full((batch.size,), opts.initial_state, dtype=torch.bool, device=dev),
        _randn(ws, "conv_weight", shape.conv_dim, w, scale=0.5).to(device=dev, dtype=dtype),
        _randn(ws, "conv_bias", shape.conv_dim, scale=0.1).to(device=dev, dtype=dtype),
        *_gate_params(shape, opts),
        (1.0 + _randn(ws, "norm_weight", d, scale=0.1)).to(device=dev, dtype=dtype),
        num_k_heads=hk,
        num_v_heads=hv,
        head_dim=d,
        quantize_fp8=opts.quantize_fp8,
        fp8_dtype=opts.fp8_dtype,
    )


BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "decode_attention": decode_attention_inputs,
    "prefill_attention": prefill_attention_inputs,
    "gdn_decode": gdn_decode_inputs,
    "gdn_prefill": gdn_prefill_inputs,
    "gdn_layer_prefill": gdn_layer_prefill_inputs,
}


def check_op(op: str) -> None:
    checks.check_choice("op", op, OPS)


def build(
    op: str, batch: Batch, shape: AttentionShape | GDNShape, opts: BuildOptions | None = None, **overrides: Any
) -> dict[str, Any]:
    """The validated arguments of `op` for `batch`.

    Args:
        op: one of OPS.
        batch: from `alone` or `make_batch`.
        shape: AttentionShape for the attention ops, GDNShape for the GDN ops.
        opts: BuildOptions (default: bf16 on the CPU); `overrides` replace its fields.

    Returns:
        The dict the op's `validate()` returns (what every backend's `run` receives).
    """
    check_op(op)
    want = AttentionShape if op in ATTENTION_OPS else GDNShape
    if not isinstance(shape, want):
        raise ValueError(f"shape: {op} takes a {want.__name__}, got {type(shape).__name__}")
    opts = opts or BuildOptions()
    if overrides:
        opts = replace(opts, **overrides)
    return BUILDERS[op](batch, shape, opts)


@dataclass(frozen=True)
class TargetView:
    """Where the target lives in an op call.

    Attributes:
        rows: the target's rows of the output's dim 0 (its query tokens or its decode row).
        slot: its state slot (GDN ops), or None.
    """

    rows: slice
    slot: int | None


def target_view(op: str, batch: Batch, args: dict[str, Any]) -> TargetView:
    """The target's output rows and state slot in a call built by `build(op, batch, ...)`."""
    check_op(op)
    if op in ("decode_attention", "gdn_decode"):
        rows = slice(batch.position, batch.position + 1)
    else:
        per_request = [r.query_tokens if op == "prefill_attention" else r.length for r in batch.requests]
        start = sum(per_request[: batch.position])
        rows = slice(start, start + per_request[batch.position])
    slot = None
    if op in GDN_OPS:
        slot = int(args["cache_indices" if op == "gdn_layer_prefill" else "slots"][batch.position])
    return TargetView(rows, slot)


def state_keys(op: str) -> tuple[str, ...]:
    """The argument names of the state pools an op updates in place (empty for attention)."""
    return {
        "gdn_decode": ("state",),
        "gdn_prefill": ("state",),
        "gdn_layer_prefill": ("delta_state", "conv_state"),
    }.get(op, ())


def fresh_copy(op: str, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments with private copies of every state the op mutates, so one run cannot feed the next."""
    out = dict(args)
    for key in state_keys(op):
        out[key] = args[key].clone()
    return out
