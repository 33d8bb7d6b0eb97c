"""KV cache dtype: fp8 error is judged against the fp32 reference, per emulated arch; rows stay invariant."""

import pytest

from gdn_lab.experiments import kv_cache_dtype as kv

ATT = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32}


def test_fp8_per_arch_against_the_fp32_reference():
    df = kv.kv_cache_dtype(
        op="decode_attention",
        backends=["torch"], arches=["gfx942", "gfx950"], contexts=[16, 300], batch_size=3, device="cpu",
        dtype="bfloat16", attention=ATT, max_context=64, progress=False,
    )  # fmt: skip
    assert len(df) == 2 * 2 * 2 and (df.status == "compared").all()
    formats = df.groupby("arch").kv_dtype.unique().apply(sorted).to_dict()
    assert formats == {"gfx942": ["bfloat16", "float8_e4m3fnuz"], "gfx950": ["bfloat16", "float8_e4m3fn"]}
    fp8, native = df[df.kv_format == "fp8"], df[df.kv_format == "compute"]
    # the kernel's own error (against the exact softmax of the cache it read) is small in both cases;
    # fp8's cost is the quantization: an order of magnitude above bf16's rounding, inside its tolerance
    assert (fp8.kernel_max_abs < 1e-2).all() and (native.kernel_max_abs < 1e-2).all()
    assert fp8.ref_rms_ratio.min() > 5 * native.ref_rms_ratio.max()
    assert df.within_tolerance.astype(bool).all() and df.bitwise_equal.astype(bool).all()
    assert df.tolerance.str.startswith("rms(out-ref)/rms(ref) <=").all()
    assert "bitwise invariant with both caches" in kv.headline(df)
    assert "gfx942 / float8_e4m3fnuz / torch" in kv.conclusion(df)


def test_unknown_arch_is_rejected():
    with pytest.raises(ValueError, match="arch"):
        kv.kv_cache_dtype(
            op="decode_attention", backends=["torch"], arches=["gfx90a"], contexts=[4], device="cpu", progress=False
        )


def test_error_rows_lead_the_headline():
    """A backend that raises on every case (as torch-partitioned once did on the H200) is counted
    first in the headline, never hidden behind "all within tolerance"."""
    from gdn_lab import routing

    def raises(**args):
        raise RuntimeError("expected self and mask to be on the same device")

    routing.register(routing.Backend("decode_attention", "test-raises", raises, routing.LIBRARY_TORCH, auto=False))
    try:
        df = kv.kv_cache_dtype(
            op="decode_attention", backends=["torch", "test-raises"], arches=["gfx950"], contexts=[16], batch_size=2,
            device="cpu", dtype="float32", attention=ATT, max_context=16, progress=False,
        )  # fmt: skip
    finally:
        routing._REGISTRY["decode_attention"].pop("test-raises")
    head = kv.headline(df)
    assert head.startswith("2 ERROR rows (test-raises: 2; first: RuntimeError: expected self and mask"), head
    assert "all 2 compared rows within tolerance" in head


def test_arches_null_is_the_device_arch():
    cfg = kv.KVCacheConfig(op="decode_attention", arches=None, device="cpu")
    assert [c.arch for c in cfg.cases()][:1] == ["cpu"]
