"""AITER's fused GDN prefill schedule rule, checked against its sources' own statements.

The expectations restate aiter_contracts.md 3.8 and the cases of AITER's own dispatch test
(op_tests/triton_tests/.../test_fused_gdn_prefill_qkvz.py), not the module's code.
"""

from __future__ import annotations

import pytest

from gdn_lab.rules import aiter_fused_gdn_prefill as rule


@pytest.mark.parametrize(
    "tokens,batch,tile",
    [
        (1023, 1, None),
        (1024, 1, "m1024_3071"),
        (3071, 64, "m1024_3071"),
        (3072, 1, "m3072_16384"),
        (12288, 5, "m3072_16384"),
        (12289, 5, "m12289_16384_b1_5"),
        (12289, 6, "m12289_16384_b6_15"),
        (16384, 15, "m12289_16384_b6_15"),
        (16384, 16, "m3072_16384"),
        (16385, 1, None),
        (2048, 65, None),
        (2048, 0, None),
    ],
)
def test_tile_bands(tokens, batch, tile):
    assert rule.select_tile_key(tokens, batch) == tile


@pytest.mark.parametrize(
    "seqlens,tile",
    [([1024], "m1024_3071"), ([1024, 1024], "m1024_3071"), ([3072], "m3072_16384"), ([2048] * 3, "m3072_16384"),
     ([12289], "m12289_16384_b1_5"), ([1600] * 8, "m12289_16384_b6_15")],
)  # fmt: skip
def test_aiter_dispatch_test_cases(seqlens, tile):
    assert rule.select_tile_key(sum(seqlens), len(seqlens)) == tile


def test_m1024_3071_chunk_size():
    """<= 3071 tokens: chunk 32 if batch >= 16 or 5 <= batch <= 7, else 64 (aiter_contracts.md 3.8)."""
    for batch in range(1, 65):
        want = 32 if batch >= 16 or batch in (5, 6, 7) else 64
        assert rule.schedule(2048, batch).chunk_size == want
        assert rule.control_chunk_size(100, batch) == want  # below the covered range: clamped to this tile


def test_larger_tiles_chunk_by_32():
    for tokens, batch in ((3072, 1), (8192, 4), (12289, 3), (14000, 10), (16384, 64)):
        assert rule.schedule(tokens, batch).chunk_size == 32
    assert rule.control_chunk_size(10**6, 1) == 32 and rule.control_chunk_size(10, 1000) == 32


def test_predict():
    same = rule.predict(target_tokens=1024, total_tokens=2048, batch=2)  # both batch <= 2, chunk 64, V tile 8
    assert same.differs is False
    changed = rule.predict(target_tokens=1024, total_tokens=2048, batch=3)  # V tile 8 -> 16
    assert changed.differs is True and "value_tile 8 -> 16" in changed.reason
    assert rule.predict(1024, 5120, 5).differs is True  # another tile
    uncovered = rule.predict(target_tokens=100, total_tokens=2048, batch=4)
    assert uncovered.differs is None and uncovered.alone is None and "alone" in uncovered.reason


@pytest.mark.parametrize(
    "target,total,batch,differs",
    [(65, 300, 5, True), (65, 300, 4, False), (20, 300, 5, False), (100, 4000, 2, True), (100, 900, 16, True)],
)
def test_control_differs(target, total, batch, differs):
    """The controls split a target differently when the rule changes the chunk and the target spans > 32 tokens."""
    assert rule.control_differs(target, total, batch) is differs
