"""Fused-prefill parity: a backend identical to the torch chain is bitwise and within tolerance; a
perturbed one is caught by the named tolerances."""

import pytest

from gdn_lab import routing
from gdn_lab.experiments import fused_prefill_parity as fp
from gdn_lab.ops.gdn_layer_prefill.reference import gdn_layer_prefill_torch

GDN = {"num_k_heads": 1, "num_v_heads": 2, "head_dim": 64}


@pytest.fixture
def chains():
    def perturbed(**args):
        normalized, quantized, scales = gdn_layer_prefill_torch(**args)
        args["delta_state"].mul_(1.5)
        return normalized * 1.1, quantized, scales

    specs = [
        routing.Backend("gdn_layer_prefill", "test-copy", gdn_layer_prefill_torch, routing.LIBRARY_TORCH, auto=False),
        routing.Backend("gdn_layer_prefill", "test-perturbed", perturbed, routing.LIBRARY_TORCH, auto=False),
    ]
    for b in specs:
        routing.register(b)
    yield
    for b in specs:
        routing._REGISTRY["gdn_layer_prefill"].pop(b.name)


def test_parity_against_the_torch_chain(chains):
    df = fp.fused_prefill_parity(
        op="gdn_layer_prefill",
        backends=["test-copy", "test-perturbed"], targets=[5, 65], batch_sizes=[1, 3], device="cpu",
        dtype="float32", gdn=GDN, max_context=20, progress=False,
    )  # fmt: skip
    assert set(df.tensor) == {"normalized", "quantized", "scales", "conv_state", "delta_state"}
    copy, bad = df[df.backend == "test-copy"], df[df.backend == "test-perturbed"]
    assert copy.bitwise_equal.astype(bool).all() and copy.within_tolerance.astype(bool).all()
    assert (copy.rel_mae == 0).all() and (copy[copy.tensor == "quantized"].codes_equal == 1).all()
    judged = bad.set_index(["target_len", "batch_size", "tensor"]).within_tolerance.astype(bool)
    assert not judged.xs("normalized", level="tensor").any()
    assert not judged.xs("delta_state", level="tensor").any()
    assert judged.xs("conv_state", level="tensor").all(), "the conv state was not touched"
    assert bad[bad.tensor == "normalized"].rel_mae.round(6).eq(0.1).all()
    assert df[df.tensor == "conv_state"].tolerance.eq("bitwise").all()
    assert "OUTSIDE tolerance" in fp.headline(df)


def test_no_fused_backend_is_a_headline_not_a_crash(chains):
    df = fp.fused_prefill_parity(
        op="gdn_layer_prefill", backends=["torch"], targets=[3], batch_sizes=[1], device="cpu", gdn=GDN, progress=False
    )
    assert df.empty and fp.headline(df).startswith("no fused backend ran")
