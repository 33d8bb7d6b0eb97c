"""AITER's Triton unified_attention: the 2D kernel or the 3D split-KV kernel, as data plus a predictor.

Read from amd-aiter 0.1.7.post2.dev18, `aiter/ops/triton/unified_attention.py`
(`unified_attention`, `use_2d_kernel`, `select_2d_config`, `select_3d_config`):

- `BLOCK_M = 16` if num_queries_per_kv <= 16 else next_pow2(num_queries_per_kv);
  `BLOCK_Q = BLOCK_M // num_queries_per_kv`;
- `target_num_prgms = get_num_sms() * 4`; `num_2d_prgms = (num_q_tokens // BLOCK_Q + num_seqs) * num_kv_heads`;
- 2D iff `sliding_window > 0 or max_seqlen_k <= 512 or num_2d_prgms > target_num_prgms`;
- else 3D with `NUM_SEGMENTS = clamp(next_pow2(ceil(target_num_prgms / num_2d_prgms)), MIN, 128)`,
  `MIN = 16` when the tile (= the KV block size in decode) is <= 16, else 8.

`get_num_sms()` is the device's CU/SM count (132 on an H200; 256 on an MI350X, 80 on an MI308X),
so the same batch can take different kernels on different machines: the predictor takes `num_cus`
as a parameter, and the lab passes the count AITER saw (`gdn_lab.aiter.effective_num_cus`).

What a request's bits depend on (`numerics_key`): the 2D kernel makes one online-softmax pass over
the request's tiles (decode: tile = KV block, fixed by the cache), and is batch invariant. The 3D
kernel cuts the request into segments of `tiles_per_segment = ceil(seq_len / (NUM_SEGMENTS * tile))`
tiles, each merged by a reduce; the segment boundaries are its numerics (`numerics_key`,
`expect`: a request that fits one segment differs from 2D in the last step only). Two launches whose
NUM_SEGMENTS differ but give the request the same segments differ only in padded, masked lanes
of the reduce, which the lab predicts to be bitwise equal (a claim the experiment tests).

Example:
    >>> p = predict(num_seqs=1, num_q_tokens=1, num_q_heads=32, num_kv_heads=8, max_seqlen_q=1,
    ...             max_seqlen_k=4000, block_size=16, num_cus=132)
    >>> p.variant, numerics_key(p, 4000)
    ('3d:128seg', '3d:2tiles/seg')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gdn_lab import checks
from gdn_lab.rules.base import CallRule

SOURCE = "amd-aiter 0.1.7.post2.dev18, aiter/ops/triton/unified_attention.py::unified_attention/use_2d_kernel/select_3d_config"


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class UnifiedAttentionRule:
    """The constants of the 2D/3D choice.

    Attributes:
        programs_per_cu: target programs per CU (`target_num_prgms = cu_count * 4`).
        max_seqlen_k_2d: 2D whenever the batch's longest context is at most this.
        block_m_min: the smallest BLOCK_M.
        max_segments: the largest NUM_SEGMENTS.
        min_segments_small_tile, min_segments: the smallest NUM_SEGMENTS for tiles <= 16 and larger.
    """

    programs_per_cu: int = 4
    max_seqlen_k_2d: int = 512
    block_m_min: int = 16
    max_segments: int = 128
    min_segments_small_tile: int = 16
    min_segments: int = 8


RULE = UnifiedAttentionRule()


@dataclass(frozen=True)
class Prediction:
    """The kernel one launch takes.

    Attributes:
        variant: "2d", or "3d:<NUM_SEGMENTS>seg".
        num_segments: NUM_SEGMENTS (None for 2D).
        tile_size: the 3D tile (the KV block size); the 2D decode tile is the same.
        num_2d_prgms, target_num_prgms: the two sides of the comparison.
        reason: the condition that decided, in words.
    """

    variant: str
    num_segments: int | None
    tile_size: int
    num_2d_prgms: int
    target_num_prgms: int
    reason: str


def predict(
    num_seqs: int,
    num_q_tokens: int,
    num_q_heads: int,
    num_kv_heads: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_size: int,
    num_cus: int,
    sliding_window: int = 0,
    rule: UnifiedAttentionRule = RULE,
) -> Prediction:
    """Which kernel `unified_attention` launches for a batch.

    Args:
        num_seqs: requests in the batch.
        num_q_tokens: query tokens in the batch (q.shape[0]; = num_seqs in decode).
        num_q_heads, num_kv_heads: Hq and Hkv.
        max_seqlen_q: the longest query run (1 in decode).
        max_seqlen_k: the longest context.
        block_size: tokens per KV block (the 3D tile).
        num_cus: the CU/SM count `get_num_sms()` returns where the kernel runs.
        sliding_window: AITER's SLIDING_WINDOW (1 + window_size[0]; 0 without a window).
        rule: the constants (default: the wheel's).

    Returns:
        A Prediction.
    """
    for name, value in (
        ("num_seqs", num_seqs),
        ("num_q_tokens", num_q_tokens),
        ("num_q_heads", num_q_heads),
        ("num_kv_heads", num_kv_heads),
        ("max_seqlen_q", max_seqlen_q),
        ("max_seqlen_k", max_seqlen_k),
        ("block_size", block_size),
        ("num_cus", num_cus),
    ):
        checks.check_positive(name, value)
    checks.check_divides("num_kv_heads", num_kv_heads, "num_q_heads", num_q_heads)
    per_kv = num_q_heads // num_kv_heads
    block_m = rule.block_m_min if per_kv <= rule.block_m_min else _next_pow2(per_kv)
    block_q = block_m // per_kv
    target = num_cus * rule.programs_per_cu
    num_2d = (num_q_tokens // block_q + num_seqs) * num_kv_heads
    if sliding_window > 0:
        return Prediction("2d", None, block_size, num_2d, target, "sliding window")
    if max_seqlen_k <= rule.max_seqlen_k_2d:
        return Prediction(
            "2d", None, block_size, num_2d, target, f"max_seqlen_k {max_seqlen_k} <= {rule.max_seqlen_k_2d}"
        )
    if num_2d > target:
        return Prediction("2d", None, block_size, num_2d, target, f"num_2d_prgms {num_2d} > 4 x {num_cus} CUs")
    floor = rule.min_segments_small_tile if block_size <= 16 else rule.min_segments
    segments = max(min(_next_pow2(math.ceil(target / num_2d)), rule.max_segments), floor)
    return Prediction(
        f"3d:{segments}seg",
        segments,
        block_size,
        num_2d,
        target,
        f"num_2d_prgms {num_2d} <= 4 x {num_cus} CUs and max_seqlen_k {max_seqlen_k} > {rule.max_seqlen_k_2d}",
    )


def tiles_per_segment(prediction: Prediction, seq_len: int) -> int | None:
    """The 3D kernel's tiles per segment for a request of `seq_len` tokens (None in 2D)."""
    if prediction.num_segments is None:
        return None
    return -(-seq_len // (prediction.num_segments * prediction.tile_size))


def numerics_key(prediction: Prediction, seq_len: int) -> str:
    """What a request's bits depend on: "2d", or its 3D segmentation.

    "3d:<t>tiles/seg" for a request cut into several segments of t tiles; "3d:1seg" for a request
    that fits one segment; "one token" for a one-token context in any variant (its softmax weight
    and exp sum are exactly 1, so every variant returns the token's value).
    """
    if seq_len == 1:
        return "one token"
    tps = tiles_per_segment(prediction, seq_len)
    if tps is None:
        return "2d"
    if seq_len <= tps * prediction.tile_size:
        return "3d:1seg"
    return f"3d:{tps}tiles/seg"


def expect(alone_key: str, batch_key: str) -> str:
    """What the rule expects of a request's bits between two launches, from their numerics keys.

    Returns:
        "equal" (the same arithmetic), "switch" (another accumulation order: bits change), or
        "rounding" for 2D against a single 3D segment: both run the same loop over the same tiles,
        then 2D multiplies by 1 / exp_sum and 3D's reduce divides by it, at most one float32 ulp
        apart, so the bits differ only where that ulp crosses a rounding boundary of the output dtype.
    """
    if alone_key == batch_key:
        return "equal"
    if {alone_key, batch_key} == {"2d", "3d:1seg"}:
        return "rounding"
    return "switch"


def predict_call(args: Mapping[str, Any], num_cus: int, rule: UnifiedAttentionRule = RULE) -> Prediction:
    """The prediction for a validated decode_attention call (as the lab's backend launches it)."""
    q, seq_lens = args["q"], args["seq_lens"]
    return predict(
        num_seqs=q.shape[0],
        num_q_tokens=q.shape[0],
        num_q_heads=q.shape[1],
        num_kv_heads=args["k_cache"].shape[2],
        max_seqlen_q=1,
        max_seqlen_k=int(seq_lens.max()),
        block_size=args["page_size"],
        num_cus=num_cus,
        rule=rule,
    )


# The rule as the lab's backend carries it (`gdn_lab.rules.base.DispatchRule`).
DISPATCH = CallRule(
    "aiter_unified_attention",
    SOURCE,
    lambda args, env: predict_call(args, env.num_cus),
    lambda p, args, i: numerics_key(p, int(args["seq_lens"][i])),
    expect,
)
