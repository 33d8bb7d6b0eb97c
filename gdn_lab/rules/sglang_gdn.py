"""SGLang's AiterGDNKernel: which GDN kernel a decode or prefill launch takes on AMD, as data plus predictors.

Read from SGLang's `python/sglang/srt/layers/attention/linear/kernels/gdn_aiter.py` in the fork copy
apinge/sglang @1de3bf01 (aiter_contracts.md 3.10; the upstream copy @0051ebfc has no such routing,
and which upstream PR brings it is not known):

Decode (`AiterGDNKernel.decode`, with `select_aiter_gdn_decode_backend` naming the same order):

1. HIP (`hip_fused_sigmoid_gating_delta_rule_update`) iff the local heads (HK, HV) are in
   `{(2, 8)}`, the active batch size is >= 24, the arch is gfx942 (`is_gfx942_supported`), the
   state is contiguous, and the runtime contract holds: q, k, v, a, b, dt_bias bf16, K = V = 128,
   fp32 state of 4 dims whose last three are (HV, 128, 128).
2. else FlyDSL (`flydsl_gdr_decode`) iff HK > 0, HV >= HK, HV % HK == 0 (the batch plays no part)
   and its runtime contract holds: q, k, v, a, b, dt_bias bf16, q/k/v last dim 128, fp32
   contiguous state of 4 dims ending in (128, 128) with shape[1] == HV.
3. else Triton (SGLang's TritonGDNKernel); any `replayssm_*` argument forces it too.

Prefill (`AiterGDNKernel.extend`): AITER (`chunk_gated_delta_rule_opt_vk` with the HIP chunk
kernel) only for one sequence (`query_start_loc.numel() == 2`), not during graph capture, without
padding, with SGLang's chunk size 64, at least `aiter_prefill_min_tokens(HV)` tokens (4096 if
HV <= 8 else 1024), bf16 q/k/v with 128 dims, HV % HK == 0, and an fp32 or bf16 contiguous state
with shape[1] == HV; everything else runs Triton.

What a request's bits depend on (the numerics key): decode "hip", "flydsl:wtk=<N>" (FlyDSL's
WARP_THREADS_K for the launch's batch size, from `gdn_lab.rules.flydsl_gdr_decode`: it sets the
order of the K = 128 sums) or "triton" (one program per (V tile, request, head) with a full-K
sum: batch invariant within a platform, aiter_contracts.md 3.5); prefill "aiter" or "triton".
Two keys that differ mean another kernel or another sum order. Not known from the sources: whether
the HIP kernel's own arithmetic follows the batch (its source is not in the aiter snapshot read);
its key assumes it does not.

Example:
    >>> decode_route(2, 8, 23, "gfx942").key, decode_route(2, 8, 24, "gfx942").key
    ('flydsl:wtk=8', 'hip')
    >>> prefill_route(4, 8, [4096]).backend, prefill_route(4, 8, [2048, 2048]).backend
    ('aiter', 'triton')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.rules import flydsl_gdr_decode
from gdn_lab.rules.base import Predicted, RuleEnv

SOURCE = (
    "sglang (fork apinge/sglang @1de3bf01), python/sglang/srt/layers/attention/linear/kernels/gdn_aiter.py::"
    "AiterGDNKernel.decode/extend, select_aiter_gdn_decode_backend, aiter_prefill_min_tokens"
)
ARCHS = flydsl_gdr_decode.ARCHS
BACKENDS = ("hip", "flydsl", "triton")
DECODE_DTYPE_NAMES = ("q", "k", "v", "a", "b", "dt_bias")


@dataclass(frozen=True)
class SglangGdnConstants:
    """The constants of SGLang's AITER GDN routing.

    Attributes:
        hip_local_heads: the (HK, HV) pairs the HIP decode serves (`_HIP_GDN_SUPPORTED_LOCAL_HEAD_SHAPES`).
        hip_min_batch: the HIP decode needs at least this active batch size.
        hip_archs: the archs the HIP decode is built for (`is_gfx942_supported`).
        head_dim: the K and V head size every AITER path needs.
        prefill_small_hv: up to this many local value heads, prefill needs `prefill_min_tokens_small`.
        prefill_min_tokens_small, prefill_min_tokens_large: `aiter_prefill_min_tokens`'s two values.
        prefill_chunk_size: the mamba cache chunk size the AITER prefill needs.
    """

    hip_local_heads: frozenset[tuple[int, int]] = frozenset({(2, 8)})
    hip_min_batch: int = 24
    hip_archs: tuple[str, ...] = ("gfx942",)
    head_dim: int = 128
    prefill_small_hv: int = 8
    prefill_min_tokens_small: int = 4096
    prefill_min_tokens_large: int = 1024
    prefill_chunk_size: int = 64


CONSTANTS = SglangGdnConstants()


@dataclass(frozen=True)
class DecodeRoute:
    """Which GDN decode kernel one launch takes.

    Attributes:
        backend: "hip", "flydsl" or "triton".
        key: what a request's bits depend on ("hip", "flydsl:wtk=<N>", "triton").
        warp_threads_k: FlyDSL's WARP_THREADS_K (None off FlyDSL).
        tuned_line: the line of gdr_decode_tuned.csv that set it (None: AITER's default, or off FlyDSL).
        reason: the conditions that decided, in words.
    """

    backend: str
    key: str
    warp_threads_k: int | None
    tuned_line: int | None
    reason: str


@dataclass(frozen=True)
class PrefillRoute:
    """Which GDN prefill kernel one launch takes.

    Attributes:
        backend: "aiter" or "triton".
        key: what a request's bits depend on (the backend).
        tokens: the launch's token count.
        min_tokens: `aiter_prefill_min_tokens(HV)`.
        reason: the condition that decided, in words.
    """

    backend: str
    key: str
    tokens: int
    min_tokens: int
    reason: str


def _dtype_name(d: torch.dtype) -> str:
    return checks.dtype_name(d)


def _check_dtype(name: str, value: object) -> None:
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{name}: expected a torch.dtype, got {value!r}")


def _check_heads(num_k_heads: object, num_v_heads: object) -> None:
    for name, value in (("num_k_heads", num_k_heads), ("num_v_heads", num_v_heads)):
        checks.check_positive(name, value)


def hip_decode_local_heads(num_k_heads: int, num_v_heads: int, constants: SglangGdnConstants = CONSTANTS) -> bool:
    """Whether the HIP decode serves these local head counts (`supports_hip_gdn_decode_local_heads`)."""
    return (num_k_heads, num_v_heads) in constants.hip_local_heads


def should_use_hip_decode(
    num_k_heads: int, num_v_heads: int, batch_size: int, constants: SglangGdnConstants = CONSTANTS
) -> bool:
    """SGLang's `should_use_hip_gdn_decode`: the HIP heads and an active batch of at least 24.

    Example:
        >>> should_use_hip_decode(2, 8, 23), should_use_hip_decode(2, 8, 24), should_use_hip_decode(4, 8, 64)
        (False, True, False)
    """
    return hip_decode_local_heads(num_k_heads, num_v_heads, constants) and batch_size >= constants.hip_min_batch


def should_use_flydsl_decode(num_k_heads: int, num_v_heads: int) -> bool:
    """SGLang's `should_use_flydsl_decode` (it ignores the batch size): HK > 0, HV >= HK, HV % HK == 0.

    Example:
        >>> should_use_flydsl_decode(16, 48), should_use_flydsl_decode(8, 4)
        (True, False)
    """
    return num_k_heads > 0 and num_v_heads >= num_k_heads and num_v_heads % num_k_heads == 0


def prefill_min_tokens(num_v_heads: int, constants: SglangGdnConstants = CONSTANTS) -> int:
    """SGLang's `aiter_prefill_min_tokens`: 4096 tokens for HV <= 8 local value heads, else 1024.

    Example:
        >>> prefill_min_tokens(8), prefill_min_tokens(9)
        (4096, 1024)
    """
    if num_v_heads <= constants.prefill_small_hv:
        return constants.prefill_min_tokens_small
    return constants.prefill_min_tokens_large


def _decode_runtime_misses(
    dtypes: Mapping[str, torch.dtype],
    head_k_dim: int,
    head_v_dim: int,
    state_dtype: torch.dtype,
    state_contiguous: bool,
    constants: SglangGdnConstants,
) -> list[str]:
    """What breaks the HIP/FlyDSL runtime contract (the two agree for the lab's [S, HV, V, K] state)."""
    misses = [f"{n} is {_dtype_name(d)}" for n, d in dtypes.items() if d != torch.bfloat16]
    if misses:
        misses = [", ".join(misses) + " (bfloat16 needed)"]
    if head_k_dim != constants.head_dim or head_v_dim != constants.head_dim:
        misses.append(f"K={head_k_dim} V={head_v_dim} ({constants.head_dim} needed)")
    if state_dtype != torch.float32:
        misses.append(f"state is {_dtype_name(state_dtype)} (float32 needed)")
    if not state_contiguous:
        misses.append("state is not contiguous")
    return misses


def _decode(
    num_k_heads: int,
    num_v_heads: int,
    batch_size: int,
    arch: str,
    dtypes: Mapping[str, torch.dtype],
    head_k_dim: int,
    head_v_dim: int,
    state_dtype: torch.dtype,
    state_contiguous: bool,
    hip_available: bool,
    fly_available: bool,
    table_path: str | Path,
    constants: SglangGdnConstants,
) -> DecodeRoute:
    checks.check_choice("arch", arch, ARCHS)
    _check_heads(num_k_heads, num_v_heads)
    checks.check_positive("batch_size", batch_size)
    checks.check_positive("head_k_dim", head_k_dim)
    checks.check_positive("head_v_dim", head_v_dim)
    for name, d in dtypes.items():
        _check_dtype(name, d)
    _check_dtype("state_dtype", state_dtype)
    misses = _decode_runtime_misses(dtypes, head_k_dim, head_v_dim, state_dtype, state_contiguous, constants)
    heads = f"(HK, HV) = ({num_k_heads}, {num_v_heads})"

    hip_why = []
    if not hip_available:
        hip_why.append("the HIP decode is not available")
    if not hip_decode_local_heads(num_k_heads, num_v_heads, constants):
        hip_why.append(f"{heads} not in {sorted(constants.hip_local_heads)}")
    elif batch_size < constants.hip_min_batch:
        hip_why.append(f"batch {batch_size} < {constants.hip_min_batch}")
    if arch not in constants.hip_archs:
        hip_why.append(f"{arch} is not {'/'.join(constants.hip_archs)}")
    hip_why += misses
    if not hip_why:
        reason = f"{heads}, batch {batch_size} >= {constants.hip_min_batch} on {arch}: HIP"
        return DecodeRoute("hip", "hip", None, None, reason)

    fly_why = []
    if not fly_available:
        fly_why.append("FlyDSL is not available")
    if not should_use_flydsl_decode(num_k_heads, num_v_heads):
        fly_why.append(f"{heads} needs HV >= HK and HV % HK == 0")
    fly_why += misses
    if not fly_why:
        wtk, row = flydsl_gdr_decode.warp_threads_k(
            arch,
            batch_size,
            num_k_heads,
            num_v_heads,
            head_k_dim,
            head_v_dim,
            dtypes["q"],
            state_dtype,
            path=table_path,
        )
        where = f"tuned line {row.line}" if row else f"AITER's default (no tuned row for batch {batch_size})"
        reason = f"not HIP ({'; '.join(hip_why)}); FlyDSL with WARP_THREADS_K {wtk} from {where}"
        return DecodeRoute("flydsl", f"flydsl:wtk={wtk}", wtk, row.line if row else None, reason)
    reason = f"not HIP ({'; '.join(hip_why)}); not FlyDSL ({'; '.join(fly_why)}): Triton"
    return DecodeRoute("triton", "triton", None, None, reason)


def decode_route(
    num_k_heads: int,
    num_v_heads: int,
    batch_size: int,
    arch: str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    gate_dtype: torch.dtype | None = None,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    state_dtype: torch.dtype = torch.float32,
    state_contiguous: bool = True,
    hip_available: bool = True,
    fly_available: bool = True,
    table_path: str | Path = flydsl_gdr_decode.TABLE_PATH,
    constants: SglangGdnConstants = CONSTANTS,
) -> DecodeRoute:
    """The GDN decode kernel SGLang's AiterGDNKernel launches, and the request's numerics key.

    The state is SGLang's VK pool `[slots, HV, V, K]` (the lab's layout).

    Args:
        num_k_heads, num_v_heads: the local (per-rank) HK and HV.
        batch_size: the active batch size (SGLang's `active_batch_size`, not the padded graph size).
        arch: "gfx942" or "gfx950".
        dtype: q, k and v's dtype.
        gate_dtype: a, b and dt_bias's dtype (default: `dtype`).
        head_k_dim, head_v_dim: K and V.
        state_dtype: the state pool's dtype.
        state_contiguous: whether the state pool is contiguous.
        hip_available, fly_available: whether the HIP decode and FlyDSL import (SGLang falls
            through to the next kernel when one does not).
        table_path: FlyDSL's tuned table.
        constants: the rule's constants.

    Returns:
        A DecodeRoute.

    Example:
        >>> decode_route(4, 8, 1, "gfx942").key, decode_route(4, 8, 4, "gfx942").key
        ('flydsl:wtk=16', 'flydsl:wtk=8')
        >>> decode_route(2, 8, 24, "gfx942", state_dtype=torch.bfloat16).backend
        'triton'
    """
    gate = dtype if gate_dtype is None else gate_dtype
    dtypes = {"q": dtype, "k": dtype, "v": dtype, "a": gate, "b": gate, "dt_bias": gate}
    return _decode(
        num_k_heads,
        num_v_heads,
        batch_size,
        arch,
        dtypes,
        head_k_dim,
        head_v_dim,
        state_dtype,
        state_contiguous,
        hip_available,
        fly_available,
        table_path,
        constants,
    )


def prefill_route(
    num_k_heads: int,
    num_v_heads: int,
    seq_lens: Sequence[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    state_dtype: torch.dtype = torch.float32,
    state_contiguous: bool = True,
    graph_capture: bool = False,
    has_padding: bool = False,
    chunk_size: int = 64,
    aiter_available: bool = True,
    constants: SglangGdnConstants = CONSTANTS,
) -> PrefillRoute:
    """The GDN prefill kernel SGLang's AiterGDNKernel.extend launches for a packed batch.

    Args:
        num_k_heads, num_v_heads: the local HK and HV.
        seq_lens: the new tokens of each sequence in the launch.
        dtype: q, k and v's dtype.
        head_k_dim, head_v_dim: K and V.
        state_dtype: the state pool's dtype (fp32 or bf16 accepted by AITER).
        state_contiguous: whether the state pool is contiguous.
        graph_capture: whether the launch is being captured into a graph (AITER is skipped).
        has_padding: SGLang's `has_padding` flag.
        chunk_size: SGLang's mamba cache chunk size.
        aiter_available: whether AITER's VK prefill imports.
        constants: the rule's constants.

    Returns:
        A PrefillRoute.

    Example:
        >>> prefill_route(4, 8, [4095]).backend, prefill_route(4, 16, [1024]).backend
        ('triton', 'aiter')
    """
    _check_heads(num_k_heads, num_v_heads)
    lens = list(seq_lens)
    if not lens:
        raise ValueError("seq_lens: expected at least one sequence, got none")
    for i, n in enumerate(lens):
        checks.check_positive(f"seq_lens[{i}]", n)
    _check_dtype("dtype", dtype)
    _check_dtype("state_dtype", state_dtype)
    tokens, need = sum(lens), prefill_min_tokens(num_v_heads, constants)
    why = []
    if not aiter_available:
        why.append("AITER's prefill is not available")
    if has_padding:
        why.append("the batch has padding")
    if chunk_size != constants.prefill_chunk_size:
        why.append(f"chunk size {chunk_size} != {constants.prefill_chunk_size}")
    if len(lens) != 1:
        why.append(f"{len(lens)} sequences (AITER takes a single one)")
    if tokens < need:
        why.append(f"{tokens} tokens < {need} (aiter_prefill_min_tokens(HV={num_v_heads}))")
    if graph_capture:
        why.append("graph capture")
    if dtype != torch.bfloat16:
        why.append(f"q/k/v are {_dtype_name(dtype)} (bfloat16 needed)")
    if head_k_dim != constants.head_dim or head_v_dim != constants.head_dim:
        why.append(f"K={head_k_dim} V={head_v_dim} ({constants.head_dim} needed)")
    if num_v_heads % num_k_heads:
        why.append(f"HV={num_v_heads} not divisible by HK={num_k_heads}")
    if state_dtype not in (torch.float32, torch.bfloat16):
        why.append(f"state is {_dtype_name(state_dtype)} (float32 or bfloat16 needed)")
    if not state_contiguous:
        why.append("state is not contiguous")
    if why:
        return PrefillRoute("triton", "triton", tokens, need, "Triton: " + "; ".join(why))
    return PrefillRoute("aiter", "aiter", tokens, need, f"one sequence of {tokens} >= {need} tokens: AITER opt_vk")


def _check_request(request: object, batch: int, what: str) -> None:
    if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < batch:
        raise ValueError(f"request: expected an index in [0, {batch}) ({what}), got {request!r}")


def _expect(alone_key: str, batched_key: str) -> str:
    return "equal" if alone_key == batched_key else "switch"


@dataclass(frozen=True)
class SglangGdnDecodeRule:
    """The DispatchRule of SGLang's GDN decode routing, for a validated gdn_decode call.

    The launch's batch size is the call's B (q.shape[0], padded rows included: SGLang's active
    batch size when the caller launches no padding).

    Attributes:
        hip_available, fly_available: whether the HIP decode and FlyDSL are taken to import.
    """

    hip_available: bool = True
    fly_available: bool = True
    name: str = "sglang_gdn_decode"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The route of the call `args` (gdn_decode's validated arguments), seen from row `request`."""
        q, v, state = args["q"], args["v"], args["state"]
        _check_request(request, q.shape[0], "a row of q")
        dtypes = {n: args[n].dtype for n in DECODE_DTYPE_NAMES}
        route = _decode(
            q.shape[1],
            v.shape[1],
            q.shape[0],
            env.arch,
            dtypes,
            q.shape[2],
            v.shape[2],
            state.dtype,
            state.is_contiguous(),
            self.hip_available,
            self.fly_available,
            flydsl_gdr_decode.TABLE_PATH,
            CONSTANTS,
        )
        variant = route.key if route.backend == "flydsl" else route.backend
        return Predicted(variant, route.key, route.reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same key, else "switch" (another kernel or another K split)."""
        return _expect(alone_key, batched_key)


@dataclass(frozen=True)
class SglangGdnPrefillRule:
    """The DispatchRule of SGLang's GDN prefill routing, for a validated gdn_prefill call.

    Attributes:
        aiter_available: whether AITER's VK prefill is taken to import.
    """

    aiter_available: bool = True
    name: str = "sglang_gdn_prefill"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The route of the call `args` (gdn_prefill's validated arguments), seen from sequence `request`."""
        q, v, state = args["q"], args["v"], args["state"]
        cu = checks.host_ints(args["cu_seqlens"])
        lens = [e - s for s, e in zip(cu, cu[1:])]
        _check_request(request, len(lens), "a sequence of cu_seqlens")
        route = prefill_route(
            q.shape[1],
            v.shape[1],
            lens,
            dtype=q.dtype,
            head_k_dim=q.shape[2],
            head_v_dim=v.shape[2],
            state_dtype=state.dtype,
            state_contiguous=state.is_contiguous(),
            aiter_available=self.aiter_available,
        )
        return Predicted(route.backend, route.key, route.reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same key, else "switch" (AITER's chunked kernel against Triton's)."""
        return _expect(alone_key, batched_key)


@dataclass(frozen=True)
class SglangGdnRule:
    """One DispatchRule for both GDN ops: a call with `cu_seqlens` is a gdn_prefill call, else gdn_decode."""

    decode: SglangGdnDecodeRule = SglangGdnDecodeRule()
    prefill: SglangGdnPrefillRule = SglangGdnPrefillRule()
    name: str = "sglang_gdn"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The decode or prefill route of the validated call `args`, seen from `request`."""
        rule = self.prefill if "cu_seqlens" in args else self.decode
        return rule.predict(args, request, env)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same key, else "switch"."""
        return _expect(alone_key, batched_key)


DECODE_RULE = SglangGdnDecodeRule()
PREFILL_RULE = SglangGdnPrefillRule()
RULE = SglangGdnRule()
