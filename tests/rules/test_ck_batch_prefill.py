"""CK batch prefill's tile switch, checked against aiter_contracts.md 2.3 (worked thresholds included)."""

from __future__ import annotations

import doctest

import pytest
import torch

from gdn_lab.cache import random_paged_kv
from gdn_lab.ops import spec
from gdn_lab.rules import ck_batch_prefill as ck
from gdn_lab.rules.base import RuleEnv

prefill_op = spec.get("prefill_attention")

SMALL, LARGE = "64x128x64", "128x128x32"


def test_docstring_examples():
    result = doctest.testmod(ck)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    "num_cus, limit",
    [(256, 6), (80, 1), (304, 7)],  # MI350X/MI355X, MI308X, MI300X
)
def test_qwen3_8b_worked_thresholds(num_cus, limit):
    """Qwen3-8B (Hq 32, hdim 128): small tile iff batch * ceil(max_q / 128) <= limit (aiter_contracts.md 2.3)."""
    assert ck.small_tile_limit(32, num_cus) == limit
    for batch in range(1, 12):
        for max_q in (1, 100, 128, 129, 256, 257, 384, 768, 769, 1024):
            product = batch * -(-max_q // 128)
            got = ck.select_tile(batch, 32, max_q, 128, num_cus, "bf16").variant
            assert got == (SMALL if product <= limit else LARGE), (batch, max_q, num_cus)


@pytest.mark.parametrize(
    "batch, max_q, num_cus, tile",
    [
        (6, 1, 256, SMALL), (7, 1, 256, LARGE),      # MI350X: 192 < 204.8 <= 224 blocks
        (3, 256, 256, SMALL), (4, 256, 256, LARGE),  # ceil(256 / 128) = 2
        (1, 768, 256, SMALL), (1, 769, 256, LARGE),  # 6 vs 7 row tiles
        (1, 128, 80, SMALL), (1, 129, 80, LARGE), (2, 1, 80, LARGE),  # MI308X: 32 < 64 <= 64 blocks
        (7, 1, 304, SMALL), (8, 1, 304, LARGE),      # MI300X: 224 < 243.2 <= 256 blocks
    ],
)  # fmt: skip
def test_both_sides_of_each_threshold(batch, max_q, num_cus, tile):
    assert ck.select_tile(batch, 32, max_q, 128, num_cus).variant == tile


def test_comparison_is_strict():
    """blocks < num_cus * 0.8: exactly 0.8 x CUs blocks takes the default tile."""
    assert ck.cu_threshold(80) == 64.0
    assert ck.select_tile(1, 63, 1, 128, 80).variant == SMALL
    assert ck.select_tile(1, 64, 1, 128, 80).variant == LARGE
    assert ck.select_tile(1, 203, 1, 128, 255).variant == SMALL  # 255 * 0.8 = 204
    assert ck.select_tile(1, 204, 1, 128, 255).variant == LARGE


def test_block_count_uses_128_rows_whatever_runs():
    assert ck.num_blocks(3, 32, 129) == 3 * 32 * 2
    assert ck.select_tile(2, 32, 1, 128, 256).num_blocks == 64


@pytest.mark.parametrize(
    "head_dim, dtype, tiles",
    [
        (128, "bf16", {SMALL, LARGE}),
        (128, "fp16", {SMALL, LARGE}),
        (64, "bf16", {SMALL, LARGE}),  # hdim_q <= 128: the 128 case
        (128, "fp8bf16", {LARGE}),
        (256, "bf16", {LARGE}),
        (192, "bf16", {LARGE}),  # hdim_q <= 256: the 256 case
        (256, "fp8bf16", {LARGE}),
    ],
)
def test_which_cases_switch(head_dim, dtype, tiles):
    got = {ck.select_tile(b, 32, 1, head_dim, 256, dtype).variant for b in range(1, 40)}
    assert got == tiles


def test_key_changes_exactly_with_the_tile():
    preds = [ck.select_tile(b, 32, 1, 128, 256) for b in range(1, 40)]
    for a, b in zip(preds, preds[1:]):
        same_tile = a.tile == b.tile
        assert (ck.numerics_key(a) == ck.numerics_key(b)) is same_tile
        assert ck.RULE.expect(ck.numerics_key(a), ck.numerics_key(b)) == ("equal" if same_tile else "switch")
    assert ck.CONSTANTS.small_tile.bk0 != ck.CONSTANTS.default_tile.bk0  # another K step: another sum order


def test_dtype_key():
    assert ck.dtype_key(torch.float16) == "fp16"
    assert ck.dtype_key(torch.float8_e4m3fnuz) == "fp8bf16"
    assert ck.dtype_key(torch.bfloat16, torch.float8_e4m3fnuz) == "fp8bf16"
    with pytest.raises(ValueError, match="dtype"):
        ck.dtype_key(torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        ck.dtype_key("fp32")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch": 0}, "batch"),
        ({"num_cus": 0}, "num_cus"),
        ({"head_dim": 320}, "head_dim"),
        ({"nhead_q": 2.0}, "nhead_q"),
    ],
)
def test_bad_input(kwargs, match):
    call = dict(batch=1, nhead_q=32, max_seqlen_q=1, head_dim=128, num_cus=256)
    call.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ck.select_tile(**call)


def _prefill_args(new_tokens, kv_dtype=None, hq: int = 32, hkv: int = 8, d: int = 128):
    lens = [n + 50 for n in new_tokens]
    kv = random_paged_kv(lens, hkv, d, dtype=torch.bfloat16, kv_dtype=kv_dtype, seed=0)
    q = torch.zeros(sum(new_tokens), hq, d, dtype=torch.bfloat16)
    qo = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()], dtype=torch.int32)
    scales = {} if kv_dtype is None else {"k_scale": torch.ones(1), "v_scale": torch.ones(1)}
    return prefill_op.validate(q, kv.k_cache, kv.v_cache, qo, kv.kv_indptr, kv.kv_indices, kv.seq_lens, **scales)


def test_rule_on_validated_calls():
    mi350 = RuleEnv("gfx950", 256)
    assert ck.RULE.predict(_prefill_args([1] * 6), 0, mi350).key == SMALL
    assert ck.RULE.predict(_prefill_args([1] * 7), 6, mi350).key == LARGE
    # one long extend sets max_seqlen_q for every request: 3 x ceil(129 / 128) = 6, 4 x 2 = 8
    assert ck.RULE.predict(_prefill_args([129, 1, 1]), 1, mi350).key == SMALL
    assert ck.RULE.predict(_prefill_args([129, 1, 1, 1]), 1, mi350).key == LARGE
    assert ck.RULE.predict(_prefill_args([1, 1]), 0, RuleEnv("gfx942", 80)).key == LARGE
    assert ck.RULE.predict(_prefill_args([1]), 0, RuleEnv("gfx942", 80)).key == SMALL
    fp8 = _prefill_args([1], kv_dtype=torch.float8_e4m3fn)
    assert ck.RULE.predict(fp8, 0, mi350).key == LARGE  # the fp8 variant has one tile
    with pytest.raises(ValueError, match="request"):
        ck.RULE.predict(_prefill_args([1, 1]), 2, mi350)
    assert ck.RULE.name == "ck_batch_prefill" and "fmha_batch_prefill.py" in ck.RULE.source
