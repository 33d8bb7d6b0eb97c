"""CK's batch prefill (AITER `mha_batch_prefill_func`): which tile a launch takes, as data plus a predictor.

Read from CK's code generator `example/ck_tile/01_fmha/codegen/ops/fmha_batch_prefill.py` (CK
af99a0ad and 01ab82ef, rocm-libraries `projects/composablekernel/...` c449990b: the rule is the same
in all three; aiter pins CK 15e12dd7, which could not be read), summarised in aiter_contracts.md 2.3.
The generated dispatcher `fmha_batch_prefill(...)`:

- reads `num_cus = hipDeviceProp.multiProcessorCount` and `min_cu_util_rate = 0.8` (a C++ float);
- counts `get_num_blocks(kM0) = batch * nhead_q * ceil(max_seqlen_q / kM0)` (one block per
  128-row query tile per head and sequence);
- picks the head-dim case by `hdim_q <= hdim` (so a head dim up to 128 takes the 128 case, up to
  256 the 256 case) and then the first tile whose constraint holds:
  - hdim 128, fp16/bf16: `64x128x64` (warp MFMA 16x16x16) iff `get_num_blocks(128) < num_cus * 0.8`,
    else the default `128x128x32` (warp MFMA 32x32x16);
  - hdim 256 (fp16/bf16), and the fp8 (`fp8bf16`) variants of either head dim: one tile,
    `128x128x32`.

The two hdim-128 tiles step the QK and PV sums by another bk0 (64 vs 32) with another MFMA shape,
so a request's logits, and so its output, follow how many sequences (and query heads, and the
longest new-token run) share its launch: the numerics key is the tile. CK has no split-KV here;
nothing else in the launch follows the batch (the `max_seqlen_q == 1` mask instance is outside
this rule). The comparison is done as the C++ does, in float32 (`unsigned < unsigned * float`).

Example:
    >>> select_tile(batch=6, nhead_q=32, max_seqlen_q=1, head_dim=128, num_cus=256).variant
    '64x128x64'
    >>> select_tile(batch=7, nhead_q=32, max_seqlen_q=1, head_dim=128, num_cus=256).variant
    '128x128x32'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gdn_lab import checks
from gdn_lab.rules.base import Predicted, RuleEnv

SOURCE = (
    "composable_kernel af99a0ad/01ab82ef (rocm-libraries c449990b), "
    "example/ck_tile/01_fmha/codegen/ops/fmha_batch_prefill.py::fmha_batch_prefill (generated dispatcher)"
)
DTYPES = ("fp16", "bf16", "fp8bf16")


@dataclass(frozen=True)
class Tile:
    """One CK batch-prefill tile.

    Attributes:
        bm0, bn0, bk0: the query-rows x keys x head-dim-step block of the QK gemm.
        warp_mfma: the warp gemm (M, N, K) of both gemms.
    """

    bm0: int
    bn0: int
    bk0: int
    warp_mfma: tuple[int, int, int]

    @property
    def name(self) -> str:
        return f"{self.bm0}x{self.bn0}x{self.bk0}"


@dataclass(frozen=True)
class CkBatchPrefillConstants:
    """The constants of the tile switch.

    Attributes:
        min_cu_util_rate: the small tile only below this fraction of the CUs in blocks.
        block_rows: the kM0 the block count is taken with (128, whatever tile runs).
        small_tile, default_tile: the hdim-128 fp16/bf16 tiles, in the order they are checked.
        single_tile: the one tile of hdim 256 and of the fp8 variants.
        switch_head_dim: the head-dim case with two tiles.
        max_head_dim: the largest head dim generated.
    """

    min_cu_util_rate: float = 0.8
    block_rows: int = 128
    small_tile: Tile = Tile(64, 128, 64, (16, 16, 16))
    default_tile: Tile = Tile(128, 128, 32, (32, 32, 16))
    single_tile: Tile = Tile(128, 128, 32, (32, 32, 16))
    switch_head_dim: int = 128
    max_head_dim: int = 256


CONSTANTS = CkBatchPrefillConstants()


@dataclass(frozen=True)
class Prediction:
    """The tile one launch takes.

    Attributes:
        variant: the tile name ("64x128x64" or "128x128x32").
        tile: the Tile.
        num_blocks: `get_num_blocks(128)`.
        threshold: `num_cus * 0.8` as the C++ computes it (float32); None where one tile exists.
        reason: the condition that decided, in words.
    """

    variant: str
    tile: Tile
    num_blocks: int
    threshold: float | None
    reason: str


def dtype_key(q_dtype: torch.dtype | str, kv_dtype: torch.dtype | str | None = None) -> str:
    """CK's data-type name for a call: "fp16", "bf16", or "fp8bf16" for an fp8 KV cache.

    SGLang casts q to fp8 for an fp8 cache, which runs CK's fp8 variant.

    Example:
        >>> dtype_key(torch.bfloat16), dtype_key(torch.bfloat16, torch.float8_e4m3fn)
        ('bf16', 'fp8bf16')
    """
    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    kv = q_dtype if kv_dtype is None else kv_dtype
    if isinstance(kv, torch.dtype) and kv in checks.FP8_DTYPES:
        return "fp8bf16"
    if isinstance(q_dtype, str):
        checks.check_choice("dtype", q_dtype, DTYPES)
        return q_dtype
    if q_dtype in checks.FP8_DTYPES:
        return "fp8bf16"
    if q_dtype not in names:
        raise ValueError(
            f"dtype: {q_dtype} has no CK batch prefill kernel; accepted: float16, bfloat16 (or an fp8 KV cache)"
        )
    return names[q_dtype]


def num_blocks(batch: int, nhead_q: int, max_seqlen_q: int, block_rows: int = 128) -> int:
    """CK's `get_num_thread_blocks`: batch * nhead_q * ceil(max_seqlen_q / block_rows)."""
    return batch * nhead_q * (-(-max_seqlen_q // block_rows))


def cu_threshold(num_cus: int, constants: CkBatchPrefillConstants = CONSTANTS) -> float:
    """`num_cus * min_cu_util_rate` in float32, as the dispatcher compares it.

    Example:
        >>> cu_threshold(80), round(cu_threshold(256), 3)
        (64.0, 204.8)
    """
    return float(np.float32(num_cus) * np.float32(constants.min_cu_util_rate))


def select_tile(
    batch: int,
    nhead_q: int,
    max_seqlen_q: int,
    head_dim: int,
    num_cus: int,
    dtype: torch.dtype | str = "bf16",
    constants: CkBatchPrefillConstants = CONSTANTS,
) -> Prediction:
    """The tile CK's batch prefill launches.

    Args:
        batch: sequences in the launch.
        nhead_q: query heads (local, per rank).
        max_seqlen_q: the longest run of new (query) tokens in the launch.
        head_dim: the q/v head size.
        num_cus: the device's CU count (MI350X/MI355X 256, MI300X 304, MI308X 80).
        dtype: "fp16", "bf16", "fp8bf16" or a torch dtype (see `dtype_key`).
        constants: the rule's constants.

    Returns:
        A Prediction.
    """
    for name, value in (
        ("batch", batch),
        ("nhead_q", nhead_q),
        ("max_seqlen_q", max_seqlen_q),
        ("head_dim", head_dim),
        ("num_cus", num_cus),
    ):
        checks.check_positive(name, value)
    if head_dim > constants.max_head_dim:
        raise ValueError(f"head_dim: {head_dim} is above CK batch prefill's largest, {constants.max_head_dim}")
    kind = dtype_key(dtype)
    blocks = num_blocks(batch, nhead_q, max_seqlen_q, constants.block_rows)
    if head_dim > constants.switch_head_dim or kind == "fp8bf16":
        case = f"hdim {constants.max_head_dim if head_dim > constants.switch_head_dim else constants.switch_head_dim}"
        tile = constants.single_tile
        return Prediction(tile.name, tile, blocks, None, f"{case} {kind}: one tile")
    threshold = cu_threshold(num_cus, constants)
    if float(np.float32(blocks)) < threshold:
        tile = constants.small_tile
        why = f"{blocks} blocks < {num_cus} CUs x {constants.min_cu_util_rate} = {threshold:g}"
    else:
        tile = constants.default_tile
        why = f"{blocks} blocks >= {num_cus} CUs x {constants.min_cu_util_rate} = {threshold:g}"
    return Prediction(tile.name, tile, blocks, threshold, f"hdim 128 {kind}: {why}")


def small_tile_limit(
    nhead_q: int, num_cus: int, block_rows: int = 128, constants: CkBatchPrefillConstants = CONSTANTS
) -> int:
    """The largest batch * ceil(max_seqlen_q / 128) that still takes the small hdim-128 tile (0: never).

    Example:
        >>> small_tile_limit(32, 256), small_tile_limit(32, 80), small_tile_limit(32, 304)
        (6, 1, 7)
    """
    checks.check_positive("nhead_q", nhead_q)
    checks.check_positive("num_cus", num_cus)
    threshold, n = cu_threshold(num_cus, constants), 0
    while float(np.float32((n + 1) * nhead_q)) < threshold:
        n += 1
    return n


def numerics_key(prediction: Prediction) -> str:
    """What a request's bits depend on: the tile (its bk0 and MFMA shape)."""
    return prediction.variant


@dataclass(frozen=True)
class CkBatchPrefillRule:
    """The DispatchRule of CK's tile switch, for a validated prefill_attention call.

    The launch's batch is the call's sequences, its max_seqlen_q their longest new-token run, its
    CU count `env.num_cus`; an fp8 KV cache runs the fp8 variant, as SGLang calls it.
    """

    name: str = "ck_batch_prefill"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The tile of the call `args` (prefill_attention's validated arguments), seen from `request`."""
        q = args["q"]
        qo = checks.host_ints(args["qo_indptr"])
        batch = len(qo) - 1
        if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < batch:
            raise ValueError(f"request: expected a sequence index in [0, {batch}), got {request!r}")
        max_q = max(e - s for s, e in zip(qo, qo[1:]))
        p = select_tile(batch, q.shape[1], max_q, q.shape[2], env.num_cus, dtype_key(q.dtype, args["k_cache"].dtype))
        return Predicted(p.variant, numerics_key(p), p.reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same tile, else "switch"."""
        return "equal" if alone_key == batched_key else "switch"


RULE = CkBatchPrefillRule()
