"""Partition edges: the exact reference is exact, references are within tolerance, edges are counted."""

import doctest

import pytest
import torch
import torch.nn.functional as F

from gdn_lab.experiments import partition_edges as pe
from gdn_lab.experiments.table import COLUMNS
from gdn_lab.ops import spec
from gdn_lab.workloads import AttentionShape, BuildOptions, alone, build, target_request

ATT = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16}
TOL = spec.get("decode_attention").tolerance("out", torch.bfloat16, "exact")
SMALL = dict(device="cpu", attention=ATT, max_context=64, batch_size=3, progress=False, include_controls=False)


def test_exact_reference_matches_a_dense_softmax_over_unpaged_kv():
    t = target_request(37, seed=1)
    args = build(
        "decode_attention", alone(t, 1), AttentionShape(4, 2, 16, page_size=4), BuildOptions(dtype=torch.float32)
    )
    from gdn_lab.cache import random_kv

    k, v = random_kv(37, 2, 16, dtype=torch.float32, device="cpu", seed=t.seed)
    q = args["q"][0].double()  # [Hq, D]
    kh, vh = (x.double().repeat_interleave(2, dim=1).transpose(0, 1) for x in (k, v))
    dense = F.softmax(q[:, None, :] @ kh.transpose(1, 2) * 16**-0.5, dim=-1) @ vh
    torch.testing.assert_close(spec.get("decode_attention").exact(args)[0], dense[:, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_references_within_tolerance_and_invariant(dtype):
    contexts = [1, 255, 256, 257, 513]
    df = pe.partition_edges(
        op="decode_attention", backends=["torch", "torch-partitioned"], contexts=contexts, dtype=dtype, **SMALL
    )
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    assert (df.status == "compared").all()
    assert df.within_tolerance.astype(bool).all() and df.bitwise_equal.astype(bool).all()
    assert df[df.backend == "torch"].partitions.tolist() == [1, 1, 1, 2, 3]
    buckets = df[list(pe.ULP_BUCKETS)].sum(axis=1)
    assert buckets.round(6).eq(1).all()
    one_token = df[(df.target_len == 1) & (df.backend == "torch")]
    assert (one_token.exact_max_ulp == 0).all(), "one token: the output is that token's value, rounded once"
    if dtype == "float32":
        # AITER's merge divides by (sum + 1e-6): visible in fp32 even for one token, 1 / (1 + 1e-6)
        aiter_like = df[(df.target_len == 1) & (df.backend == "torch-partitioned")]
        assert (aiter_like.exact_max_ulp > 0).all() and aiter_like.within_tolerance.astype(bool).all()
    hist = pe.ulp_histogram(df)
    assert set(hist.ulp) == {"0", "1", "2", ">2"} and set(hist.backend) == {"torch", "torch-partitioned"}
    assert "compared rows within tolerance" in pe.headline(df) and "all batch invariant" in pe.headline(df)


def test_tolerance_catches_a_wrong_result():
    exact = torch.linspace(-2, 2, 64, dtype=torch.float64)
    good = pe.error_vs_exact(exact.to(torch.bfloat16), exact, TOL)
    bad = pe.error_vs_exact((exact * 1.05).to(torch.bfloat16), exact, TOL)
    assert good["within_tolerance"] and good["exact_max_ulp"] == 0
    assert not bad["within_tolerance"] and bad["exact_max_ulp"] > 2


def test_docstring_example():
    result = doctest.testmod(pe)
    assert result.attempted > 0 and result.failed == 0
