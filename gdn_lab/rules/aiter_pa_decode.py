"""AITER's Triton paged decode: V1 (one pass) or V2 (1024-token partitions + reduce), as data plus a predictor.

Read from amd-aiter 0.1.7.post2.dev18, `aiter/ops/triton/pa_decode.py::paged_attention_decode`:

- `_SEQ_PARTITION_SIZE = 1024` and `max_num_partitions = ceil(max_seq_len / 1024)`;
- `use_v1 = max_seq_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_q_heads > 512)`;
- V1 (`paged_attn_decode_v1`) walks a request's context in one online-softmax pass; V2
  (`paged_attn_decode_v2`) computes each 1024-token partition apart, stores its max logit, exp sum
  and partial output (the partial in the output dtype), and a reduce kernel merges them.

`max_seq_len` is the caller's (the batch's longest context) and `num_seqs * num_q_heads` grows
with the batch, so the kernel follows the batch.

What a request's bits depend on (`numerics_key`): V1 rounds once, at the end of one pass; V2
rounds each partition's partial to the output dtype and merges them, so a request longer than one
partition changes bits when its batch switches between V1 and V2. A request of at most 1024 tokens
does not: V2's partition pass is V1's loop, and its reduce multiplies the one partial by
exp(0) = 1 and divides the exp sum by itself (exactly 1), so both store the same rounded value.

The reduce's width is the batch's, not the request's: `_paged_attn_decode_v2_w_dot_reduce_kernel`
loads a request's partitions as one tile of `MAX_NUM_SEQ_PARTITIONS_POW2 = next_pow2(
max_num_partitions)` rows (masked to its own partitions, zeros beyond) and adds them with `tl.sum`
over that axis, twice (the exp sums, then the rescaled partials). Padding with exact zeros would be
neutral in a fixed binary tree, but a GPU reduction is not one: how a tile's rows are spread over a
warp's threads (which partitions one thread adds in sequence before the shuffle tree) follows the
tile's shape, so the association of a request's partition sums changes with the batch's longest
context. The float32 results then differ in their last bits, and the output's rounding shows that
only for some elements and some data: so a request of several partitions whose reduce width differs
between two V2 launches is expected to be "rounding" (its bits may or may not change), never
"equal". Measured on the H200 (benchmarks/probe_aiter_pa_decode_reduce.py, data/bench/h200/
probe_aiter_pa_decode_reduce.csv): with the inputs fixed and only the reduce width changed, targets of
2000, 4000 and 7000 tokens changed 1 or 2 ulp in 1 to 2 of 8 seeds at widths above their own, never
at their own width (0 of 64); 1025 tokens (a second partition of one token) never. Under Triton's CPU interpreter `tl.sum` is numpy's, which adds the rows in order, so
padding is neutral there.

Example:
    >>> predict(num_seqs=17, num_q_heads=32, max_seq_len=4000).variant
    'v1'
    >>> p = predict(num_seqs=16, num_q_heads=32, max_seq_len=4000)
    >>> p.variant, numerics_key(p, 4000), numerics_key(p, 1000)
    ('v2', 'partitioned:reduce4', 'single pass')
    >>> expect("partitioned:reduce4", numerics_key(predict(2, 32, 16383), 4000))
    'rounding'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gdn_lab import checks
from gdn_lab.rules.base import CallRule

SOURCE = "amd-aiter 0.1.7.post2.dev18, aiter/ops/triton/pa_decode.py::paged_attention_decode"


@dataclass(frozen=True)
class PaDecodeRule:
    """The constants of the V1/V2 choice.

    Attributes:
        partition_size: tokens per V2 partition (`_SEQ_PARTITION_SIZE`).
        v1_max_seq_len: V1 only when the batch's longest context is at most this.
        v1_min_rows: V1 for a multi-partition batch only when num_seqs * num_q_heads exceeds this.
    """

    partition_size: int = 1024
    v1_max_seq_len: int = 8192
    v1_min_rows: int = 512


RULE = PaDecodeRule()


@dataclass(frozen=True)
class Prediction:
    """The kernel one launch takes.

    Attributes:
        variant: "v1" or "v2".
        max_num_partitions: ceil(max_seq_len / partition_size).
        reduce_width: the V2 reduce's partition tile, next_pow2(max_num_partitions).
        rows: num_seqs * num_q_heads.
        reason: the condition that decided, in words.
    """

    variant: str
    max_num_partitions: int
    rows: int
    reason: str

    @property
    def reduce_width(self) -> int:
        return 1 << (self.max_num_partitions - 1).bit_length()


def predict(num_seqs: int, num_q_heads: int, max_seq_len: int, rule: PaDecodeRule = RULE) -> Prediction:
    """Which kernel `paged_attention_decode` runs for a batch.

    Args:
        num_seqs: requests in the batch.
        num_q_heads: query heads (Hq).
        max_seq_len: the longest context in the batch (what callers pass).
        rule: the constants (default: the wheel's).

    Returns:
        A Prediction.
    """
    for name, value in (("num_seqs", num_seqs), ("num_q_heads", num_q_heads), ("max_seq_len", max_seq_len)):
        checks.check_positive(name, value)
    parts = -(-max_seq_len // rule.partition_size)
    rows = num_seqs * num_q_heads
    if max_seq_len > rule.v1_max_seq_len:
        return Prediction("v2", parts, rows, f"max_seq_len {max_seq_len} > {rule.v1_max_seq_len}")
    if parts == 1:
        return Prediction("v1", parts, rows, f"one partition (max_seq_len {max_seq_len} <= {rule.partition_size})")
    if rows > rule.v1_min_rows:
        return Prediction("v1", parts, rows, f"num_seqs*num_q_heads {rows} > {rule.v1_min_rows}")
    return Prediction("v2", parts, rows, f"{parts} partitions and num_seqs*num_q_heads {rows} <= {rule.v1_min_rows}")


def numerics_key(prediction: Prediction, seq_len: int, rule: PaDecodeRule = RULE) -> str:
    """What a request of `seq_len` tokens' bits depend on: "single pass", or
    "partitioned:reduce<width>" (V2 with several partitions, reduced over a tile of that width)."""
    if prediction.variant == "v1" or seq_len <= rule.partition_size:
        return "single pass"
    return f"partitioned:reduce{prediction.reduce_width}"


def predict_call(args: Mapping[str, Any], rule: PaDecodeRule = RULE) -> Prediction:
    """The prediction for a validated decode_attention call (as the lab's backend launches it)."""
    q, seq_lens = args["q"], args["seq_lens"]
    return predict(q.shape[0], q.shape[1], int(seq_lens.max()), rule)


def expect(alone_key: str, batch_key: str) -> str:
    """ "equal" for the same numerics key; "rounding" for two V2 reduces of different widths (the
    float32 association moves, the output's bits may or may not); else "switch" (V1 against V2)."""
    if alone_key == batch_key:
        return "equal"
    if alone_key.startswith("partitioned") and batch_key.startswith("partitioned"):
        return "rounding"
    return "switch"


# The rule as the lab's backend carries it (`gdn_lab.rules.base.DispatchRule`).
DISPATCH = CallRule(
    "aiter_pa_decode",
    SOURCE,
    lambda args, env: predict_call(args),
    lambda p, args, i: numerics_key(p, int(args["seq_lens"][i])),
    expect,
)
