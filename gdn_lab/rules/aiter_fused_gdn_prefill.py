"""AITER's fused GDN prefill (`fused_gdn_prefill_qkvz`): which schedule a launch takes, as data plus a predictor.

Source: ROCm/aiter `aiter/ops/triton/gated_delta_net/fused_gdn_prefill_qkvz.py` (`_select_tile_key`,
commit 84e47fa3) and the four host launchers beside it, `_gdn_prefill_launch_<tile>.py`
(m1024_3071 at 84e47fa3, the others at 7734b8f5); aiter PR #5606, aiter_contracts.md 3.8. The op
covers Qwen3-Next TP4 only (HK/HV 4/8, K = V = 128, width 4, bf16, gfx950), 1024..16384 tokens
and 1..64 sequences, and picks one of four tile schedules from (tokens, batch). Inside a tile the
chunk size, the V tile of the recurrence and the way the state crosses chunks (chunk after chunk,
segments, hierarchical blocks, snapshots) follow the batch too; each of those changes the float32
arithmetic, so a sequence's bits follow what it is batched with.

- `select_tile_key` mirrors AITER's dispatch exactly (None outside the covered range, where a
  caller such as SGLang falls back to the unfused chain).
- `schedule` is the tile's batch-dependent choices: chunk size, V tile, scan structure.
- `predict` says whether a target computed alone and inside a batch takes two schedules.
- `RULE` is the DispatchRule the `aiter-fused` backend carries (its key: the whole schedule).
- `control_chunk_size` is the lab's control rule: the chunk size of `schedule` with (tokens, batch)
  clamped into the covered range, so the controls `triton-chunk-by-batch` and
  `triton-fused-tiles-by-batch` follow the rule on any shape, tiny CPU ones included.

Example:
    >>> select_tile_key(2048, 4), schedule(2048, 4).chunk_size, schedule(2048, 5).chunk_size
    ('m1024_3071', 64, 32)
    >>> predict(target_tokens=1024, total_tokens=2048, batch=6).differs
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn_lab import checks
from gdn_lab.rules.base import Predicted

MIN_TOKENS, MAX_TOKENS, MAX_BATCH = 1024, 16384, 64

# (largest token count, largest batch, tile), first match wins: `_select_tile_key`'s branches
TILE_BANDS: tuple[tuple[int, int, str], ...] = (
    (3071, MAX_BATCH, "m1024_3071"),
    (12288, MAX_BATCH, "m3072_16384"),
    (MAX_TOKENS, 5, "m12289_16384_b1_5"),
    (MAX_TOKENS, 15, "m12289_16384_b6_15"),
    (MAX_TOKENS, MAX_BATCH, "m3072_16384"),
)


@dataclass(frozen=True)
class Schedule:
    """The batch-dependent choices of one launch of AITER's fused GDN prefill.

    Attributes:
        tile: the tile key (`_select_tile_key`).
        chunk_size: tokens per chunk of the chunked delta rule.
        value_tile: V rows per program of the launch that owns the state recurrence.
        scan: how the state crosses chunks, with the flags that change its arithmetic.
    """

    tile: str
    chunk_size: int
    value_tile: int
    scan: str


def select_tile_key(tokens: int, batch: int) -> str | None:
    """AITER's tile for (total tokens, number of sequences), or None outside the covered range."""
    if not (MIN_TOKENS <= tokens <= MAX_TOKENS and 1 <= batch <= MAX_BATCH):
        return None
    return next(tile for max_tokens, max_batch, tile in TILE_BANDS if tokens <= max_tokens and batch <= max_batch)


def _m1024_3071(m: int, batch: int) -> Schedule:
    chunk = 32 if batch >= 16 or 5 <= batch <= 7 else 64
    value_tile = 64 if batch >= 16 else (8 if batch <= 2 else 16)
    # segments need m >= 4096, outside this tile; batch <= 2 keeps every chunk's state for the output
    outputs = "from stored chunk states" if batch <= 2 else "from carried rows"
    return Schedule("m1024_3071", chunk, value_tile, f"chunk after chunk, outputs {outputs}")


def _m3072_16384(m: int, batch: int) -> Schedule:
    snapshots = 3 <= batch <= 4 and m <= 4096
    hierarchical = batch <= 5 and (batch < 4 or m > 4096) and not snapshots
    compact = ", compact qk" if batch >= 16 else ""
    if snapshots:
        return Schedule("m3072_16384", 32, 16, "chunk states as snapshots")
    if hierarchical:
        wide = 12288 < m <= 16384 and 3 <= batch <= 5
        group = 4 if m <= 2048 else 12 if 4096 < m <= 6144 else 8 if m <= 8192 else 24 if m <= 12288 else 16
        group = 20 if wide else group
        value_tile = 16 if m < 4096 else 128 if m >= 32768 else 64 if wide else 32
        value_tile = 32 if 12288 < m <= 16384 and batch == 2 else value_tile
        return Schedule("m3072_16384", 32, value_tile, f"hierarchical, blocks of {group} chunks")
    layout = "" if 8 <= batch < 16 else ", transposed"
    return Schedule("m3072_16384", 32, 64 if batch >= 32 else 32, f"chunk after chunk{layout}{compact}")


def _b1_5_segment_tokens(m: int, batch: int) -> int:
    if 2 < batch < 8 and m <= 4096:
        return 0
    if batch <= 4 and m <= 4096:
        return 128
    if m <= 2048 * batch:
        return 0
    if batch == 1:
        return 1024 if m >= 32768 else ((m + 511) // 512) * 32 if m <= 12288 else 512
    if 3 <= batch <= 4 and m >= 24576:
        return 1024
    if 3 <= batch <= 5 and 12288 <= m <= 24576:
        return 704
    if (batch == 2 and m >= 16384) or (batch > 4 and m > 4096 * batch):
        return 512
    return 256


def _m12289_16384_b1_5(m: int, batch: int) -> Schedule:
    seg = _b1_5_segment_tokens(m, batch)
    wide = batch == 2 and m >= 16384
    value_tile = (64 if wide or m >= 32768 else 32) if seg else (32 if batch < 32 else 64)
    scan = f"segments of {seg} tokens" if seg else "chunk after chunk"
    return Schedule("m12289_16384_b1_5", 32, value_tile, scan)


def _m12289_16384_b6_15(m: int, batch: int) -> Schedule:
    # batches 6..15 take the compact path; the V tile and the transposed layout switch at 8
    if batch <= 8:
        return Schedule("m12289_16384_b6_15", 32, 16, "compact chunk after chunk, transposed")
    return Schedule("m12289_16384_b6_15", 32, 32, "compact chunk after chunk")


_SCHEDULES = {
    "m1024_3071": _m1024_3071,
    "m3072_16384": _m3072_16384,
    "m12289_16384_b1_5": _m12289_16384_b1_5,
    "m12289_16384_b6_15": _m12289_16384_b6_15,
}


def schedule(tokens: int, batch: int) -> Schedule | None:
    """The schedule AITER's fused GDN prefill runs for (total tokens, number of sequences), or None if uncovered."""
    tile = select_tile_key(tokens, batch)
    return None if tile is None else _SCHEDULES[tile](tokens, batch)


def control_chunk_size(tokens: int, batch: int) -> int:
    """The controls' chunk size: `schedule`'s, with tokens and batch clamped into the covered range.

    Below 1024 tokens this is the m1024_3071 rule (32 if batch >= 16 or 5 <= batch <= 7, else 64);
    every tile above 3071 tokens chunks by 32.
    """
    clamped = schedule(min(max(tokens, MIN_TOKENS), MAX_TOKENS), min(max(batch, 1), MAX_BATCH))
    assert clamped is not None  # the clamped point is inside the covered range
    return clamped.chunk_size


@dataclass(frozen=True)
class Prediction:
    """Whether a target's schedule alone differs from its schedule inside a batch.

    Attributes:
        alone: the schedule of the target alone (None: AITER's op does not cover it).
        batched: the schedule of the whole batch (None: not covered).
        differs: True if the two schedules differ, False if they are the same, None if either is
            uncovered (the caller runs another path there, which this rule does not describe).
        reason: one line saying which choice changes.
    """

    alone: Schedule | None
    batched: Schedule | None
    differs: bool | None
    reason: str


def predict(target_tokens: int, total_tokens: int, batch: int) -> Prediction:
    """Compare the schedule of a target alone (target_tokens, batch 1) and in its batch (total_tokens, batch)."""
    alone, batched = schedule(target_tokens, 1), schedule(total_tokens, batch)
    if alone is None or batched is None:
        where = "alone" if alone is None else "batched"
        return Prediction(alone, batched, None, f"not covered {where} (1024..16384 tokens, 1..64 sequences)")
    changed = [f for f in ("tile", "chunk_size", "value_tile", "scan") if getattr(alone, f) != getattr(batched, f)]
    if not changed:
        return Prediction(alone, batched, False, f"same schedule ({alone.tile}, chunk {alone.chunk_size})")
    detail = ", ".join(f"{f} {getattr(alone, f)} -> {getattr(batched, f)}" for f in changed)
    return Prediction(alone, batched, True, detail)


def control_differs(target_tokens: int, total_tokens: int, batch: int) -> bool:
    """Whether the controls chunk a target differently alone and in its batch, splitting it differently.

    A target of at most 32 tokens is one chunk under either chunk size; only its tile shape changes,
    which need not change its bits, so it is not counted as a predicted difference.
    """
    chunks = control_chunk_size(target_tokens, 1), control_chunk_size(total_tokens, batch)
    return chunks[0] != chunks[1] and target_tokens > min(chunks)


def schedule_key(s: Schedule | None) -> str:
    """A schedule as the numerics key of its launch ("unfused" outside the covered range)."""
    return "unfused" if s is None else f"{s.tile} chunk={s.chunk_size} vtile={s.value_tile} {s.scan}"


@dataclass(frozen=True)
class FusedGdnPrefillRule:
    """The DispatchRule of `fused_gdn_prefill_qkvz`'s schedule, for a validated gdn_layer_prefill call.

    The launch is the call's total tokens (projected_qkvz.shape[0]) and sequences (cu_seqlens);
    every sequence of one launch shares its schedule, which is its numerics key.
    """

    name: str = "aiter_fused_gdn_prefill"
    source: str = (
        "aiter PR #5606 aiter/ops/triton/gated_delta_net/fused_gdn_prefill_qkvz.py::_select_tile_key "
        "+ _gdn_prefill_launch_<tile>.py"
    )

    def predict(self, args, request: int, env) -> Predicted:
        """The schedule of the call `args`, seen from sequence `request`."""
        cu = checks.host_ints(args["cu_seqlens"])
        batch = len(cu) - 1
        if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < batch:
            raise ValueError(f"request: expected a sequence index in [0, {batch}), got {request!r}")
        tokens = int(args["projected_qkvz"].shape[0])
        key = schedule_key(schedule(tokens, batch))
        return Predicted(key, key, f"{tokens} tokens in {batch} sequences: {key}")

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same schedule, else "switch" (another chunk size, V tile or scan)."""
        return "equal" if alone_key == batched_key else "switch"


RULE = FusedGdnPrefillRule()
