"""The FlyDSL GDN decode rule: AITER's lookup of gdr_decode_tuned.csv, and the control's extension."""

import csv
import random

import pytest
import torch

from gdn_lab.rules import flydsl_gdr_decode as rule

BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "arch, b, hk, hv, state_dtype, wtk, line",
    [
        # Read by hand from data/aiter/gdr_decode_tuned.csv (line numbers count the header as 1).
        ("gfx950", 1, 4, 8, F32, 32, 2690),
        ("gfx950", 2, 4, 8, F32, 16, 2691),
        ("gfx950", 8, 4, 8, F32, 16, 2697),
        ("gfx950", 64, 4, 8, F32, 8, 2753),
        ("gfx950", 256, 4, 8, F32, 16, 4609),
        ("gfx942", 1, 16, 32, F32, 8, 1154),
        ("gfx942", 128, 16, 32, F32, 16, 1281),
        ("gfx942", 1, 4, 8, BF16, 16, 2),
        ("gfx942", 4, 4, 8, BF16, 4, 5),
    ],
)
def test_hand_picked_rows(arch, b, hk, hv, state_dtype, wtk, line):
    got, row = rule.warp_threads_k(arch, b, hk, hv, 128, 128, BF16, state_dtype)
    assert (got, row.line, row.batch_size) == (wtk, line, b)


def test_every_sampled_row_is_found():
    """An independent read of the CSV: 200 random rows come back as the predictor's answer."""
    with rule.TABLE_PATH.open() as f:
        rows = list(csv.DictReader(f))
    for r in random.Random(0).sample(rows, 200):
        wtk, row = rule.warp_threads_k(
            r["arch"], int(r["b"]), int(r["num_k_heads"]), int(r["num_v_heads"]), int(r["head_k_dim"]),
            int(r["head_v_dim"]), r["dtype"], r["state_dtype"],
        )  # fmt: skip
        assert wtk == int(r["WARP_THREADS_K"]) and row.num_warps == int(r["NUM_WARPS"])


@pytest.mark.parametrize(
    "arch, b, hk, hv, kd, dtype, why",
    [
        ("gfx950", 257, 4, 8, 128, BF16, "past the gfx950 batches"),
        ("gfx942", 129, 4, 8, 128, BF16, "past the gfx942 batches"),
        ("gfx950", 4, 16, 48, 128, BF16, "Qwen3.5-27B ratio-3 heads"),
        ("gfx950", 4, 2, 4, 128, BF16, "(2, 4) heads"),
        ("gfx950", 4, 4, 8, 64, BF16, "K = 64"),
        ("gfx950", 4, 4, 8, 128, torch.float16, "fp16 queries"),
    ],
)
def test_untuned_launches_take_the_default(arch, b, hk, hv, kd, dtype, why):
    assert rule.warp_threads_k(arch, b, hk, hv, kd, kd, dtype, F32) == (rule.DEFAULT_WTK, None), why


def test_control_matches_aiter_on_tuned_shapes():
    for b in (1, 2, 3, 64, 200, 256, 300):
        pred = rule.control_prediction("gfx950", b, 4, 8, 128, 128, BF16, F32)
        assert pred.exact and (pred.wtk, pred.row) == rule.warp_threads_k("gfx950", b, 4, 8, 128, 128, BF16, F32)


def test_control_borrows_the_nearest_shape_and_says_so():
    pred = rule.control_prediction("gfx950", 1, 2, 4, 32, 32, F32, F32)
    assert not pred.exact
    assert (pred.shape.num_k_heads, pred.shape.num_v_heads, pred.shape.dtype) == (2, 8, "torch.bfloat16")
    assert "nearest tuned shape" in pred.note and f"line {pred.row.line}" in pred.note
    assert pred.wtk == rule.warp_threads_k("gfx950", 1, 2, 8, 128, 128, BF16, F32)[0]
    picks = {rule.control_prediction("gfx950", b, 2, 4, 32, 32, F32, F32).wtk for b in range(1, 64)}
    assert len(picks) > 1, "the control must vary with the batch on an untuned shape"
    past = rule.control_prediction("gfx950", 1000, 2, 4, 32, 32, F32, F32)
    assert past.row is None and past.wtk == rule.DEFAULT_WTK and "default" in past.note


def test_tuned_shapes():
    shapes = {(s.num_k_heads, s.num_v_heads) for s in rule.tuned_shapes("gfx950")}
    assert shapes == {(2, 8), (4, 8), (4, 16), (8, 16), (8, 32), (16, 32), (16, 64)}
    s = rule.Shape("torch.bfloat16", "torch.float32", 1, 4, 8, 128, 128)
    assert rule.tuned_batches("gfx950", s) == list(range(1, 257))
    assert rule.tuned_batches("gfx942", s) == list(range(1, 129))


def test_slow_rows_are_ignored(tmp_path):
    """Rows with duration >= 10000 are dropped, as AITER does."""
    src = rule.TABLE_PATH.read_text().splitlines()
    header, first = src[0], src[1].split(",")
    first[-1] = "10000.0"
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, ",".join(first), src[2]]) + "\n")
    assert rule.warp_threads_k("gfx942", 1, 4, 8, 128, 128, BF16, BF16, path=path) == (rule.DEFAULT_WTK, None)
    assert rule.warp_threads_k("gfx942", 2, 4, 8, 128, 128, BF16, BF16, path=path)[1].line == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arch": "gfx90a"}, "arch"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_v_heads": 8.0}, "num_v_heads"),
        ({"dtype": "bf16"}, "dtype"),
    ],
)
def test_bad_input(kwargs, match):
    call = dict(arch="gfx950", batch_size=1, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128)
    call.update(kwargs)
    with pytest.raises(ValueError, match=match):
        rule.warp_threads_k(**call)


def test_missing_table():
    with pytest.raises(ValueError, match="path"):
        rule.load_table("/nonexistent/gdr_decode_tuned.csv")
