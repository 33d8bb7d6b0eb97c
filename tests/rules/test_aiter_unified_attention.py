"""AITER's Triton unified_attention 2D/3D rule: its boundaries, and agreement with the wheel's own dispatch."""

from __future__ import annotations

import itertools

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.rules.aiter_unified_attention import expect, numerics_key, predict, tiles_per_segment


def decode(num_seqs, hq=32, hkv=8, max_k=4000, block=16, cus=132):
    return predict(num_seqs, num_seqs, hq, hkv, 1, max_k, block, cus)


def test_h200_decode_switches_to_2d_at_54_requests():
    # 32/8 heads: BLOCK_Q = 4, so num_2d_prgms = (B // 4 + B) * 8 exceeds 4 * 132 from B = 54.
    assert decode(53).variant == "3d:16seg"
    assert decode(54).variant == "2d"


@pytest.mark.parametrize(
    ("num_seqs", "segments"), [(1, 128), (2, 64), (3, 32), (4, 16), (40, 16)], ids=lambda v: str(v)
)
def test_segments_shrink_as_the_batch_grows(num_seqs, segments):
    assert decode(num_seqs).num_segments == segments


def test_short_batches_are_2d_and_cu_count_matters():
    assert decode(1, max_k=512).variant == "2d"
    assert decode(1, max_k=513).variant.startswith("3d")
    assert decode(40, cus=132).variant.startswith("3d") and decode(40, cus=80).variant == "2d"  # 400 programs
    assert decode(1, block=32).num_segments == 128 and decode(40, block=32).num_segments == 8


def test_numerics_key_is_the_requests_segmentation():
    alone, pair = decode(1), decode(2)  # 128 and 64 segments of 16-token tiles
    assert tiles_per_segment(alone, 600) == tiles_per_segment(pair, 600) == 1
    assert numerics_key(alone, 600) == numerics_key(pair, 600)  # only the reduce's padding differs
    assert numerics_key(alone, 4000) != numerics_key(pair, 4000)  # 2 vs 4 tiles per segment
    assert numerics_key(decode(54), 4000) == "2d"
    assert numerics_key(decode(54), 1) == numerics_key(alone, 1) == "one token"  # the output is the token's value
    assert numerics_key(alone, 16) == "3d:1seg" and numerics_key(decode(54), 16) == "2d"
    assert expect("2d", "3d:1seg") == "rounding" and expect("2d", "3d:2tiles/seg") == "switch"
    assert expect("3d:1seg", "3d:1seg") == "equal"


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_rule_matches_the_wheel(monkeypatch):
    """The wheel's unified_attention, with its kernels replaced by spies, launches what we predict."""
    module = aiter.load("unified_attention")
    launched = []

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda **kw: launched.append((self.name, kw))

    for name in ("kernel_unified_attention_2d", "kernel_unified_attention_3d", "reduce_segments"):
        monkeypatch.setattr(module, name, Spy(name))
    cases = itertools.product((1, 2, 3, 4, 9, 54, 100), ((32, 8), (4, 2), (32, 2)), (1, 3), (100, 513, 4000), (16, 32))
    for (num_seqs, (hq, hkv), q_per_seq, max_k, block), cus in itertools.product(cases, (1, 80, 132, 256)):
        tokens = num_seqs * q_per_seq
        monkeypatch.setattr(module, "get_num_sms", lambda cus=cus: cus)
        q = torch.zeros(tokens, hq, 16)
        cache = torch.zeros(1, block, hkv, 16)
        module.unified_attention(
            q=q, k=cache, v=cache, out=q, cu_seqlens_q=torch.zeros(num_seqs + 1, dtype=torch.int32),
            max_seqlen_q=q_per_seq, seqused_k=torch.ones(num_seqs, dtype=torch.int32), max_seqlen_k=max_k,
            softmax_scale=1.0, causal=True, window_size=(-1, -1), block_table=torch.zeros(num_seqs, 1, dtype=torch.int32),
            softcap=0.0, q_descale=None, k_descale=None, v_descale=None,
        )  # fmt: skip
        name, kw = launched[0]
        got = "2d" if name.endswith("2d") else f"3d:{kw['NUM_SEGMENTS_PER_SEQ']}seg"
        expected = predict(num_seqs, tokens, hq, hkv, q_per_seq, max_k, block, cus).variant
        assert got == expected, (num_seqs, hq, hkv, q_per_seq, max_k, block, cus)
        launched.clear()
