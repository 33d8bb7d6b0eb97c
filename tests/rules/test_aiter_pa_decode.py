"""AITER's Triton paged-decode V1/V2 rule: its boundaries, and agreement with the wheel's own dispatch."""

from __future__ import annotations

import itertools

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.rules.aiter_pa_decode import RULE, expect, numerics_key, predict


@pytest.mark.parametrize(
    ("num_seqs", "num_q_heads", "max_seq_len", "variant"),
    [
        pytest.param(1, 32, 1024, "v1", id="one-partition"),
        pytest.param(16, 32, 1025, "v2", id="512-rows"),
        pytest.param(17, 32, 1025, "v1", id="544-rows"),
        pytest.param(129, 4, 4000, "v1", id="516-rows"),
        pytest.param(128, 4, 4000, "v2", id="512-rows-gqa"),
        pytest.param(256, 32, 8192, "v1", id="8192"),
        pytest.param(256, 32, 8193, "v2", id="8193"),
        pytest.param(1, 1, 8193, "v2", id="long-alone"),
    ],
)
def test_boundaries(num_seqs, num_q_heads, max_seq_len, variant):
    p = predict(num_seqs, num_q_heads, max_seq_len)
    assert p.variant == variant
    assert p.max_num_partitions == -(-max_seq_len // 1024) and p.rows == num_seqs * num_q_heads


def test_numerics_key_separates_partitioned_requests_only():
    v2 = predict(2, 4, 3000)
    assert v2.variant == "v2"
    assert numerics_key(v2, 1024) == numerics_key(predict(1, 4, 1024), 1024) == "single pass"
    assert numerics_key(v2, 1025) == "partitioned:reduce4" != numerics_key(predict(200, 4, 3000), 1025)


@pytest.mark.parametrize(
    "max_seq_len, width",
    [(1025, 2), (2048, 2), (2049, 4), (4096, 4), (4097, 8), (8192, 8), (8193, 16), (16383, 16), (16385, 32)],
)
def test_the_reduce_width_is_the_batchs_padded_partition_count(max_seq_len, width):
    assert predict(1, 4, max_seq_len).reduce_width == width


def test_expectations_between_launches():
    alone, wide = numerics_key(predict(1, 4, 4000), 4000), numerics_key(predict(8, 4, 16383), 4000)
    assert (alone, wide) == ("partitioned:reduce4", "partitioned:reduce16")
    assert expect(alone, wide) == "rounding"  # the reduce's float32 association moves
    assert expect(alone, "single pass") == "switch" and expect(alone, alone) == "equal"


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="max_seq_len"):
        predict(1, 4, 0)


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_rule_matches_the_wheel(monkeypatch):
    """The wheel's paged_attention_decode, with its two launchers replaced by spies, picks what we predict."""
    module = aiter.load("pa_decode")
    assert RULE.partition_size == module._SEQ_PARTITION_SIZE
    chosen = []
    monkeypatch.setattr(module, "paged_attn_decode_v1", lambda *a, **k: chosen.append("v1"))
    monkeypatch.setattr(module, "paged_attn_decode_v2", lambda *a, **k: chosen.append("v2"))
    one = torch.ones(1)
    cache = torch.zeros(1, 1, 16, 1)
    for num_seqs, hq, max_len in itertools.product(
        (1, 2, 16, 17, 33, 128, 129, 257), (1, 4, 16, 32), (1, 1024, 1025, 4000, 8192, 8193, 20000)
    ):
        q = torch.zeros(num_seqs, hq, 1)
        module.paged_attention_decode(
            q, q, cache, cache, torch.ones(num_seqs, dtype=torch.int32), torch.zeros(num_seqs, 1, dtype=torch.int32),
            1.0, max_len, None, one, one,
        )  # fmt: skip
        assert chosen.pop() == predict(num_seqs, hq, max_len).variant, (num_seqs, hq, max_len)
