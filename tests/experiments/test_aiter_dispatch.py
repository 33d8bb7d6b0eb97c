"""Predicted vs measured batch variance of AITER's Triton kernels, on the CPU smoke scale.

The smoke case is built so that each rule must predict both outcomes: a 1100-token target switches
pa_decode from V2 (alone, 2 requests) to V1 (17 requests x 32 heads > 512 rows) and unified_attention
from 3D (alone) to 2D (one CU: 4 target programs); a 20-token target keeps its bits everywhere.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.experiments.aiter_dispatch import (
    OUTCOMES,
    DispatchConfig,
    aiter_dispatch_by_op,
    conclusion,
    headline,
    invariance_map,
    misses,
    outcome,
    outcome_map,
    ruled_backends,
    summarize,
)
from gdn_lab.experiments.table import COLUMNS

SMOKE = dict(
    ops={
        "decode_attention": {
            "targets": [20, 1100],
            "batch_sizes": [2, 17],
            "max_context": 64,
            "backends": ["aiter-triton-pa", "aiter-triton-unified"],
        },
        "prefill_attention": {"targets": [20], "batch_sizes": [2], "max_context": 16, "backends": ["aiter-triton-mha"]},
    },
    num_cus=1,
    attention={"num_q_heads": 32, "num_kv_heads": 2, "head_dim": 16},
    progress=False,
)


def test_outcomes():
    cases = [
        ("equal", True),
        ("switch", False),
        ("rounding", True),
        ("rounding", False),
        ("switch", True),
        ("equal", False),
    ]
    assert [outcome(e, m) for e, m in cases] == list(OUTCOMES)
    with pytest.raises(ValueError, match="expected"):
        outcome("maybe", True)


def test_config_validation():
    with pytest.raises(ValueError, match="backends"):
        DispatchConfig(backends=["aiter-triton-nope"])
    with pytest.raises(ValueError, match="arch"):
        DispatchConfig(arch="gfx90a")
    with pytest.raises(ValueError, match="max_context"):
        DispatchConfig(min_context=10, max_context=5)
    with pytest.raises(ValueError, match="no backend that carries a dispatch rule"):
        aiter_dispatch_by_op({"rms_norm": {}})
    assert (
        DispatchConfig(attention={"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16}).shapes["attention"]["page_size"]
        == 16
    )


def test_ruled_backends_are_found_through_their_metadata():
    names = {b.name for b in ruled_backends()}
    assert {"aiter-triton-pa", "aiter-triton-unified", "aiter-triton-mha", "aiter-triton-gemm"} <= names
    assert {"aiter", "aiter-flydsl", "sglang-aiter", "aiter-vk", "aiter-fused"} <= names
    assert all(b.rule.source and b.library.amd for b in ruled_backends())


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_smoke_run_meets_every_prediction(device):
    df = aiter_dispatch_by_op(device=str(device), **SMOKE)
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS and "predicted_variant" in df.columns
    decode = df[df.op == "decode_attention"]
    assert len(decode) == 2 * 2 * 2 and decode.covered.all() and (decode.status == "compared").all()
    assert set(decode.prediction) == set(OUTCOMES[:2])  # both outcomes occur, and no miss
    assert decode.within_tolerance.all()
    assert (df.emulated_arch == aiter.effective_arch(device)).all() and (df.arch == df.emulated_arch).all()
    assert (df.num_cus == 1).all() and (df.aiter_route == aiter.probe().route).all()
    switched = decode[decode.prediction == "switch observed"]
    assert set(switched.target_len) == {1100} and (switched.n_diff > 0).all()
    pa = decode[(decode.backend == "aiter-triton-pa") & (decode.target_len == 1100)]
    assert pa.set_index("batch_size").predicted_variant.to_dict() == {2: "v2", 17: "v1"}
    mha = df[df.backend == "aiter-triton-mha"]
    ok, reason = aiter.kernel_available("mha", device)
    assert mha.covered.all() if ok else (~mha.covered.astype(bool)).all() and (mha.reason.str.contains("aiter")).all()

    s = summarize(df).set_index("backend")
    assert s.loc["aiter-triton-pa", "rule_holds"] and s.loc["aiter-triton-unified", "switch_observed"] == 2
    assert "rule holds" in headline(df) and "RULE MISSES" not in headline(df)
    text = conclusion(df)
    assert "aiter-triton-pa" in text and ("not yet run on AMD hardware" in text) == (not torch.version.hip)
    imap = invariance_map(df, "aiter-triton-pa")
    assert imap.loc[20].tolist() == [1.0, 1.0] and imap.loc[1100].tolist() == [1.0, 0.0]
    codes, labels = outcome_map(df, "aiter-triton-unified")
    assert labels.loc["1100 (alone: 3d:16seg)"].tolist() == ["2d", "2d"] and codes.loc[
        "1100 (alone: 3d:16seg)"
    ].tolist() == [1, 1]
    assert misses(df).empty


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_an_op_takes_several_case_sets(device):
    small = {"targets": [20], "batch_sizes": [2], "max_context": 8, "backends": ["aiter-triton-pa"]}
    df = aiter_dispatch_by_op(
        {"decode_attention": [small, {**small, "max_context": 40, "trials": 2}]},
        device=str(device), num_cus=1, progress=False,
        attention={"num_q_heads": 32, "num_kv_heads": 2, "head_dim": 16},
    )  # fmt: skip
    assert len(df) == 3 and sorted(df.trial.tolist()) == [0, 0, 1] and df.batch_max_len.max() > 8
